/*
 * End-to-end generation: the same seed reproduces the same tokens and the same PNG bytes,
 * whatever the thread count; different seeds differ; bad sampling parameters are refused
 * with a message naming them; model files truncated or rewritten in place under a loaded
 * model change nothing (no SIGBUS, the same image).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/png_write.h"
#include "kernels/vs_kernels.h"
#include "tests/support/method_of.h"

static vspec_host host;
static vs_registry *reg;

static void generate_png(int threads, uint64_t seed, int32_t *tokens, uint8_t **png, size_t *len) {
  char err[VSPEC_ERRLEN];
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), threads, &dev, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, "tests/golden/micro_c2i", VS_ROLE_TARGET, &models, err,
                     sizeof err))
    fail_msg("%s", err);
  vs_job job = {.method = NULL, .class_label = 2, .seed = seed,
                .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f,
                             .cfg_interval = -1}};
  vs_metrics mt;
  assert_int_equal(vs_generate(models, dev, &job, tokens, &mt, err, sizeof err), 0);
  uint8_t rgb[8 * 8 * 3];
  const vs_backend_model *t = &models->target;
  assert_int_equal(t->vt->decode(t->model, dev, tokens, rgb, err, sizeof err), 0);
  char desc[256];
  vs_job_describe(&job, models->name, desc, sizeof desc);
  vs_png_text text = {"vspec", desc};
  assert_int_equal(vs_png_encode(rgb, 8, 8, &text, 1, png, len, err, sizeof err), 0);
  vs_models_close(models);
  vs_dev_destroy(dev);
}

static void test_same_seed_same_bytes(void **state) {
  (void)state;
  int32_t a[16], b[16], c[16];
  uint8_t *pa, *pb, *pc;
  size_t la, lb, lc;
  generate_png(1, 1234, a, &pa, &la);
  generate_png(2, 1234, b, &pb, &lb);
  generate_png(1, 1235, c, &pc, &lc);
  assert_memory_equal(a, b, sizeof a);
  assert_int_equal(la, lb);
  assert_memory_equal(pa, pb, la);
  /* A different seed must give a different image (16 tokens from 64 codes). */
  assert_true(memcmp(a, c, sizeof a) != 0);
  free(pa);
  free(pb);
  free(pc);
}

static void test_bad_sampling_refused(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_models_open(reg, &host, dev, "tests/golden/micro_c2i", VS_ROLE_TARGET,
                                  &models, err, sizeof err), 0);
  int32_t tokens[16];
  vs_job job = {.method = NULL, .class_label = 2, .seed = 1, .sampling = models->defaults};
  job.sampling.top_p = 0.0f;
  assert_int_equal(vs_generate(models, dev, &job, tokens, NULL, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "top_p"));
  job.sampling = models->defaults;
  job.sampling.top_k = 65;
  assert_int_equal(vs_generate(models, dev, &job, tokens, NULL, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "top_k"));
  job.sampling = models->defaults;
  /* a job carries a parsed method: an unknown one is refused where it is parsed */
  vs_method warp;
  assert_int_equal(vs_method_parse("warp", &warp, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "warp"));
  /* size=auto is resolved before the engine (core/autotune.h): the engine refuses it */
  job.method = vs_method_of("sd:exact@standard:size=auto");
  assert_int_equal(vs_generate(models, dev, &job, tokens, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "size=auto is resolved before"));
  job.method = NULL;
  job.class_label = -1;
  assert_int_equal(vs_generate(models, dev, &job, tokens, NULL, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "class"));
  vs_models_close(models);
  vs_dev_destroy(dev);
}

static void cancel_after_3(void *user, const vs_round_info *info) {
  if (info->n_tokens >= 3) atomic_store((atomic_int *)user, 1);
}

static void test_cancel(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_models_open(reg, &host, dev, "tests/golden/micro_c2i", VS_ROLE_TARGET,
                                  &models, err, sizeof err), 0);
  atomic_int cancel = 0;
  int32_t tokens[16];
  vs_job job = {.method = NULL, .class_label = 2, .seed = 1, .sampling = models->defaults,
                .on_round = cancel_after_3, .user = &cancel, .cancel = &cancel};
  vs_metrics mt;
  assert_int_equal(vs_generate(models, dev, &job, tokens, &mt, err, sizeof err), VSPEC_ECANCELED);
  assert_non_null(strstr(err, "cancelled"));
  vs_models_close(models);
  vs_dev_destroy(dev);
}

static void copy_to(const char *src, const char *dst) {
  FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
}

/* One image's tokens and pixels from a loaded model. */
static void image(vs_models *models, vspec_dev *dev, int32_t tokens[16], uint8_t rgb[192]) {
  char err[VSPEC_ERRLEN];
  vs_job job = {.method = NULL, .class_label = 3, .seed = 77, .sampling = models->defaults};
  if (vs_generate(models, dev, &job, tokens, NULL, err, sizeof err)) fail_msg("%s", err);
  const vs_backend_model *t = &models->target;
  assert_int_equal(t->vt->decode(t->model, dev, tokens, rgb, err, sizeof err), 0);
}

/* `cp new old` over the files of a loaded model truncates them and writes into the same
 * inodes: the daemon's next job must neither die of SIGBUS nor see other weights. */
static void test_model_files_replaced_in_place(void **state) {
  (void)state;
  char dir[64], err[VSPEC_ERRLEN], gpt[128], vq[128];
  snprintf(dir, sizeof dir, "/tmp/vspec-test-inplace-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", dir);
  snprintf(vq, sizeof vq, "%s/vq.safetensors", dir);
  copy_to("tests/golden/micro_c2i/gpt.safetensors", gpt);
  copy_to("tests/golden/micro_c2i/vq.safetensors", vq);
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, dir, VS_ROLE_TARGET, &models, err, sizeof err))
    fail_msg("%s", err);
  int32_t t0[16], t1[16];
  uint8_t p0[192], p1[192];
  image(models, dev, t0, p0);
  /* cp's first step: both files empty */
  assert_int_equal(truncate(gpt, 0), 0);
  assert_int_equal(truncate(vq, 0), 0);
  image(models, dev, t1, p1);
  assert_memory_equal(t1, t0, sizeof t0);
  assert_memory_equal(p1, p0, sizeof p0);
  /* then other bytes in the same inodes (each file gets the other's content) */
  copy_to("tests/golden/micro_c2i/vq.safetensors", gpt);
  copy_to("tests/golden/micro_c2i/gpt.safetensors", vq);
  image(models, dev, t1, p1);
  assert_memory_equal(t1, t0, sizeof t0);
  assert_memory_equal(p1, p0, sizeof p0);
  vs_models_close(models);
  vs_dev_destroy(dev);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_missing_model_dir(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_models_open(reg, &host, dev, "tests/golden/no_such_model", VS_ROLE_TARGET,
                                  &models, err, sizeof err), VSPEC_ENOENT);
  assert_non_null(strstr(err, "no_such_model"));
  vs_dev_destroy(dev);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_same_bytes),
      cmocka_unit_test(test_bad_sampling_refused),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_missing_model_dir),
      cmocka_unit_test(test_model_files_replaced_in_place),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  return rc;
}
