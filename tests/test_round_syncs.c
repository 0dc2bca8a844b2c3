/*
 * tests/test_round_syncs.c - what a speculative round makes the host wait for (issue 29 item
 * 5), counted on the CPU device. On a GPU every download waits for its copy (and so for the
 * work queued before it), an upload is queued without a wait (kernels/cuda/cuda_dev.h: the
 * upload ring), and `syncs` counts every other wait; so downloads + syncs of a round is how
 * often the host stops for the GPU in it. The code that issues them is the same on every
 * device, so the budget asserted here holds there.
 *
 * Whole jobs on models/fmnist with the walk on the device (VSPEC_WALK=device, the default
 * everywhere but on the CPU). A verified round that is not an AR step waits for:
 *  - the target: 1 download (the walk's result), plus 1 download of the verified nodes'
 *    features where the drafter reads them (the EAGLE head's next root and catch-up chain
 *    come from them);
 *  - each forward of the drafter: 1 download (its logits, which the engine turns into draft
 *    distributions on the host). The EAGLE head keeps its output features on the device
 *    (ABI 1.7, vspec_forward_batch.feature_src: a tree node's input is its parent's output)
 *    where the scheduler never skips: no download of features per head forward. Under VVS
 *    (a skipped round reads the head's node features on the host) it still downloads them:
 *    2 downloads per head forward.
 * and uploads, without waiting, 2 arrays for the target (the forward's integers; the tree
 * for the walk) and 1 per drafter forward (its integers, with the target features the
 * catch-up chain and the root take). AR steps (the root alone: the device draws the token)
 * wait for 1 download (and the features for a head) after 1 upload. No round waits
 * otherwise (syncs 0). Adding a wait or an upload anywhere in a round fails this test.
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

typedef struct budget {
  int target_feats;        /* the target downloads features (a feature head drafts) */
  int draft_downloads;     /* downloads per drafter forward */
  vs_dev_counters last;    /* the device's counters after the previous round */
  int64_t last_forwards;   /* the drafter's forwards by then */
  int rounds, ar_steps, over, under;
  int64_t waits, drafts;   /* the verified rounds' waits and drafter forwards */
  char first_bad[160];
} budget;

static void br_round(void *user, const vs_round_info *in) {
  budget *b = user;
  vs_dev_counters now, d;
  vs_dev_counters_get(dev, &now);
  d = now;
  vs_dev_counters_sub(&d, &b->last);
  b->last = now;
  int64_t forwards = in->metrics->draft_forwards - b->last_forwards;
  b->last_forwards = in->metrics->draft_forwards;
  if (in->round == 0 || in->skipped) return;
  int64_t waits = (int64_t)(d.downloads + d.syncs), want, ups;
  int nodes = in->prepended + (in->tree ? in->tree->n : 1);
  if (nodes == 1 && forwards == 0) { /* an AR step: the device draws the token */
    want = 1 + b->target_feats;
    ups = 1;
    b->ar_steps++;
  } else {
    want = 1 + b->target_feats + forwards * b->draft_downloads;
    ups = 2 + forwards;
    b->rounds++;
    b->waits += waits;
    b->drafts += forwards;
  }
  if ((waits != want || (int64_t)d.uploads != ups) && !b->first_bad[0])
    snprintf(b->first_bad, sizeof b->first_bad, "round %lld: %lld waits (%llu down, %llu "
             "syncs; %llu up) for %lld drafter forwards, budget %lld waits and %lld up",
             (long long)in->round, (long long)waits, (unsigned long long)d.downloads,
             (unsigned long long)d.syncs, (unsigned long long)d.uploads, (long long)forwards,
             (long long)want, (long long)ups);
  b->over += waits > want || (int64_t)d.uploads > ups;
  b->under += waits < want || (int64_t)d.uploads < ups;
}

/* Two seeds in the plain build; one under the sanitizers, whose value here is the memory
 * checks (the counts are the same code's), to keep make test's ASan pass short. */
#ifdef VSPEC_SANITIZED
#define RS_SEEDS 1
#else
#define RS_SEEDS 2
#endif

static void check(const char *method, int target_feats, int draft_downloads) {
  static const vs_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                                .cfg_scale = 2.0f, .cfg_interval = -1};
  char err[VSPEC_ERRLEN];
  int32_t tokens[N_TOK];
  for (uint64_t seed = 0; seed < RS_SEEDS; seed++) {
    budget b = {.target_feats = target_feats, .draft_downloads = draft_downloads};
    vs_dev_counters_get(dev, &b.last);
    setenv("VSPEC_WALK", "device", 1);
    vs_job job = {.method = vs_method_of(method), .class_label = (int32_t)seed * 3,
                  .seed = seed, .sampling = s, .on_round = br_round, .user = &b};
    vs_metrics m;
    int rc = vs_generate(models, dev, &job, tokens, &m, err, sizeof err);
    unsetenv("VSPEC_WALK");
    if (rc) fail_msg("%s: %s", method, err);
    printf("  %-70s seed %llu: %d rounds, %.2f waits a round (%.2f drafter forwards), "
           "%d AR steps\n", method, (unsigned long long)seed, b.rounds,
           b.rounds ? (double)b.waits / b.rounds : 0.0,
           b.rounds ? (double)b.drafts / b.rounds : 0.0, b.ar_steps);
    if (b.over || b.under) fail_msg("%s: %d rounds over budget, %d under; first: %s", method,
                                    b.over, b.under, b.first_bad);
    assert_true(b.rounds > 0);
  }
}

/* The EAGLE head, chain, static and dynamic trees: one download per head forward. */
static void test_head_keeps_features(void **state) {
  (void)state;
  check("sd:exact@standard:shape=chain,depth=4,drafter=head", 1, 1);
  check("sd:coolsd:delta=2@standard:shape=static,tree=fmnist,drafter=head", 1, 1);
  check("sd:lantern:delta=0.2@standard:shape=dynamic,drafter=head,depth=4,top_k=4,"
        "total_tokens=8", 1, 1);
}

/* Under VVS the head's node features come to the host (node_feature), as before. */
static void test_head_under_vvs(void **state) {
  (void)state;
  check("sd:exact@vvs:skip=uniform,interval=2,warmup=0,drafter=head,shape=chain,depth=3", 1, 2);
}

/* The draft GPT: no features anywhere. */
static void test_draft_gpt(void **state) {
  (void)state;
  check("sd:exact@standard:shape=chain,depth=4,drafter=model", 0, 1);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err) ||
      vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_head_keeps_features),
                                     cmocka_unit_test(test_head_under_vvs),
                                     cmocka_unit_test(test_draft_gpt)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
  return rc;
}
