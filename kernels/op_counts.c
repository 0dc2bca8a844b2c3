/*
 * kernels/op_counts.c - the counting ops table every device context hands out.
 *
 * What a forward costs on a device is, to first order, how many ops it issues (on a GPU each
 * is a kernel launch, microseconds of fixed cost), how many times data crosses between host
 * and device, and how often the host waits for the device. Those are properties of the code
 * that issues the ops, not of one device, so they are counted here, above every device: the
 * host hands plugins a copy of the device's table whose functions count, then call the
 * device's own (vs_dev_head.cls->ops). A budget that tests assert on the CPU then holds on a
 * GPU too (issue 29: fused ops must lower it, and nothing may raise it unnoticed).
 * Memory management (alloc, free, scratch, weight formats) is not work and is not counted;
 * transfers (upload, download) and waits are counted by each device where it makes them
 * (vs_dev_count_transfer, kernels/vs_device.h), so that one an op makes inside counts too.
 * The cost is one indirect call and one relaxed atomic add per op: a few nanoseconds against
 * the microseconds of the smallest op.
 */
#include <pthread.h>
#include <string.h>

#include "kernels/vs_kernels.h"

static inline vs_dev_head *vs__head(vspec_dev *dev) { return (vs_dev_head *)(void *)dev; }
static inline const vspec_ops *vs__own(vspec_dev *dev) { return vs__head(dev)->cls->ops; }
/* An op recorded into a graph is not issued: it counts when the graph is launched, as the
 * launch (one op, however many it holds). */
static inline void vs__op(vspec_dev *dev) {
  vs_dev_head *h = vs__head(dev);
  vs_dev_count(h->recording ? &h->counters.recorded : &h->counters.ops, 1);
}

static int c_copy(vspec_dev *dev, void *dst, const void *src, size_t bytes) {
  vs__op(dev);
  return vs__own(dev)->copy(dev, dst, src, bytes);
}

static void c_gemm(vspec_dev *dev, int ta, int tb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c,
                   int ldc) {
  vs__op(dev);
  vs__own(dev)->gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void c_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                     const float *bias, float *y) {
  vs__op(dev);
  vs__own(dev)->linear(dev, x, m, n_in, w, n_out, bias, y);
}

static void c_rmsnorm(vspec_dev *dev, const float *x, const float *w, int rows, int dim,
                      float eps, float *y) {
  vs__op(dev);
  vs__own(dev)->rmsnorm(dev, x, w, rows, dim, eps, y);
}

static void c_groupnorm(vspec_dev *dev, const float *x, int channels, int hw, int groups,
                        float eps, const float *gamma, const float *beta, float *y) {
  vs__op(dev);
  vs__own(dev)->groupnorm(dev, x, channels, hw, groups, eps, gamma, beta, y);
}

static void c_silu(vspec_dev *dev, float *x, size_t n) {
  vs__op(dev);
  vs__own(dev)->silu(dev, x, n);
}

static void c_swiglu(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y) {
  vs__op(dev);
  vs__own(dev)->swiglu(dev, gate, up, n, y);
}

static void c_gelu_tanh(vspec_dev *dev, float *x, size_t n) {
  vs__op(dev);
  vs__own(dev)->gelu_tanh(dev, x, n);
}

static void c_add(vspec_dev *dev, float *y, const float *x, size_t n) {
  vs__op(dev);
  vs__own(dev)->add(dev, y, x, n);
}

static void c_rope_apply(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads,
                         int head_dim, const int32_t *pos, const float *table) {
  vs__op(dev);
  vs__own(dev)->rope_apply(dev, x, rows, row_stride, n_heads, head_dim, pos, table);
}

static void c_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                        int n_kv_heads, int head_dim, const float *k, const float *v,
                        int slot_stride, int n_kv, const uint8_t *mask, float *out) {
  vs__op(dev);
  vs__own(dev)->attention(dev, q, n_q, q_stride, n_heads, n_kv_heads, head_dim, k, v,
                          slot_stride, n_kv, mask, out);
}

static void c_softmax(vspec_dev *dev, float *x, int rows, int n) {
  vs__op(dev);
  vs__own(dev)->softmax(dev, x, rows, n);
}

static void c_log_softmax(vspec_dev *dev, float *x, int rows, int n) {
  vs__op(dev);
  vs__own(dev)->log_softmax(dev, x, rows, n);
}

