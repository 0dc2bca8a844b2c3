/*
 * kernels/cuda/cuda_tree_attention.cu - the fused attention of a forward's tree (ABI 1.4
 * tree_attention) and of a cross-job batch's sessions (ABI 1.9 tree_attention_batch): every
 * CFG row, query and head in one launch, visibility evaluated per slot from the tree's
 * parents and the prefix rule (include/vspec/ops.h, vspec_kv_tree_view), no mask uploaded.
 */
#include <math.h>

#include "kernels/common/vs_math.h"
#include "kernels/common/vs_tree_visible.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_reduce.h"

/* ---- tree_attention -------------------------------------------------------------------------
 * One block per (CFG row r, query i, head h), the math of vs_k_attention (cuda_attention.cu):
 * scores in shared memory, a stable softmax summed in double, one thread per output channel.
 * Visibility is vs_tree_mask_row's rule evaluated per slot instead of a byte row: thread 0
 * marks the query's ancestors (itself included) in a shared bitmap of the pending slots, and
 * slot s is visible iff (s < committed or its pending node is marked) and (s >= n_prefix or
 * prefix[s] or s is the query's own slot) - the same rule, with the slots spread over the
 * block's threads. An invisible slot's weight is exactly 0 and the value pass skips zero
 * weights, so a slot never written (inf or NaN) contributes nothing; a visible slot whose
 * weight underflows to 0 is skipped too, which changes nothing for the finite values a
 * written slot holds. */
#define VS_TATT_THREADS 128
/* the block reductions (cuda_reduce.h) keep their result in red[31]: warp 31 must not exist */
static_assert(VS_TATT_THREADS <= 31 * 32, "vs_block_max / vs_block_dsum use red[31]");
/* Dynamic shared memory: the default 48 KiB per block less the kernel's static 384 bytes
 * (no opt-in attribute needed on any architecture): about 12k slots at head_dim 64. */
#define VS_TATT_SHARED (48 * 1024 - 512)

/* Marks base + i and its ancestors in anc (bits over pending nodes); the block's threads
 * must have zeroed it. Parents precede children (vs_kv_tree_add checks it); a parent that
 * does not is treated as the root so that a bad array cannot loop forever. */
__device__ static void vs_tatt_ancestors(const vspec_kv_tree_view *t, int base, int i,
                                         uint32_t *anc) {
  if (threadIdx.x == 0)
    for (int a = base + i; a >= 0;) {
      anc[a >> 5] |= 1u << (a & 31);
      int p = t->parents[a];
      a = p < a ? p : -1;
    }
  __syncthreads();
}

__device__ static inline int vs_tatt_visible(const vspec_kv_tree_view *t, const uint32_t *anc,
                                             int L, int s, int self) {
  if (s >= L && !((anc[(s - L) >> 5] >> ((s - L) & 31)) & 1u)) return 0;
  return s >= t->n_prefix || t->prefix[s] || s == self;
}

/* The scores sc[0, kv_len) (-INFINITY where unseen) to their softmax, in place: a stable
 * softmax summed in double, each weight exactly 0 where unseen. Every thread of the block
 * calls it with its own running maximum; its barriers publish what the threads wrote to sc
 * before the call, and a barrier ends it. 0 when nothing is visible (the same answer for the
 * whole block, so no barrier is skipped): the block then writes zeros. */
__device__ static int vs_tatt_softmax(float *sc, int kv_len, float local_max, float *fred,
                                      double *dred) {
  float mx = vs_block_max(local_max, fred);
  if (mx == -INFINITY) return 0;
  double local_sum = 0.0;
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) {
    /* vs_exp_poly: the CPU attention's exp (cpu_attention_softmax.c), one formula */
    float e = sc[s] == -INFINITY ? 0.0f : vs_exp_poly(sc[s] - mx);
    sc[s] = e;
    local_sum += e;
  }
  float fsum = (float)vs_block_dsum(local_sum, dred); /* >= 1: the maximum gives exp(0) */
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) sc[s] /= fsum;
  __syncthreads();
  return 1;
}

