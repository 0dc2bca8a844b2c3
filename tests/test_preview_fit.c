/*
 * The fitted preview colour table (daemon/preview_fit.h): on models/fmnist, the daemon's
 * default fit stays within the bound docs/DESIGN.md gives of the exact mean colours, on
 * codes it did not decode (each checked by decoding it); a vocabulary no larger than the
 * samples gets the exact table; a big decoder takes its samples several to a grid.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/host.h"
#include "daemon/config.h"
#include "daemon/preview_fit.h"
#include "kernels/vs_kernels.h"
#include "support/daemon_harness.h"

/* The bound: mean |RGB difference| over codes outside the sample (measured 8.2 over all
 * 1024 codes of models/fmnist; docs/DESIGN.md "Model load"), and no code further off than
 * a third of the range. */
#define MEAN_BOUND 12.0
#define MAX_BOUND 85

typedef struct env {
  vspec_host host;
  vspec_dev *dev;
  vs_registry *reg;
  vs_models *models;
} env;

static int open_model(env *e, const char *dir) {
  char plugins[600], err[VSPEC_ERRLEN];
  snprintf(plugins, sizeof plugins, "%s/plugins", vs_harness_build());
  vs_host_init(&e->host, vs_cpu_ops());
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &e->dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(plugins, &e->host, &e->reg, err, sizeof err), 0);
  if (vs_models_open(e->reg, &e->host, e->dev, dir, VS_ROLE_TARGET, &e->models, err,
                     sizeof err)) {
    vs_registry_close(e->reg);
    vs_dev_destroy(e->dev);
    return -1;
  }
  return 0;
}

static void close_model(env *e) {
  vs_models_close(e->models);
  vs_registry_close(e->reg);
  vs_dev_destroy(e->dev);
}

/* The exact mean colour of `code` (as vs_preview_lut_build computes it). */
static void exact_colour(env *e, int code, uint8_t out[3]) {
  const vs_backend_model *t = &e->models->target;
  int n = t->info.grid_h * t->info.grid_w;
  size_t px = (size_t)t->info.image_h * t->info.image_w;
  int32_t *grid = malloc((size_t)n * sizeof *grid);
  uint8_t *rgb = malloc(px * 3);
  assert_non_null(grid);
  assert_non_null(rgb);
  for (int i = 0; i < n; i++) grid[i] = code;
  char err[VSPEC_ERRLEN];
  assert_int_equal(t->vt->decode(t->model, e->dev, grid, rgb, err, sizeof err), 0);
  for (int ch = 0; ch < 3; ch++) {
    uint64_t s = 0;
    for (size_t p = 0; p < px; p++) s += rgb[p * 3 + ch];
    out[ch] = (uint8_t)((s + px / 2) / px);
  }
  free(grid);
  free(rgb);
}

