/*
 * Golden tests of the `mar` backend and the MAR sampler against the float64 PyTorch
 * reference (tools/ref/mar_ref.py via tools/ref/make_mar_golden.py, data in
 * tests/golden/micro_mar/): the transformer's condition vectors, the diffusion head, the
 * respaced schedule, and whole generations for a given order and noises (CFG linear and
 * constant, and without CFG) with their pixels. Tolerance: max |c - ref| <= 1e-4 x max |ref|
 * per tensor, also for the whole generations (a hundred sampler steps per token).
 *
 * Sizes (S tokens of C values, condition width D, K sampler steps) come from the golden
 * tensors and the model's info, so VSPEC_MAR_GOLDEN_DIR may name another directory:
 * goldens of a shipped model written by tools/ref/make_mar_golden.py --model PATH --out DIR
 * (its golden.safetensors says which model in its metadata, and what the micro-only checks
 * below would hard-code). Default: tests/golden/micro_mar, then tests/golden/fmnist_mar (the
 * shipped models/fmnist-mar target: head dimension 40, 64 tokens, clamped x0; plain build
 * only).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diffusion.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "kernels/vs_kernels.h"
#include "tests/support/test_device.h"
#include "tests/support/method_of.h"

#define DIR "tests/golden/micro_mar"

static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;
static vs_models *models;
static vspec_tensor_file *gold;
/* sizes of the goldens: S tokens of C values, condition width D, K sampler steps */
static int S, C, D, K;
static int micro; /* the micro goldens (no "model" in the golden metadata) */

/* The shape of a golden tensor (fails the test when it is missing or has another rank). */
static const int64_t *golden_shape(const char *name, int ndim) {
  static vspec_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  if (vs_st_find(gold, name, &t) || t.ndim != ndim) return NULL;
  return t.shape;
}

static long golden_meta(const char *key) {
  const char *v = vs_st_meta(gold, key);
  if (!v) fail_msg("golden metadata '%s' missing", key);
  return strtol(v, NULL, 10);
}

static const void *tensor(const char *name, int dtype, int64_t numel) {
  vspec_tensor t = {.struct_size = sizeof t};
  if (vs_st_find(gold, name, &t)) fail_msg("golden tensor '%s' missing", name);
  if ((int)t.dtype != dtype || t.numel != numel)
    fail_msg("golden tensor '%s': dtype %u numel %lld, expected %d %lld", name, t.dtype,
             (long long)t.numel, dtype, (long long)numel);
  return t.data;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double rtol) {
  double scale = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d == d)) d = INFINITY;
    if (d > worst) worst = d, at = i;
  }
  printf("  %-28s max |c - ref| %.3g (max |ref| %.3g, ratio %.3g)\n", what, worst, scale,
         scale > 0 ? worst / scale : worst);
  if (!(worst <= rtol * scale))
    fail_msg("%s: max |diff| %.3g at %zu (c %.8g, ref %.8g) vs max |ref| %.3g", what, worst, at,
             got[at], want[at], scale);
}

static vspec_session *session(int cls, int rows) {
  const vs_backend_model *t = &models->target;
  vspec_session_config c = {.struct_size = sizeof c, .class_label = cls, .rows = rows,
                            .max_nodes = S};
  vspec_session *s = NULL;
  char err[VSPEC_ERRLEN];
  if (t->vt->session_open(t->model, dev, &c, &s, err, sizeof err)) fail_msg("%s", err);
  return s;
}

static void test_info(void **state) {
  const vspec_model_info *i = &models->target.info;
  assert_int_equal(i->token_kind, VSPEC_TOKENS_CONTINUOUS);
  assert_int_equal(i->grid_h * i->grid_w, S);
  assert_int_equal(i->token_dim, C);
  assert_int_equal(i->feature_dim, D);
  assert_int_equal(i->image_h, i->grid_h * 4); /* the patch4 tokenizer */
  assert_int_equal(i->sampling_steps, K);
  if (micro) {
    assert_int_equal(S, 16);
    assert_int_equal(C, 16);
    assert_int_equal(D, 32);
    assert_int_equal(i->num_classes, 10);
    assert_int_equal(i->image_h, 16);
    assert_int_equal(i->sampling_steps, 100);
    assert_int_equal(i->num_iter, 8);
    assert_int_equal(models->draft.info.feature_dim, 16);
    assert_int_equal(models->defaults.num_iter, 8);
    assert_int_equal(models->defaults.cfg_schedule, VS_CFG_LINEAR);
  } else {
    assert_int_equal(i->num_classes, golden_meta("num_classes"));
    assert_int_equal(i->clip_denoised, golden_meta("clip_denoised"));
    assert_int_equal(i->diffusion_steps, golden_meta("diffusion_steps"));
    assert_int_equal(i->sampling_steps, golden_meta("num_sampling_steps"));
  }
}