__global__ void vs_k_tree_attention(const float *qkv, vspec_kv_cache kv, vspec_kv_tree_view t,
                                    float scale, float *out) {
  VS_PDL_ENTER();
  /* q [hd], scores [kv.slots], ancestor bits [(kv.slots + 31) / 32]: sized for the cache,
   * since the lengths are read here, on the device (a graph replays with new ones) */
  extern __shared__ float sh[];
  __shared__ float fred[32];
  __shared__ double dred[32];
  int H = kv.n_heads, hd = kv.head_dim, n = t.n;
  int L = t.lens[0], base = t.lens[1];
  /* in 64 bits: bad lengths must not wrap into a valid-looking one */
  long long len64 = (long long)L + base + n;
  int kv_len = (int)len64;
  if (L < 0 || base < 0 || len64 > kv.slots) { /* uniform over the block: zeros out */
    kv_len = 0;
    L = base = 0;
  }
  int h = blockIdx.x % H, ri = blockIdx.x / H, i = ri % n, r = ri / n;
  int g = h / (H / kv.kv_heads), words = kv_len ? (base + n + 31) / 32 : 0;
  int self = L + base + i;
  float *q = sh, *sc = sh + hd;
  uint32_t *anc = (uint32_t *)(sc + kv.slots);
  const float *qh = qkv + (size_t)ri * (H + 2 * kv.kv_heads) * hd + (size_t)h * hd;
  size_t head = ((size_t)r * kv.kv_heads + g) * kv.slots * hd;
  const float *kh = kv.k + head, *vh = kv.v + head;
  float *oh = out + (size_t)ri * H * hd + (size_t)h * hd;

  for (int c = threadIdx.x; c < hd; c += blockDim.x) q[c] = qh[c];
  for (int w = threadIdx.x; w < words; w += blockDim.x) anc[w] = 0u;
  __syncthreads();
  if (kv_len) vs_tatt_ancestors(&t, base, i, anc); /* ends with a barrier */
  __syncthreads();
  float local_max = -INFINITY;
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) {
    if (!vs_tatt_visible(&t, anc, L, s, self)) {
      sc[s] = -INFINITY;
      continue;
    }
    const float *ks = kh + (size_t)s * hd;
    float dot = 0.0f;
    for (int c = 0; c < hd; c++) dot += q[c] * ks[c];
    sc[s] = scale * dot;
    local_max = fmaxf(local_max, sc[s]);
  }
  if (!vs_tatt_softmax(sc, kv_len, local_max, fred, dred)) {
    for (int c = threadIdx.x; c < hd; c += blockDim.x) oh[c] = 0.0f;
    return;
  }
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < kv_len; s++)
      if (sc[s] != 0.0f) acc += sc[s] * vh[(size_t)s * hd + c];
    oh[c] = acc;
  }
}

/* The same op for a head_dim of 32, 64 or 128 (every LlamaGen and EAGLE shape), laid out for
 * memory latency: the first GPU profile (docs/BENCHMARKS.md, "On a GPU", second run) had the
 * kernel above at 27.6 us a layer over a 128-slot cache, 7.2 us over 1 slot, with its loads
 * used as soon as issued (a loop over channels or slots of run-time length cannot be
 * software-pipelined). Here every trip count is a constant: a warp loads VS_TATTF_KEYS whole
 * keys (lanes across the channels, coalesced) before it uses any, so a block waits on memory
 * about kv_len / (warps x keys) times per pass instead of once per slot: 16 keys a warp,
 * so the 128 keys of the profile's half image take one trip (at 8 they took two, 9.0 us a
 * layer in the third run), and the values of the keys just loaded are asked into L2 for the
 * value pass. The ancestor walk
 * reads the parents from shared memory, staged there by the whole block (a 64-node chain
 * walked in global memory is 64 dependent loads). Same rule, same skip of zero weights (a
 * value is loaded but never multiplied by a zero weight, so NaN in an unseen slot stays out),
 * the softmax as above; the sums run in another order, so the bits differ from the kernel
 * above, within the tests' tolerance against the CPU. */
#define VS_TATTF_WARPS 8
#define VS_TATTF_KEYS 16

/* Asks for the 128-byte line holding p in L2, without waiting for it. */
__device__ static inline void vs_tatt_prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
static_assert(VS_TATTF_WARPS * 32 <= 31 * 32, "vs_block_max / vs_block_dsum use red[31]");

