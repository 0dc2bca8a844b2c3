#include "core/text.h"

#include <string.h>

int vs_text_utf8_char(const char *s, size_t n, uint32_t *cp) {
  const unsigned char *p = (const unsigned char *)s;
  if (n == 0) return 0;
  unsigned c = p[0];
  int len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf) len = 2, v = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0) len = 3, v = c & 0x0f, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, v = c & 0x07, min = 0x10000;
  else return 0;
  if ((size_t)len > n) return 0;
  for (int k = 1; k < len; k++) {
    if ((p[k] & 0xc0) != 0x80) return 0;
    v = v << 6 | (p[k] & 0x3f);
  }
  /* Overlong forms (one character, several spellings: filters get bypassed), UTF-16
   * surrogates and code points past U+10FFFF are not UTF-8 (RFC 3629). */
  if (v < min || (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff) return 0;
  *cp = v;
  return len;
}

int vs_text_is_control(uint32_t cp) {
  /* C0, DEL and C1 drive terminals (ESC, and CSI as U+009B); the separators end lines for
   * some readers (forged log lines); the bidirectional controls reorder what a reader sees
   * (a name that displays as another). */
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x061c || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

/* The output for the input at s[0..n) (n > 0): a whole character as it is, or one byte
 * escaped. Returns the bytes written to out; *in says how many input bytes they stand for. */
static size_t tx_piece(const char *s, size_t n, unsigned flags, char out[4], size_t *in) {
  static const char hex[] = "0123456789abcdef";
  uint32_t cp = 0;
  int len = vs_text_utf8_char(s, n, &cp);
  int show = len > 0 && !vs_text_is_control(cp) && !((flags & VS_TEXT_ASCII) && cp >= 0x80);
  if (show && cp == '\\' && (flags & VS_TEXT_BACKSLASH)) {
    memcpy(out, "\\\\", 2);
    *in = 1;
    return 2;
  }
  if (show) {
    memcpy(out, s, (size_t)len);
    *in = (size_t)len;
    return (size_t)len;
  }
  /* One byte at a time: the bytes after it are looked at again, so a valid character right
   * after a broken one is kept. */
  unsigned char c = (unsigned char)s[0];
  out[0] = '\\';
  out[1] = 'x';
  out[2] = hex[c >> 4];
  out[3] = hex[c & 15];
  *in = 1;
  return 4;
}

/* Writes whole pieces while they fit in `limit` bytes; *used = input bytes consumed. */
static size_t text_emit(char *dst, size_t limit, const char *src, size_t n, unsigned flags,
                        size_t *used) {
  size_t o = 0, i = 0;
  while (i < n) {
    char piece[4];
    size_t in;
    size_t w = tx_piece(src + i, n - i, flags, piece, &in);
    if (o + w > limit) break;
    memcpy(dst + o, piece, w);
    o += w;
    i += in;
  }
  *used = i;
  return o;
}

size_t vs_text_clean(char *dst, size_t cap, const char *src, size_t n, unsigned flags) {
  if (cap == 0) return 0;
  size_t used, o = text_emit(dst, cap - 1, src, n, flags, &used);
  if (used < n && cap - 1 >= 3) {
    /* Cut: again with room for the mark, so that a reader knows there was more. */
    o = text_emit(dst, cap - 1 - 3, src, n, flags, &used);
    memcpy(dst + o, "...", 3);
    o += 3;
  }
  dst[o] = 0;
  return o;
}

const char *vs_text_quote(char *dst, size_t cap, const char *src, size_t n) {
  if (cap < 3) {
    if (cap) dst[0] = 0;
    return dst;
  }
  dst[0] = '\'';
  size_t o = 1 + vs_text_clean(dst + 1, cap - 2, src, n, VS_TEXT_ASCII | VS_TEXT_BACKSLASH);
  dst[o++] = '\'';
  dst[o] = 0;
  return dst;
}

/* Both run on every string of every message sent or received: printable ASCII, nearly all
 * of it, takes the short way. */
size_t vs_text_utf8_prefix(const char *s, size_t n) {
  size_t i = 0;
  uint32_t cp;
  int len;
  while (i < n) {
    if ((unsigned char)s[i] < 0x80) {
      i++;
      continue;
    }
    if ((len = vs_text_utf8_char(s + i, n - i, &cp)) == 0) break;
    i += (size_t)len;
  }
  return i;
}

size_t vs_text_clean_prefix(const char *s, size_t n) {
  size_t i = 0;
  uint32_t cp;
  int len;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f) {
      i++;
      continue;
    }
    if ((len = vs_text_utf8_char(s + i, n - i, &cp)) == 0 || vs_text_is_control(cp)) break;
    i += (size_t)len;
  }
  return i;
}