static void test_condition(void **state) {
  const vs_backend_model *t = &models->target;
  size_t nz = (size_t)S * 2 * D;
  const float *tokens = tensor("cond.tokens", VSPEC_DTYPE_F32, (int64_t)S * C);
  const uint8_t *known = tensor("cond.known", VSPEC_DTYPE_U8, S);
  int cls = *(const int32_t *)tensor("cond.class", VSPEC_DTYPE_I32, 1);
  vspec_session *s = session(cls, 2);
  int32_t *pos = malloc((size_t)S * sizeof *pos);
  float *got = malloc(nz * sizeof *got);
  uint8_t *none = calloc((size_t)S, 1);
  assert_non_null(pos);
  assert_non_null(got);
  assert_non_null(none);
  for (int i = 0; i < S; i++) pos[i] = i;
  char err[VSPEC_ERRLEN];
  int n_known = 0;
  for (int i = 0; i < S; i++) n_known += known[i] != 0;
  char what[64];
  snprintf(what, sizeof what, "condition (%d known)", n_known);
  assert_int_equal(t->vt->condition(s, tokens, known, pos, S, got, err, sizeof err), 0);
  expect_close(what, got, tensor("cond.out", VSPEC_DTYPE_F32, (int64_t)nz), nz, 1e-4);
  assert_int_equal(t->vt->condition(s, tokens, none, pos, S, got, err, sizeof err), 0);
  expect_close("condition (step 0)", got, tensor("cond0.out", VSPEC_DTYPE_F32, (int64_t)nz), nz,
               1e-4);
  /* a subset of positions, out of order: the rows of those positions (9, 2, 14 of 16) */
  int32_t some[3] = {S * 9 / 16, S * 2 / 16, S * 14 / 16};
  float *part = malloc((size_t)3 * 2 * D * sizeof *part);
  assert_non_null(part);
  assert_int_equal(t->vt->condition(s, tokens, known, some, 3, part, err, sizeof err), 0);
  const float *want = tensor("cond.out", VSPEC_DTYPE_F32, (int64_t)nz);
  for (int i = 0; i < 3; i++)
    expect_close("condition (subset)", part + (size_t)i * 2 * D, want + (size_t)some[i] * 2 * D,
                 (size_t)2 * D, 1e-4);
  /* bad positions are refused */
  int32_t bad = S;
  assert_int_equal(t->vt->condition(s, tokens, known, &bad, 1, part, err, sizeof err), VSPEC_ERANGE);
  t->vt->session_close(s);
  free(part);
  free(none);
  free(got);
  free(pos);
}

static void test_denoise(void **state) {
  const vs_backend_model *t = &models->target;
  vspec_session *s = session(0, 1);
  float *out = malloc((size_t)5 * 2 * C * sizeof *out);
  assert_non_null(out);
  char err[VSPEC_ERRLEN];
  assert_int_equal(t->vt->denoise(s, tensor("head.x", VSPEC_DTYPE_F32, 5 * C),
                                  tensor("head.t", VSPEC_DTYPE_I32, 5),
                                  tensor("head.cond", VSPEC_DTYPE_F32, 5 * D), 5, out, err,
                                  sizeof err),
                   0);
  expect_close("diffusion head", out, tensor("head.out", VSPEC_DTYPE_F32, 5 * 2 * C),
               (size_t)5 * 2 * C, 1e-4);
  int32_t late = 1000;
  assert_int_equal(t->vt->denoise(s, out, &late, out, 1, out, err, sizeof err), VSPEC_ERANGE);
  t->vt->session_close(s);
  free(out);
}

