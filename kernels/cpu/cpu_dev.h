/*
 * kernels/cpu/cpu_dev.h - the CPU device context and the internal op entry points.
 *
 * Internal to the compute layer: plugins only ever see `vspec_dev` as an opaque pointer.
 */
#ifndef VS_CPU_DEV_H
#define VS_CPU_DEV_H

#include <stddef.h>

#include "kernels/vs_kernels.h"

/* Scratch a fresh device starts with. Big enough for every op at LlamaGen/MAR sizes
 * (attention score tiles, the conv im2col tile, sampling index arrays) so that the
 * engine never has to call reserve_scratch for the shipped models. */
#define VS_CPU_SCRATCH_DEFAULT ((size_t)16 << 20)

/* Alignment of alloc() and of the scratch base: one cache line, and enough for AVX-512. */
#define VS_CPU_ALIGN ((size_t)64)

struct vs_pool;

struct vspec_dev {
  vs_dev_head head;     /* first: the host reads the class and ops table through it */
  int threads;          /* compute threads, >= 1 (vs_dev_create resolves 0 to online cores) */
  struct vs_pool *pool; /* threads - 1 persistent helpers (cpu_threads.h) */
  int isa;              /* VS_ISA_* of the hand-written kernels (cpu_linear_skinny.h) */
  int skinny_max_m;     /* products A B^T with at most this many rows skip BLIS */
  int precision;        /* VS_PRECISION_FP32, or VS_PRECISION_BF16: linear layers with bf16
                         * copies of the weights, on AMX tiles (cpu_linear_amx.h) or widened
                         * in fp32 FMAs (cpu_linear_bf16.h) */
  int amx;              /* AMX tiles usable (with isa == VS_ISA_AVX512) */
  int amx_int8;         /* and AMX-INT8: weights marked for int8 use it (cpu_linear_amx8.h) */
  void *scratch;        /* VS_CPU_ALIGN-aligned, contents undefined between ops */
  size_t scratch_bytes;
  void *fused;          /* the fused ops' temporaries (vs_fused_scratch), VS_CPU_ALIGN-aligned */
  size_t fused_bytes;
  struct vs_cpu_graph *rec; /* the graph being recorded (ABI 1.5, cpu_graph.c), or NULL */
  int rec_status;           /* VSPEC_OK, or why the recording failed */
};

/* Returns the scratch base with at least `bytes` available. Ops size their tiles from
 * vs_scratch_size() first, so this only grows the arena when a single minimal tile (one
 * row of attention scores, one output row of im2col, ...) does not fit - a shape far
 * beyond the shipped models. Growing is a malloc on the hot path, which the ops contract
 * wants to avoid, hence it is the last resort; when even that fails there is no way to
 * report an error through a void op, so the process aborts with a message. */
void *vs_scratch(vspec_dev *dev, size_t bytes);
size_t vs_scratch_size(const vspec_dev *dev);

/* A second arena, for the temporaries of a fused op (cpu_fused.c): a fused op is a sequence
 * of the ops above, and they clobber `scratch` (linear, attention), so what one inner op
 * hands the next cannot live there. Returns its base with at least `bytes` available, grown
 * on first use and when a larger shape comes (contents are not kept: each fused op asks once,
 * for all of its temporaries, before it writes any); aborts like vs_scratch when growing
 * fails. Freed with the device. */
void *vs_fused_scratch(vspec_dev *dev, size_t bytes);

/* Rounds up to the scratch alignment, for carving several arrays out of one scratch. */
static inline size_t vs_align_up(size_t n) { return (n + VS_CPU_ALIGN - 1) & ~(VS_CPU_ALIGN - 1); }

/* ---- op implementations (one file per concept) --------------------------------------- */

/* cpu_dev.c */
void *vs_cpu_alloc(vspec_dev *dev, size_t bytes);
void *vs_cpu_alloc_uninit(vspec_dev *dev, size_t bytes);
void vs_cpu_free(vspec_dev *dev, void *ptr);
int vs_cpu_upload(vspec_dev *dev, void *dst, const void *src_host, size_t bytes);
int vs_cpu_download(vspec_dev *dev, void *dst_host, const void *src, size_t bytes);
int vs_cpu_copy(vspec_dev *dev, void *dst, const void *src, size_t bytes);
int vs_cpu_reserve_scratch(vspec_dev *dev, size_t bytes);
int vs_cpu_copy3d(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                  size_t src_a, size_t src_b, size_t width, int na, int nb);

/* cpu_gemm.c */
void vs_cpu_gemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
void vs_cpu_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                   const float *bias, float *y);
/* Nonzero when BLIS runs kernels tuned for this CPU, zero when its CPU detection fell
 * back to the portable reference kernels (BLIS 0.9 on CPUs newer than it knows). */
int vs_blis_tuned(void);
/* The one matrix product of the CPU ops (row-major, BLAS argument meanings): a few rows
 * times a transposed matrix go to the skinny kernel (cpu_linear_skinny.h), the rest to
 * single-threaded BLIS calls, large products split into row or column blocks over the
 * device's pool (cpu_gemm.c says why). */
void vs_sgemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

int vs_cpu_weight_format(vspec_dev *dev, const float *w, int n_out, int n_in, int format);

