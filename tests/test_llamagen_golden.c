/*
 * Golden tests: the llamagen backend against the float64 PyTorch reference
 * (tools/ref/make_golden.py, data in tests/golden/). Everything runs through the plugin
 * ABI, as the engine uses it. Tolerance: max |c - ref| <= 1e-4 * max |ref| per tensor.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "kernels/host/host_math.h"
#include "kernels/vs_kernels.h"
#include "tests/support/test_device.h"
#include "tests/support/method_of.h"

#define GOLDEN_RTOL 1e-4

static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;

/* A golden case: a model directory and the directory of its golden.safetensors. */
typedef struct golden_case {
  const char *model_dir, *golden_dir;
} golden_case;

static const golden_case micro_c2i = {"tests/golden/micro_c2i", "tests/golden/micro_c2i"};
/* The trained shipped target (tools/ref/make_trained_golden.py). */
static const golden_case fmnist = {"models/fmnist", "tests/golden/fmnist"};

typedef struct golden {
  vs_models *models;
  vspec_tensor_file *g;
  const vs_backend_model *t;
} golden;

static void open_golden_case(golden *gd, const golden_case *gc) {
  char err[VSPEC_ERRLEN], path[512];
  int rc = vs_models_open(reg, &host, dev, gc->model_dir, VS_ROLE_TARGET, &gd->models, err,
                          sizeof err);
  if (rc) fail_msg("%s", err);
  snprintf(path, sizeof path, "%s/golden.safetensors", gc->golden_dir);
  rc = vs_st_open(path, &gd->g, err, sizeof err);
  if (rc) fail_msg("%s", err);
  gd->t = &gd->models->target;
}

static void open_golden(golden *gd, const char *dir) {
  golden_case gc = {dir, dir};
  open_golden_case(gd, &gc);
}

static void close_golden(golden *gd) {
  vs_st_close(gd->g);
  vs_models_close(gd->models);
}

/* Golden tensor `name` with `numel` elements of the given dtype. */
static const void *tensor(golden *gd, const char *name, int dtype, int64_t numel) {
  vspec_tensor t = {.struct_size = sizeof t};
  if (vs_st_find(gd->g, name, &t)) fail_msg("golden tensor '%s' missing", name);
  if ((int)t.dtype != dtype) fail_msg("golden tensor '%s' has dtype %u", name, t.dtype);
  if (numel >= 0 && t.numel != numel)
    fail_msg("golden tensor '%s' has %lld elements, expected %lld", name, (long long)t.numel,
             (long long)numel);
  return t.data;
}

static int64_t numel_of(golden *gd, const char *name) {
  vspec_tensor t = {.struct_size = sizeof t};
  if (vs_st_find(gd->g, name, &t)) fail_msg("golden tensor '%s' missing", name);
  return t.numel;
}

static void expect_close(const char *what, const float *got, const float *want, int64_t n) {
  double maxref = 0, maxdiff = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++) {
    if (fabs(want[i]) > maxref) maxref = fabs(want[i]);
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= maxdiff)) maxdiff = d, worst = i;
  }
  if (!(maxdiff <= GOLDEN_RTOL * maxref))
    fail_msg("%s: max |diff| %.3g at %lld (got %.7g, want %.7g) exceeds %.0e x max|ref| %.3g",
             what, maxdiff, (long long)worst, got[worst], want[worst], GOLDEN_RTOL, maxref);
}

static vspec_session *open_session(golden *gd, int class_label, int rows, int max_nodes) {
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = class_label,
                              .rows = rows, .max_nodes = max_nodes};
  vspec_session *s;
  char err[VSPEC_ERRLEN];
  if (gd->t->vt->session_open(gd->t->model, dev, &cfg, &s, err, sizeof err)) fail_msg("%s", err);
  return s;
}

static void forward_chain(golden *gd, vspec_session *s, const int32_t *tokens, int n, float *logits,
                          float *features) {
  int32_t parents[64], path[64];
  for (int i = 0; i < n; i++) parents[i] = i - 1, path[i] = i;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tokens,
                           .parents = parents};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = features};
  char err[VSPEC_ERRLEN];
  if (gd->t->vt->forward(s, &b, &o, err, sizeof err)) fail_msg("forward: %s", err);
  if (gd->t->vt->commit(s, path, n, err, sizeof err)) fail_msg("commit: %s", err);
}