/* One block's work: query row ri (CFG row ri / n, node ri % n) and head h of the session
 * whose rows start at qkv and out. */
template <int HD>
__device__ static void vs_tatt_fast(const float *qkv, const vspec_kv_cache &kv,
                                    const vspec_kv_tree_view &t, int ri, int h, float scale,
                                    float *out) {
  constexpr int CH = HD / 32; /* channels a lane holds: lane + 32 j */
  /* scores [kv.slots] (first the staged parents), ancestor bits [(kv.slots + 31) / 32], the
   * warps' partial outputs [VS_TATTF_WARPS][HD] */
  extern __shared__ float sh[];
  __shared__ float fred[32];
  __shared__ double dred[32];
  int H = kv.n_heads, n = t.n;
  int L = t.lens[0], base = t.lens[1];
  long long len64 = (long long)L + base + n; /* in 64 bits, as above */
  int kv_len = (int)len64;
  if (L < 0 || base < 0 || len64 > kv.slots) {
    kv_len = 0;
    L = base = 0;
  }
  int i = ri % n, r = ri / n;
  int g = h / (H / kv.kv_heads), words = kv_len ? (base + n + 31) / 32 : 0;
  int self = L + base + i, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *sc = sh;
  uint32_t *anc = (uint32_t *)(sc + kv.slots);
  float *part = (float *)(anc + (kv.slots + 31) / 32);
  const float *qh = qkv + (size_t)ri * (H + 2 * kv.kv_heads) * HD + (size_t)h * HD;
  size_t head = ((size_t)r * kv.kv_heads + g) * kv.slots * HD;
  const float *kh = kv.k + head, *vh = kv.v + head;
  float *oh = out + (size_t)ri * H * HD + (size_t)h * HD;

  float qr[CH];
#pragma unroll
  for (int j = 0; j < CH; j++) qr[j] = qh[lane + 32 * j];
  for (int w = threadIdx.x; w < words; w += blockDim.x) anc[w] = 0u;
  if (kv_len) { /* uniform over the block */
    int *par = (int *)sc; /* the scores' room is free until the scores */
    for (int a = threadIdx.x; a < base + n; a += blockDim.x) par[a] = t.parents[a];
    __syncthreads();
    if (threadIdx.x == 0) /* as vs_tatt_ancestors: a parent that is not earlier ends it */
      for (int a = base + i; a >= 0;) {
        anc[a >> 5] |= 1u << (a & 31);
        int p = par[a];
        a = p < a ? p : -1;
      }
  }
  __syncthreads();

  /* scores: a past-the-end key is read at slot kv_len - 1 (memory of the cache) and dropped */
  float local_max = -INFINITY;
  for (int s0 = warp * VS_TATTF_KEYS; s0 < kv_len; s0 += VS_TATTF_WARPS * VS_TATTF_KEYS) {
    float kr[VS_TATTF_KEYS][CH], dot[VS_TATTF_KEYS];
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      const float *ks = kh + (size_t)min(s0 + u, kv_len - 1) * HD;
#pragma unroll
      for (int j = 0; j < CH; j++) kr[u][j] = ks[lane + 32 * j];
    }
    /* the same keys' values asked into L2 now: the value pass then waits on L2, not DRAM
     * (a prefetch changes no result) */
    for (int l = lane; l < VS_TATTF_KEYS * (HD / 32); l += 32) /* HD / 32 lines a key */
      if (s0 + l / (HD / 32) < kv_len)
        vs_tatt_prefetch_l2(vh + (size_t)(s0 + l / (HD / 32)) * HD + (l % (HD / 32)) * 32);
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      dot[u] = 0.0f;
#pragma unroll
      for (int j = 0; j < CH; j++) dot[u] += qr[j] * kr[u][j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], off);
    }
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      int s = s0 + u;
      if (s >= kv_len) break;
      float v = vs_tatt_visible(&t, anc, L, s, self) ? scale * dot[u] : -INFINITY;
      if (lane == 0) sc[s] = v;
      local_max = fmaxf(local_max, v);
    }
  }
  if (!vs_tatt_softmax(sc, kv_len, local_max, fred, dred)) {
    for (int c = threadIdx.x; c < HD; c += blockDim.x) oh[c] = 0.0f;
    return;
  }

  /* values: the same chunks of keys, loaded before they are weighed */
  float acc[CH];
