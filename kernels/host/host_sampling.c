/*
 * kernels/host/host_sampling.c - softmax family, LlamaGen's logit processing, inverse-CDF
 * sampling, argmax and the CFG combination on host memory (LlamaGen
 * autoregressive/models/generate.py: sample, top_k_top_p_filtering, prefill).
 *
 * Ordering: top-k and top-p rank tokens by (value descending, index ascending). The index
 * tie-break makes the order total, so selection and sorting need no care for duplicates,
 * and the result is deterministic where torch.sort's order among equal values is not
 * specified (that only matters for top-p when equal logits straddle the cut).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/common/vs_exp_simd.h"
#include "kernels/common/vs_math.h"
#include "kernels/host/host_math.h"

/* ---- the exponentials of a softmax row, in vector loops with the scalar loop's bits ------ */

/* e = vs_exp_poly(x - max), and entry i's e goes to double partial sum i mod 8 (the sums are
 * added in a fixed tree after, vs_sum8): every instruction set gives the same bits. The row
 * softmax of a 1024-code vocabulary, once per drafted and per verified node, was 4 % of a
 * speculative job on models/fmnist with expf one entry at a time (perf, 2026-11-27).
 * vs_exp_poly is 0 below -87.34 where expf still gave denormals (down to e^-104): entries that
 * far below the row's maximum now get probability 0 instead of less than 1e-37. */
static void exp_scalar(float *x, int from, int n, float mx, double *s) {
  for (int i = from; i < n; i++) {
    float e = vs_exp_poly(x[i] - mx);
    x[i] = e;
    s[i % 8] += e;
  }
}

/* The level in force (VS_HOST_SIMD_*; -1 until first use). Atomic, not pthread_once: the
 * probe is pure CPUID, so threads that race on the first use compute the same value, and the
 * CUDA module, which links this file, needs no libpthread. */
static atomic_int host_simd = -1;

static int host_simd_best(void) {
  int best = VS_HOST_SIMD_NONE;
#if VS_EXP_SIMD
  __builtin_cpu_init(); /* libgcc's checks include the OS's register state (XCR0) */
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = VS_HOST_SIMD_AVX2;
  if (__builtin_cpu_supports("avx512f")) best = VS_HOST_SIMD_AVX512;
#endif
  return best;
}

static int host_simd_level(void) {
  int level = atomic_load_explicit(&host_simd, memory_order_relaxed);
  if (level < 0) {
    int expected = -1;
    atomic_compare_exchange_strong(&host_simd, &expected, host_simd_best());
    level = atomic_load(&host_simd);
  }
  return level;
}

int vs_host_simd_set(int level) {
  int best = host_simd_best();
  if (level >= 0) atomic_store(&host_simd, level < best ? level : best);
  return host_simd_level();
}

#if VS_EXP_SIMD
__attribute__((target("avx512f"))) static int exp_512(float *x, int n, float mx, double *s) {
  __m512d acc = _mm512_loadu_pd(s);
  const __m512 m = _mm512_set1_ps(mx);
  int i = 0;
  for (; i + 16 <= n; i += 16) { /* entries i..i+7 then i+8..i+15 into lanes 0..7 */
    __m512 e = exp_poly_512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    acc = _mm512_add_pd(
        acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  _mm512_storeu_pd(s, acc);
  return i;
}

__attribute__((target("avx2,fma"))) static int exp_256(float *x, int n, float mx, double *s) {
  __m256d lo = _mm256_loadu_pd(s), hi = _mm256_loadu_pd(s + 4); /* sums 0-3 and 4-7 */
  const __m256 m = _mm256_set1_ps(mx);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp_poly_256(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  _mm256_storeu_pd(s, lo);
  _mm256_storeu_pd(s + 4, hi);
  return i;
}
#endif

/* x[i] = x[i] / d, and (nan_to_ninf) a NaN result becomes -inf: IEEE divisions lane by lane,
 * the scalar loop's bits. */
static void div_scalar(const float *x, int from, int n, float d, int nan_to_ninf, float *y) {
  for (int i = from; i < n; i++) {
    float q = x[i] / d;
    y[i] = nan_to_ninf && q != q ? -INFINITY : q;
  }
}

#if VS_EXP_SIMD
__attribute__((target("avx512f"))) static int div_512(const float *x, int n, float d,
                                                      int nan_to_ninf, float *y) {
  const __m512 vd = _mm512_set1_ps(d), ninf = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x + i), vd);
    if (nan_to_ninf) q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q), ninf);
    _mm512_storeu_ps(y + i, q);
  }
  return i;
}

