#include "core/cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int vs_cli_long(const char *option, const char *text, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || *end || errno) {
    fprintf(stderr, "%s: '%s' is not an integer\n", option, text);
    return 0;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "%s: %ld is out of range (allowed %ld..%ld)\n", option, v, lo, hi);
    return 0;
  }
  *out = v;
  return 1;
}

int vs_cli_u64(const char *option, const char *text, unsigned long long *out) {
  char *end;
  errno = 0;
  if (*text == '-') {
    fprintf(stderr, "%s: '%s' must not be negative\n", option, text);
    return 0;
  }
  unsigned long long v = strtoull(text, &end, 10);
  if (end == text || *end || errno) {
    fprintf(stderr, "%s: '%s' is not a non-negative integer\n", option, text);
    return 0;
  }
  *out = v;
  return 1;
}

int vs_cli_double(const char *option, const char *text, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno || !isfinite(v)) {
    fprintf(stderr, "%s: '%s' is not a number\n", option, text);
    return 0;
  }
  if (v < lo || v > hi) {
    fprintf(stderr, "%s: %g is out of range (allowed %g..%g)\n", option, v, lo, hi);
    return 0;
  }
  *out = v;
  return 1;
}