static void test_schedule(void **state) {
  vs_diffusion d;
  const vspec_model_info *i = &models->target.info;
  assert_int_equal(vs_diffusion_init(&d, i->diffusion_steps, K), 0);
  const int32_t *ts = tensor("sched.timesteps", VSPEC_DTYPE_I32, K);
  assert_memory_equal(d.timestep, ts, (size_t)K * sizeof(int32_t));
  expect_close("sqrt_recip_abar", d.sqrt_recip_abar,
               tensor("sched.sqrt_recip_abar", VSPEC_DTYPE_F32, K), K, 1e-6);
  expect_close("sqrt_recipm1_abar", d.sqrt_recipm1_abar,
               tensor("sched.sqrt_recipm1_abar", VSPEC_DTYPE_F32, K), K, 1e-6);
  expect_close("coef1", d.coef1, tensor("sched.coef1", VSPEC_DTYPE_F32, K), K, 1e-6);
  expect_close("coef2", d.coef2, tensor("sched.coef2", VSPEC_DTYPE_F32, K), K, 1e-6);
  expect_close("log beta", d.log_beta, tensor("sched.log_betas", VSPEC_DTYPE_F32, K), K, 1e-6);
  expect_close("posterior log variance", d.post_log_var,
               tensor("sched.post_log_var", VSPEC_DTYPE_F32, K), K, 1e-6);
  vs_diffusion_free(&d);
  assert_int_not_equal(vs_diffusion_init(&d, 1000, 1), 0);
}

/* `model` as the target: the micro target clamps its x0 estimate (clip_denoised, pixel-space
 * tokens); the micro draft does not, as MAR. */
static void check_generation(const char *name, const vs_backend_model *model) {
  vs_models as = *models; /* a shallow view with `model` as the target */
  as.target = *model;
  char key[64];
  snprintf(key, sizeof key, "%s.params", name);
  const float *p = tensor(key, VSPEC_DTYPE_F32, 5);
  snprintf(key, sizeof key, "%s.order", name);
  const int32_t *order = tensor(key, VSPEC_DTYPE_I32, S);
  snprintf(key, sizeof key, "%s.noise", name);
  const float *noise = tensor(key, VSPEC_DTYPE_F32, (int64_t)S * (K + 1) * C);
  float *latents = malloc((size_t)S * C * sizeof *latents);
  assert_non_null(latents);
  vs_job job = {.method = NULL, .class_label = (int32_t)p[0], .seed = 1, .latents = latents,
                .mar_order = order, .mar_noise = noise, .sampling = models->defaults};
  job.sampling.cfg_scale = p[1];
  job.sampling.temperature = p[2];
  job.sampling.num_iter = (int)p[3];
  job.sampling.cfg_schedule = p[4] != 0.0f ? VS_CFG_CONSTANT : VS_CFG_LINEAR;
  char err[VSPEC_ERRLEN];
  vs_metrics mt;
  if (vs_generate(&as, dev, &job, NULL, &mt, err, sizeof err)) fail_msg("%s: %s", name, err);
  assert_int_equal(mt.target_forwards, (int)p[3]);
  assert_int_equal(mt.tokens, S);
  snprintf(key, sizeof key, "%s.tokens", name);
  char what[96];
  snprintf(what, sizeof what, "%s (%d steps, cfg %g)", name, (int)p[3], p[1]);
  expect_close(what, latents, tensor(key, VSPEC_DTYPE_F32, (int64_t)S * C), (size_t)S * C,
               1e-4);
  /* pixels: the patch decoder, within one level (the byte rule truncates) */
  const vs_backend_model *t = model;
  int npx = t->info.image_h * t->info.image_w;
  uint8_t *rgb = malloc((size_t)npx * 3);
  assert_non_null(rgb);
  assert_int_equal(t->vt->decode_latents(t->model, dev, latents, rgb, err, sizeof err), 0);
  snprintf(key, sizeof key, "%s.pixels", name);
  const uint8_t *px = tensor(key, VSPEC_DTYPE_U8, npx);
  for (int i = 0; i < npx; i++) {
    assert_true(abs((int)rgb[i * 3] - (int)px[i]) <= 1);
    assert_true(rgb[i * 3] == rgb[i * 3 + 1] && rgb[i * 3] == rgb[i * 3 + 2]);
  }
  free(rgb);
  free(latents);
}

/* Every whole generation of the goldens (NAME.params), with the draft as the target for
 * NAME ending in _draft. */
