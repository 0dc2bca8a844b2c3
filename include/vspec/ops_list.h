/*
 * vspec/ops_list.h - the ops of the table, once: every op's signature and doc comment, in
 * table order. include/vspec/ops.h generates struct vspec_ops from it, each device its
 * declarations and its table (kernels/cpu/cpu_dev.h and cpu_ops.c, kernels/cuda/cuda_dev.h
 * and cuda_ops.cu), and kernels/op_counts.c its counting wrappers.
 *
 * VSPEC_OPS(X) calls X once per op, in the order of the members of vspec_ops:
 *
 *   X(ret, name, params, args, minor, kind)
 *
 *   ret     the return type
 *   name    the member's name
 *   params  the parameter list, parenthesised: (vspec_dev *dev, float *x, size_t n)
 *   args    the same names as arguments, parenthesised: (dev, x, n) (a wrapper's call)
 *   minor   the ABI minor version (1.minor) that appended the op
 *   kind    what the counting table (kernels/op_counts.c) does with it:
 *             op         an op: counted, one per call (on a GPU, a launch)
 *             op_ret     the same, for an op that returns a value (a status, an index)
 *             graph      graph_begin, graph_end, graph_launch: counted by hand there
 *             uncounted  not work: memory management, transfers (counted by each device
 *                        where it makes them), what runs on the host alone
 *
 * The table only grows at the end: a new op is appended after the last entry, under a
 * marker of the ABI version that adds it (VSPEC_ABI_MINOR in plugin.h goes up with it), with
 * minor set to that version; nothing above the last entry moves or changes, since plugins
 * built against an older minor read the members they know at their offsets
 * (tests/test_ops_abi.c checks the layout and the order of minor). A device without an op
 * leaves its entry NULL (its ops file says which); what the callers do then is in the op's
 * comment.
 */
#ifndef VSPEC_OPS_LIST_H
#define VSPEC_OPS_LIST_H