/* ---- c2i micro model ----------------------------------------------------------------- */

static void test_c2i_prefill_and_decode(void **state) {
  golden gd;
  open_golden_case(&gd, *state);
  int V = gd.t->info.vocab, d = gd.t->info.feature_dim;
  int cls = *(const int32_t *)tensor(&gd, "cond.class", VSPEC_DTYPE_I32, 1);
  vspec_session *s = open_session(&gd, cls, 2, 8);
  float *logits = malloc(sizeof(float) * 8 * 2 * V), *features = malloc(sizeof(float) * 8 * 2 * d);
  assert_non_null(logits);
  assert_non_null(features);
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = features};
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  expect_close("prefill.logits", logits, tensor(&gd, "prefill.logits", VSPEC_DTYPE_F32, 2 * V),
               2 * V);
  expect_close("prefill.features", features,
               tensor(&gd, "prefill.features", VSPEC_DTYPE_F32, 2 * d), 2 * d);

  int n = (int)numel_of(&gd, "decode.tokens");
  const int32_t *tok = tensor(&gd, "decode.tokens", VSPEC_DTYPE_I32, n);
  const float *want = tensor(&gd, "decode.logits", VSPEC_DTYPE_F32, (int64_t)n * 2 * V);
  const float *want_f = tensor(&gd, "decode.features", VSPEC_DTYPE_F32, (int64_t)n * 2 * d);
  for (int i = 0; i < n; i++) {
    char what[64];
    forward_chain(&gd, s, &tok[i], 1, logits, features);
    snprintf(what, sizeof what, "decode.logits[%d]", i);
    expect_close(what, logits, want + (size_t)i * 2 * V, 2 * V);
    snprintf(what, sizeof what, "decode.features[%d]", i);
    expect_close(what, features, want_f + (size_t)i * 2 * d, 2 * d);
  }
  assert_int_equal(gd.t->vt->committed(s), 1 + n);
  gd.t->vt->session_close(s);

  /* The same decode steps as one chain forward: a multi-node commit. */
  s = open_session(&gd, cls, 2, 8);
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  forward_chain(&gd, s, tok, n, logits, features);
  expect_close("decode.logits as one chain", logits, want, (int64_t)n * 2 * V);
  gd.t->vt->session_close(s);
  free(logits);
  free(features);
  close_golden(&gd);
}