static void c_cfg_combine(vspec_dev *dev, const float *cond, const float *uncond, size_t n,
                          float scale, float *out) {
  vs__op(dev);
  vs__own(dev)->cfg_combine(dev, cond, uncond, n, scale, out);
}

static int c_logits_to_probs(vspec_dev *dev, const float *logits, int n, float temperature,
                             int top_k, float top_p, float *probs) {
  vs__op(dev);
  return vs__own(dev)->logits_to_probs(dev, logits, n, temperature, top_k, top_p, probs);
}

static int c_sample(vspec_dev *dev, const float *probs, int n, double u) {
  vs__op(dev);
  return vs__own(dev)->sample(dev, probs, n, u);
}

static int c_argmax(vspec_dev *dev, const float *x, int n) {
  vs__op(dev);
  return vs__own(dev)->argmax(dev, x, n);
}

static void c_conv2d(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                     const float *bias, int cout, int kh, int kw, int stride, int pt, int pl,
                     int pb, int pr, float *y) {
  vs__op(dev);
  vs__own(dev)->conv2d(dev, x, cin, h, w, weight, bias, cout, kh, kw, stride, pt, pl, pb, pr, y);
}

static void c_upsample_nearest2x(vspec_dev *dev, const float *x, int channels, int h, int w,
                                 float *y) {
  vs__op(dev);
  vs__own(dev)->upsample_nearest2x(dev, x, channels, h, w, y);
}

static int c_copy3d(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                    size_t src_a, size_t src_b, size_t width, int na, int nb) {
  vs__op(dev);
  return vs__own(dev)->copy3d(dev, dst, dst_a, dst_b, src, src_a, src_b, width, na, nb);
}

static void c_layernorm(vspec_dev *dev, const float *x, const float *w, const float *b,
                        int rows, int dim, float eps, float *y) {
  vs__op(dev);
  vs__own(dev)->layernorm(dev, x, w, b, rows, dim, eps, y);
}

static void c_gelu(vspec_dev *dev, float *x, size_t n) {
  vs__op(dev);
  vs__own(dev)->gelu(dev, x, n);
}

static void c_mul(vspec_dev *dev, float *y, const float *x, size_t n) {
  vs__op(dev);
  vs__own(dev)->mul(dev, y, x, n);
}

/* ABI 1.4: a fused op is one op, whatever it runs inside (its point is the launches it saves). */
static void c_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                          float *dst) {
  vs__op(dev);
  vs__own(dev)->gather_rows(dev, src, idx, n, dim, dst);
}

static void c_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                           const float *w, float eps, float *y) {
  vs__op(dev);
  vs__own(dev)->rmsnorm_rows(dev, x, idx, n, dim, w, eps, y);
}

static void c_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                         int n_out, float *y) {
  vs__op(dev);
  vs__own(dev)->linear_add(dev, x, m, n_in, w, n_out, y);
}

static void c_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                          float eps, const float *w1, const float *w3, int hidden, float *y) {
  vs__op(dev);
  vs__own(dev)->norm_swiglu(dev, x, m, dim, norm_w, eps, w1, w3, hidden, y);
}

static void c_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                            float eps, const float *wqkv, const int32_t *pos,
                            const float *rope_table, const vspec_kv_cache *kv,
                            const int32_t *slots, float *qkv) {
  vs__op(dev);
  vs__own(dev)->norm_qkv_rope(dev, x, n, dim, norm_w, eps, wqkv, pos, rope_table, kv, slots,
                              qkv);
}

static void c_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                             const vspec_kv_tree_view *tree, float *out) {
  vs__op(dev);
  vs__own(dev)->tree_attention(dev, qkv, kv, tree, out);
}

static void c_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                            int32_t *tokens) {
  vs__op(dev);
  vs__own(dev)->sample_tokens(dev, logits, spec, tokens);
}

/* ABI 1.5 graphs: begin and end mark the head as recording (not work themselves); a launch
 * is one op and one launch. graph_free is memory management: not wrapped. */
static int c_graph_begin(vspec_dev *dev) {
  int rc = vs__own(dev)->graph_begin(dev);
  if (rc == VSPEC_OK) vs__head(dev)->recording = 1;
  return rc;
}

static int c_graph_end(vspec_dev *dev, vspec_graph **graph) {
  vs__head(dev)->recording = 0;
  return vs__own(dev)->graph_end(dev, graph);
}

static int c_graph_launch(vspec_dev *dev, vspec_graph *graph) {
  vs__op(dev);
  vs_dev_count(&vs__head(dev)->counters.launches, 1);
  return vs__own(dev)->graph_launch(dev, graph);
}

