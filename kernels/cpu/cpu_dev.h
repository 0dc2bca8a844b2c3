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
  int isa;              /* VS_ISA_* of the hand-written kernels (cpu_isa.h) */
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
  unsigned scratch_gen;     /* scratch reallocations so far: a graph recorded before the last
                             * one is refused at launch, as on CUDA (cpu_graph.c) */
};

/* ---- the device's memory (cpu_dev.c: a leaf, the other files call it and it calls none) -- */

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

/* A block for weights that decoding streams (a model's tensors, their bf16 copies): when it
 * spans at least one 2 MiB page it starts on a 2 MiB boundary and asks for transparent huge
 * pages (see cpu_dev.c). Contents undefined, free() frees it; NULL when out of memory. The
 * pages are given at first touch, so fill the block right away. */
void *vs_cpu_weight_alloc(size_t bytes);
/* The block of the alloc ops: VS_CPU_ALIGN-aligned, rounded up to it, a distinct pointer for
 * zero bytes; fill is the byte every new block starts with (0: a weight block, on huge pages
 * as above), or -1 to leave it as malloc gives it. NULL when out of memory. */
void *vs_cpu_block_alloc(size_t bytes, int fill);

/* Rounds up to the scratch alignment, for carving several arrays out of one scratch. */
static inline size_t vs_align_up(size_t n) { return (n + VS_CPU_ALIGN - 1) & ~(VS_CPU_ALIGN - 1); }

/* ---- op implementations (one file per concept) --------------------------------------- */

/* vs_cpu_<op> for every op of include/vspec/ops_list.h, with the op's signature:
 *   cpu_memory.c     alloc, free, upload, download, copy, copy3d, alloc_uninit
 *   cpu_dev.c        reserve_scratch
 *   cpu_gemm.c       gemm, linear, weight_format
 *   cpu_norm.c       rmsnorm, groupnorm, layernorm
 *   cpu_elementwise.c silu, swiglu, gelu_tanh, add, cfg_combine, gelu, mul
 *   cpu_rope.c       rope2d_table, rope_apply
 *   cpu_attention.c  attention
 *   cpu_sampling.c   softmax, log_softmax, logits_to_probs, sample, argmax, sample_tokens,
 *                    draw_probs, draw_children
 *   cpu_conv.c       conv2d, upsample_nearest2x
 *   cpu_fused.c      the ABI 1.4 fused ops, each the sequence of the ops it replaces
 *                    (sample_tokens: cpu_sampling.c)
 *   cpu_graph.c      graph_begin, graph_end, graph_launch, graph_free
 *   cpu_walk.c       verify_walk (the engine's host walk, with kernels/common/vs_walk_rules.h)
 * The table (cpu_ops.c) points at these, except for the ops a graph records (below). */
#define VS_CPU_DECLARE(ret, name, params, args, minor, kind) ret vs_cpu_##name params;
VSPEC_OPS(VS_CPU_DECLARE)
#undef VS_CPU_DECLARE

/* cpu_gemm.c */
/* Nonzero when BLIS runs kernels tuned for this CPU, zero when its CPU detection fell
 * back to the portable reference kernels (BLIS 0.9 on CPUs newer than it knows). */
int vs_blis_tuned(void);
/* The one matrix product of the CPU ops (row-major, BLAS argument meanings): a few rows
 * times a transposed matrix go to the skinny kernel (cpu_linear_skinny.h), the rest to
 * single-threaded BLIS calls, large products split into row or column blocks over the
 * device's pool (cpu_gemm.c says why). */
void vs_sgemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

/* cpu_device.c: the device itself (open, close, info) */
/* Test and benchmark hook: makes `dev` use the kernels of `isa` (VS_ISA_*, cpu_isa.h), with
 * that instruction set's threshold. Returns
 * VSPEC_OK, VSPEC_ENOTSUP when this CPU lacks it, VSPEC_EINVAL for an unknown value.
 * A new device uses vs_isa_best(), capped by the environment variable VSPEC_CPU_ISA
 * (scalar, avx2, avx512) when that is set. */
int vs_cpu_set_isa(vspec_dev *dev, int isa);

/* cpu_graph.c: ABI 1.5 graphs by recording (the ops a fused forward issues), and the rest
 * of the table refusing to be recorded */
/* Nonzero while dev records; then an op that is not recorded calls vs_cpu_graph_refuse,
 * which fails the recording (VSPEC_ENOTSUP). Both inline here rather than in cpu_graph.c:
 * every op refuses, and cpu_graph.c replays ops, so the ops must not call into that file. */
static inline int vs_cpu_recording(const vspec_dev *dev) { return dev && dev->rec; }
static inline void vs_cpu_graph_refuse(vspec_dev *dev, const char *op) {
  (void)op; /* the status says it; the caller falls back to eager ops */
  if (dev->rec_status == VSPEC_OK) dev->rec_status = VSPEC_ENOTSUP;
}
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
void vs_cpu_rec_draw_probs(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                           float *probs, int32_t *tokens);
void vs_cpu_rec_norm_qkv_rope_batch(vspec_dev *dev, const float *x, int dim,
                                    const float *norm_w, float eps, const float *wqkv,
                                    const int32_t *pos, const float *rope_table,
                                    const vspec_kv_batch *b, float *qkv);
void vs_cpu_rec_tree_attention_batch(vspec_dev *dev, const float *qkv, const vspec_kv_batch *b,
                                     float *out);

#endif /* VS_CPU_DEV_H */