#pragma unroll
  for (int j = 0; j < CH; j++) acc[j] = 0.0f;
  for (int s0 = warp * VS_TATTF_KEYS; s0 < kv_len; s0 += VS_TATTF_WARPS * VS_TATTF_KEYS) {
    float vr[VS_TATTF_KEYS][CH], p[VS_TATTF_KEYS];
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      int s = min(s0 + u, kv_len - 1);
      p[u] = s0 + u < kv_len ? sc[s] : 0.0f;
      const float *vs = vh + (size_t)s * HD;
#pragma unroll
      for (int j = 0; j < CH; j++) vr[u][j] = vs[lane + 32 * j];
    }
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++)
      if (p[u] != 0.0f)
#pragma unroll
        for (int j = 0; j < CH; j++) acc[j] += p[u] * vr[u][j];
  }
#pragma unroll
  for (int j = 0; j < CH; j++) part[warp * HD + lane + 32 * j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < HD; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < VS_TATTF_WARPS; w++) o += part[w * HD + c];
    oh[c] = o;
  }
}

template <int HD>
__global__ void __launch_bounds__(VS_TATTF_WARPS * 32)
    vs_k_tree_attention_hd(const float *qkv, vspec_kv_cache kv, vspec_kv_tree_view t,
                           float scale, float *out) {
  VS_PDL_ENTER();
  vs_tatt_fast<HD>(qkv, kv, t, blockIdx.x / kv.n_heads, blockIdx.x % kv.n_heads, scale, out);
}

/* A batch's sessions (ABI 1.9): block (row, head) of the batch; the row's session is the
 * last entry whose first row is at most `row` (entries in row order), counted over the
 * block's threads in one barrier. */
template <int HD>
__global__ void __launch_bounds__(VS_TATTF_WARPS * 32)
    vs_k_tree_attention_batch_hd(const float *qkv, const vspec_kv_batch_entry *es, int count,
                                 int H, float scale, float *out) {
  VS_PDL_ENTER();
  int row = blockIdx.x / H, h = blockIdx.x % H;
  int k = __syncthreads_count(threadIdx.x < count && es[threadIdx.x].row0 <= row) - 1;
  const vspec_kv_batch_entry *se = &es[k < 0 ? 0 : k];
  vspec_kv_cache kv = se->kv;
  vspec_kv_tree_view t = se->tree;
  size_t r0 = (size_t)se->row0;
  vs_tatt_fast<HD>(qkv + r0 * (H + 2 * kv.kv_heads) * HD, kv, t, row - se->row0, h, scale,
                   out + r0 * H * HD);
}

/* Checks the view against the cache; 0 (failure recorded) when it does not fit. */
static int ta_tree_ok(vs_cuda_dev *d, const vspec_kv_cache *kv, const vspec_kv_tree_view *t,
                      size_t *shared) {
  int ok = t && t->n > 0 && t->lens && t->parents && t->n_prefix >= 0 &&
           (t->n_prefix == 0 || t->prefix);
  if (!ok) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: tree_attention: bad tree view", d->head.index);
    return 0;
  }
  /* committed and base are device values: the kernel reads them and refuses (zeros out) a
   * length past the cache; here the shared memory is sized for the whole cache */
  *shared = ((size_t)kv->head_dim + (size_t)kv->slots + (size_t)(kv->slots + 31) / 32) * 4;
  if (t->n > kv->slots || *shared > VS_TATT_SHARED) {
    vs_cuda_fail(d, VSPEC_ERANGE,
                 "cuda:%d: tree_attention: %d queries, a cache of %d slots (shared memory for "
                 "about %d)", d->head.index, t->n, kv->slots,
                 (int)(VS_TATT_SHARED / 4 - kv->head_dim) * 32 / 33);
    return 0;
  }
  return 1;
}

