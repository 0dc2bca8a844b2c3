/*
 * Golden tests of the `mar` backend and the MAR sampler against the float64 PyTorch
 * reference (tools/ref/mar_ref.py via tools/ref/make_mar_golden.py, data in
 * tests/golden/micro_mar/): the transformer's condition vectors, the diffusion head, the
 * respaced schedule, and whole generations for a given order and noises (CFG linear and
 * constant, and without CFG) with their pixels. Tolerance: max |c - ref| <= 1e-4 x max |ref|
 * per tensor, also for the whole generations (a hundred sampler steps per token).
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

#define DIR "tests/golden/micro_mar"

static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;
static vs_models *models;
static vspec_tensor_file *gold;

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
  printf("  %-28s max |c - ref| %.3g (max |ref| %.3g)\n", what, worst, scale);
  if (!(worst <= rtol * scale))
    fail_msg("%s: max |diff| %.3g at %zu (c %.8g, ref %.8g) vs max |ref| %.3g", what, worst, at,
             got[at], want[at], scale);
}

static vspec_session *session(int cls, int rows) {
  const vs_backend_model *t = &models->target;
  vspec_session_config c = {.struct_size = sizeof c, .class_label = cls, .rows = rows,
                            .max_nodes = 16};
  vspec_session *s = NULL;
  char err[VSPEC_ERRLEN];
  if (t->vt->session_open(t->model, dev, &c, &s, err, sizeof err)) fail_msg("%s", err);
  return s;
}

static void test_info(void **state) {
  const vspec_model_info *i = &models->target.info;
  assert_int_equal(i->token_kind, VSPEC_TOKENS_CONTINUOUS);
  assert_int_equal(i->grid_h * i->grid_w, 16);
  assert_int_equal(i->token_dim, 16);
  assert_int_equal(i->feature_dim, 32);
  assert_int_equal(i->num_classes, 10);
  assert_int_equal(i->image_h, 16);
  assert_int_equal(i->sampling_steps, 100);
  assert_int_equal(i->num_iter, 8);
  assert_int_equal(models->draft.info.feature_dim, 16);
  assert_int_equal(models->defaults.num_iter, 8);
  assert_int_equal(models->defaults.cfg_schedule, VS_CFG_LINEAR);
}

static void test_condition(void **state) {
  const vs_backend_model *t = &models->target;
  const float *tokens = tensor("cond.tokens", VSPEC_DTYPE_F32, 16 * 16);
  const uint8_t *known = tensor("cond.known", VSPEC_DTYPE_U8, 16);
  int cls = *(const int32_t *)tensor("cond.class", VSPEC_DTYPE_I32, 1);
  vspec_session *s = session(cls, 2);
  int32_t pos[16];
  for (int i = 0; i < 16; i++) pos[i] = i;
  float got[16 * 2 * 32];
  char err[VSPEC_ERRLEN];
  assert_int_equal(t->vt->condition(s, tokens, known, pos, 16, got, err, sizeof err), 0);
  expect_close("condition (6 known)", got, tensor("cond.out", VSPEC_DTYPE_F32, 16 * 2 * 32),
               16 * 2 * 32, 1e-4);
  uint8_t none[16] = {0};
  assert_int_equal(t->vt->condition(s, tokens, none, pos, 16, got, err, sizeof err), 0);
  expect_close("condition (step 0)", got, tensor("cond0.out", VSPEC_DTYPE_F32, 16 * 2 * 32),
               16 * 2 * 32, 1e-4);
  /* a subset of positions, out of order: the rows of those positions */
  int32_t some[3] = {9, 2, 14};
  float part[3 * 2 * 32];
  assert_int_equal(t->vt->condition(s, tokens, known, some, 3, part, err, sizeof err), 0);
  const float *want = tensor("cond.out", VSPEC_DTYPE_F32, 16 * 2 * 32);
  for (int i = 0; i < 3; i++)
    expect_close("condition (subset)", part + i * 64, want + some[i] * 64, 64, 1e-4);
  /* bad positions are refused */
  int32_t bad = 16;
  assert_int_equal(t->vt->condition(s, tokens, known, &bad, 1, part, err, sizeof err), VSPEC_ERANGE);
  t->vt->session_close(s);
}

static void test_denoise(void **state) {
  const vs_backend_model *t = &models->target;
  vspec_session *s = session(0, 1);
  float out[5 * 32];
  char err[VSPEC_ERRLEN];
  assert_int_equal(t->vt->denoise(s, tensor("head.x", VSPEC_DTYPE_F32, 5 * 16),
                                  tensor("head.t", VSPEC_DTYPE_I32, 5),
                                  tensor("head.cond", VSPEC_DTYPE_F32, 5 * 32), 5, out, err,
                                  sizeof err),
                   0);
  expect_close("diffusion head", out, tensor("head.out", VSPEC_DTYPE_F32, 5 * 32), 5 * 32, 1e-4);
  int32_t late = 1000;
  assert_int_equal(t->vt->denoise(s, out, &late, out, 1, out, err, sizeof err), VSPEC_ERANGE);
  t->vt->session_close(s);
}

