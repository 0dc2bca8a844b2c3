/*
 * tests/test_walk_jobs.c - whole jobs with the verification walk on the device (ABI 1.6,
 * core/verify_device.c: the backend walks where the logits are, the round downloads the
 * result) give the tokens and the metrics of the host walk, for every built-in rule on
 * chains, static trees and dynamic trees, drafted by the draft model and by the EAGLE head,
 * after tokens accepted without verification (VVS) too, sampled (with CFG, top-k, top-p and a CFG interval) and greedy. models/fmnist on the CPU
 * device, where VSPEC_WALK=device runs the CPU op over the head's logits (the CPU's default
 * stays the host walk); the same engine and backend code asks for and takes the walk on a
 * GPU. The device runs also download fewer bytes: the walk's result instead of the logits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/tree.h"
#include "kernels/vs_kernels.h"
#include "tests/support/method_of.h"

#define N_TOK 64

static vspec_host host;
static vs_registry *reg;
static vspec_dev *dev;
static vs_models *models;

static const char *const methods[] = {
    "sd:exact@standard:shape=chain,depth=4,drafter=model",
    "sd:exact@standard:shape=static,tree=fmnist,drafter=model",
    "sd:exact@standard:shape=dynamic,drafter=head,depth=4,top_k=4,total_tokens=8",
    "sd:uniform_rsd:omega=1.5@standard:shape=static,tree=fmnist,drafter=head",
    "sd:coolsd:delta=1.6@standard:shape=chain,depth=5,drafter=model",
    "sd:coolsd:resample=rule@standard:shape=dynamic,drafter=model,depth=3,top_k=3,"
    "total_tokens=8",
    "sd:lantern:k=8,delta=0.3@standard:shape=chain,depth=4,drafter=head",
    "sd:lantern:reject=reference,k=4,delta=0.2@standard:shape=static,tree=fmnist,"
    "drafter=model",
    "sd:lanternpp:lambda=3@standard:shape=dynamic,drafter=head,depth=4,top_k=4,total_tokens=8",
    "sd:lanternpp:resample=optimal,k=6@standard:shape=chain,depth=3,drafter=model",
    /* rounds after tokens accepted unverified (VVS): the walk covers the batch's last nodes */
    "sd:exact@vvs:skip=uniform,interval=2,select=confidence,warmup=0,drafter=model,"
    "shape=dynamic,top_k=3,depth=3,total_tokens=8",
    "sd:lantern:delta=0.2@vvs:skip=dynamic,threshold=0.0,select=confidence,warmup=0,"
    "drafter=model,shape=dynamic,top_k=2,depth=3,total_tokens=6",
};
#define N_METHODS (sizeof methods / sizeof methods[0])

static const vs_sampling samplings[] = {
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
    {.temperature = 0.8f, .top_k = 100, .top_p = 0.9f, .cfg_scale = 3.0f, .cfg_interval = 20},
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1},
    {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
};
#define N_SAMPLINGS (sizeof samplings / sizeof samplings[0])

typedef struct run {
  int32_t tokens[N_TOK];
  vs_metrics m;
  uint64_t download_bytes;
  uint64_t logits_bytes; /* what the verified rounds past AR steps download as logits */
  uint64_t walks;        /* those rounds */
  int rows;
} run;

/* Every verified round but an AR step (the root alone, nothing prepended: sample_tokens draws
 * it) downloads its batch's logits when the host walks: the prepended tokens and the tree. */
static void count_round(void *user, const vs_round_info *in) {
  run *r = user;
  if (in->round == 0 || in->skipped) return;
  int nodes = in->prepended + (in->tree ? in->tree->n : 1);
  if (nodes == 1) return;
  r->logits_bytes += (uint64_t)nodes * r->rows * 1024 * sizeof(float);
  r->walks++;
}

static void generate(const char *walk, const char *method, const vs_sampling *s, uint64_t seed,
                     run *out) {
  char err[VSPEC_ERRLEN];
  setenv("VSPEC_WALK", walk, 1);
  vs_job job = {.method = vs_method_of(method), .class_label = (int32_t)(seed % 10), .seed = seed,
                .sampling = *s, .on_round = count_round, .user = out};
  out->rows = s->cfg_scale > 1.0f ? 2 : 1;
  vs_dev_counters before, after;
  vs_dev_counters_get(dev, &before);
  if (vs_generate(models, dev, &job, out->tokens, &out->m, err, sizeof err))
    fail_msg("%s (VSPEC_WALK=%s): %s", method, walk, err);
  vs_dev_counters_get(dev, &after);
  vs_dev_counters_sub(&after, &before);
  out->download_bytes = after.download_bytes;
  unsetenv("VSPEC_WALK");
}

