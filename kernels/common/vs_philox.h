/*
 * kernels/common/vs_philox.h - Philox4x32-10 counter-based RNG (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC'11; the Random123 algorithm), host and device.
 *
 * Why counter-based: a draw is a pure function of (key, counter), so a stream needs no
 * state beyond its counter and any draw can be recomputed anywhere - on another thread, on
 * the GPU, after a restart. The engine keys a stream by (seed, stream id) and walks the
 * counter, which is what makes "same job seed => same image" independent of thread count,
 * batch composition and device.
 *
 * vspec_rng layout (include/vspec/types.h):
 *   key[0..1] = seed (low word, high word)
 *   ctr[2..3] = stream id (low, high)      - fixed for the life of the stream
 *   ctr[0..1] = 64-bit block counter       - block b of the stream is philox(ctr = b)
 *   buf, used = the current block and how many of its 4 words were handed out
 * The n-th u32 of a stream (n = 0, 1, ...) is word n % 4 of block n / 4, so every draw is a
 * pure function of (seed, stream, n). Helpers below consume a fixed number of u32 words
 * per call (uniform: 2, normal: 4), so the k-th uniform/normal of a stream is also fixed.
 */
#ifndef VS_PHILOX_H
#define VS_PHILOX_H

#include <stdint.h>

#include "vs_math.h"
#include "vspec/types.h"

#define VS_PHILOX_M0 0xD2511F53u
#define VS_PHILOX_M1 0xCD9E8D57u
#define VS_PHILOX_W0 0x9E3779B9u /* golden ratio */
#define VS_PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

VS_HD static inline void vs_philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

/* One Philox4x32-10 block: out = philox(ctr, key). out may alias ctr. */
VS_HD static inline void vs_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                          uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    if (round > 0) { /* the key schedule bumps between rounds, not before the first */
      k0 += VS_PHILOX_W0;
      k1 += VS_PHILOX_W1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    vs_philox_mulhilo(VS_PHILOX_M0, c0, &hi0, &lo0);
    vs_philox_mulhilo(VS_PHILOX_M1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* Starts stream `stream` of `seed` at draw 0. */
VS_HD static inline void vs_rng_init(vspec_rng *r, uint64_t seed, uint64_t stream) {
  r->key[0] = (uint32_t)seed;
  r->key[1] = (uint32_t)(seed >> 32);
  r->ctr[0] = 0;
  r->ctr[1] = 0;
  r->ctr[2] = (uint32_t)stream;
  r->ctr[3] = (uint32_t)(stream >> 32);
  r->buf[0] = r->buf[1] = r->buf[2] = r->buf[3] = 0;
  r->used = 4;
}

VS_HD static inline uint32_t vs_rng_next_u32(vspec_rng *r) {
  if (r->used >= 4) {
    vs_philox4x32_10(r->ctr, r->key, r->buf);
    /* 64-bit block counter; 2^64 blocks per stream will not wrap in practice */
    if (++r->ctr[0] == 0) r->ctr[1]++;
    r->used = 0;
  }
  return r->buf[r->used++];
}

/* Uniform double in [0, 1) with 53 random bits (27 from one word, 26 from the next), so
 * every value is a multiple of 2^-53 and 1.0 is unreachable. */
VS_HD static inline double vs_rng_uniform(vspec_rng *r) {
  uint32_t a = vs_rng_next_u32(r) >> 5;
  uint32_t b = vs_rng_next_u32(r) >> 6;
  return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

/* The n-th uniform of stream `stream` of `seed`, as the n-th vs_rng_uniform of a fresh stream
 * returns it (words 2n and 2n + 1: one block), without walking the stream: per-position noise
 * that any round can recompute. */
VS_HD static inline double vs_rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t n) {
  uint32_t ctr[4] = {(uint32_t)(n >> 1), (uint32_t)(n >> 33), (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
  vs_philox4x32_10(ctr, key, out);
  int w = (int)(n & 1) * 2;
  uint32_t a = out[w] >> 5, b = out[w + 1] >> 6;
  return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller. The radius uses 1 - u in (0, 1], so log(0) cannot occur
 * and the largest |z| is sqrt(-2 ln 2^-53) ~ 8.6. Only the cosine branch is returned: the
 * sine twin is dropped so that a normal always costs exactly 4 words and the draw stays a
 * pure function of the position in the stream. */
VS_HD static inline double vs_rng_normal(vspec_rng *r) {
  double u1 = 1.0 - vs_rng_uniform(r);
  double u2 = vs_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* VS_PHILOX_H */
