/*
 * tests/fuzz/fuzz.h - what the libFuzzer targets of tests/fuzz/ share (make fuzz; the rules
 * are in docs/RELIABILITY.md, "Fuzzing").
 *
 * A target gets arbitrary bytes and must neither crash nor trip ASan/UBSan; beyond that each
 * checks the promises of the code it drives (a refusal comes with a message, what was
 * accepted reads back the same) with VS_FUZZ_REQUIRE, which aborts, so libFuzzer keeps the
 * input like any other crash.
 */
#ifndef VS_FUZZ_H
#define VS_FUZZ_H

#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VS_FUZZ_REQUIRE(cond, ...)                                          \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "fuzz: %s:%d: %s does not hold: ", __FILE__, __LINE__, \
              #cond);                                                       \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
      abort();                                                              \
    }                                                                       \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The build directory of this target (build/fuzz: targets live in build/fuzz/targets/), for
 * the plugins built beside it. */
static inline void vs_fuzz_build_dir(char *out, size_t len) {
  char exe[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    fprintf(stderr, "fuzz: cannot read /proc/self/exe\n");
    exit(1);
  }
  exe[n] = 0;
  snprintf(out, len, "%s", dirname(dirname(exe)));
}

/* The input as a NUL-terminated string (parsers of text files take those). */
static inline char *vs_fuzz_text(const uint8_t *data, size_t size) {
  char *t = malloc(size + 1);
  if (!t) abort();
  memcpy(t, data, size);
  t[size] = 0;
  return t;
}

/* Resident memory over a run (issue 32, finding 8; docs/RELIABILITY.md, "Fuzzing"): with
 * VSPEC_FUZZ_RSS_WARM=W in the environment (tests/fuzz/run.sh sets it for make fuzz), VmRSS is
 * read at the first input, at input W (the end of the warm-up: the corpus loaded, caches and
 * the ASan quarantine filled) and at exit, and its highest value every 4096 inputs; at exit
 * one line "fuzz-rss: ..." goes to stderr, which run.sh holds to its bound. Each target calls
 * vs_fuzz_rss_tick() first thing for every input. */
static long vs__fuzz_inputs, vs__fuzz_warm_at, vs__fuzz_rss_start, vs__fuzz_rss_warm,
    vs__fuzz_rss_max;

static inline long vs_fuzz_rss_kb(void) {
  char line[256];
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

static inline void vs__fuzz_rss_at_exit(void) {
  long end = vs_fuzz_rss_kb();
  if (end > vs__fuzz_rss_max) vs__fuzz_rss_max = end;
  fprintf(stderr, "fuzz-rss: inputs %ld start_kb %ld warm_inputs %ld warm_kb %ld end_kb %ld "
          "max_kb %ld\n", vs__fuzz_inputs, vs__fuzz_rss_start,
          vs__fuzz_inputs >= vs__fuzz_warm_at ? vs__fuzz_warm_at : 0, vs__fuzz_rss_warm, end,
          vs__fuzz_rss_max);
}

static inline void vs_fuzz_rss_tick(void) {
  long n = ++vs__fuzz_inputs;
  if (n == 1) {
    const char *w = getenv("VSPEC_FUZZ_RSS_WARM");
    vs__fuzz_warm_at = w ? atol(w) : 0;
    if (vs__fuzz_warm_at <= 0) return;
    vs__fuzz_rss_start = vs__fuzz_rss_max = vs_fuzz_rss_kb();
    atexit(vs__fuzz_rss_at_exit);
  }
  if (vs__fuzz_warm_at <= 0) return;
  if (n == vs__fuzz_warm_at) vs__fuzz_rss_warm = vs_fuzz_rss_kb();
  if (n % 4096 == 0) {
    long kb = vs_fuzz_rss_kb();
    if (kb > vs__fuzz_rss_max) vs__fuzz_rss_max = kb;
  }
}

#endif /* VS_FUZZ_H */
