/*
 * vspec/ops.h - the compute ops table: one struct of function pointers per device.
 *
 * Model code (backend plugins, the engine) is written once against this table and runs
 * on every device that provides one. The host hands the table to plugins through
 * vspec_host.ops; plugins never link a BLAS or CUDA themselves.
 *
 * Conventions for every op:
 *  - `dev` is the device context of the calling worker thread (scratch arena, thread
 *    count, later a CUDA stream). Ops are not reentrant on one `dev`; each worker has its
 *    own.
 *  - Pointers to float data are device pointers obtained from `alloc` (on the CPU device
 *    these are ordinary host pointers). Integer index arrays (positions, masks) are host
 *    pointers unless stated otherwise.
 *  - Matrices are row-major. Linear-layer weights are stored PyTorch style, [out, in].
 *  - Ops do not allocate on the hot path: temporary memory comes from the device's
 *    scratch arena, sized once at creation and grown outside the round loop by
 *    `reserve_scratch`.
 *
 * The table only grows at the end (check struct_size before using a newer entry; a plugin
 * built against ABI 1.1 gets a 1.1 table, because the host refuses plugins newer than
 * itself).
 */
#ifndef VSPEC_OPS_H
#define VSPEC_OPS_H

#include "vspec/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vspec_dev vspec_dev; /* device context, owned by the host */
typedef struct vspec_graph vspec_graph; /* ABI 1.5: a recorded sequence of ops (graph_end) */

typedef enum vspec_device_kind {
  VSPEC_DEVICE_CPU = 1,
  VSPEC_DEVICE_CUDA = 2
} vspec_device_kind;

/* ABI 1.4: one layer's KV cache as the fused ops see it. Keys of CFG row r, kv head h and
 * slot s start at k + ((r kv_heads + h) slots + s) head_dim, values likewise at v. Query head
 * q uses kv head q / (n_heads / kv_heads). The layout is fixed: a later op that needs more
 * takes another struct. */
typedef struct vspec_kv_cache {
  float *k, *v; /* device */
  int32_t rows, n_heads, kv_heads, head_dim, slots;
} vspec_kv_cache;

/* ABI 1.4: which cache slots each query of a forward sees (speculative trees). Slots
 * [0, committed) hold the accepted sequence; pending node p (forwarded since the last
 * commit) sits at slot committed + p. The forward's query i is pending node base + i, at slot
 * committed + base + i, and sees slot s < committed + base + n iff
 *   (s < committed, or s - committed is base + i or one of its ancestors by `parents`), and
 *   (s >= n_prefix, or prefix[s] != 0, or s is the query's own slot).
 * The prefix rule is LlamaGen's caption mask (t2i: padding slots hidden, the diagonal kept;
 * generate.py); a prefill is the chain parents[i] = i - 1 with committed = 0.
 * committed and base are device memory, read when the op runs, like every value that changes
 * from one step to the next: a recorded sequence of ops (a CUDA graph) then serves every step
 * whose shapes match. n may include padding nodes (parents -1): no real node has them as
 * ancestors, so nothing real sees them. */
typedef struct vspec_kv_tree_view {
  int32_t n;              /* queries per CFG row */
  int32_t n_prefix;       /* slots under the prefix rule (0: none) */
  const int32_t *lens;    /* device [2]: committed (slots of the accepted sequence), then base
                           * (the pending index of query 0) */
  const int32_t *parents; /* device [base + n]: pending index of the parent, or -1 */
  const uint8_t *prefix;  /* device [n_prefix], NULL when n_prefix is 0 */
} vspec_kv_tree_view;

/* ABI 1.4: how sample_tokens draws one token per node (LlamaGen generate.py sample; the same
 * rules as the engine's host sampler). */
typedef struct vspec_sample_spec {
  int32_t n;             /* nodes: logits [n, rows, vocab], node-major as a forward returns them */
  int32_t rows;          /* 1, or 2: the conditional row, then the unconditional one */
  int32_t vocab;
  int32_t top_k;         /* keep values >= the k-th largest (ties kept); 0 or >= vocab: off */
  float cfg_scale;       /* rows 2, guided node: uncond + cfg_scale (cond - uncond) */
  float temperature;     /* logits / max(temperature, 1e-5); <= 0: greedy, the first argmax */
  float top_p;           /* the smallest descending prefix crossing top_p; >= 1: off */
  const uint8_t *guided; /* [n]: 0 where a node is not guided (LlamaGen's cfg_interval: the
                          * conditional row alone); NULL: every node guided */
  const double *u;       /* [n]: each node's uniform in [0, 1) (not read when greedy) */
} vspec_sample_spec;