static void test_c2i_tree_forward_and_commit(void **state) {
  golden gd;
  open_golden_case(&gd, *state);
  int V = gd.t->info.vocab, d = gd.t->info.feature_dim;
  int cls = *(const int32_t *)tensor(&gd, "cond.class", VSPEC_DTYPE_I32, 1);
  int prefix = *(const int32_t *)tensor(&gd, "tree.prefix", VSPEC_DTYPE_I32, 1);
  const int32_t *dec = tensor(&gd, "decode.tokens", VSPEC_DTYPE_I32, -1);
  vspec_session *s = open_session(&gd, cls, 2, 8);
  float *logits = malloc(sizeof(float) * 8 * 2 * V), *features = malloc(sizeof(float) * 8 * 2 * d);
  assert_non_null(logits);
  assert_non_null(features);
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = features};
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  forward_chain(&gd, s, dec, prefix, logits, features);

  int n = (int)numel_of(&gd, "tree.tokens");
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n,
                           .tokens = tensor(&gd, "tree.tokens", VSPEC_DTYPE_I32, n),
                           .parents = tensor(&gd, "tree.parents", VSPEC_DTYPE_I32, n)};
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), 0);
  expect_close("tree.logits", logits, tensor(&gd, "tree.logits", VSPEC_DTYPE_F32, n * 2 * V),
               n * 2 * V);
  expect_close("tree.features", features,
               tensor(&gd, "tree.features", VSPEC_DTYPE_F32, n * 2 * d), n * 2 * d);

  int np = (int)numel_of(&gd, "commit.path");
  const int32_t *path = tensor(&gd, "commit.path", VSPEC_DTYPE_I32, np);
  /* A path that is not a parent chain is refused and changes nothing. */
  int32_t bad[2] = {path[0], path[0]};
  assert_int_equal(gd.t->vt->commit(s, bad, 2, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(gd.t->vt->commit(s, path, np, err, sizeof err), 0);
  assert_int_equal(gd.t->vt->committed(s), 1 + prefix + np);
  forward_chain(&gd, s, tensor(&gd, "after.token", VSPEC_DTYPE_I32, 1), 1, logits, features);
  expect_close("after.logits (KV compaction)", logits,
               tensor(&gd, "after.logits", VSPEC_DTYPE_F32, 2 * V), 2 * V);
  expect_close("after.features", features,
               tensor(&gd, "after.features", VSPEC_DTYPE_F32, 2 * d), 2 * d);
  gd.t->vt->session_close(s);
  free(logits);
  free(features);
  close_golden(&gd);
}

/* The same tree grown one level per forward with append = 1, as a drafter does. */
static void test_c2i_tree_grown_by_appending(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_c2i");
  int V = gd.t->info.vocab;
  int cls = *(const int32_t *)tensor(&gd, "cond.class", VSPEC_DTYPE_I32, 1);
  int prefix = *(const int32_t *)tensor(&gd, "tree.prefix", VSPEC_DTYPE_I32, 1);
  const int32_t *dec = tensor(&gd, "decode.tokens", VSPEC_DTYPE_I32, -1);
  const int32_t *tok = tensor(&gd, "tree.tokens", VSPEC_DTYPE_I32, 7);
  const int32_t *par = tensor(&gd, "tree.parents", VSPEC_DTYPE_I32, 7);
  const float *want = tensor(&gd, "tree.logits", VSPEC_DTYPE_F32, 7 * 2 * V);
  vspec_session *s = open_session(&gd, cls, 2, 8);
  float logits[8 * 2 * 64];
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  forward_chain(&gd, s, dec, prefix, logits, NULL);
  /* Pending nodes left by an earlier non-committed forward are replaced by append = 0. */
  int32_t junk = 5, minus1 = -1;
  vspec_forward_batch jb = {.struct_size = sizeof jb, .n_nodes = 1, .tokens = &junk,
                            .parents = &minus1};
  assert_int_equal(gd.t->vt->forward(s, &jb, &o, err, sizeof err), 0);
  const int groups[][2] = {{0, 1}, {1, 3}, {3, 7}}; /* [first, end) per forward */
  for (int k = 0; k < 3; k++) {
    int first = groups[k][0], n = groups[k][1] - first;
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tok + first,
                             .parents = par + first, .append = k > 0};
    assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), 0);
    expect_close("tree.logits grown by appending", logits, want + (size_t)first * 2 * V,
                 (int64_t)n * 2 * V);
  }
  /* Appending past the session's capacity is refused. */
  int32_t more[2] = {1, 2}, more_par[2] = {6, 7};
  vspec_forward_batch big = {.struct_size = sizeof big, .n_nodes = 2, .tokens = more,
                             .parents = more_par, .append = 1};
  assert_int_equal(gd.t->vt->forward(s, &big, &o, err, sizeof err), VSPEC_ERANGE);
  const int32_t *path = tensor(&gd, "commit.path", VSPEC_DTYPE_I32, 3);
  assert_int_equal(gd.t->vt->commit(s, path, 3, err, sizeof err), 0);
  forward_chain(&gd, s, tensor(&gd, "after.token", VSPEC_DTYPE_I32, 1), 1, logits, NULL);
  expect_close("after.logits after an appended tree", logits,
               tensor(&gd, "after.logits", VSPEC_DTYPE_F32, 2 * V), 2 * V);
  gd.t->vt->session_close(s);
  close_golden(&gd);
}