/* The whole grid (every method x sampling x 2 seeds) in the plain build; under the sanitizers,
 * which look for memory errors rather than at the grid and run these jobs 12 times slower
 * (5 minutes of make test's budget), each method once, the samplings taken in turn. */
#if defined(__SANITIZE_ADDRESS__)
#define FULL_GRID 0
#else
#define FULL_GRID 1
#endif

static void test_jobs_match_host_walk(void **state) {
  (void)state;
  for (size_t i = 0; i < N_METHODS; i++) {
    uint64_t saved = 0, accepted = 0, host_bytes = 0;
    for (size_t k = 0; k < N_SAMPLINGS; k++)
      for (uint64_t seed = 0; seed < 2; seed++) {
        if (!FULL_GRID && (k != i % N_SAMPLINGS || seed > 0)) continue;
        run *h = calloc(1, sizeof *h), *d = calloc(1, sizeof *d);
        generate("host", methods[i], &samplings[k], seed * 7 + k, h);
        generate("device", methods[i], &samplings[k], seed * 7 + k, d);
        if (memcmp(h->tokens, d->tokens, sizeof h->tokens))
          fail_msg("%s, sampling %zu, seed %llu: the tokens differ", methods[i], k,
                   (unsigned long long)seed);
        const vs_metrics *a = &h->m, *b = &d->m;
        assert_int_equal(a->rounds, b->rounds);
        assert_int_equal(a->accepted, b->accepted);
        assert_int_equal(a->drafted, b->drafted);
        assert_int_equal(a->siblings_tried, b->siblings_tried);
        assert_int_equal(a->residual_fallbacks, b->residual_fallbacks);
        assert_memory_equal(a->reached, b->reached, sizeof a->reached);
        assert_memory_equal(a->accepted_at, b->accepted_at, sizeof a->accepted_at);
        /* every such round downloaded the walk's result instead of its logits (rounds after
         * unverified tokens too), and nothing else changed (fmnist's vocabulary: 1024) */
        assert_int_equal(h->logits_bytes, d->logits_bytes);
        assert_true(d->logits_bytes > 0);
        assert_int_equal(h->download_bytes - d->download_bytes,
                         d->logits_bytes - d->walks * sizeof(vspec_walk_result));
        saved += h->download_bytes - d->download_bytes;
        host_bytes += h->download_bytes;
        accepted += (uint64_t)a->accepted;
        free(h);
        free(d);
      }
    printf("  %-86s %llu accepted, %llu of %llu bytes not downloaded\n", methods[i],
           (unsigned long long)accepted, (unsigned long long)saved,
           (unsigned long long)host_bytes);
    assert_true(accepted > 0);
  }
}

/* A value of VSPEC_WALK that means nothing fails the job with a message naming it (a typo does
 * not silently pick a walk). */
static void test_bad_setting(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN] = "";
  int32_t tokens[N_TOK];
  vs_metrics m;
  vs_job job = {.method = vs_method_of(methods[0]), .seed = 1, .sampling = samplings[0]};
  setenv("VSPEC_WALK", "sideways", 1);
  int rc = vs_generate(models, dev, &job, tokens, &m, err, sizeof err);
  unsetenv("VSPEC_WALK");
  assert_int_equal(rc, VSPEC_EINVAL);
  printf("  %s\n", err);
  assert_non_null(strstr(err, "VSPEC_WALK=sideways"));
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024], cache[] = "/tmp/vspec-walk-jobs-XXXXXX";
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  if (!mkdtemp(cache)) return 1;
  setenv("VSPEC_CACHE_DIR", cache, 1); /* the neighbour table is built, not read from $HOME */
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err) ||
      vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_jobs_match_host_walk),
                                     cmocka_unit_test(test_bad_setting)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  if (system(cmd)) rc |= 0;
  return rc;
}
