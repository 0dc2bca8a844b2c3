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

typedef enum vspec_device_kind {
  VSPEC_DEVICE_CPU = 1,
  VSPEC_DEVICE_CUDA = 2
} vspec_device_kind;

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

#ifdef __cplusplus
}
#endif
#endif /* VSPEC_OPS_H */
