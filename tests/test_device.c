/* tests/test_device.c - opening devices by name (kernels/device.c): parsing, the CPU class,
 * and the clear refusal of a CUDA device where none can be used. On a machine with a GPU
 * and a built module the CUDA checks here only open and close it; the GPU suite
 * (make gpu-test) tests what runs on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/host.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/vs_kernels.h"

static void test_parse(void **state) {
  uint32_t kind;
  int index;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_device_parse("cpu", &kind, &index, err, sizeof err), VSPEC_OK);
  assert_int_equal(kind, VSPEC_DEVICE_CPU);
  assert_int_equal(vs_device_parse("cuda", &kind, &index, err, sizeof err), VSPEC_OK);
  assert_int_equal(kind, VSPEC_DEVICE_CUDA);
  assert_int_equal(index, 0);
  assert_int_equal(vs_device_parse("cuda:3", &kind, &index, err, sizeof err), VSPEC_OK);
  assert_int_equal(index, 3);
  static const char *const bad[] = {"gpu", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999", "CPU",
                                     "cudax", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = '\0';
    assert_int_equal(vs_device_parse(bad[i], &kind, &index, err, sizeof err), VSPEC_EINVAL);
    /* the message names what was given and what is allowed */
    assert_non_null(strstr(err, "cpu, cuda or cuda:N"));
  }
}

static void test_cpu_class(void **state) {
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  vs_device_options opt = {.threads = 2};
  assert_int_equal(vs_device_open("cpu", &opt, &dev, err, sizeof err), VSPEC_OK);
  assert_ptr_equal(vs_dev_ops(dev), vs__counted_ops(vs_cpu_device_class()));
  assert_int_equal(vs_dev_ops(dev)->device, VSPEC_DEVICE_CPU);
  assert_int_equal(vs_dev_space(dev), 0);
  vs_device_info info;
  assert_int_equal(vs_dev_info(dev, &info), VSPEC_OK);
  assert_int_equal(info.kind, VSPEC_DEVICE_CPU);
  assert_int_equal(info.precision, VS_PRECISION_FP32);
  assert_non_null(strstr(info.name, "2 threads"));
  assert_int_equal(vs_dev_check(dev, err, sizeof err), VSPEC_OK);
  vs_dev_destroy(dev);
  /* bf16 on the CPU needs AMX tiles or AVX2: opens where it can run, else refused with a
   * message */
  int rc = vs_device_open("cpu", &(vs_device_options){.precision = VS_PRECISION_BF16}, &dev, err,
                          sizeof err);
  if (rc == VSPEC_OK) {
    assert_int_equal(vs_dev_info(dev, &info), VSPEC_OK);
    assert_int_equal(info.precision, VS_PRECISION_BF16);
    vs_dev_destroy(dev);
    dev = NULL;
  } else {
    assert_int_equal(rc, VSPEC_ENOTSUP);
    assert_null(dev);
    assert_non_null(strstr(err, "bf16"));
  }
  /* and it is device 0 */
  assert_int_equal(vs_cpu_device_class()->open(&(vs_device_options){.index = 1}, &dev, err,
                                                sizeof err),
                   VSPEC_ERANGE);
  assert_null(dev);
}

/* Without a GPU (or without the module) a CUDA device is refused with a message that says
 * which; with one it opens. Never a crash. */
static void test_cuda_refused_or_opened(void **state) {
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  int rc = vs_device_open("cuda", NULL, &dev, err, sizeof err);
  if (rc == VSPEC_OK) {
    assert_non_null(dev);
    assert_int_equal(vs_dev_ops(dev)->device, VSPEC_DEVICE_CUDA);
    assert_int_not_equal(vs_dev_space(dev), 0);
    vs_dev_destroy(dev);
    /* an index past the last GPU is refused by number */
    rc = vs_device_open("cuda:1023", NULL, &dev, err, sizeof err);
    assert_int_equal(rc, VSPEC_ERANGE);
    assert_non_null(strstr(err, "does not exist"));
    return;
  }
  assert_null(dev);
  printf("  cuda refused: %s\n", err);
  assert_true(strstr(err, "no CUDA device") || strstr(err, "no CUDA support") ||
              strstr(err, "cannot load the CUDA module"));
}

/* A model loaded on one memory space refuses sessions on another (plugin.h dev_space):
 * here two CPU devices share space 0, so the session opens. */
static void test_same_space_sessions(void **state) {
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *a = NULL, *b = NULL;
  assert_int_equal(vs_device_open("cpu", NULL, &a, err, sizeof err), VSPEC_OK);
  assert_int_equal(vs_device_open("cpu", &(vs_device_options){.threads = 1}, &b, err, sizeof err),
                   VSPEC_OK);
  assert_int_equal(vs_dev_space(a), vs_dev_space(b));
  vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  assert_ptr_equal(host.dev_ops(b), vs__counted_ops(vs_cpu_device_class()));
  assert_int_equal(host.dev_space(a), 0);
  vs_dev_destroy(a);
  vs_dev_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_cpu_class),
      cmocka_unit_test(test_cuda_refused_or_opened),
      cmocka_unit_test(test_same_space_sessions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