static void test_c2i_cfg_and_sampling(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_c2i");
  /* The engine's host sampling path (core/sampling.c -> kernels/host/), the same on every
   * device. */
  int V = gd.t->info.vocab;
  const float *pre = tensor(&gd, "prefill.logits", VSPEC_DTYPE_F32, 2 * V);
  float scale = *(const float *)tensor(&gd, "cfg.scale", VSPEC_DTYPE_F32, 1);
  float mixed[64], probs[64];
  void *work = malloc(vs_host_probs_work_bytes(V));
  assert_non_null(work);
  vs_host_cfg_combine(pre, pre + V, (size_t)V, scale, mixed);
  expect_close("cfg.logits", mixed, tensor(&gd, "cfg.logits", VSPEC_DTYPE_F32, V), V);
  const char *cases[] = {"sample", "sample2", "sample3"};
  for (int c = 0; c < 3; c++) {
    char name[64];
    snprintf(name, sizeof name, "%s.params", cases[c]);
    const float *p = tensor(&gd, name, VSPEC_DTYPE_F32, 3);
    snprintf(name, sizeof name, "%s.logits", cases[c]);
    const float *l = tensor(&gd, name, VSPEC_DTYPE_F32, V);
    vs_host_logits_to_probs(l, V, p[0], (int)p[1], p[2], probs, work);
    snprintf(name, sizeof name, "%s.probs", cases[c]);
    const float *want = tensor(&gd, name, VSPEC_DTYPE_F32, V);
    expect_close(name, probs, want, V);
    /* The filtered support must match exactly, not just approximately. */
    for (int i = 0; i < V; i++) assert_int_equal(probs[i] > 0, want[i] > 0);
  }
  free(work);
  close_golden(&gd);
}

static void test_c2i_greedy_generation(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_c2i");
  int N = gd.t->info.grid_h * gd.t->info.grid_w;
  int cls = *(const int32_t *)tensor(&gd, "cond.class", VSPEC_DTYPE_I32, 1);
  float scale = *(const float *)tensor(&gd, "cfg.scale", VSPEC_DTYPE_F32, 1);
  const char *names[] = {"greedy.tokens", "greedy_interval.tokens"};
  int intervals[] = {-1, 3};
  for (int c = 0; c < 2; c++) {
    vs_job job = {.method = NULL, .class_label = cls, .seed = 7,
                  .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f,
                               .cfg_scale = scale, .cfg_interval = intervals[c]}};
    int32_t tokens[64];
    vs_metrics mt;
    char err[VSPEC_ERRLEN];
    assert_int_equal(vs_generate(gd.models, dev, &job, tokens, &mt, err, sizeof err), 0);
    const int32_t *want = tensor(&gd, names[c], VSPEC_DTYPE_I32, N);
    for (int i = 0; i < N; i++)
      if (tokens[i] != want[i]) fail_msg("%s: token %d is %d, reference %d", names[c], i, tokens[i], want[i]);
    assert_int_equal(mt.tokens, N);
    assert_int_equal(mt.target_forwards, N);
  }
  close_golden(&gd);
}

static void test_vq_decode(void **state) {
  golden gd;
  open_golden_case(&gd, *state);
  int H = gd.t->info.image_h, W = gd.t->info.image_w, V = gd.t->info.vocab;
  int N = gd.t->info.grid_h * gd.t->info.grid_w;
  const int32_t *codes = tensor(&gd, "vq.codes", VSPEC_DTYPE_I32, N);
  const uint8_t *want = tensor(&gd, "vq.pixels", VSPEC_DTYPE_U8, H * W * 3);
  uint8_t *rgb = malloc((size_t)H * W * 3);
  int32_t *bad = malloc(sizeof(int32_t) * N);
  assert_non_null(rgb);
  assert_non_null(bad);
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->decode(gd.t->model, dev, codes, rgb, err, sizeof err), 0);
  /* Bytes are truncated from x*255+0.5: a float64 reference and fp32 code may straddle a
   * rounding boundary, so allow one step, and require most bytes to be exact. */
  int exact = 0;
  for (int i = 0; i < H * W * 3; i++) {
    if (abs((int)rgb[i] - (int)want[i]) > 1)
      fail_msg("pixel byte %d: got %d, reference %d", i, rgb[i], want[i]);
    exact += rgb[i] == want[i];
  }
  assert_true(exact >= H * W * 3 * 95 / 100);
  /* An out-of-range code is an error, not a crash. */
  memcpy(bad, codes, sizeof(int32_t) * N);
  bad[5] = V;
  assert_int_equal(gd.t->vt->decode(gd.t->model, dev, bad, rgb, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "position 5"));
  free(rgb);
  free(bad);
  close_golden(&gd);
}

