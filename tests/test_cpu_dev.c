/* tests/test_cpu_dev.c - CPU device context: creation, memory ops, scratch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "tests/support/kernels_testutil.h"

static void test_create_errors(void **state) {
  vspec_dev *dev = (vspec_dev *)1;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_dev_create(NULL, 0, &dev, err, sizeof err), VSPEC_EINVAL);
  assert_null(dev);
  assert_true(strlen(err) > 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), -1, &dev, err, sizeof err), VSPEC_EINVAL);
  vspec_ops fake = *vs_cpu_ops();
  fake.device = VSPEC_DEVICE_CUDA;
  assert_int_equal(vs_dev_create(&fake, 0, &dev, NULL, 0), VSPEC_ENOTSUP);
  vs_dev_destroy(NULL);
}

static void test_table(void **state) {
  const vspec_ops *ops = vs_cpu_ops();
  assert_int_equal(ops->struct_size, sizeof(vspec_ops));
  assert_int_equal(ops->device, VSPEC_DEVICE_CPU);
  assert_string_equal(ops->name, "cpu");
  /* every entry is filled in */
  const void *const *fn = (const void *const *)&ops->alloc;
  const void *const *end = (const void *const *)((const char *)ops + sizeof *ops);
  for (; fn < end; fn++) assert_non_null(*fn);
  vspec_dev *dev = vt_dev(0);
  /* a device hands out the counting copy of its table (kernels/op_counts.c) */
  assert_ptr_equal(vs_dev_ops(dev), vs__counted_ops(vs_cpu_device_class()));
  assert_string_equal(vs_dev_ops(dev)->name, "cpu");
  vs_dev_destroy(dev);
}

static void test_memory(void **state) {
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  /* from 2 MiB on, weight-sized blocks start on a huge-page boundary (cpu_dev.c) */
  const size_t sizes[] = {0, 1, 63, 64, 1000, 1 << 20, (2 << 20) + 4, 5 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    unsigned char *p = ops->alloc(dev, sizes[s]);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (sizes[s] >= (2 << 20) ? (2 << 20) : 64), 0);
    for (size_t i = 0; i < sizes[s]; i++) assert_int_equal(p[i], 0);
    ops->free(dev, p);
  }
  ops->free(dev, NULL);

  float host[100], back[100];
  for (int i = 0; i < 100; i++) host[i] = (float)i;
  float *d = ops->alloc(dev, sizeof host);
  assert_int_equal(ops->upload(dev, d, host, sizeof host), VSPEC_OK);
  /* copy has memmove semantics */
  assert_int_equal(ops->copy(dev, d + 10, d, 50 * sizeof(float)), VSPEC_OK);
  assert_int_equal(ops->download(dev, back, d, sizeof back), VSPEC_OK);
  for (int i = 0; i < 100; i++) {
    float want = i < 10 ? (float)i : (i < 60 ? (float)(i - 10) : (float)i);
    assert_true(back[i] == want);
  }
  assert_int_equal(ops->copy(dev, d, d + 10, 50 * sizeof(float)), VSPEC_OK);
  assert_int_equal(ops->download(dev, back, d, sizeof back), VSPEC_OK);
  for (int i = 0; i < 50; i++) assert_true(back[i] == (float)i);
  assert_int_equal(ops->upload(dev, NULL, host, 4), VSPEC_EINVAL);
  assert_int_equal(ops->upload(dev, NULL, NULL, 0), VSPEC_OK);
  ops->free(dev, d);
  vs_dev_destroy(dev);
}

static void test_scratch(void **state) {
  vspec_dev *dev = vt_dev(0);
  const vspec_ops *ops = vs_dev_ops(dev);
  /* an op that needs more than the default arena (top-k over 4M entries: 32 MiB of index
   * and weight arrays) grows it as a last resort and still works */
  int n = 1 << 22;
  float *logits = ops->alloc(dev, (size_t)n * sizeof(float));
  float *probs = ops->alloc(dev, (size_t)n * sizeof(float));
  for (int i = 0; i < n; i++) logits[i] = (float)(i % 1000) * 0.01f;
  /* top 10 of 0.00..9.99 repeated: all 4194 ties with 9.99 survive top-k; top-p 0.5 over
   * those equal weights is crossed at 2098/4194 (2097/4194 is exactly 0.5, not above) */
  int kept = ops->logits_to_probs(dev, logits, n, 1.0f, 10, 0.5f, probs);
  assert_int_equal(kept, 2098);
  assert_true(probs[999] > 0 && probs[998] == 0.0f);
  assert_int_equal(ops->reserve_scratch(dev, 1000), VSPEC_OK);
  assert_int_equal(ops->reserve_scratch(dev, (size_t)40 << 20), VSPEC_OK);
  assert_int_equal(ops->reserve_scratch(dev, (size_t)1 << 20), VSPEC_OK);
  ops->free(dev, logits);
  ops->free(dev, probs);
  vs_dev_destroy(dev);
}

/* After the first device allocation, a block of a few megabytes (a job's KV cache) comes from
 * the heap, not from its own mmap that is unmapped when freed and faults again in the next job
 * (kernels/cpu/cpu_dev.c, malloc_keep_job_memory). glibc only, and not under the sanitizers,
 * whose allocator is their own. */
static void test_job_memory_stays(void **state) {
#if defined(__GLIBC__) && !defined(VSPEC_SANITIZED)
  if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_")) skip();
  vspec_dev *dev = vt_dev(1);
  void *first = vs_dev_ops(dev)->alloc(dev, 64);
  assert_non_null(first);
  size_t mapped = mallinfo2().hblkhd;
  /* volatile: a block that is only written and freed may be optimised away entirely */
  char *volatile block = malloc((size_t)8 << 20);
  assert_non_null(block);
  memset(block, 1, (size_t)8 << 20);
  size_t mapped_after = mallinfo2().hblkhd;
  free(block);
  assert_true(mapped_after < mapped + ((size_t)8 << 20));
  vs_dev_ops(dev)->free(dev, first);
  vs_dev_destroy(dev);
#else
  skip();
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* first: before the other tests free large blocks, which raise glibc's own threshold */
      cmocka_unit_test(test_job_memory_stays),
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_memory),
      cmocka_unit_test(test_scratch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
