/*
 * kernels/cuda/cuda_rope_store.h - what norm_qkv_rope does with one pair of channels of a
 * row's q, k or v (ABI 1.4, include/vspec/ops.h), written once for the kernel that runs it
 * after the product (vs_k_rope_store, cuda_fused.cu) and for the few-row product that runs it
 * in its epilogue (VS_SKINNY_ROPE, cuda_gemm.cu): the same statements, so the same bits.
 */
#ifndef VS_CUDA_ROPE_STORE_H
#define VS_CUDA_ROPE_STORE_H

#include "kernels/common/vs_math.h"

/* Pair j (channels 2j, 2j + 1) of head hh, holding (y0, y1) from the product, written to the
 * row's head xh: q and k rotate by the table row t of the row's position (as vs_k_rope:
 * entries 2j and 2j + 1); k and v of CFG row r also go to cache slot `slot` (none outside the
 * cache). An odd head_dim leaves its last channel unrotated, as rope_apply does. */
__device__ static inline void vs_rope_store_vals(float *xh, float y0, float y1, int hh, int j,
                                                 int H, int Hkv, int hd, const float *t,
                                                 const vspec_kv_cache &kv, int r, int slot) {
  int c = 2 * j, pair = c + 1 < hd;
  if (hh < H + Hkv && j < hd / 2) { /* q or k: rotate */
    float x0 = y0, x1 = y1;
    vs_rope_rotate(x0, x1, t[2 * j], t[2 * j + 1], &y0, &y1);
    xh[c] = y0;
    xh[c + 1] = y1;
  } else { /* v, or an odd head_dim's last channel: as computed */
    xh[c] = y0;
    if (pair) xh[c + 1] = y1;
  }
  if (hh >= H && slot >= 0 && slot < kv.slots) { /* k or v: store into the cache */
    int is_v = hh >= H + Hkv, g = hh - H - (is_v ? Hkv : 0);
    float *dst = (is_v ? kv.v : kv.k) + (((size_t)r * Hkv + g) * kv.slots + (size_t)slot) * hd + c;
    dst[0] = y0;
    if (pair) dst[1] = y1;
  }
}

#endif /* VS_CUDA_ROPE_STORE_H */
