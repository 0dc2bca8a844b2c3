/*
 * Exactness of speculative decoding: with the `exact` rule the sampled sequences follow the
 * target's distribution, for chain drafting with a separate draft model, for a sampled
 * EAGLE-1-style static tree and for a deterministic top-k EAGLE-2-style dynamic tree, with a
 * feature-conditioned (EAGLE) drafter, and for Speculative Jacobi Decoding (no draft model)
 * with each coupling.
 *
 * The model is a micro table model (tests/support/table_model.h): random logits for every
 * prefix, CFG on (two rows), temperature 1, so the exact joint distribution is enumerated.
 * Each method draws SAMPLES sequences through the engine (one job per seed); Pearson's
 * chi-square against the exact joint must give p > 1e-3. A deliberately wrong rule,
 * accepting with min(1, 1.5 q/p), must fail the same test: that shows the test can fail.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/host.h"
#include "kernels/vs_kernels.h"
#include "tests/support/stats.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

/* The sanitizer build is several times slower; its run checks memory and that the exact
 * methods pass, the plain run also that the wrong rule fails (which needs the larger sample). */
#ifdef VSPEC_SANITIZED
#define SAMPLES 20000
#define CHECK_POWER 0
#else
#define SAMPLES 200000
#define CHECK_POWER 1
#endif
#define P_MIN 1e-3

typedef struct world {
  vs_table_world tw;
  double *joint;
} world;

static void world_open(world *w, int vocab, int len, uint64_t seed) {
  vs_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f,
                   .cfg_interval = -1};
  vs_table_world_open(&w->tw, vocab, len, seed, 1.2, 1.0, &s);
  w->joint = malloc((size_t)w->tw.cells * sizeof(double));
  vs_table_joint(&w->tw.tm, &w->tw.s, w->joint);
}

static void world_close(world *w) {
  free(w->joint);
  vs_table_world_close(&w->tw);
}

/* Samples `n` sequences with `method`; returns the chi-square p-value against the target. */
static double sample_pvalue(world *w, const char *method, int n, double *tpf) {
  int64_t *counts = calloc((size_t)w->tw.cells, sizeof *counts);
  int32_t tokens[16];
  char err[VSPEC_ERRLEN];
  vs_metrics total;
  memset(&total, 0, sizeof total);
  for (int i = 0; i < n; i++) {
    vs_job job = {.method = vs_method_of(method),
                  .class_label = 0, .seed = 1000003ull * 17 + (uint64_t)i,
                  .sampling = w->tw.s};
    vs_metrics mt;
    if (vs_generate(w->tw.models, w->tw.dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
    vs_metrics_add(&total, &mt);
    int64_t code = 0;
    for (int l = 0; l < w->tw.tm.len; l++) code = code * w->tw.tm.vocab + tokens[l];
    counts[code]++;
  }
  double stat;
  int dof;
  double p = vs_chi2_test(counts, w->joint, (int)w->tw.cells, n, 5.0, &stat, &dof);
  *tpf = vs_metrics_tpf(&total);
  printf("  %-70s chi2 %9.1f dof %4d p %.4g  TPF %.3f  accept %.3f\n", method, stat, dof, p,
         *tpf, vs_metrics_accept_rate(&total));
  free(counts);
  return p;
}

static const char *const exact_methods[] = {
    "ar",
    "sd:exact@standard:shape=chain,depth=3,drafter=model",
    "sd:exact@standard:shape=static,tree=0/1/2/0.0/0.1/1.0/0.0.0,drafter=model",
    "sd:exact@standard:shape=dynamic,top_k=3,depth=3,total_tokens=8,drafter=model",
    /* an EAGLE-style feature head: the table head fails the job if the catch-up chain or
     * the tree feeds it a misaligned feature */
    "sd:exact@standard:shape=static,tree=0/1/0.0/0.0.0,drafter=head",
    /* Speculative Jacobi Decoding: no draft model, the window's drafts are the target's own
     * earlier outputs, redrawn each round (independently, Gumbel-coupled, maximally coupled) */
    "sd:exact@standard:drafter=jacobi,depth=3",
    "sd:exact@standard:drafter=jacobi,depth=3,coupling=gumbel",
    "sd:exact@standard:drafter=jacobi,depth=3,coupling=maximal,init=repeat",
    /* a window shorter than the image, so the drafter's ring of positions wraps around */
    "sd:exact@standard:drafter=jacobi,depth=2,coupling=maximal",
    "sd:exact@standard:drafter=jacobi,depth=3,coupling=gumbel,init=random",
    /* SJD-PAC: the first two positions as a 2-ary tree of shared candidates */
    "sd:exact@standard:drafter=jacobi,depth=3,continue=2x3,coupling=maximal",
};
static const char *const wrong_method =
    "sd:uniform_rsd:omega=1.5,resample=rule@standard:shape=chain,depth=3,drafter=model";

static void check_world(int vocab, int len, uint64_t seed) {
  world w;
  world_open(&w, vocab, len, seed);
  printf("  vocab %d, %d tokens, %d sequences per method\n", vocab, len, SAMPLES);
  double tpf;
  for (size_t i = 0; i < sizeof exact_methods / sizeof exact_methods[0]; i++) {
    double p = sample_pvalue(&w, exact_methods[i], SAMPLES, &tpf);
    if (!(p > P_MIN)) fail_msg("%s: chi-square p = %.3g <= %g", exact_methods[i], p, P_MIN);
    if (i > 0) assert_true(tpf > 1.0); /* speculation really happened */
  }
  /* The wrong rule must be caught by the very same test, and so must a Jacobi drafter that
   * judges a carried-over draft against the new distribution instead of the one it was drawn
   * from. */
  if (CHECK_POWER) {
    double p = sample_pvalue(&w, wrong_method, SAMPLES, &tpf);
    if (!(p < P_MIN)) fail_msg("the wrong rule passed the chi-square test (p = %.3g)", p);
    /* (only where the window outlives a round: with 3 tokens every Jacobi draft is a first
     * draw, which the fault leaves alone) */
    if (len < 5) goto done;
    p = sample_pvalue(&w, "sd:exact@standard:drafter=jacobi_wrong,depth=3", SAMPLES, &tpf);
    if (!(p < P_MIN)) fail_msg("the wrong Jacobi update passed the chi-square test (p = %.3g)", p);
  }
done:
  world_close(&w);
}

/* The configuration of the issue: vocab 8, 3 tokens (trees of depth 1 after the first,
 * prefilled token). */
static void test_exact_vocab8_len3(void **state) {
  (void)state;
  check_world(8, 3, 11);
}

/* A deeper world so that acceptance chains over several depths: vocab 5, 5 tokens. */
static void test_exact_vocab5_len5(void **state) {
  (void)state;
  check_world(5, 5, 12);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_vocab8_len3),
      cmocka_unit_test(test_exact_vocab5_len5),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
