/*
 * Greedy speculative decoding (temperature 0): trees keep their width (ranked by the
 * drafter's softmax, not its one-hot argmax), exact verification reproduces greedy AR token
 * for token, and relaxed rules judge against the target's softmax (as LANTERN's greedy path
 * does: jadohu/LANTERN models/ea_model_llamagen.py, EaModel.evaluate_posterior), so they
 * accept more than the exact rule. Greedy Jacobi decoding reproduces greedy AR too.
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
#include "core/tree.h"
#include "kernels/vs_kernels.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

static int widest;

static void note_width(void *user, const vs_round_info *in) {
  (void)user;
  if (!in->tree) return;
  for (int i = 0; i < in->tree->n; i++)
    if (in->tree->nodes[i].n_children > widest) widest = in->tree->nodes[i].n_children;
}

static void test_greedy(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_table_world w;
  vs_sampling s = {.temperature = 0.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 6, 6, 51, 0.6, 0.8, &s);
  vs_models *models = w.models;
  vspec_dev *dev = w.dev;
  double tpf_exact = 0, tpf_lantern = 0, tpf_jacobi[2] = {0, 0};
  for (int seed = 0; seed < 40; seed++) {
    int32_t ar[6], sd[6], relaxed[6];
    vs_metrics m1, m2, m3;
    vs_job job = {.method = NULL, .seed = (uint64_t)seed, .class_label = 0, .sampling = s};
    assert_int_equal(vs_generate(models, dev, &job, ar, &m1, err, sizeof err), 0);
    job.method =
        vs_method_of("sd:exact@standard:shape=dynamic,top_k=4,depth=3,total_tokens=12,drafter=model");
    job.on_round = note_width;
    if (vs_generate(models, dev, &job, sd, &m2, err, sizeof err)) fail_msg("%s", err);
    /* greedy exact SD is greedy AR */
    assert_memory_equal(ar, sd, sizeof ar);
    /* and so is Jacobi decoding (with SJD-PAC's tree: top candidates) */
    job.on_round = NULL;
    static const char *const jacobi[] = {"sd:exact@standard:drafter=jacobi,depth=4",
                                         "sd:exact@standard:drafter=jacobi,depth=4,continue=3x3"};
    for (int k = 0; k < 2; k++) {
      int32_t jd[6];
      vs_metrics mj;
      job.method = vs_method_of(jacobi[k]);
      if (vs_generate(models, dev, &job, jd, &mj, err, sizeof err)) fail_msg("%s", err);
      assert_memory_equal(ar, jd, sizeof ar);
      tpf_jacobi[k] += vs_metrics_tpf(&mj);
    }
    job.on_round = note_width;
    job.method = vs_method_of("sd:lantern:k=5,delta=0.9@standard:shape=dynamic,top_k=4,"
                              "depth=3,total_tokens=12,drafter=model");
    if (vs_generate(models, dev, &job, relaxed, &m3, err, sizeof err)) fail_msg("%s", err);
    tpf_exact += vs_metrics_tpf(&m2);
    tpf_lantern += vs_metrics_tpf(&m3);
  }
  printf("  greedy TPF: exact %.3f, lantern delta 0.9 %.3f, jacobi %.3f, with a 3x3 tree "
         "%.3f; widest node %d children\n", tpf_exact / 40, tpf_lantern / 40,
         tpf_jacobi[0] / 40, tpf_jacobi[1] / 40, widest);
  assert_true(widest > 1);
  assert_true(tpf_lantern > tpf_exact + 0.05);
  vs_table_world_close(&w);
}

/* The relaxed greedy test judges against the unfiltered softmax whatever the job's top-k
 * (as the authors' greedy path, softmax of the raw logits): with a chain the draft and the
 * argmaxes do not depend on top_k, so top_k = 1 must give the same tokens as top_k = 0. A
 * filtered softmax would be one-hot at top_k = 1 and LANTERN would reduce to greedy AR;
 * the test checks that the relaxation does change some sequences, so that it would see it. */
static void test_greedy_unfiltered(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_table_world w;
  vs_sampling s = {.temperature = 0.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 6, 6, 51, 0.6, 0.8, &s);
  int differs_from_ar = 0;
  for (int seed = 0; seed < 40; seed++) {
    int32_t ar[6], open_k[6], top1[6];
    vs_metrics m;
    vs_job job = {.method = NULL, .seed = (uint64_t)seed, .sampling = s};
    assert_int_equal(vs_generate(w.models, w.dev, &job, ar, &m, err, sizeof err), 0);
    job.method =
        vs_method_of("sd:lantern:k=5,delta=0.9@standard:shape=chain,depth=3,drafter=model");
    if (vs_generate(w.models, w.dev, &job, open_k, &m, err, sizeof err)) fail_msg("%s", err);
    job.sampling.top_k = 1;
    if (vs_generate(w.models, w.dev, &job, top1, &m, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(open_k, top1, sizeof top1);
    differs_from_ar += memcmp(ar, open_k, sizeof ar) != 0;
  }
  printf("  greedy lantern, top_k 1 = top_k 0; %d of 40 sequences differ from greedy AR\n",
         differs_from_ar);
  assert_true(differs_from_ar > 0);
  vs_table_world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_greedy),
                                     cmocka_unit_test(test_greedy_unfiltered)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
