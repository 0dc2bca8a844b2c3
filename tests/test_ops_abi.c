/*
 * tests/test_ops_abi.c - the ops table's layout is the ABI: vspec_ops, generated from
 * include/vspec/ops_list.h, must keep every member of ABI 1.5 where it was, with its type,
 * and the list must stay in ABI order (the table only grows at the end). Also which entries
 * each device leaves NULL (a device's table is generated from the same list).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vs_kernels.h"
#include "vspec/plugin.h"

/* vspec_ops of ABI 1.5 as it was written by hand before the list (comments dropped): a frozen
 * copy, never to be edited. A later ABI appends members after graph_free; the checks below
 * then hold for this prefix still. */
typedef struct vs_ops_1_5 {
  uint32_t struct_size;
  uint32_t device;
  const char *name;
  void *(*alloc)(vspec_dev *dev, size_t bytes);
  void (*free)(vspec_dev *dev, void *ptr);
  int (*upload)(vspec_dev *dev, void *dst, const void *src_host, size_t bytes);
  int (*download)(vspec_dev *dev, void *dst_host, const void *src, size_t bytes);
  int (*copy)(vspec_dev *dev, void *dst, const void *src, size_t bytes);
  int (*reserve_scratch)(vspec_dev *dev, size_t bytes);
  void (*gemm)(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
               const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  void (*linear)(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                 const float *bias, float *y);
  void (*rmsnorm)(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                  float *y);
  void (*groupnorm)(vspec_dev *dev, const float *x, int channels, int hw, int groups, float eps,
                    const float *gamma, const float *beta, float *y);
  void (*silu)(vspec_dev *dev, float *x, size_t n);
  void (*swiglu)(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y);
  void (*gelu_tanh)(vspec_dev *dev, float *x, size_t n);
  void (*add)(vspec_dev *dev, float *y, const float *x, size_t n);
  void (*rope2d_table)(int n_cond, int grid, int head_dim, float base, float *table);
  void (*rope_apply)(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads, int head_dim,
                     const int32_t *pos, const float *table);
  void (*attention)(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                    int n_kv_heads, int head_dim, const float *k, const float *v, int slot_stride,
                    int n_kv, const uint8_t *mask, float *out);
  void (*softmax)(vspec_dev *dev, float *x, int rows, int n);
  void (*log_softmax)(vspec_dev *dev, float *x, int rows, int n);
  void (*cfg_combine)(vspec_dev *dev, const float *cond, const float *uncond, size_t n, float scale,
                      float *out);
  int (*logits_to_probs)(vspec_dev *dev, const float *logits, int n, float temperature, int top_k,
                         float top_p, float *probs);
  int (*sample)(vspec_dev *dev, const float *probs, int n, double u);
  int (*argmax)(vspec_dev *dev, const float *x, int n);
  void (*conv2d)(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                 const float *bias, int cout, int kh, int kw, int stride, int pad_top, int pad_left,
                 int pad_bottom, int pad_right, float *y);
  void (*upsample_nearest2x)(vspec_dev *dev, const float *x, int channels, int h, int w, float *y);
  int (*copy3d)(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                size_t src_a, size_t src_b, size_t width, int na, int nb);
  void (*layernorm)(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                    int dim, float eps, float *y);
  void (*gelu)(vspec_dev *dev, float *x, size_t n);
  void (*mul)(vspec_dev *dev, float *y, const float *x, size_t n);
  int (*weight_format)(vspec_dev *dev, const float *w, int n_out, int n_in, int format);
  void *(*alloc_uninit)(vspec_dev *dev, size_t bytes);
  void (*gather_rows)(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                      float *dst);
  void (*rmsnorm_rows)(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                       const float *w, float eps, float *y);
  void (*linear_add)(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                     float *y);
  void (*norm_swiglu)(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                      float eps, const float *w1, const float *w3, int hidden, float *y);
  void (*norm_qkv_rope)(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                        float eps, const float *wqkv, const int32_t *pos,
                        const float *rope_table, const vspec_kv_cache *kv,
                        const int32_t *slots, float *qkv);
  void (*tree_attention)(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                         const vspec_kv_tree_view *tree, float *out);
  void (*sample_tokens)(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                        int32_t *tokens);
  int (*graph_begin)(vspec_dev *dev);
  int (*graph_end)(vspec_dev *dev, vspec_graph **graph);
  int (*graph_launch)(vspec_dev *dev, vspec_graph *graph);
  void (*graph_free)(vspec_dev *dev, vspec_graph *graph);
} vs_ops_1_5;

/* Every member of the frozen copy at the same offset and of the same type in the generated
 * struct (checked at compile time; typeof and __builtin_types_compatible_p: GCC and clang). */
#define SAME_MEMBER(m)                                                                         \
  _Static_assert(offsetof(vspec_ops, m) == offsetof(vs_ops_1_5, m), #m " moved");              \
  _Static_assert(__builtin_types_compatible_p(__typeof__(((vspec_ops *)0)->m),                 \
                                              __typeof__(((vs_ops_1_5 *)0)->m)),               \
                 #m " changed its type")
SAME_MEMBER(struct_size);
SAME_MEMBER(device);
SAME_MEMBER(name);
/* Every op of ABI 1.0 to 1.5 in the list (by its minor); the ops of a later minor are not in
 * the frozen copy (a minor past 10 adds its SAME_OP_n here). */
#define SAME_OP_0 SAME_MEMBER
#define SAME_OP_1 SAME_MEMBER
#define SAME_OP_2 SAME_MEMBER
#define SAME_OP_3 SAME_MEMBER
#define SAME_OP_4 SAME_MEMBER
#define SAME_OP_5 SAME_MEMBER
#define NEWER(m) _Static_assert(1, #m " came after ABI 1.5")
#define SAME_OP_6 NEWER
#define SAME_OP_7 NEWER
#define SAME_OP_8 NEWER
#define SAME_OP_9 NEWER
#define SAME_OP_10 NEWER
#define SAME_OP(ret, name, params, args, minor, kind) SAME_OP_##minor(name);
VSPEC_OPS(SAME_OP)
/* ... and nothing else up to graph_free: while ABI 1.5 is the newest, exactly as long as the
 * frozen copy, later no shorter. */
#if VSPEC_ABI_MINOR == 5
_Static_assert(sizeof(vspec_ops) == sizeof(vs_ops_1_5), "vspec_ops grew or shrank");
#endif
_Static_assert(sizeof(vspec_ops) >= sizeof(vs_ops_1_5), "vspec_ops shrank");
/* Hand-written numbers on LP64 (x86-64, aarch64): 2 x 4 bytes, the name, 42 pointers. */
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(offsetof(vspec_ops, alloc) == 16, "alloc");
_Static_assert(offsetof(vspec_ops, copy3d) == 16 + 25 * 8, "copy3d (ABI 1.1)");
_Static_assert(offsetof(vspec_ops, weight_format) == 16 + 29 * 8, "weight_format (ABI 1.2)");
_Static_assert(offsetof(vspec_ops, alloc_uninit) == 16 + 30 * 8, "alloc_uninit (ABI 1.3)");
_Static_assert(offsetof(vspec_ops, gather_rows) == 16 + 31 * 8, "gather_rows (ABI 1.4)");
_Static_assert(offsetof(vspec_ops, graph_begin) == 16 + 38 * 8, "graph_begin (ABI 1.5)");
_Static_assert(offsetof(vspec_ops, verify_walk) == 16 + 42 * 8, "verify_walk (ABI 1.6)");
_Static_assert(offsetof(vspec_ops, draw_probs) == 16 + 43 * 8, "draw_probs (ABI 1.8)");
_Static_assert(offsetof(vspec_ops, norm_qkv_rope_batch) == 16 + 44 * 8,
               "norm_qkv_rope_batch (ABI 1.9)");
_Static_assert(offsetof(vspec_ops, draw_children) == 16 + 46 * 8, "draw_children (ABI 1.10)");
#endif

/* The list as data: each entry's name, offset and ABI minor, in list order. */
typedef struct op_entry {
  const char *name;
  size_t offset;
  int minor;
} op_entry;
#define ENTRY(ret, name, params, args, minor, kind) {#name, offsetof(vspec_ops, name), minor},
static const op_entry entries[] = {VSPEC_OPS(ENTRY)};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

/* The minor each member of ABI 1.5 came with, by where it sits: the first member of each. */
static int minor_of_1_5(size_t offset) {
  static const size_t first[] = {
      offsetof(vs_ops_1_5, copy3d),      offsetof(vs_ops_1_5, weight_format),
      offsetof(vs_ops_1_5, alloc_uninit), offsetof(vs_ops_1_5, gather_rows),
      offsetof(vs_ops_1_5, graph_begin),
  };
  int minor = 0;
  for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
    if (offset >= first[i]) minor = (int)i + 1;
  return minor;
}

/* The list is the table, in order, one pointer per entry, with nothing between. */
static void test_list_is_the_table(void **state) {
  (void)state;
  size_t off = offsetof(vspec_ops, alloc);
  for (size_t i = 0; i < N_ENTRIES; i++) {
    if (entries[i].offset != off)
      fail_msg("%s at offset %zu, expected %zu", entries[i].name, entries[i].offset, off);
    off += sizeof(void (*)(void));
  }
  assert_int_equal(off, sizeof(vspec_ops));
  printf("  %zu ops, sizeof(vspec_ops) %zu\n", N_ENTRIES, sizeof(vspec_ops));
}

/* ABI markers: the minors never go down along the list, none is newer than the ABI, and the
 * members of ABI 1.5 carry the minor they came with. */
static void test_list_in_abi_order(void **state) {
  (void)state;
  int prev = 0;
  for (size_t i = 0; i < N_ENTRIES; i++) {
    const op_entry *e = &entries[i];
    if (e->minor < prev) fail_msg("%s (ABI 1.%d) after an op of ABI 1.%d", e->name, e->minor, prev);
    if (e->minor > VSPEC_ABI_MINOR)
      fail_msg("%s: ABI 1.%d, newer than VSPEC_ABI_MINOR %d", e->name, e->minor, VSPEC_ABI_MINOR);
    if (e->offset < sizeof(vs_ops_1_5) && e->minor != minor_of_1_5(e->offset))
      fail_msg("%s: minor %d in the list, but it came with ABI 1.%d", e->name, e->minor,
               minor_of_1_5(e->offset));
    prev = e->minor;
  }
}

/* A device's table: its header, and exactly the entries it leaves NULL (comma-separated names;
 * "" for none): the ops it has none for. */
static void check_table(const vspec_ops *ops, uint32_t device, const char *name,
                        const char *nulls) {
  assert_non_null(ops);
  assert_int_equal(ops->struct_size, sizeof(vspec_ops));
  assert_int_equal(ops->device, device);
  assert_string_equal(ops->name, name);
  char got[512] = "";
  for (size_t i = 0; i < N_ENTRIES; i++) {
    void *p;
    memcpy(&p, (const char *)ops + entries[i].offset, sizeof p);
    if (!p)
      snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", got[0] ? "," : "",
               entries[i].name);
  }
  assert_string_equal(got, nulls);
}

/* Each device fills its table from the list. The CPU has every op. */
static void test_cpu_table(void **state) {
  (void)state;
  check_table(vs_cpu_ops(), VSPEC_DEVICE_CPU, "cpu", "");
}

/* The CUDA module's table without a GPU: building it needs none (skipped where the module
 * was not built: no nvcc, or a sanitizer build). */
static void test_cuda_table(void **state) {
  (void)state;
  const char *build = getenv("VSPEC_BUILD");
  char path[4096];
  snprintf(path, sizeof path, "%s/lib/libvspec-cuda.so", build && *build ? build : "build");
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    printf("  no CUDA module: %s\n", dlerror());
    skip();
  }
  vs_device_class_fn fn = (vs_device_class_fn)dlsym(h, VS_CUDA_CLASS_SYMBOL);
  assert_non_null(fn);
  /* weight_format: one weight format per precision */
  check_table(fn()->ops, VSPEC_DEVICE_CUDA, "cuda", "weight_format");
  /* not dlclose'd: the CUDA runtime does not like being unloaded */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_list_is_the_table),
      cmocka_unit_test(test_list_in_abi_order),
      cmocka_unit_test(test_cpu_table),
      cmocka_unit_test(test_cuda_table),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