/* clang-format off */
#define VSPEC_OPS(X)                                                                               \
  /* ==== ABI 1.0 ==================================================================== */          \
  /* ---- memory ------------------------------------------------------------------- */            \
  /* Aligned device allocation (64 bytes on the CPU), zero-filled. NULL on failure. */             \
  X(void *, alloc, (vspec_dev *dev, size_t bytes), (dev, bytes), 0, uncounted)                     \
  X(void, free, (vspec_dev *dev, void *ptr), (dev, ptr), 0, uncounted)                             \
  /* Host <-> device copies; on the CPU device these are memcpy. upload queues its copy and        \
   * does not wait for the device: src_host may change once it returns, and the work queued        \
   * after it on dev sees the data. download waits for its copy, and so for the work queued        \
   * before it: the host's one way to wait for a result. */                                        \
  X(int, upload, (vspec_dev *dev, void *dst, const void *src_host, size_t bytes),                  \
    (dev, dst, src_host, bytes), 0, uncounted)                                                     \
  X(int, download, (vspec_dev *dev, void *dst_host, const void *src, size_t bytes),                \
    (dev, dst_host, src, bytes), 0, uncounted)                                                     \
  /* Device-to-device copy (memmove semantics: regions may overlap). */                            \
  X(int, copy, (vspec_dev *dev, void *dst, const void *src, size_t bytes),                         \
    (dev, dst, src, bytes), 0, op_ret)                                                             \
  /* Make sure at least `bytes` of scratch are available (call outside hot loops). */              \
  X(int, reserve_scratch, (vspec_dev *dev, size_t bytes), (dev, bytes), 0, uncounted)              \
                                                                                                   \
  /* ---- dense algebra -------------------------------------------------------------- */          \
  /* C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op(X) = X or X^T (trans != 0). */         \
  X(void, gemm,                                                                                    \
    (vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,                   \
     const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc),             \
    (dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), 0, op)                  \
  /* y[m, n_out] = x[m, n_in] W^T + bias, with W [n_out, n_in] (PyTorch nn.Linear). bias may       \
   * be NULL. W is a weight: a whole allocation whose contents do not change while it is           \
   * allocated (a device may keep a converted copy of it, e.g. bf16 on a GPU). */                  \
  X(void, linear,                                                                                  \
    (vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,                   \
     const float *bias, float *y),                                                                 \
    (dev, x, m, n_in, w, n_out, bias, y), 0, op)                                                   \
                                                                                                   \
  /* ---- normalisation, activations, elementwise ---------------------------------- */            \
  /* y_i = x_i / sqrt(mean(x^2) + eps) * w_i per row (LlamaGen RMSNorm, fp32). y may equal x. */   \
  X(void, rmsnorm,                                                                                 \
    (vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps, float *y),      \
    (dev, x, w, rows, dim, eps, y), 0, op)                                                         \
  /* GroupNorm over one sample x[channels, hw]: groups of channels/groups consecutive              \
   * channels, biased variance, then per-channel affine gamma/beta. y may equal x. */              \
  X(void, groupnorm,                                                                               \
    (vspec_dev *dev, const float *x, int channels, int hw, int groups, float eps,                  \
     const float *gamma, const float *beta, float *y),                                             \
    (dev, x, channels, hw, groups, eps, gamma, beta, y), 0, op)                                    \
  /* In place: x = x * sigmoid(x) (SiLU / swish). */                                               \
  X(void, silu, (vspec_dev *dev, float *x, size_t n), (dev, x, n), 0, op)                          \
  /* y = silu(gate) * up (LlamaGen FeedForward). y may equal gate or up. */                        \
  X(void, swiglu, (vspec_dev *dev, const float *gate, const float *up, size_t n, float *y),        \
    (dev, gate, up, n, y), 0, op)                                                                  \
  /* In place tanh-approximated GELU (LlamaGen caption MLP). */                                    \
  X(void, gelu_tanh, (vspec_dev *dev, float *x, size_t n), (dev, x, n), 0, op)                     \
  /* y += x */                                                                                     \
  X(void, add, (vspec_dev *dev, float *y, const float *x, size_t n), (dev, y, x, n), 0, op)        \
                                                                                                   \
  /* ---- positions ------------------------------------------------------------------- */         \
  /* LlamaGen 2-D RoPE table (precompute_freqs_cis_2d): (n_cond + grid*grid) rows of               \
   * head_dim/2 (cos, sin) pairs. Condition rows are (0, 0); image token i = r*grid + c            \
   * rotates pair j < head_dim/4 by r*theta_j and pair j >= head_dim/4 by c*theta_{j-hd/4},        \
   * theta_k = base^(-4k/head_dim). Written to host memory `table` (float, 2 per pair). */         \
  X(void, rope2d_table, (int n_cond, int grid, int head_dim, float base, float *table),            \
    (n_cond, grid, head_dim, base, table), 0, uncounted)                                           \
  /* Rotates interleaved pairs (x[2j], x[2j+1]) of every head of `rows` vectors in place.          \
   * Row r starts at x + r*row_stride and holds n_heads*head_dim values; it uses table row         \
   * pos[r] (host array). `table` is a device copy of rope2d_table's output. */                    \
  X(void, rope_apply,                                                                              \
    (vspec_dev *dev, float *x, int rows, int row_stride, int n_heads, int head_dim,                \
     const int32_t *pos, const float *table),                                                      \
    (dev, x, rows, row_stride, n_heads, head_dim, pos, table), 0, op)                              \
                                                                                                   \
  /* ---- attention ------------------------------------------------------------------- */         \
  /* Multi-head attention of n_q queries over n_kv cache slots.                                    \
   *   q:    [n_q, q_stride], head h at q + i*q_stride + h*head_dim                                \
   *   k, v: [n_kv_heads, slot_stride, head_dim] (slots of one head contiguous); only the          \
   *         first n_kv slots are read                                                             \
   *   mask: host [n_q, n_kv] bytes, nonzero = may attend; NULL = every slot visible               \
   *   out:  [n_q, n_heads*head_dim]                                                               \
   * Query head h uses kv head h / (n_heads / n_kv_heads) (repeat_interleave semantics).           \
   * Scale 1/sqrt(head_dim). A query row whose mask is all zero yields zeros. */                   \
  X(void, attention,                                                                               \
    (vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads, int n_kv_heads,           \
     int head_dim, const float *k, const float *v, int slot_stride, int n_kv,                      \
     const uint8_t *mask, float *out),                                                             \
    (dev, q, n_q, q_stride, n_heads, n_kv_heads, head_dim, k, v, slot_stride, n_kv, mask, out),    \
    0, op)                                                                                         \
                                                                                                   \
  /* ---- distributions ----------------------------------------------------------------- */       \
  /* Row-wise in place, numerically stable; -INFINITY entries get probability 0. */                \
  X(void, softmax, (vspec_dev *dev, float *x, int rows, int n), (dev, x, rows, n), 0, op)          \
  X(void, log_softmax, (vspec_dev *dev, float *x, int rows, int n), (dev, x, rows, n), 0, op)      \
  /* out = uncond + scale * (cond - uncond). out may alias either input. */                        \
  X(void, cfg_combine,                                                                             \
    (vspec_dev *dev, const float *cond, const float *uncond, size_t n, float scale, float *out),   \
    (dev, cond, uncond, n, scale, out), 0, op)                                                     \
  /* LlamaGen's logit processing then softmax (generate.py sample):                                \
   *   l = logits / max(temperature, 1e-5); top_k > 0 keeps values >= the k-th largest             \
   *   (ties kept); top_p < 1 keeps the smallest descending prefix whose cumulative softmax        \
   *   first crosses top_p (the crossing token kept); probs = softmax(l).                          \
   * temperature <= 0 means greedy: probs is one-hot at the first argmax.                          \
   * Returns the number of tokens with nonzero probability. */                                     \
  X(int, logits_to_probs,                                                                          \
    (vspec_dev *dev, const float *logits, int n, float temperature, int top_k, float top_p,        \
     float *probs),                                                                                \
    (dev, logits, n, temperature, top_k, top_p, probs), 0, op_ret)                                 \
  /* Inverse-CDF draw: the first i with cumsum(probs)[i] > u * sum(probs); u in [0, 1).            \
   * Zero-probability entries are never returned. Host pointer probs on the CPU. */                \
  X(int, sample, (vspec_dev *dev, const float *probs, int n, double u), (dev, probs, n, u), 0,     \
    op_ret)                                                                                        \
  /* Index of the first maximum. */                                                                \
  X(int, argmax, (vspec_dev *dev, const float *x, int n), (dev, x, n), 0, op_ret)                  \
                                                                                                   \
  /* ---- images -------------------------------------------------------------------------- */     \
  /* 2-D convolution of one sample x[cin, h, w] with weight [cout, cin, kh, kw] and optional       \
   * bias[cout]; zero padding pad_top/left/bottom/right; output [cout, ho, wo] with                \
   * ho = (h + pt + pb - kh)/stride + 1. */                                                        \
  X(void, conv2d,                                                                                  \
    (vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,                   \
     const float *bias, int cout, int kh, int kw, int stride, int pad_top, int pad_left,           \
     int pad_bottom, int pad_right, float *y),                                                     \
    (dev, x, cin, h, w, weight, bias, cout, kh, kw, stride, pad_top, pad_left, pad_bottom,         \
     pad_right, y),                                                                                \
    0, op)                                                                                         \
  /* Nearest-neighbour x2: y[c, 2h, 2w], y[c][i][j] = x[c][i/2][j/2]. */                           \
  X(void, upsample_nearest2x,                                                                      \
    (vspec_dev *dev, const float *x, int channels, int h, int w, float *y),                        \
    (dev, x, channels, h, w, y), 0, op)                                                            \
                                                                                                   \
  /* ==== ABI 1.1 ==================================================================== */          \
  /* Strided block copy on the device: for a < na and b < nb, the `width` bytes at                 \
   * src + a*src_a + b*src_b go to dst + a*dst_a + b*dst_b (strides in bytes). Blocks must         \
   * not overlap. One call does what na*nb `copy` calls would (the KV-cache stores of a            \
   * forward), which on a GPU is one launch instead of hundreds. */                                \
  X(int, copy3d,                                                                                   \
    (vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src, size_t src_a,         \
     size_t src_b, size_t width, int na, int nb),                                                  \
    (dev, dst, dst_a, dst_b, src, src_a, src_b, width, na, nb), 1, op_ret)                         \
  /* LayerNorm per row (PyTorch nn.LayerNorm): (x - mean) / sqrt(biased var + eps), then           \
   * times w and plus b when given (either may be NULL: no affine). y may equal x. */              \
  X(void, layernorm,                                                                               \
    (vspec_dev *dev, const float *x, const float *w, const float *b, int rows, int dim,            \
     float eps, float *y),                                                                         \
    (dev, x, w, b, rows, dim, eps, y), 1, op)                                                      \
  /* In place exact GELU: 0.5 x (1 + erf(x / sqrt 2)) (PyTorch nn.GELU(), timm's MLPs). */         \
  X(void, gelu, (vspec_dev *dev, float *x, size_t n), (dev, x, n), 1, op)                          \
  /* y *= x elementwise. */                                                                        \
  X(void, mul, (vspec_dev *dev, float *y, const float *x, size_t n), (dev, y, x, n), 1, op)        \
                                                                                                   \
  /* ==== ABI 1.2 ==================================================================== */          \
  /* Asks that `linear` multiply by the weight w [n_out, n_in] (as `linear` takes it: the start    \
   * of memory from `alloc` or from tensors_get_f32) in `format` whenever the device runs at a     \
   * precision below fp32; at fp32 every weight stays fp32. VSPEC_WEIGHTS_INT8 adds a request,     \
   * VSPEC_WEIGHTS_DEFAULT withdraws one made earlier: a backend withdraws each of its requests    \
   * before it lets the weight go (unload), because requests belong to the memory and models       \
   * that share it (the same file opened twice) share the format while one stands. Call at load    \
   * and unload, not while forwards run. VSPEC_OK when this device will use the format (a CPU      \
   * with AMX-INT8 at bf16 precision) or the request was withdrawn, VSPEC_ENOTSUP when it          \
   * keeps its own precision for this weight (the request still counts: another device of the      \
   * process may use it), VSPEC_EINVAL for a bad argument. NULL on devices with one format. */     \
  X(int, weight_format, (vspec_dev *dev, const float *w, int n_out, int n_in, int format),         \
    (dev, w, n_out, n_in, format), 2, uncounted)                                                   \
                                                                                                   \
  /* ==== ABI 1.3 ==================================================================== */          \
  /* As alloc, but the contents are unspecified (not zero-filled): for buffers that are only       \
   * read where they were written first, such as KV caches (attention never reads a masked         \
   * slot) and activations. A session of a speculative job is sized for the largest tree, and      \
   * zero-filling its megabytes was a twentieth of a job on a small model. Free with `free`.       \
   * NULL where zero-filling costs nothing extra: use alloc then. */                               \
  X(void *, alloc_uninit, (vspec_dev *dev, size_t bytes), (dev, bytes), 3, uncounted)              \
                                                                                                   \
  /* ==== ABI 1.4: fused ops ============================================================== */     \
  /* A transformer decode step in five ops per layer plus three, where the ops above take          \
   * 12 + 3 x rows per layer plus 2 per node and row: on a GPU each op is at least one kernel      \
   * launch, microseconds that a step at the memory-bandwidth bound cannot afford. Each does       \
   * what the sequence of ops named in its comment does, with the same numbers on the CPU.         \
   * Integer and byte arrays here (idx, pos, parents, prefix) are device memory from `alloc`       \
   * (ordinary host memory on the CPU), so that a forward uploads them once. NULL on a device      \
   * without them: use the unfused ops then (vspec_has_fused_ops). */                              \
  /* dst[i, :] = src[idx[i], :] for i < n, rows of dim floats (embedding and head-row              \
   * gathers). dst must not overlap src. */                                                        \
  X(void, gather_rows,                                                                             \
    (vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim, float *dst),            \
    (dev, src, idx, n, dim, dst), 4, op)                                                           \
  /* y[i, :] = rmsnorm(x[idx[i], :]) * w, as gather_rows then rmsnorm. y must not overlap x. */    \
  X(void, rmsnorm_rows,                                                                            \
    (vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim, const float *w,           \
     float eps, float *y),                                                                         \
    (dev, x, idx, n, dim, w, eps, y), 4, op)                                                       \
  /* y[m, n_out] += x[m, n_in] W^T (a linear layer into a residual stream): linear into a          \
   * temporary, then add. y must not overlap x. */                                                 \
  X(void, linear_add,                                                                              \
    (vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out, float *y),        \
    (dev, x, m, n_in, w, n_out, y), 4, op)                                                         \
  /* y[m, hidden] = silu(h W1^T) * (h W3^T) with h = rmsnorm(x[m, dim]) * norm_w (LlamaGen's       \
   * FeedForward after ffn_norm): rmsnorm, linear w1, linear w3, swiglu. y must not overlap        \
   * x. */                                                                                         \
  X(void, norm_swiglu,                                                                             \
    (vspec_dev *dev, const float *x, int m, int dim, const float *norm_w, float eps,               \
     const float *w1, const float *w3, int hidden, float *y),                                      \
    (dev, x, m, dim, norm_w, eps, w1, w3, hidden, y), 4, op)                                       \
  /* Attention's input for m = kv->rows x n rows of x, ordered (CFG row, node): qkv[m, qkv_w]      \
   * = rmsnorm(x) * norm_w times wqkv^T (qkv_w = (n_heads + 2 kv_heads) head_dim: q, then k,       \
   * then v), q and k rotated by rope_apply with table row pos[i], then the keys and values        \
   * of node j of CFG row r stored at cache slot slots[j] (vspec_kv_cache; slots is device         \
   * memory [n], the same for every CFG row). norm_w NULL: no norm, x itself is multiplied         \
   * (EAGLE's first layer has no input norm). qkv must not overlap x. */                           \
  X(void, norm_qkv_rope,                                                                           \
    (vspec_dev *dev, const float *x, int n, int dim, const float *norm_w, float eps,               \
     const float *wqkv, const int32_t *pos, const float *rope_table, const vspec_kv_cache *kv,     \
     const int32_t *slots, float *qkv),                                                            \
    (dev, x, n, dim, norm_w, eps, wqkv, pos, rope_table, kv, slots, qkv), 4, op)                   \
  /* Attention of a forward's nodes over the cache, every CFG row and head in one op: query        \
   * rows come from qkv as norm_qkv_rope wrote them (row r, node i at qkv + (r n + i) qkv_w),      \
   * out[(r n + i), n_heads head_dim] as `attention` writes it, with the visibility of             \
   * vspec_kv_tree_view instead of a byte mask. */                                                 \
  X(void, tree_attention,                                                                          \
    (vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv, const vspec_kv_tree_view *tree,   \
     float *out),                                                                                  \
    (dev, qkv, kv, tree, out), 4, op)                                                              \
  /* A token per node from its logits on the device, as the engine's host sampler would            \
   * draw it: CFG mix, temperature, top-k, top-p, softmax, then the inverse-CDF draw at u[i]       \
   * (logits_to_probs, sample; greedy: the first maximum). logits [n, rows, vocab] and             \
   * tokens [n] are device memory, as are spec->guided and spec->u (spec itself is host            \
   * memory). A node whose distribution has no mass gets -1. An AR step downloads n tokens         \
   * instead of n x rows x vocab logits. */                                                        \
  X(void, sample_tokens,                                                                           \
    (vspec_dev *dev, const float *logits, const vspec_sample_spec *spec, int32_t *tokens),         \
    (dev, logits, spec, tokens), 4, op)                                                            \
                                                                                                   \
  /* ==== ABI 1.5: graphs ================================================================= */     \
  /* A recorded sequence of ops replayed with one call: on a GPU one graph launch instead of       \
   * a launch per kernel (CUDA graphs: cudaStreamBeginCapture .. cudaGraphLaunch). The             \
   * semantics are CUDA's on every device: between graph_begin and graph_end the ops called on     \
   * `dev` are recorded, NOT executed; graph_launch executes them, with the arguments they         \
   * were recorded with. Pointers are kept, never what they point to: a replay reads device        \
   * memory as it is when it runs, so whatever changes from one replay to the next must be         \
   * device memory written before the launch (one upload), never an argument by value, a           \
   * host array or a struct's field (vspec_kv_tree_view.lens, not a count in the struct).          \
   * The structs passed by pointer (vspec_kv_cache, vspec_kv_tree_view, vspec_sample_spec)         \
   * are copied when recorded. Transfers (upload, download), copies and memory management          \
   * do not belong in a graph: make them before graph_begin or after graph_launch. A device        \
   * may refuse to record some op (the CPU records the fused ops of ABI 1.4 and `linear`,          \
   * what a fused forward issues): the op is then neither recorded nor run and graph_end           \
   * fails, so the caller runs the same ops again without a graph. NULL on a device without        \
   * graphs (vspec_has_graphs). A graph belongs to the device context that recorded it and is      \
   * launched there only; launches of one graph on one context run in order. */                    \
  /* Starts recording on dev. VSPEC_EBUSY while a recording is open on it. */                      \
  X(int, graph_begin, (vspec_dev *dev), (dev), 5, graph)                                           \
  /* Stops recording; on success *graph is the new graph (free it with graph_free). A              \
   * negative status (*graph NULL) when the recording failed: an op the device cannot record       \
   * (VSPEC_ENOTSUP), one that would have had to allocate or wait (VSPEC_EBUSY), no recording      \
   * open (VSPEC_EINVAL). Either way dev is no longer recording. */                                \
  X(int, graph_end, (vspec_dev *dev, vspec_graph **graph), (dev, graph), 5, graph)                 \
  /* Runs a graph's ops on dev, asynchronously on a GPU like any op. VSPEC_ENOENT for a NULL       \
   * graph (none recorded for this shape yet) or a stale one, recorded before the device's         \
   * scratch was reallocated (a later op needed more: free it and record again); VSPEC_EBUSY       \
   * while recording. */                                                                           \
  X(int, graph_launch, (vspec_dev *dev, vspec_graph *graph), (dev, graph), 5, graph)               \
  /* Frees a graph (NULL: nothing); its launches may still be queued on a GPU. */                  \
  X(void, graph_free, (vspec_dev *dev, vspec_graph *graph), (dev, graph), 5, uncounted)       \
                                                                                                   \
  /* ==== ABI 1.6: the verification walk ================================================= */     \
  /* Walks a verified tree on the device for a built-in rule, as the engine's host walk does       \
   * (core/verify_walk.c): at each node the target distribution from logits [n, rows, vocab]       \
   * (sample_tokens' processing), the children tried in index order with the rule's acceptance     \
   * probability against spec->accept's next uniform, the rule's residual normalised after a       \
   * rejection (with the host walk's fallbacks), the next token drawn from the target (a leaf)     \
   * or the residual with spec->target's next uniform; greedy (temperature <= 0) as the host       \
   * walk's greedy path. Writes *out (device memory); logits and spec's arrays are device          \
   * memory, spec itself host memory. An SD round then downloads the result, not n x rows x        \
   * vocab logits; an AR step is the one-node tree. NULL on a device without it: the engine        \
   * walks on the host then (and for rules that have no walk_rule). */                             \
  X(void, verify_walk,                                                                             \
    (vspec_dev *dev, const float *logits, const vspec_walk_spec *spec, vspec_walk_result *out),    \
    (dev, logits, spec, out), 6, op)                                                               \
                                                                                                   \
  /* ==== ABI 1.8: a draft drawn on the device ============================================ */     \
  /* sample_tokens that keeps what it drew from: node i's distribution (sample_tokens' CFG         \
   * mix, temperature, top-k, top-p and softmax; the engine's vs_node_distribution) to probs       \
   * [n, vocab], and its token drawn from that row at u[i] or, with u NULL, the row's first        \
   * maximum (a greedy draft over the distribution the walk compares with). temperature must       \
   * be > 0. All device memory but spec. A node without mass gets a zero row and token 0, so       \
   * that a forward fed it reads a valid embedding. A draft then stays on the device: the walk     \
   * reads probs, the next forward the token (vspec_forward_batch.token_dev). */                   \
  X(void, draw_probs,                                                                              \
    (vspec_dev *dev, const float *logits, const vspec_sample_spec *spec, float *probs,             \
     int32_t *tokens),                                                                             \
    (dev, logits, spec, probs, tokens), 8, op)                                                    \
                                                                                                   \
  /* ==== ABI 1.9: a cross-job batch's sessions in one op ================================= */     \
  /* norm_qkv_rope for every session of b (vspec_kv_batch), each over its own rows of x, pos       \
   * and qkv (from row entries[i].row0) into its own caches at its own slots: on a GPU one         \
   * norm and one product over all b->m rows, the weights read once, and one kernel for RoPE       \
   * and the stores; the CPU runs the sessions' norm_qkv_rope in turn (the same numbers as         \
   * alone). Where a batch took 2 ops per session and layer, it takes 2. */                        \
  X(void, norm_qkv_rope_batch,                                                                     \
    (vspec_dev *dev, const float *x, int dim, const float *norm_w, float eps, const float *wqkv,   \
     const int32_t *pos, const float *rope_table, const vspec_kv_batch *b, float *qkv),            \
    (dev, x, dim, norm_w, eps, wqkv, pos, rope_table, b, qkv), 9, op)                              \
  /* tree_attention for every session of b over its own cache and tree, its query rows at qkv      \
   * + entries[i].row0 x qkv_w and its output at out + entries[i].row0 x n_heads head_dim. */      \
  X(void, tree_attention_batch,                                                                    \
    (vspec_dev *dev, const float *qkv, const vspec_kv_batch *b, float *out),                      \
    (dev, qkv, b, out), 9, op)                                                                    \
                                                                                                   \
  /* ==== ABI 1.10: a tree's drafts drawn on the device =================================== */     \
  /* Children drawn without replacement from draw_probs' rows (EAGLE-1's static tree, arXiv        \
   * 2401.15077 §4), as the engine's host drafter draws them (core/draft_tree.c), row after row:   \
   * row i's spec->counts[i] children, child j at tokens[first[i] + j], each drawn by sample's     \
   * inverse CDF over probs [n, vocab] row i with the row's earlier children set to zero           \
   * (unnormalised: the draw scales its uniform by what is left) at u[*cursor], then cursor moves  \
   * on; with u NULL (greedy) each the first maximum of what is left. A child drawn after the      \
   * row's mass is spent is absent (drawn 0, no uniform), as are all children of a row whose node  \
   * (node[i] >= 0) is absent; an absent child's token is its row's first child's (0 when that is  \
   * absent too): a forward can be fed it, the walk skips it (that token's draft mass is spent)    \
   * or in a one-hot tree judges it as it judged that first child, and a host that sees the        \
   * tokens knows it from the repeat. A row's children past VSPEC_CHILDREN_MAX are absent (CUDA    \
   * refuses a max_count above it). All device memory but spec. A static tree's level then stays   \
   * on the device: the next forward reads the children (vspec_forward_batch.token_dev), the walk  \
   * their rows. */                                                                                \
  X(void, draw_children,                                                                           \
    (vspec_dev *dev, const float *probs, const vspec_children_spec *spec, int32_t *tokens),        \
    (dev, probs, spec, tokens), 10, op)

/* clang-format on */

#endif /* VSPEC_OPS_LIST_H */