/* cpu_norm.c */
void vs_cpu_rmsnorm(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                    float *y);
void vs_cpu_groupnorm(vspec_dev *dev, const float *x, int channels, int hw, int groups, float eps,
                      const float *gamma, const float *beta, float *y);

/* cpu_elementwise.c */
void vs_cpu_gelu(vspec_dev *dev, float *x, size_t n);
void vs_cpu_mul(vspec_dev *dev, float *y, const float *x, size_t n);
void vs_cpu_layernorm(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                      int dim, float eps, float *y);
void vs_cpu_silu(vspec_dev *dev, float *x, size_t n);
void vs_cpu_swiglu(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y);
void vs_cpu_gelu_tanh(vspec_dev *dev, float *x, size_t n);
void vs_cpu_add(vspec_dev *dev, float *y, const float *x, size_t n);
void vs_cpu_cfg_combine(vspec_dev *dev, const float *cond, const float *uncond, size_t n,
                        float scale, float *out);

/* cpu_rope.c */
void vs_cpu_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table);
void vs_cpu_rope_apply(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads,
                       int head_dim, const int32_t *pos, const float *table);

/* cpu_attention.c */
void vs_cpu_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                      int n_kv_heads, int head_dim, const float *k, const float *v,
                      int slot_stride, int n_kv, const uint8_t *mask, float *out);

/* cpu_sampling.c */
void vs_cpu_softmax(vspec_dev *dev, float *x, int rows, int n);
void vs_cpu_log_softmax(vspec_dev *dev, float *x, int rows, int n);
int vs_cpu_logits_to_probs(vspec_dev *dev, const float *logits, int n, float temperature,
                           int top_k, float top_p, float *probs);
int vs_cpu_sample(vspec_dev *dev, const float *probs, int n, double u);
int vs_cpu_argmax(vspec_dev *dev, const float *x, int n);

/* cpu_fused.c: the ABI 1.4 fused ops, each the sequence of the ops above it replaces */
void vs_cpu_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                        float *dst);
void vs_cpu_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                         const float *w, float eps, float *y);
void vs_cpu_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                       int n_out, float *y);
void vs_cpu_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                        float eps, const float *w1, const float *w3, int hidden, float *y);
void vs_cpu_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                          float eps, const float *wqkv, const int32_t *pos,
                          const float *rope_table, const vspec_kv_cache *kv, const int32_t *slots,
                          float *qkv);
void vs_cpu_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                           const vspec_kv_tree_view *tree, float *out);
void vs_cpu_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                          int32_t *tokens);

/* cpu_graph.c: ABI 1.5 graphs by recording (the ops a fused forward issues), and the rest
 * of the table refusing to be recorded */
int vs_cpu_graph_begin(vspec_dev *dev);
int vs_cpu_graph_end(vspec_dev *dev, vspec_graph **graph);
int vs_cpu_graph_launch(vspec_dev *dev, vspec_graph *graph);
void vs_cpu_graph_free(vspec_dev *dev, vspec_graph *graph);
/* Nonzero while dev records; then an op that is not recorded calls vs_cpu_graph_refuse,
 * which fails the recording (VSPEC_ENOTSUP, the op's name logged once). */
static inline int vs_cpu_recording(const vspec_dev *dev) { return dev && dev->rec; }
void vs_cpu_graph_refuse(vspec_dev *dev, const char *op);
/* First statement of every op that is not recorded: while recording it is neither recorded
 * nor run (as a CUDA capture that met a host copy), and the recording fails. */
#define VS_CPU_UNRECORDED(dev, name)                                                           \
  do {                                                                                         \
    if (vs_cpu_recording(dev)) {                                                               \
      vs_cpu_graph_refuse((dev), (name));                                                      \
      return;                                                                                  \
    }                                                                                          \
  } while (0)
#define VS_CPU_UNRECORDED_RC(dev, name, rc)                                                    \
  do {                                                                                         \
    if (vs_cpu_recording(dev)) {                                                               \
      vs_cpu_graph_refuse((dev), (name));                                                      \
      return (rc);                                                                             \
    }                                                                                          \
  } while (0)
/* The table's entries for the recordable ops: record while recording, else run. */
void vs_cpu_rec_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                       int n_out, const float *bias, float *y);
void vs_cpu_rec_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n,
                            int dim, float *dst);
void vs_cpu_rec_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                             const float *w, float eps, float *y);
void vs_cpu_rec_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                           int n_out, float *y);
void vs_cpu_rec_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                            float eps, const float *w1, const float *w3, int hidden, float *y);
void vs_cpu_rec_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim,
                              const float *norm_w, float eps, const float *wqkv,
                              const int32_t *pos, const float *rope_table,
                              const vspec_kv_cache *kv, const int32_t *slots, float *qkv);
void vs_cpu_rec_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                               const vspec_kv_tree_view *tree, float *out);
void vs_cpu_rec_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                              int32_t *tokens);

/* cpu_conv.c */
void vs_cpu_conv2d(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                   const float *bias, int cout, int kh, int kw, int stride, int pad_top,
                   int pad_left, int pad_bottom, int pad_right, float *y);
void vs_cpu_upsample_nearest2x(vspec_dev *dev, const float *x, int channels, int h, int w,
                               float *y);

#endif /* VS_CPU_DEV_H */