static void test_fmnist_within_bound(void **state) {
  (void)state;
#ifdef VSPEC_SANITIZED
  skip(); /* 100 decodes of the fmnist VQ: 17 s under ASan; the code paths run below too */
#endif
  struct stat sb;
  if (stat("models/fmnist/vq.safetensors", &sb)) skip();
  env e;
  if (open_model(&e, "models/fmnist")) skip();
  const vs_backend_model *t = &e.models->target;
  vs_preview_fit_opts o;
  vs_preview_fit_default(&t->info, &o);
  assert_int_equal(o.tiles_per_side, 1); /* 32 x 32 pixels: one code per decode */
  vs_preview_lut lut;
  char err[VSPEC_ERRLEN];
  if (vs_preview_lut_fit(t, e.dev, &o, &lut, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(lut.vocab, t->info.vocab);
  assert_true(lut.neutral >= 0 && lut.neutral < lut.vocab);
  /* Codes between the samples (which sit at i * vocab / samples): the fit's own work. */
  int stride = t->info.vocab / o.samples, n = 0, mx = 0;
  double sum = 0;
  int checks = 32;
  for (int i = 0; i < checks; i++) {
    int code = (i * 7 % o.samples) * stride + stride / 2;
    uint8_t want[3];
    exact_colour(&e, code, want);
    for (int ch = 0; ch < 3; ch++) {
      int d = abs((int)lut.rgb[code * 3 + ch] - (int)want[ch]);
      sum += d;
      if (d > mx) mx = d;
      n++;
    }
  }
  printf("  fitted table vs exact on %d unsampled codes: mean |diff| %.2f (bound %.0f), max %d "
         "(bound %d)\n", checks, sum / n, MEAN_BOUND, mx, MAX_BOUND);
  assert_true(sum / n <= MEAN_BOUND);
  assert_true(mx <= MAX_BOUND);
  /* The sampled codes keep their exact colour. */
  uint8_t want[3];
  exact_colour(&e, stride * 3, want);
  assert_memory_equal(lut.rgb + stride * 3 * 3, want, 3);
  vs_preview_lut_free(&lut);
  close_model(&e);
}

static void test_small_vocabulary_is_exact(void **state) {
  (void)state;
  env e;
  assert_int_equal(open_model(&e, "tests/golden/micro_c2i"), 0);
  const vs_backend_model *t = &e.models->target;
  vs_preview_fit_opts o;
  vs_preview_fit_default(&t->info, &o);
  assert_true(o.samples >= t->info.vocab); /* 64 codes */
  vs_preview_lut fit, exact;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_preview_lut_fit(t, e.dev, &o, &fit, err, sizeof err), 0);
  assert_int_equal(vs_preview_lut_build(t, e.dev, &exact, err, sizeof err), 0);
  assert_int_equal(fit.vocab, exact.vocab);
  assert_memory_equal(fit.rgb, exact.rgb, (size_t)exact.vocab * 3);
  assert_int_equal(fit.neutral, exact.neutral);
  double mean;
  int mx;
  vs_preview_lut_diff(&fit, &exact, &mean, &mx);
  assert_int_equal(mx, 0);
  /* Half the samples: a real fit, no longer equal everywhere, but a table of every code. */
  o.samples = 32;
  vs_preview_lut half;
  assert_int_equal(vs_preview_lut_fit(t, e.dev, &o, &half, err, sizeof err), 0);
  assert_int_equal(half.vocab, 64);
  vs_preview_lut_free(&half);
  vs_preview_lut_free(&fit);
  vs_preview_lut_free(&exact);
  close_model(&e);
}

static void test_default_batches_big_decoders(void **state) {
  (void)state;
  vspec_model_info in = {.image_h = 256, .image_w = 256, .grid_h = 16, .grid_w = 16};
  vs_preview_fit_opts o;
  vs_preview_fit_default(&in, &o);
  /* one 256 x 256 decode holds the 64 samples, 8 x 8 blocks of 2 x 2 tokens */
  assert_int_equal(o.samples, VS_PREVIEW_FIT_SAMPLES);
  assert_int_equal(o.tiles_per_side, 8);
  in.image_h = in.image_w = 64;
  vs_preview_fit_default(&in, &o);
  assert_int_equal(o.tiles_per_side, 2); /* 16 decodes of 4 samples */
}

static void test_config_key(void **state) {
  (void)state;
  vs_daemon_config c;
  char err[256];
  vs_config_defaults(&c);
  assert_int_equal(c.preview_table_exact, 0); /* fit by default */
  assert_int_equal(vs_config_set(&c, "defaults", "preview_table", "exact", err, sizeof err), 0);
  assert_int_equal(c.preview_table_exact, 1);
  assert_int_equal(vs_config_set(&c, "defaults", "preview_table", "fit", err, sizeof err), 0);
  assert_int_equal(c.preview_table_exact, 0);
  assert_int_not_equal(vs_config_set(&c, "defaults", "preview_table", "fast", err, sizeof err), 0);
  assert_non_null(strstr(err, "defaults.preview_table"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fmnist_within_bound),
      cmocka_unit_test(test_small_vocabulary_is_exact),
      cmocka_unit_test(test_default_batches_big_decoders),
      cmocka_unit_test(test_config_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