static void test_schedule(void **state) {
  vs_diffusion d;
  assert_int_equal(vs_diffusion_init(&d, 1000, 100), 0);
  const int32_t *ts = tensor("sched.timesteps", VSPEC_DTYPE_I32, 100);
  assert_memory_equal(d.timestep, ts, 100 * sizeof(int32_t));
  expect_close("sqrt_recip_abar", d.sqrt_recip_abar,
               tensor("sched.sqrt_recip_abar", VSPEC_DTYPE_F32, 100), 100, 1e-6);
  expect_close("sqrt_recipm1_abar", d.sqrt_recipm1_abar,
               tensor("sched.sqrt_recipm1_abar", VSPEC_DTYPE_F32, 100), 100, 1e-6);
  expect_close("coef1", d.coef1, tensor("sched.coef1", VSPEC_DTYPE_F32, 100), 100, 1e-6);
  expect_close("coef2", d.coef2, tensor("sched.coef2", VSPEC_DTYPE_F32, 100), 100, 1e-6);
  expect_close("log beta", d.log_beta, tensor("sched.log_betas", VSPEC_DTYPE_F32, 100), 100, 1e-6);
  expect_close("posterior log variance", d.post_log_var,
               tensor("sched.post_log_var", VSPEC_DTYPE_F32, 100), 100, 1e-6);
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
  const int32_t *order = tensor(key, VSPEC_DTYPE_I32, 16);
  snprintf(key, sizeof key, "%s.noise", name);
  const float *noise = tensor(key, VSPEC_DTYPE_F32, 16 * 101 * 16);
  float latents[16 * 16];
  vs_job job = {.method = "ar", .class_label = (int32_t)p[0], .seed = 1, .latents = latents,
                .mar_order = order, .mar_noise = noise, .sampling = models->defaults};
  job.sampling.cfg_scale = p[1];
  job.sampling.temperature = p[2];
  job.sampling.num_iter = (int)p[3];
  job.sampling.cfg_schedule = p[4] != 0.0f ? VS_CFG_CONSTANT : VS_CFG_LINEAR;
  char err[VSPEC_ERRLEN];
  vs_metrics mt;
  if (vs_generate(&as, dev, &job, NULL, &mt, err, sizeof err)) fail_msg("%s: %s", name, err);
  assert_int_equal(mt.target_forwards, (int)p[3]);
  assert_int_equal(mt.tokens, 16);
  snprintf(key, sizeof key, "%s.tokens", name);
  expect_close(name, latents, tensor(key, VSPEC_DTYPE_F32, 16 * 16), 16 * 16, 1e-4);
  /* pixels: the patch decoder, within one level (the byte rule truncates) */
  uint8_t rgb[16 * 16 * 3];
  const vs_backend_model *t = model;
  assert_int_equal(t->vt->decode_latents(t->model, dev, latents, rgb, err, sizeof err), 0);
  snprintf(key, sizeof key, "%s.pixels", name);
  const uint8_t *px = tensor(key, VSPEC_DTYPE_U8, 16 * 16);
  for (int i = 0; i < 256; i++) {
    assert_true(abs((int)rgb[i * 3] - (int)px[i]) <= 1);
    assert_true(rgb[i * 3] == rgb[i * 3 + 1] && rgb[i * 3] == rgb[i * 3 + 2]);
  }
}

static void test_generation(void **state) {
  assert_int_equal(models->target.info.clip_denoised, 1);
  assert_int_equal(models->draft.info.clip_denoised, 0);
  check_generation("gen", &models->target);
  check_generation("gen_nocfg", &models->target);
  check_generation("gen_const", &models->target);
  check_generation("gen_draft", &models->draft);
}

/* The seed's own draws: same seed, same latents; another seed, others. */
static void test_seed_determinism(void **state) {
  float a[256], b[256], c[256];
  char err[VSPEC_ERRLEN];
  vs_job job = {.method = "ar", .class_label = 2, .seed = 11, .latents = a,
                .sampling = models->defaults};
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  job.latents = b;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  job.latents = c;
  job.seed = 12;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), 0);
  assert_memory_equal(a, b, sizeof a);
  assert_memory_not_equal(a, c, sizeof a);
  /* no latent buffer: a clear error */
  job.latents = NULL;
  assert_int_equal(vs_generate(models, dev, &job, NULL, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "latent"));
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  dev = vt_test_device(1);
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_models_open(reg, &host, dev, DIR, VS_ROLE_ALL, &models, err, sizeof err) ||
      vs_st_open(DIR "/golden.safetensors", &gold, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_info),       cmocka_unit_test(test_condition),
      cmocka_unit_test(test_denoise),    cmocka_unit_test(test_schedule),
      cmocka_unit_test(test_generation), cmocka_unit_test(test_seed_determinism),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_st_close(gold);
  vs_models_close(models);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
  return rc;
}
