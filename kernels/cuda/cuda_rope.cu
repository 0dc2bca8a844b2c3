/*
 * kernels/cuda/cuda_rope.cu - LlamaGen's 2-D rotary embedding on the device. The table is
 * built on the host (kernels/host/host_rope.c) and uploaded by the backend; the rotation is
 * the shared vs_rope_rotate.
 */
#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/host/host_math.h"

void vs_cuda_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table) {
  vs_host_rope2d_table(n_cond, grid, head_dim, base, table);
}

/* One thread per (row, head, pair). */
__global__ void vs_k_rope(float *x, int rows, int row_stride, int n_heads, int head_dim,
                          const int32_t *pos, const float *table) {
  int half = head_dim / 2;
  size_t total = (size_t)rows * n_heads * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int j = (int)(i % (size_t)half);
    size_t rh = i / (size_t)half;
    int h = (int)(rh % (size_t)n_heads), r = (int)(rh / (size_t)n_heads);
    const float *t = table + (size_t)pos[r] * half * 2;
    float *xh = x + (size_t)r * row_stride + (size_t)h * head_dim;
    float y0, y1;
    vs_rope_rotate(xh[2 * j], xh[2 * j + 1], t[2 * j], t[2 * j + 1], &y0, &y1);
    xh[2 * j] = y0;
    xh[2 * j + 1] = y1;
  }
}

void vs_cuda_rope_apply(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads,
                        int head_dim, const int32_t *pos, const float *table) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (rows <= 0 || n_heads <= 0 || head_dim < 2 || d->failed || !vs_cuda_enter(d)) return;
  const int32_t *pos_dev = vs_cuda_stage_pos(d, pos, (size_t)rows);
  if (!pos_dev) return;
  size_t total = (size_t)rows * n_heads * (head_dim / 2);
  vs_k_rope<<<vs_cuda_grid(total, 256), 256, 0, d->stream>>>(x, rows, row_stride, n_heads,
                                                            head_dim, pos_dev, table);
  VS_CUDA_LAUNCHED(d, "rope_apply");
}
