#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/text.h"

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
 * messages): control characters and bytes that are not UTF-8 are written as \xNN
 * (core/text.h), so that one call is one line and nothing can forge another line or reach
 * the terminal as an escape sequence. A backslash stays as it is: values from the network
 * are quoted where they enter a message (vs_text_quote, which doubles it), and the line reads
 * as the client's error message did. */
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
  vs_text_clean(safe, sizeof safe, line, strlen(line), 0);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  /* One fprintf per line so lines from different threads do not interleave. */
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] %s\n", tm.tm_year + 1900,
          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
          tags[level], who ? who : "vspec", safe);
}
