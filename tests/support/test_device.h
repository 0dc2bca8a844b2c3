/*
 * tests/support/test_device.h - the device a device-agnostic test runs on (header only).
 *
 * VSPEC_TEST_DEVICE = cpu (default) | cuda | cuda:N and VSPEC_TEST_PRECISION = fp32
 * (default: tests compare against fp32 references) | bf16 choose it; `make gpu-test` runs
 * the golden tests again with VSPEC_TEST_DEVICE=cuda. A requested device that cannot be
 * opened makes the test binary exit with VT_EXIT_SKIP after saying why: the runner
 * (tools/gpu/run_gpu_tests.sh) reports it as skipped, never as passed.
 */
#ifndef VS_TEST_DEVICE_H
#define VS_TEST_DEVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vs_kernels.h"

#define VT_EXIT_SKIP 77 /* automake's "skipped" */

static inline const char *vt_test_device_name(void) {
  const char *s = getenv("VSPEC_TEST_DEVICE");
  return s && *s ? s : "cpu";
}

/* Opens the test device or exits (VT_EXIT_SKIP when a GPU was asked for and none can be
 * used, 1 on any other failure). */
static inline vspec_dev *vt_test_device(int threads) {
  const char *spec = vt_test_device_name();
  const char *prec = getenv("VSPEC_TEST_PRECISION");
  vs_device_options opt = {.threads = threads,
                           .precision = prec && strcmp(prec, "bf16") == 0 ? VS_PRECISION_BF16
                                                                           : VS_PRECISION_FP32};
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  int rc = vs_device_open(spec, &opt, &dev, err, sizeof err);
  if (rc == VSPEC_OK) return dev;
  fprintf(stderr, "SKIPPED: cannot open device '%s': %s\n", spec, err);
  exit(strcmp(spec, "cpu") == 0 ? 1 : VT_EXIT_SKIP);
}

#endif /* VS_TEST_DEVICE_H */