void vs_cuda_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                            const vspec_kv_tree_view *tree, float *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  size_t shared = 0;
  if (d->failed || !vs_cuda_enter(d) || !vs__cuda_kv_ok(d, kv, "tree_attention") ||
      !ta_tree_ok(d, kv, tree, &shared))
    return;
  float scale = (float)(1.0 / sqrt((double)kv->head_dim));
  unsigned blocks = (unsigned)kv->rows * tree->n * kv->n_heads;
  int hd = kv->head_dim;
  size_t fast = ((size_t)kv->slots + (size_t)(kv->slots + 31) / 32 +
                 (size_t)VS_TATTF_WARPS * hd) * 4;
  if (d->tatt_generic || fast > VS_TATT_SHARED || (hd != 32 && hd != 64 && hd != 128))
    vs_cuda_launch(d, "tree_attention", vs_k_tree_attention, blocks, VS_TATT_THREADS, shared, qkv,
                   *kv, *tree, scale, out);
  else
    vs_cuda_launch(d, "tree_attention",
                   hd == 64 ? vs_k_tree_attention_hd<64>
                   : hd == 128 ? vs_k_tree_attention_hd<128>
                               : vs_k_tree_attention_hd<32>,
                   blocks, VS_TATTF_WARPS * 32, fast, qkv, *kv, *tree, scale, out);
}

/* Every session's tree attention in one launch (ABI 1.9), by the kernel above for a
 * head_dim of 32, 64 or 128; other sizes, and caches too long for its shared memory, run
 * session by session (the host copy of the entries). */
void vs_cuda_tree_attention_batch(vspec_dev *dev, const float *qkv, const vspec_kv_batch *b,
                                  float *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!b || b->count <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (b->count > VS_TATTF_WARPS * 32 || !b->entries || !b->entries_dev) {
    vs_cuda_fail(d, VSPEC_ERANGE, "cuda:%d: tree_attention_batch: %d sessions (at most %d)",
                 d->head.index, b->count, VS_TATTF_WARPS * 32);
    return;
  }
  const vspec_kv_cache *k0 = &b->entries[0].kv;
  int H = k0->n_heads, hd = k0->head_dim, rows = 0, max_slots = 0;
  for (int i = 0; i < b->count; i++) { /* the host copy: every session checked as alone */
    const vspec_kv_batch_entry *e = &b->entries[i];
    size_t shared;
    if (!vs__cuda_kv_ok(d, &e->kv, "tree_attention_batch") || !ta_tree_ok(d, &e->kv, &e->tree, &shared))
      return;
    if (e->kv.n_heads != H || e->kv.kv_heads != k0->kv_heads || e->kv.head_dim != hd ||
        e->row0 != rows) {
      vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: tree_attention_batch: session %d does not fit "
                   "the batch (shape, rows from %d)", d->head.index, i, e->row0);
      return;
    }
    rows += e->kv.rows * e->tree.n;
    if (e->kv.slots > max_slots) max_slots = e->kv.slots;
  }
  if (rows != b->m || max_slots > b->max_slots) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: tree_attention_batch: %d rows and %d slots at most, "
                 "the sessions have %d and %d", d->head.index, b->m, b->max_slots, rows,
                 max_slots);
    return;
  }
  float scale = (float)(1.0 / sqrt((double)hd));
  size_t fast = ((size_t)max_slots + (size_t)(max_slots + 31) / 32 +
                 (size_t)VS_TATTF_WARPS * hd) * 4;
  if (d->tatt_generic || fast > VS_TATT_SHARED || (hd != 32 && hd != 64 && hd != 128)) {
    /* session by session from the host copy, whose pointers a graph would replay for other
     * sessions (ops.h: a recorded batch op reads entries_dev when it runs) */
    if (vs_cuda_refuse_in_capture(d, VSPEC_ENOTSUP, "tree_attention_batch (session by session)"))
      return;
    for (int i = 0; i < b->count; i++) {
      const vspec_kv_batch_entry *e = &b->entries[i];
      size_t r0 = (size_t)e->row0;
      vs_cuda_tree_attention(dev, qkv + r0 * (H + 2 * e->kv.kv_heads) * hd, &e->kv, &e->tree,
                             out + r0 * H * hd);
    }
    return;
  }
  vs_cuda_launch(d, "tree_attention_batch",
                 hd == 64 ? vs_k_tree_attention_batch_hd<64>
                 : hd == 128 ? vs_k_tree_attention_batch_hd<128>
                             : vs_k_tree_attention_batch_hd<32>,
                 (unsigned)b->m * H, VS_TATTF_WARPS * 32, fast, qkv, b->entries_dev, b->count, H,
                 scale, out);
}