__attribute__((target("avx2"))) static int div_256(const float *x, int n, float d,
                                                   int nan_to_ninf, float *y) {
  const __m256 vd = _mm256_set1_ps(d), ninf = _mm256_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_div_ps(_mm256_loadu_ps(x + i), vd);
    if (nan_to_ninf) q = _mm256_blendv_ps(q, ninf, _mm256_cmp_ps(q, q, _CMP_UNORD_Q));
    _mm256_storeu_ps(y + i, q);
  }
  return i;
}
#endif

static void div_row(const float *x, int n, float d, int nan_to_ninf, float *y) {
  int done = 0;
#if VS_EXP_SIMD
  int level = host_simd_level();
  if (level >= VS_HOST_SIMD_AVX512) done = div_512(x, n, d, nan_to_ninf, y);
  else if (level >= VS_HOST_SIMD_AVX2) done = div_256(x, n, d, nan_to_ninf, y);
#endif
  div_scalar(x, done, n, d, nan_to_ninf, y);
}

double vs_host_exp_row(float *x, int n, float mx) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int done = 0;
#if VS_EXP_SIMD
  int level = host_simd_level();
  if (level >= VS_HOST_SIMD_AVX512) done = exp_512(x, n, mx, s);
  else if (level >= VS_HOST_SIMD_AVX2) done = exp_256(x, n, mx, s);
#endif
  exp_scalar(x, done, n, mx, s);
  return vs_sum8(s);
}

/* ---- softmax family -------------------------------------------------------------------- */

#if VS_EXP_SIMD
/* The maximum over NaN-free lanes (a lane takes x only where x > its maximum, so NaN never
 * enters): the scalar loop's value, up to the sign of a zero maximum, which e^(x - max)
 * does not see. The scalar loop was 1 % of a speculative job (two vocabulary rows per
 * drafted and verified node). */
__attribute__((target("avx512f"))) static int max_512(const float *x, int n, float *mx) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), v);
  }
  *mx = _mm512_reduce_max_ps(m);
  return i;
}
#endif

/* Returns 0 when every entry is -inf (or NaN): no finite maximum exists. */
static int row_max(const float *x, int n, float *out) {
  float mx = -INFINITY;
  int i = 0;
#if VS_EXP_SIMD
  if (host_simd_level() >= VS_HOST_SIMD_AVX512) i = max_512(x, n, &mx);
#endif
  for (; i < n; i++)
    if (x[i] > mx) mx = x[i];
  *out = mx;
  return mx > -INFINITY;
}

/* A row with no finite entry has no distribution; it becomes all zeros so that
 * downstream code (sample, count of nonzero tokens) sees "nothing to draw" rather than
 * NaNs. */
static void softmax_row(float *x, int n) {
  float mx;
  if (!row_max(x, n, &mx)) {
    memset(x, 0, (size_t)n * sizeof(float));
    return;
  }
  float fsum = (float)vs_host_exp_row(x, n, mx);
  div_row(x, n, fsum, 0, x);
}

void vs_host_softmax(float *x, int rows, int n) {
  if (n <= 0) return;
  for (int r = 0; r < rows; r++) softmax_row(x + (size_t)r * n, n);
}

/* A row with no finite entry stays all -inf (log of the zero row softmax produces). */
void vs_host_log_softmax(float *x, int rows, int n) {
  if (n <= 0) return;
  for (int r = 0; r < rows; r++) {
    float *xr = x + (size_t)r * n;
    float mx;
    if (!row_max(xr, n, &mx)) {
      for (int i = 0; i < n; i++) xr[i] = -INFINITY;
      continue;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)(xr[i] - mx));
    float lsum = (float)log(sum);
    for (int i = 0; i < n; i++) xr[i] = (xr[i] - mx) - lsum;
  }
}

