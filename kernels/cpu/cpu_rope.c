/*
 * kernels/cpu/cpu_rope.c - LlamaGen's 2-D rotary position embedding
 * (autoregressive/models/gpt.py, precompute_freqs_cis_2d and apply_rotary_emb).
 *
 * head_dim must be a multiple of 4 (two axes, each of head_dim/4 interleaved pairs); the
 * reference cannot build its table otherwise either.
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/host/host_math.h"

void vs_cpu_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table) {
  vs_host_rope2d_table(n_cond, grid, head_dim, base, table);
}

void vs_cpu_rope_apply(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads,
                       int head_dim, const int32_t *pos, const float *table) {
  int half = head_dim / 2;
  for (int r = 0; r < rows; r++) {
    const float *t = table + (size_t)pos[r] * half * 2;
    float *xr = x + (size_t)r * row_stride;
    for (int h = 0; h < n_heads; h++) {
      float *xh = xr + (size_t)h * head_dim;
      for (int j = 0; j < half; j++) {
        vs_rope_rotate(xh[2 * j], xh[2 * j + 1], t[2 * j], t[2 * j + 1], &xh[2 * j],
                       &xh[2 * j + 1]);
      }
    }
  }
}
