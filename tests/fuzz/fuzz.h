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

#endif /* VS_FUZZ_H */