static void test_session_errors(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_c2i");
  char err[VSPEC_ERRLEN];
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 10, .rows = 2,
                              .max_nodes = 4};
  vspec_session *s;
  assert_int_equal(gd.t->vt->session_open(gd.t->model, dev, &cfg, &s, err, sizeof err),
                   VSPEC_ERANGE);
  assert_non_null(strstr(err, "class label 10"));
  cfg.class_label = 1;
  cfg.rows = 3;
  assert_int_equal(gd.t->vt->session_open(gd.t->model, dev, &cfg, &s, err, sizeof err),
                   VSPEC_EINVAL);
  s = open_session(&gd, 1, 1, 4);
  int32_t tok[4] = {1, 2, 3, 4}, parents[4] = {-1, 0, 2, 1};
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 4, .tokens = tok,
                           .parents = parents};
  float logits[4 * 64];
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), VSPEC_EINVAL); /* no prefill */
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), VSPEC_EINVAL); /* parent 2 of 2 */
  parents[2] = 1;
  tok[3] = 99;
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), VSPEC_ERANGE); /* token 99 */
  tok[3] = 4;
  b.n_nodes = 5;
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), VSPEC_ERANGE); /* > max_nodes */
  /* Walk to the end of the grid: a chain past the last position is refused. */
  int32_t one = 7;
  for (int i = 0; i < 16; i++) forward_chain(&gd, s, &one, 1, logits, NULL);
  b.n_nodes = 1;
  assert_int_equal(gd.t->vt->forward(s, &b, &o, err, sizeof err), VSPEC_ERANGE);
  gd.t->vt->session_close(s);
  close_golden(&gd);
}

/* ---- t2i and head_dim 100 ---------------------------------------------------------- */

static void test_t2i_caption_path(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_t2i");
  int V = gd.t->info.vocab, d = gd.t->info.feature_dim;
  int L = gd.t->info.caption_len, C = gd.t->info.caption_dim;
  assert_int_equal(L, 120);
  vspec_session_config cfg = {.struct_size = sizeof cfg, .rows = 2, .max_nodes = 4,
                              .caption = tensor(&gd, "cond.caption", VSPEC_DTYPE_F32, L * C),
                              .caption_mask = tensor(&gd, "cond.mask", VSPEC_DTYPE_U8, L)};
  vspec_session *s;
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->session_open(gd.t->model, dev, &cfg, &s, err, sizeof err), 0);
  float logits[2 * 64], features[2 * 64];
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = features};
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  expect_close("t2i prefill.logits", logits, tensor(&gd, "prefill.logits", VSPEC_DTYPE_F32, 2 * V),
               2 * V);
  expect_close("t2i prefill.features", features,
               tensor(&gd, "prefill.features", VSPEC_DTYPE_F32, 2 * d), 2 * d);
  int n = (int)numel_of(&gd, "decode.tokens");
  const int32_t *tok = tensor(&gd, "decode.tokens", VSPEC_DTYPE_I32, n);
  const float *want = tensor(&gd, "decode.logits", VSPEC_DTYPE_F32, (int64_t)n * 2 * V);
  for (int i = 0; i < n; i++) {
    forward_chain(&gd, s, &tok[i], 1, logits, features);
    expect_close("t2i decode.logits", logits, want + (size_t)i * 2 * V, 2 * V);
  }
  gd.t->vt->session_close(s);
  cfg.caption = NULL;
  assert_int_equal(gd.t->vt->session_open(gd.t->model, dev, &cfg, &s, err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "caption"));
  close_golden(&gd);
}

