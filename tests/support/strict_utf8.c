#include "tests/support/strict_utf8.h"

#include <stdint.h>

static int vt__format_control(uint32_t cp) {
  return cp == 0x2028 || cp == 0x2029 || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

long vt_utf8_bad_at(const char *str, size_t n, int format_controls) {
  const unsigned char *s = (const unsigned char *)str;
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t more;
    uint32_t cp, min;
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return (long)i;
      i++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf) more = 1, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) more = 2, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) more = 3, cp = c & 0x07, min = 0x10000;
    else return (long)i;
    if (i + more >= n) return (long)i;
    for (size_t k = 1; k <= more; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return (long)i;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    if (cp < min || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff || cp <= 0x9f ||
        (format_controls && vt__format_control(cp)))
      return (long)i;
    i += more + 1;
  }
  return -1;
}