/* The counting copy of `own`: every op the device has, counted; the rest as it is. An op the
 * device lacks stays NULL (the copy, then no wrapper): callers test for NULL to fall back to
 * other ops (vspec_has_fused_ops), and a wrapper would call through NULL. A table member
 * added later (the table only grows at the end) is copied uncounted until it gets a wrapper
 * here; tests/test_op_counts.c fails for a member of today's table left out. */
static void vs__build(vspec_ops *t, const vspec_ops *own) {
  *t = *own;
#define VS__WRAP(name) \
  if (own->name) t->name = c_##name
  VS__WRAP(copy);
  VS__WRAP(gemm);
  VS__WRAP(linear);
  VS__WRAP(rmsnorm);
  VS__WRAP(groupnorm);
  VS__WRAP(silu);
  VS__WRAP(swiglu);
  VS__WRAP(gelu_tanh);
  VS__WRAP(add);
  VS__WRAP(rope_apply);
  VS__WRAP(attention);
  VS__WRAP(softmax);
  VS__WRAP(log_softmax);
  VS__WRAP(cfg_combine);
  VS__WRAP(logits_to_probs);
  VS__WRAP(sample);
  VS__WRAP(argmax);
  VS__WRAP(conv2d);
  VS__WRAP(upsample_nearest2x);
  VS__WRAP(copy3d);
  VS__WRAP(layernorm);
  VS__WRAP(gelu);
  VS__WRAP(mul);
  VS__WRAP(gather_rows);
  VS__WRAP(rmsnorm_rows);
  VS__WRAP(linear_add);
  VS__WRAP(norm_swiglu);
  VS__WRAP(norm_qkv_rope);
  VS__WRAP(tree_attention);
  VS__WRAP(sample_tokens);
  VS__WRAP(graph_begin);
  VS__WRAP(graph_end);
  VS__WRAP(graph_launch);
#undef VS__WRAP
}

/* One counting table per device class (a process has at most a CPU and a CUDA class). */
#define VS__CLASSES 4
static pthread_mutex_t vs__mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const vs_device_class *cls;
  vspec_ops table;
} vs__tables[VS__CLASSES];

const vspec_ops *vs__counted_ops(const vs_device_class *cls) {
  const vspec_ops *t = cls->ops; /* uncounted if the slots are full: never in practice */
  pthread_mutex_lock(&vs__mu);
  for (int i = 0; i < VS__CLASSES; i++) {
    if (vs__tables[i].cls == cls) {
      t = &vs__tables[i].table;
      break;
    }
    if (!vs__tables[i].cls) {
      vs__build(&vs__tables[i].table, cls->ops);
      vs__tables[i].cls = cls;
      t = &vs__tables[i].table;
      break;
    }
  }
  pthread_mutex_unlock(&vs__mu);
  return t;
}

int vs_dev_counters_get(const vspec_dev *dev, vs_dev_counters *out) {
  memset(out, 0, sizeof *out);
  if (!dev) return VSPEC_EINVAL;
  const vs_dev_counters *c = &((const vs_dev_head *)(const void *)dev)->counters;
  out->ops = __atomic_load_n(&c->ops, __ATOMIC_RELAXED);
  out->uploads = __atomic_load_n(&c->uploads, __ATOMIC_RELAXED);
  out->upload_bytes = __atomic_load_n(&c->upload_bytes, __ATOMIC_RELAXED);
  out->downloads = __atomic_load_n(&c->downloads, __ATOMIC_RELAXED);
  out->download_bytes = __atomic_load_n(&c->download_bytes, __ATOMIC_RELAXED);
  out->syncs = __atomic_load_n(&c->syncs, __ATOMIC_RELAXED);
  out->launches = __atomic_load_n(&c->launches, __ATOMIC_RELAXED);
  out->recorded = __atomic_load_n(&c->recorded, __ATOMIC_RELAXED);
  return VSPEC_OK;
}

void vs_dev_counters_sub(vs_dev_counters *a, const vs_dev_counters *b) {
  a->ops -= b->ops;
  a->uploads -= b->uploads;
  a->upload_bytes -= b->upload_bytes;
  a->downloads -= b->downloads;
  a->download_bytes -= b->download_bytes;
  a->syncs -= b->syncs;
  a->launches -= b->launches;
  a->recorded -= b->recorded;
}