static void test_head_dim_100(void **state) {
  (void)state;
  golden gd;
  open_golden(&gd, "tests/golden/micro_hd100");
  int V = gd.t->info.vocab;
  vspec_session *s = open_session(&gd, 5, 2, 4);
  float logits[2 * 64];
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
  char err[VSPEC_ERRLEN];
  assert_int_equal(gd.t->vt->prefill(s, &o, err, sizeof err), 0);
  expect_close("hd100 prefill.logits", logits,
               tensor(&gd, "prefill.logits", VSPEC_DTYPE_F32, 2 * V), 2 * V);
  int n = (int)numel_of(&gd, "decode.tokens");
  const int32_t *tok = tensor(&gd, "decode.tokens", VSPEC_DTYPE_I32, n);
  const float *want = tensor(&gd, "decode.logits", VSPEC_DTYPE_F32, (int64_t)n * 2 * V);
  for (int i = 0; i < n; i++) {
    forward_chain(&gd, s, &tok[i], 1, logits, NULL);
    expect_close("hd100 decode.logits", logits, want + (size_t)i * 2 * V, 2 * V);
  }
  gd.t->vt->session_close(s);
  close_golden(&gd);
}

/* weight_format=int8 only asks the device; the fp32 device of these tests keeps fp32, so the
 * logits are those of the plain load, bit for bit (golden tests stay fp32). A format the
 * backend does not know is refused by name. */
static void test_weight_format_param(void **state) {
  (void)state;
  const char *gpt = "models/fmnist/draft.safetensors";
  char err[VSPEC_ERRLEN] = "";
  vs_backend_model plain, int8, bad;
  assert_int_equal(vs_backend_model_load(reg, &host, dev, "llamagen", gpt, "", &plain, err,
                                         sizeof err), 0);
  assert_int_equal(vs_backend_model_load(reg, &host, dev, "llamagen", gpt, "weight_format=int8",
                                         &int8, err, sizeof err), 0);
  assert_int_equal(vs_backend_model_load(reg, &host, dev, "llamagen", gpt, "weight_format=int4",
                                         &bad, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "weight_format=int4"));
  int V = plain.info.vocab;
  float *a = malloc(sizeof(float) * 2 * V), *b = malloc(sizeof(float) * 2 * V);
  assert_non_null(a);
  assert_non_null(b);
  const vs_backend_model *models[2] = {&plain, &int8};
  float *outs[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 3, .rows = 2,
                                .max_nodes = 4};
    vspec_session *s;
    assert_int_equal(models[i]->vt->session_open(models[i]->model, dev, &cfg, &s, err, sizeof err), 0);
    vspec_forward_out o = {.struct_size = sizeof o, .logits = outs[i]};
    assert_int_equal(models[i]->vt->prefill(s, &o, err, sizeof err), 0);
    models[i]->vt->session_close(s);
  }
  assert_memory_equal(a, b, sizeof(float) * 2 * V);
  free(a);
  free(b);
  vs_backend_model_unload(&plain);
  vs_backend_model_unload(&int8);
}

/* Prefill logits of `bm` on `d` (class 3, CFG rows) into out [2 V]. */
static void prefill_logits(const vs_backend_model *bm, vspec_dev *d, float *out) {
  char err[VSPEC_ERRLEN];
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 3, .rows = 2,
                              .max_nodes = 4};
  vspec_session *s;
  if (bm->vt->session_open(bm->model, d, &cfg, &s, err, sizeof err)) fail_msg("%s", err);
  vspec_forward_out o = {.struct_size = sizeof o, .logits = out};
  if (bm->vt->prefill(s, &o, err, sizeof err)) fail_msg("%s", err);
  bm->vt->session_close(s);
}

/* On a bf16 CPU device with AMX-INT8: weight_format=int8 changes a GPT's logits (int8
 * products), and unloading that model withdraws its requests, so a plain load of the same file
 * is bf16 again. The micro model's file is F32, whose tensors are lent zero-copy: both loads
 * multiply by the same memory, and while the int8 model is loaded the plain one is int8 too
 * (requests belong to the memory, include/vspec/ops.h). */