static void test_generation(void **state) {
  if (micro) {
    assert_int_equal(models->target.info.clip_denoised, 1);
    assert_int_equal(models->draft.info.clip_denoised, 0);
  }
  int n = 0;
  for (size_t i = 0; i < vs_st_count(gold); i++) {
    const char *full = vs_st_name(gold, i);
    size_t len = strlen(full);
    if (len < 8 || strcmp(full + len - 7, ".params") != 0 || len - 7 >= 64) continue;
    char name[64];
    memcpy(name, full, len - 7);
    name[len - 7] = 0;
    int draft = len - 7 >= 6 && strcmp(name + len - 7 - 6, "_draft") == 0;
    if (draft && !models->draft.model) fail_msg("%s: the goldens have no draft", name);
    check_generation(name, draft ? &models->draft : &models->target);
    n++;
  }
  assert_true(n >= (micro ? 4 : 1));
}

/* The seed's own draws: same seed, same latents; another seed, others. */
static void test_seed_determinism(void **state) {
  size_t n = (size_t)S * C;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
  assert_true(a && b && c);
  char err[VSPEC_ERRLEN];
  vs_job job = {.method = NULL, .class_label = 2, .seed = 11, .latents = a,
                .sampling = models->defaults};
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  job.latents = b;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  job.latents = c;
  job.seed = 12;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  assert_memory_equal(a, b, n * sizeof *a);
  assert_memory_not_equal(a, c, n * sizeof *a);
  /* no latent buffer: a clear error */
  job.latents = NULL;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "latent"));
  free(a);
  free(b);
  free(c);
}

/* One goldens directory: its model, its golden file, the six checks. */
static int run_dir(const char *plugin_dir, const char *gdir) {
  char err[VSPEC_ERRLEN], golden[1100];
  snprintf(golden, sizeof golden, "%s/golden.safetensors", gdir);
  if (vs_registry_open(plugin_dir, &host, &reg, err, sizeof err) ||
      vs_models_open(reg, &host, dev, gdir, VS_ROLE_ALL, &models, err, sizeof err) ||
      vs_st_open(golden, &gold, err, sizeof err)) {
    fprintf(stderr, "setup %s: %s\n", gdir, err);
    return 1;
  }
  /* sizes: cond.tokens [S, C], cond.out [S, 2, D], sched.timesteps [K] */
  S = C = D = K = 0;
  const int64_t *sh = golden_shape("cond.tokens", 2);
  if (sh) S = (int)sh[0], C = (int)sh[1];
  sh = golden_shape("cond.out", 3);
  if (sh) D = (int)sh[2];
  sh = golden_shape("sched.timesteps", 1);
  if (sh) K = (int)sh[0];
  int rc = 1;
  if (S <= 0 || C <= 0 || D <= 0 || K <= 1) {
    fprintf(stderr, "setup: %s lacks cond.tokens [S, C], cond.out [S, 2, D] or "
            "sched.timesteps [K]\n", golden);
  } else {
    micro = vs_st_meta(gold, "model") == NULL;
    printf("goldens %s: %s, S %d tokens of C %d, D %d, K %d\n", gdir,
           micro ? "micro" : vs_st_meta(gold, "model"), S, C, D, K);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info),       cmocka_unit_test(test_condition),
        cmocka_unit_test(test_denoise),    cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_generation), cmocka_unit_test(test_seed_determinism),
    };
    rc = cmocka_run_group_tests_name(gdir, tests, NULL, NULL);
  }
  vs_st_close(gold);
  gold = NULL;
  vs_models_close(models);
  models = NULL;
  vs_registry_close(reg);
  reg = NULL;
  return rc;
}

/* Default: the micro model's goldens and the shipped models/fmnist-mar target's (its
 * golden.safetensors in tests/golden/fmnist_mar/, the weights by a link). */
int main(void) {
  char dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  const char *gdir = getenv("VSPEC_MAR_GOLDEN_DIR");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  dev = vt_test_device(1);
  int rc = 0;
  if (gdir && *gdir) {
    rc = run_dir(dir, gdir);
  } else {
    rc |= run_dir(dir, DIR);
#ifndef VSPEC_SANITIZED
    /* minutes under ASan (64 steps of a 2.3M model); the micro goldens take the same paths */
    rc |= run_dir(dir, "tests/golden/fmnist_mar");
#endif
  }
  vs_dev_destroy(dev);
  return rc;
}
