/*
 * kernels/cuda/cuda_reduce.h - block-wide reductions shared by the CUDA kernels (attention,
 * tree attention, softmax): a warp shuffle, then thread 0 over the warps' partials. Every
 * thread of the block must call them (each holds barriers), with a block of whole warps and
 * at most 31 of them: the result travels through red[31]. red is shared memory of 32 entries.
 */
#ifndef VS_CUDA_REDUCE_H
#define VS_CUDA_REDUCE_H

/* Largest value over the block (fmaxf: a NaN loses to a number). */
__device__ static inline float vs_block_max(float v, float *red) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, red[i]);
    red[31] = m;
  }
  __syncthreads();
  float r = red[31];
  __syncthreads();
  return r;
}

/* Sum over the block in double, warps added in a fixed order (the same bits every run). */
__device__ static inline double vs_block_dsum(double v, double *red) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += red[i];
    red[31] = s;
  }
  __syncthreads();
  double r = red[31];
  __syncthreads();
  return r;
}

#endif /* VS_CUDA_REDUCE_H */