static void test_weight_format_int8_on_bf16(void **state) {
  (void)state;
  vs_device_options opt = {.threads = 1, .precision = VS_PRECISION_BF16};
  vspec_dev *bf = NULL;
  char err[VSPEC_ERRLEN] = "";
  if (vs_device_open("cpu", &opt, &bf, err, sizeof err) != VSPEC_OK) {
    print_message("  (no bf16 CPU device here: %s)\n", err);
    skip();
  }
  const vspec_ops *ops = vs_dev_ops(bf);
  float probe_w[32 * 64] = {0}, *w = ops->alloc(bf, sizeof probe_w);
  int int8_here = ops->weight_format(bf, w, 32, 64, VSPEC_WEIGHTS_INT8) == VSPEC_OK;
  ops->weight_format(bf, w, 32, 64, VSPEC_WEIGHTS_DEFAULT);
  ops->free(bf, w);
  if (!int8_here) {
    print_message("  (no AMX-INT8 on this CPU: int8 weights are not used here)\n");
    vs_dev_destroy(bf);
    skip();
  }
  const char *gpt = "tests/golden/micro_c2i/gpt.safetensors";
  vs_backend_model plain, int8;
  if (vs_backend_model_load(reg, &host, bf, "llamagen", gpt, "", &plain, err, sizeof err))
    fail_msg("%s", err);
  int V = plain.info.vocab;
  float *p1 = malloc(sizeof(float) * 2 * V), *i1 = malloc(sizeof(float) * 2 * V);
  float *p2 = malloc(sizeof(float) * 2 * V);
  assert_true(p1 && i1 && p2);
  prefill_logits(&plain, bf, p1);
  if (vs_backend_model_load(reg, &host, bf, "llamagen", gpt, "weight_format=int8", &int8, err,
                            sizeof err))
    fail_msg("%s", err);
  prefill_logits(&int8, bf, i1);
  assert_memory_not_equal(p1, i1, sizeof(float) * 2 * V);
  prefill_logits(&plain, bf, p2); /* the shared memory has a request standing */
  assert_memory_equal(p2, i1, sizeof(float) * 2 * V);
  double max_diff = 0, max_ref = 0; /* int8 stays close: a draft, not another model */
  for (int i = 0; i < 2 * V; i++) {
    max_diff = fmax(max_diff, fabs((double)p1[i] - i1[i]));
    max_ref = fmax(max_ref, fabs((double)p1[i]));
  }
  assert_true(max_diff < 0.1 * max_ref);
  vs_backend_model_unload(&int8);
  prefill_logits(&plain, bf, p2);
  assert_memory_equal(p1, p2, sizeof(float) * 2 * V);
  vs_backend_model_unload(&plain);
  free(p1), free(i1), free(p2);
  vs_dev_destroy(bf);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  dev = vt_test_device(1); /* VSPEC_TEST_DEVICE: make gpu-test runs this on CUDA */
  printf("device: %s\n", vt_test_device_name());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_prestate(test_c2i_prefill_and_decode, (void *)&micro_c2i),
      cmocka_unit_test_prestate(test_c2i_tree_forward_and_commit, (void *)&micro_c2i),
      cmocka_unit_test(test_c2i_tree_grown_by_appending),
      cmocka_unit_test(test_c2i_cfg_and_sampling),
      cmocka_unit_test(test_c2i_greedy_generation),
      cmocka_unit_test_prestate(test_vq_decode, (void *)&micro_c2i),
      cmocka_unit_test(test_session_errors),
      cmocka_unit_test(test_t2i_caption_path),
      cmocka_unit_test(test_head_dim_100),
      cmocka_unit_test(test_weight_format_param),
      cmocka_unit_test(test_weight_format_int8_on_bf16),
      /* The trained target and tokenizer shipped in models/fmnist (issue 3). */
      cmocka_unit_test_prestate(test_c2i_prefill_and_decode, (void *)&fmnist),
      cmocka_unit_test_prestate(test_c2i_tree_forward_and_commit, (void *)&fmnist),
      cmocka_unit_test_prestate(test_vq_decode, (void *)&fmnist),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
  return rc;
}
