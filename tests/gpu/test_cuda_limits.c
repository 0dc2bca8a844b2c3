/* tests/gpu/test_cuda_limits.c - a GPU that runs out of memory, or is asked for by a wrong
 * index, gives a clear error and never a crash. (Own binary: a memory limit binds every
 * context of its GPU for the rest of the process.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/support/method_of.h"

static void test_wrong_index(void **state) {
  vspec_dev *gpu = gt_gpu(VS_PRECISION_FP32); /* skips without a GPU */
  vs_dev_destroy(gpu);
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  assert_int_equal(vs_device_open("cuda:1000", NULL, &dev, err, sizeof err), VSPEC_ERANGE);
  assert_null(dev);
  assert_non_null(strstr(err, "does not exist"));
  printf("  %s\n", err);
}

/* The kernel switches read at open (VSPEC_CUDA_ATTENTION, VSPEC_CUDA_PDL, VSPEC_CUDA_ROPE): a
 * value they do not know is refused with a message naming the variable and what it takes;
 * the known ones open. */
static void test_kernel_switches(void **state) {
  vspec_dev *gpu = gt_gpu(VS_PRECISION_FP32); /* skips without a GPU */
  vs_dev_destroy(gpu);
  static const char *const vars[3][3] = {{"VSPEC_CUDA_ATTENTION", "generic", "auto"},
                                         {"VSPEC_CUDA_PDL", "off", "auto"},
                                         {"VSPEC_CUDA_ROPE", "separate", "auto"}};
  for (int v = 0; v < 3; v++) {
    char err[VSPEC_ERRLEN] = "";
    vspec_dev *dev = NULL;
    setenv(vars[v][0], "maybe", 1); /* unset_switches clears it even when this test fails */
    assert_int_equal(vs_device_open("cuda", NULL, &dev, err, sizeof err), VSPEC_EINVAL);
    assert_null(dev);
    assert_non_null(strstr(err, vars[v][0]));
    assert_non_null(strstr(err, vars[v][2]));
    printf("  %s\n", err);
    for (int k = 1; k < 3; k++) {
      setenv(vars[v][0], vars[v][k], 1);
      assert_int_equal(vs_device_open("cuda", NULL, &dev, err, sizeof err), VSPEC_OK);
      vs_dev_destroy(dev);
    }
    unsetenv(vars[v][0]);
  }
}

static int unset_switches(void **state) {
  (void)state;
  unsetenv("VSPEC_CUDA_ATTENTION");
  unsetenv("VSPEC_CUDA_PDL");
  unsetenv("VSPEC_CUDA_ROPE");
  return 0;
}

/* models/fmnist needs about 30 MB for its fp32 weights: under a 16 MiB limit the load fails
 * with a message that names the limit, and the device stays usable (running out of memory
 * is not a device failure): the micro model, well under the limit, loads and generates. */
static void test_memory_limit(void **state) {
  vs_device_options opt = {.precision = VS_PRECISION_FP32, .memory_limit = (size_t)16 << 20};
  char err[VSPEC_ERRLEN] = "", dir[1024];
  vspec_dev *dev = NULL;
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  if (!spec || strcmp(spec, "cpu") == 0) spec = "cuda";
  if (vs_device_open(spec, &opt, &dev, err, sizeof err)) {
    fprintf(stderr, "SKIPPED: %s\n", err);
    exit(VT_EXIT_SKIP);
  }
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vspec_host host;
  vs_registry *reg = NULL;
  vs_models *models = NULL;
  vs_host_init(&host, vs_cpu_ops());
  assert_int_equal(vs_registry_open(dir, &host, &reg, err, sizeof err), 0);
  int rc = vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err, sizeof err);
  assert_int_equal(rc, VSPEC_ENOMEM);
  assert_null(models);
  printf("  load under 16 MiB: %s\n", err);
  assert_non_null(strstr(err, "memory limit"));
  char why[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_dev_check(dev, why, sizeof why), VSPEC_OK);
  /* still usable */
  assert_int_equal(vs_models_open(reg, &host, dev, "tests/golden/micro_c2i", VS_ROLE_ALL, &models,
                                  err, sizeof err), VSPEC_OK);
  int32_t tokens[64];
  vs_job job = {.method = NULL, .class_label = 1, .seed = 3, .sampling = models->defaults};
  assert_int_equal(vs_generate(models, dev, &job, tokens, NULL, err, sizeof err), VSPEC_OK);
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrong_index),
      cmocka_unit_test_teardown(test_kernel_switches, unset_switches),
      cmocka_unit_test(test_memory_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
