#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int vs__log_level = VSPEC_LOG_WARN;

void vs_log_set_level(int level) { atomic_store(&vs__log_level, level); }
int vs_log_get_level(void) { return atomic_load(&vs__log_level); }

int vs_log_parse_level(const char *name) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, names[i]) == 0) return i;
  return -1;
}

/* Log lines carry text from the network (job tags, method strings, plugin names in error
 * messages): control characters and bytes that are not UTF-8 are written as \xNN (and '\'
 * as "\\"), so that one call is one line and nothing can forge another line or reach the
 * terminal as an escape sequence. */
static void vs__sanitize(const char *in, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)in;
  size_t o = 0;
  while (*p && o + 5 < cap) {
    unsigned c = *p;
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
              : (c & 0xf8) == 0xf0 ? 4 : 0;
    int ok = len > 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; ok && k < len; k++) {
      ok = (p[k] & 0xc0) == 0x80;
      cp = cp << 6 | (p[k] & 0x3f);
    }
    /* no overlong forms, surrogates or code points past U+10FFFF */
    if (ok && len > 1)
      ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) &&
           !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff;
    if (ok && len == 1 && (c < 0x20 || c == 0x7f || c == '\\')) ok = 0;
    if (!ok && c == '\\') {
      out[o++] = '\\';
      out[o++] = '\\';
      p++;
    } else if (!ok) {
      out[o++] = '\\';
      out[o++] = 'x';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
      p++;
    } else {
      if (o + (size_t)len >= cap) break;
      for (int k = 0; k < len; k++) out[o++] = (char)p[k];
      p += len;
    }
  }
  out[o] = 0;
}

void vs_log(int level, const char *who, const char *fmt, ...) {
  static const char *const tags[] = {"error", "warn", "info", "debug"};
  if (level > atomic_load(&vs__log_level)) return;
  if (level < 0) level = 0;
  if (level > 3) level = 3;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  char safe[sizeof line * 2];
  vs__sanitize(line, safe, sizeof safe);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  /* One fprintf per line so lines from different threads do not interleave. */
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] %s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
          tags[level], who ? who : "vspec", safe);
}