int vs_host_argmax(const float *x, int n) {
  if (n <= 0) return -1;
  int best = -1;
  for (int i = 0; i < n; i++) {
    if (x[i] != x[i]) continue; /* NaN never wins */
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

/* ---- ranking by (value desc, index asc) over an index array ----------------------------- */

static inline int ranks_before(const float *v, int a, int b) {
  return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static inline void swap_idx(int *a, int i, int j) {
  int t = a[i];
  a[i] = a[j];
  a[j] = t;
}

static void insertion_sort(int *a, int lo, int hi, const float *v) {
  for (int i = lo + 1; i <= hi; i++) {
    int x = a[i], j = i - 1;
    while (j >= lo && ranks_before(v, x, a[j])) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = x;
  }
}

static void sift_down(int *a, int root, int count, const float *v) {
  /* max-heap where "max" = ranks last, so popping yields best-first order at the front */
  for (;;) {
    int child = 2 * root + 1;
    if (child >= count) return;
    if (child + 1 < count && ranks_before(v, a[child], a[child + 1])) child++;
    if (!ranks_before(v, a[root], a[child])) return;
    swap_idx(a, root, child);
    root = child;
  }
}

static void heap_sort(int *a, int count, const float *v) {
  for (int i = count / 2 - 1; i >= 0; i--) sift_down(a, i, count, v);
  for (int end = count - 1; end > 0; end--) {
    swap_idx(a, 0, end);
    sift_down(a, 0, end, v);
  }
}

/* Median-of-three partition of a[lo..hi] (at least 3 elements); returns the pivot's final
 * position p: everything left of p ranks before it, everything right after it. */
static int partition(int *a, int lo, int hi, const float *v) {
  int mid = lo + (hi - lo) / 2;
  if (ranks_before(v, a[mid], a[lo])) swap_idx(a, lo, mid);
  if (ranks_before(v, a[hi], a[lo])) swap_idx(a, lo, hi);
  if (ranks_before(v, a[hi], a[mid])) swap_idx(a, mid, hi);
  /* a[lo] <= pivot <= a[hi] now serve as sentinels for the scans */
  swap_idx(a, mid, hi - 1);
  int pivot = a[hi - 1];
  int i = lo, j = hi - 1;
  for (;;) {
    while (ranks_before(v, a[++i], pivot)) {
    }
    while (ranks_before(v, pivot, a[--j])) {
    }
    if (i >= j) break;
    swap_idx(a, i, j);
  }
  swap_idx(a, i, hi - 1);
  return i;
}

static int depth_budget(int count) {
  int d = 0;
  while (count > 1) {
    count >>= 1;
    d++;
  }
  return 2 * d + 4;
}

#define VS_SMALL_RANGE 16

/* Introsort: quicksort, heap sort once the depth budget is spent (no quadratic inputs). */
static void sort_range(int *a, int lo, int hi, const float *v, int depth) {
  while (hi - lo > VS_SMALL_RANGE) {
    if (depth-- == 0) {
      heap_sort(a + lo, hi - lo + 1, v);
      return;
    }
    int p = partition(a, lo, hi, v);
    if (p - lo < hi - p) {
      sort_range(a, lo, p - 1, v, depth);
      lo = p + 1;
    } else {
      sort_range(a, p + 1, hi, v, depth);
      hi = p - 1;
    }
  }
  insertion_sort(a, lo, hi, v);
}

/* Rearranges a[0..count) so that a[0..kth) are the kth best entries (unordered) and
 * everything after ranks below them. Expected O(count); sorts the range as a fallback when
 * partitions keep coming out lopsided. */
static void select_top(int *a, int count, int kth, const float *v) {
  if (kth <= 0 || kth >= count) return;
  int lo = 0, hi = count - 1, target = kth - 1, budget = depth_budget(count);
  while (hi - lo > VS_SMALL_RANGE) {
    if (budget-- == 0) {
      sort_range(a, lo, hi, v, depth_budget(hi - lo + 1));
      return;
    }
    int p = partition(a, lo, hi, v);
    if (target < p)
      hi = p - 1;
    else if (target > p)
      lo = p + 1;
    else
      return;
  }
  insertion_sort(a, lo, hi, v);
}

/* ---- LlamaGen logit processing ----------------------------------------------------------- */

/* top-p (nucleus) filter of generate.py over the finite entries of l, in place.
 *
 * The reference sorts every token, takes the cumulative softmax and cuts after the first
 * entry whose cumsum exceeds top_p. Only the position of that crossing matters, so this
 * finds it with a quickselect that carries probability mass instead of a count: after each
 * partition, the mass ranked before the pivot says on which side the crossing lies.
 * Expected O(n) whatever the nucleus size, against O(n log n) for the sort; only the last
 * small range is sorted and walked in order. w[i] receives exp(l[i] - max) for every
 * candidate i (scratch). */
static void top_p_filter(float *l, int n, float top_p, int *idx, float *w) {
  int m = 0;
  for (int i = 0; i < n; i++)
    if (l[i] > -INFINITY) idx[m++] = i;
  if (m == 0) return;
  float mx = -INFINITY;
  for (int r = 0; r < m; r++)
    if (l[idx[r]] > mx) mx = l[idx[r]];
  double z = 0.0;
  for (int r = 0; r < m; r++) {
    float e = expf(l[idx[r]] - mx); /* float like the reference's softmax */
    w[idx[r]] = e;
    z += e;
  }
  /* The reference compares its float cumsum with top_p: (float)(mass / z) > top_p. The
   * entry where that first holds is kept (the removal mask is shifted right by one), and
   * so is the top entry whatever top_p is. */
#define VS_CROSSED(mass) ((float)((mass) / z) > top_p)
  int lo = 0, hi = m - 1, cross = -1, budget = depth_budget(m);
  double cum = 0.0; /* mass of the entries ranked before lo; never crossed */
  while (cross < 0 && hi - lo > VS_SMALL_RANGE) {
    if (budget-- == 0) { /* lopsided partitions: finish by sorting */
      sort_range(idx, lo, hi, l, depth_budget(hi - lo + 1));
      break;
    }
    int p = partition(idx, lo, hi, l);
    double left = 0.0;
    for (int r = lo; r < p; r++) left += w[idx[r]];
    if (VS_CROSSED(cum + left)) {
      hi = p - 1;
      continue;
    }
    cum += left + w[idx[p]];
    if (VS_CROSSED(cum)) cross = p;
    else lo = p + 1;
  }
  if (cross < 0) {
    if (hi - lo <= VS_SMALL_RANGE) insertion_sort(idx, lo, hi, l);
    for (int r = lo; r <= hi; r++) {
      cum += w[idx[r]];
      if (VS_CROSSED(cum)) {
        cross = r;
        break;
      }
    }
  }
#undef VS_CROSSED
  /* idx[0..cross] are now exactly the best cross+1 entries; no crossing (rounding left
   * the total at or below top_p) keeps everything */
  for (int r = cross < 0 ? m : cross + 1; r < m; r++) l[idx[r]] = -INFINITY;
}

size_t vs_host_probs_work_bytes(int n) {
  return n > 0 ? vs_host_align_up((size_t)n * sizeof(int)) + (size_t)n * sizeof(float) : 0;
}

int vs_host_logits_to_probs(const float *logits, int n, float temperature, int top_k,
                            float top_p, float *probs, void *work) {
  if (n <= 0) return 0;
  if (!(temperature > 0.0f)) { /* greedy (NaN temperature too): one-hot at first argmax */
    int best = vs_host_argmax(logits, n);
    memset(probs, 0, (size_t)n * sizeof(float));
    probs[best] = 1.0f;
    return 1;
  }
  float t = temperature > 1e-5f ? temperature : 1e-5f;
  /* probs doubles as the working logit buffer. NaN logits are treated as -inf so the
   * ranking stays a total order and they end with probability 0. */
  div_row(logits, n, t, 1, probs);
  int *idx = NULL;
  float *w = NULL;
  if ((top_k > 0 && top_k < n) || top_p < 1.0f) {
    idx = (int *)work;
    w = (float *)((unsigned char *)work + vs_host_align_up((size_t)n * sizeof(int)));
  }

  if (top_k > 0 && top_k < n) { /* k = clamp(top_k, 1, n); k = n filters nothing */
    for (int i = 0; i < n; i++) idx[i] = i;
    select_top(idx, n, top_k, probs);
    float thr = probs[idx[top_k - 1]];
    for (int i = 0; i < n; i++)
      if (probs[i] < thr) probs[i] = -INFINITY; /* ties with the k-th value survive */
  }
  if (top_p < 1.0f) top_p_filter(probs, n, top_p, idx, w);

  softmax_row(probs, n);
  int nonzero = 0;
  for (int i = 0; i < n; i++) nonzero += probs[i] > 0.0f;
  return nonzero;
}

/* Sums in double so that the running sum reaches the total exactly in the same order.
 * NaN and negative entries count as zero. Returns -1 when there is no positive mass. */
int vs_host_sample(const float *probs, int n, double u) {
  double total = 0.0;
  int last = -1;
  for (int i = 0; i < n; i++) {
    if (probs[i] > 0.0f) {
      total += probs[i];
      last = i;
    }
  }
  if (last < 0) return -1;
  double target = u * total;
  double run = 0.0;
  for (int i = 0; i < last; i++) {
    if (!(probs[i] > 0.0f)) continue; /* running sum cannot cross on a zero entry */
    run += probs[i];
    if (run > target) return i;
  }
  /* the last nonzero entry, also when rounding of u * total ran past the sum */
  return last;
}

void vs_host_cfg_combine(const float *cond, const float *uncond, size_t n, float scale,
                         float *out) {
  /* Both inputs are read before out[i] is written, so out may alias either. */
  for (size_t i = 0; i < n; i++) out[i] = vs_cfg_mix(cond[i], uncond[i], scale);
}