typedef struct vspec_ops {
  uint32_t struct_size; /* sizeof(vspec_ops) as built into the host */
  uint32_t device;      /* vspec_device_kind */
  const char *name;     /* "cpu", "cuda" */

  /* ---- memory ------------------------------------------------------------------- */
  /* Aligned device allocation (64 bytes on the CPU), zero-filled. NULL on failure. */
  void *(*alloc)(vspec_dev *dev, size_t bytes);
  void (*free)(vspec_dev *dev, void *ptr);
  /* Host <-> device copies; on the CPU device these are memcpy. */
  int (*upload)(vspec_dev *dev, void *dst, const void *src_host, size_t bytes);
  int (*download)(vspec_dev *dev, void *dst_host, const void *src, size_t bytes);
  /* Device-to-device copy (memmove semantics: regions may overlap). */
  int (*copy)(vspec_dev *dev, void *dst, const void *src, size_t bytes);
  /* Make sure at least `bytes` of scratch are available (call outside hot loops). */
  int (*reserve_scratch)(vspec_dev *dev, size_t bytes);

  /* ---- dense algebra -------------------------------------------------------------- */
  /* C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op(X) = X or X^T (trans != 0). */
  void (*gemm)(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
               const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
  /* y[m, n_out] = x[m, n_in] W^T + bias, with W [n_out, n_in] (PyTorch nn.Linear). bias may
   * be NULL. W is a weight: a whole allocation whose contents do not change while it is
   * allocated (a device may keep a converted copy of it, e.g. bf16 on a GPU). */
  void (*linear)(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                 const float *bias, float *y);

  /* ---- normalisation, activations, elementwise ---------------------------------- */
  /* y_i = x_i / sqrt(mean(x^2) + eps) * w_i per row (LlamaGen RMSNorm, fp32). y may equal x. */
  void (*rmsnorm)(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                  float *y);
  /* GroupNorm over one sample x[channels, hw]: groups of channels/groups consecutive
   * channels, biased variance, then per-channel affine gamma/beta. y may equal x. */
  void (*groupnorm)(vspec_dev *dev, const float *x, int channels, int hw, int groups, float eps,
                    const float *gamma, const float *beta, float *y);
  /* In place: x = x * sigmoid(x) (SiLU / swish). */
  void (*silu)(vspec_dev *dev, float *x, size_t n);
  /* y = silu(gate) * up (LlamaGen FeedForward). y may equal gate or up. */
  void (*swiglu)(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y);
  /* In place tanh-approximated GELU (LlamaGen caption MLP). */
  void (*gelu_tanh)(vspec_dev *dev, float *x, size_t n);
  /* y += x */
  void (*add)(vspec_dev *dev, float *y, const float *x, size_t n);

  /* ---- positions ------------------------------------------------------------------- */
  /* LlamaGen 2-D RoPE table (precompute_freqs_cis_2d): (n_cond + grid*grid) rows of
   * head_dim/2 (cos, sin) pairs. Condition rows are (0, 0); image token i = r*grid + c
   * rotates pair j < head_dim/4 by r*theta_j and pair j >= head_dim/4 by c*theta_{j-hd/4},
   * theta_k = base^(-4k/head_dim). Written to host memory `table` (float, 2 per pair). */
  void (*rope2d_table)(int n_cond, int grid, int head_dim, float base, float *table);
  /* Rotates interleaved pairs (x[2j], x[2j+1]) of every head of `rows` vectors in place.
   * Row r starts at x + r*row_stride and holds n_heads*head_dim values; it uses table row
   * pos[r] (host array). `table` is a device copy of rope2d_table's output. */
  void (*rope_apply)(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads, int head_dim,
                     const int32_t *pos, const float *table);

  /* ---- attention ------------------------------------------------------------------- */
  /* Multi-head attention of n_q queries over n_kv cache slots.
   *   q:    [n_q, q_stride], head h at q + i*q_stride + h*head_dim
   *   k, v: [n_kv_heads, slot_stride, head_dim] (slots of one head contiguous); only the
   *         first n_kv slots are read
   *   mask: host [n_q, n_kv] bytes, nonzero = may attend; NULL = every slot visible
   *   out:  [n_q, n_heads*head_dim]
   * Query head h uses kv head h / (n_heads / n_kv_heads) (repeat_interleave semantics).
   * Scale 1/sqrt(head_dim). A query row whose mask is all zero yields zeros. */
  void (*attention)(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                    int n_kv_heads, int head_dim, const float *k, const float *v, int slot_stride,
                    int n_kv, const uint8_t *mask, float *out);

  /* ---- distributions ----------------------------------------------------------------- */
  /* Row-wise in place, numerically stable; -INFINITY entries get probability 0. */
  void (*softmax)(vspec_dev *dev, float *x, int rows, int n);
  void (*log_softmax)(vspec_dev *dev, float *x, int rows, int n);
  /* out = uncond + scale * (cond - uncond). out may alias either input. */
  void (*cfg_combine)(vspec_dev *dev, const float *cond, const float *uncond, size_t n, float scale,
                      float *out);
  /* LlamaGen's logit processing then softmax (generate.py sample):
   *   l = logits / max(temperature, 1e-5); top_k > 0 keeps values >= the k-th largest
   *   (ties kept); top_p < 1 keeps the smallest descending prefix whose cumulative softmax
   *   first crosses top_p (the crossing token kept); probs = softmax(l).
   * temperature <= 0 means greedy: probs is one-hot at the first argmax.
   * Returns the number of tokens with nonzero probability. */
  int (*logits_to_probs)(vspec_dev *dev, const float *logits, int n, float temperature, int top_k,
                         float top_p, float *probs);
  /* Inverse-CDF draw: the first i with cumsum(probs)[i] > u * sum(probs); u in [0, 1).
   * Zero-probability entries are never returned. Host pointer probs on the CPU. */
  int (*sample)(vspec_dev *dev, const float *probs, int n, double u);
  /* Index of the first maximum. */
  int (*argmax)(vspec_dev *dev, const float *x, int n);

  /* ---- images -------------------------------------------------------------------------- */
  /* 2-D convolution of one sample x[cin, h, w] with weight [cout, cin, kh, kw] and optional
   * bias[cout]; zero padding pad_top/left/bottom/right; output [cout, ho, wo] with
   * ho = (h + pt + pb - kh)/stride + 1. */
  void (*conv2d)(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                 const float *bias, int cout, int kh, int kw, int stride, int pad_top, int pad_left,
                 int pad_bottom, int pad_right, float *y);
  /* Nearest-neighbour x2: y[c, 2h, 2w], y[c][i][j] = x[c][i/2][j/2]. */
  void (*upsample_nearest2x)(vspec_dev *dev, const float *x, int channels, int h, int w, float *y);

  /* ---- ABI 1.1 ------------------------------------------------------------------------ */
  /* Strided block copy on the device: for a < na and b < nb, the `width` bytes at
   * src + a*src_a + b*src_b go to dst + a*dst_a + b*dst_b (strides in bytes). Blocks must
   * not overlap. One call does what na*nb `copy` calls would (the KV-cache stores of a
   * forward), which on a GPU is one launch instead of hundreds. */
  int (*copy3d)(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                size_t src_a, size_t src_b, size_t width, int na, int nb);
  /* LayerNorm per row (PyTorch nn.LayerNorm): (x - mean) / sqrt(biased var + eps), then
   * times w and plus b when given (either may be NULL: no affine). y may equal x. */
  void (*layernorm)(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                    int dim, float eps, float *y);
  /* In place exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (PyTorch nn.GELU(), timm's MLPs). */
  void (*gelu)(vspec_dev *dev, float *x, size_t n);
  /* y *= x elementwise. */
  void (*mul)(vspec_dev *dev, float *y, const float *x, size_t n);
  /* ---- ABI 1.2 ------------------------------------------------------------------------ */
  /* Asks that `linear` multiply by the weight w [n_out, n_in] (as `linear` takes it: the start
   * of memory from `alloc` or from tensors_get_f32) in `format` whenever the device runs at a
   * precision below fp32; at fp32 every weight stays fp32. VSPEC_WEIGHTS_INT8 adds a request,
   * VSPEC_WEIGHTS_DEFAULT withdraws one made earlier: a backend withdraws each of its requests
   * before it lets the weight go (unload), because requests belong to the memory and models
   * that share it (the same file opened twice) share the format while one stands. Call at load
   * and unload, not while forwards run. VSPEC_OK when this device will use the format (a CPU
   * with AMX-INT8 at bf16 precision) or the request was withdrawn, VSPEC_ENOTSUP when it
   * keeps its own precision for this weight (the request still counts: another device of the
   * process may use it), VSPEC_EINVAL for a bad argument. NULL on devices with one format. */
  int (*weight_format)(vspec_dev *dev, const float *w, int n_out, int n_in, int format);
  /* ---- ABI 1.3 ------------------------------------------------------------------------ */
  /* As alloc, but the contents are unspecified (not zero-filled): for buffers that are only
   * read where they were written first, such as KV caches (attention never reads a masked
   * slot) and activations. A session of a speculative job is sized for the largest tree, and
   * zero-filling its megabytes was a twentieth of a job on a small model. Free with `free`.
   * NULL where zero-filling costs nothing extra: use alloc then. */
  void *(*alloc_uninit)(vspec_dev *dev, size_t bytes);
  /* ---- ABI 1.4: fused ops --------------------------------------------------------------- */
  /* A transformer decode step in five ops per layer plus three, where the ops above take
   * 12 + 3 x rows per layer plus 2 per node and row: on a GPU each op is at least one kernel
   * launch, microseconds that a step at the memory-bandwidth bound cannot afford. Each does
   * what the sequence of ops named in its comment does, with the same numbers on the CPU.
   * Integer and byte arrays here (idx, pos, parents, prefix) are device memory from `alloc`
   * (ordinary host memory on the CPU), so that a forward uploads them once. NULL on a device
   * without them: use the unfused ops then (vspec_has_fused_ops). */
  /* dst[i, :] = src[idx[i], :] for i < n, rows of dim floats (embedding and head-row
   * gathers). dst must not overlap src. */
  void (*gather_rows)(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                      float *dst);
  /* y[i, :] = rmsnorm(x[idx[i], :]) * w, as gather_rows then rmsnorm. y must not overlap x. */
  void (*rmsnorm_rows)(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                       const float *w, float eps, float *y);
  /* y[m, n_out] += x[m, n_in] W^T (a linear layer into a residual stream): linear into a
   * temporary, then add. y must not overlap x. */
  void (*linear_add)(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                     float *y);
  /* y[m, hidden] = silu(h W1^T) * (h W3^T) with h = rmsnorm(x[m, dim]) * norm_w (LlamaGen's
   * FeedForward after ffn_norm): rmsnorm, linear w1, linear w3, swiglu. */
  void (*norm_swiglu)(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                      float eps, const float *w1, const float *w3, int hidden, float *y);
  /* Attention's input for m = kv->rows x n rows of x, ordered (CFG row, node): qkv[m, qkv_w]
   * = rmsnorm(x) * norm_w times wqkv^T (qkv_w = (n_heads + 2 kv_heads) head_dim: q, then k,
   * then v), q and k rotated by rope_apply with table row pos[i], then the keys and values
   * of node j of CFG row r stored at cache slot slots[j] (vspec_kv_cache; slots is device
   * memory [n], the same for every CFG row). norm_w NULL: no norm, x itself is multiplied
   * (EAGLE's first layer has no input norm). */
  void (*norm_qkv_rope)(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                        float eps, const float *wqkv, const int32_t *pos,
                        const float *rope_table, const vspec_kv_cache *kv,
                        const int32_t *slots, float *qkv);
  /* Attention of a forward's nodes over the cache, every CFG row and head in one op: query
   * rows come from qkv as norm_qkv_rope wrote them (row r, node i at qkv + (r n + i) qkv_w),
   * out[(r n + i), n_heads head_dim] as `attention` writes it, with the visibility of
   * vspec_kv_tree_view instead of a byte mask. */
  void (*tree_attention)(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                         const vspec_kv_tree_view *tree, float *out);
  /* A token per node from its logits on the device, as the engine's host sampler would
   * draw it: CFG mix, temperature, top-k, top-p, softmax, then the inverse-CDF draw at u[i]
   * (logits_to_probs, sample; greedy: the first maximum). logits [n, rows, vocab] and
   * tokens [n] are device memory, as are spec->guided and spec->u (spec itself is host
   * memory). A node whose distribution has no mass gets -1. An AR step downloads n tokens
   * instead of n x rows x vocab logits. */
  void (*sample_tokens)(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                        int32_t *tokens);
  /* ---- ABI 1.5: graphs ------------------------------------------------------------------ */
  /* A recorded sequence of ops replayed with one call: on a GPU one graph launch instead of
   * a launch per kernel (CUDA graphs: cudaStreamBeginCapture .. cudaGraphLaunch). The
   * semantics are CUDA's on every device: between graph_begin and graph_end the ops called on
   * `dev` are recorded, NOT executed; graph_launch executes them, with the arguments they
   * were recorded with. Pointers are kept, never what they point to: a replay reads device
   * memory as it is when it runs, so whatever changes from one replay to the next must be
   * device memory written before the launch (one upload), never an argument by value, a
   * host array or a struct's field (vspec_kv_tree_view.lens, not a count in the struct).
   * The structs passed by pointer (vspec_kv_cache, vspec_kv_tree_view, vspec_sample_spec)
   * are copied when recorded. Transfers (upload, download), copies and memory management
   * do not belong in a graph: make them before graph_begin or after graph_launch. A device
   * may refuse to record some op (the CPU records the fused ops of ABI 1.4 and `linear`,
   * what a fused forward issues): the op is then neither recorded nor run and graph_end
   * fails, so the caller runs the same ops again without a graph. NULL on a device without
   * graphs (vspec_has_graphs). A graph belongs to the device context that recorded it and is
   * launched there only; launches of one graph on one context run in order. */
  /* Starts recording on dev. VSPEC_EBUSY while a recording is open on it. */
  int (*graph_begin)(vspec_dev *dev);
  /* Stops recording; on success *graph is the new graph (free it with graph_free). A
   * negative status (*graph NULL) when the recording failed: an op the device cannot record
   * (VSPEC_ENOTSUP), one that would have had to allocate or wait (VSPEC_EBUSY), no recording
   * open (VSPEC_EINVAL). Either way dev is no longer recording. */
  int (*graph_end)(vspec_dev *dev, vspec_graph **graph);
  /* Runs a graph's ops on dev, asynchronously on a GPU like any op. VSPEC_ENOENT for a NULL
   * graph (none recorded for this shape yet), VSPEC_EBUSY while recording. */
  int (*graph_launch)(vspec_dev *dev, vspec_graph *graph);
  /* Frees a graph (NULL: nothing); its launches may still be queued on a GPU. */
  void (*graph_free)(vspec_dev *dev, vspec_graph *graph);
} vspec_ops;

/* Formats for weight_format. */
enum {
  VSPEC_WEIGHTS_DEFAULT = 0, /* the device's precision: withdraws an earlier request */
  VSPEC_WEIGHTS_INT8 = 1     /* int8 per output channel (scale = max |row| / 127); activations
                              * quantised per row when the product runs */
};

/* alloc_uninit where the device has it and the host's table is recent enough, else alloc. */
static inline void *vspec_alloc_uninit(const vspec_ops *ops, vspec_dev *dev, size_t bytes) {
  if (VSPEC_HAS_FIELD(ops, vspec_ops, alloc_uninit) && ops->alloc_uninit)
    return ops->alloc_uninit(dev, bytes);
  return ops->alloc(dev, bytes);
}

/* Whether a device (and the host's table) has every fused op of ABI 1.4. */
static inline int vspec_has_fused_ops(const vspec_ops *ops) {
  return VSPEC_HAS_FIELD(ops, vspec_ops, tree_attention) && ops->gather_rows &&
         ops->rmsnorm_rows && ops->linear_add && ops->norm_swiglu && ops->norm_qkv_rope &&
         ops->tree_attention;
}

/* Whether a device (and the host's table) records and replays graphs (ABI 1.5). */
static inline int vspec_has_graphs(const vspec_ops *ops) {
  return VSPEC_HAS_FIELD(ops, vspec_ops, graph_free) && ops->graph_begin && ops->graph_end &&
         ops->graph_launch && ops->graph_free;
}

#ifdef __cplusplus
}
#endif
#endif /* VSPEC_OPS_H */
