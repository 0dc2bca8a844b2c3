/*
 * kernels/cpu/cpu_rope.c - LlamaGen's 2-D rotary position embedding (models.md §1.6).
 *
 * head_dim must be a multiple of 4 (two axes, each of head_dim/4 interleaved pairs); the
 * reference cannot build its table otherwise either.
 */
#include <math.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"

void vs_cpu_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table) {
  int half = head_dim / 2; /* pairs per head */
  int quarter = half / 2;  /* frequencies per axis */
  if (half <= 0) return;
  size_t row_floats = (size_t)half * 2;
  /* Condition rows are (cos, sin) = (0, 0), not the identity: this zeroes condition
   * queries and keys, a quirk the released checkpoints were trained with (§1.6). */
  if (n_cond > 0) memset(table, 0, (size_t)n_cond * row_floats * sizeof(float));
  for (int j = 0; j < half; j++) {
    int row_axis = j < quarter; /* first quarter of the pairs: row index; second: column */
    float theta = vs_rope_theta(row_axis ? j : j - quarter, head_dim, base);
    for (int r = 0; r < grid; r++) {
      for (int c = 0; c < grid; c++) {
        float *t = table + ((size_t)n_cond + (size_t)r * grid + c) * row_floats;
        /* the reference forms the angle as a float32 product; cos/sin of that float are
         * then taken in double so the entry is the correctly rounded value for it */
        float angle = (float)(row_axis ? r : c) * theta;
        t[2 * j] = (float)cos((double)angle);
        t[2 * j + 1] = (float)sin((double)angle);
      }
    }
  }
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
        float c = t[2 * j], s = t[2 * j + 1];
        float x0 = xh[2 * j], x1 = xh[2 * j + 1];
        xh[2 * j] = x0 * c - x1 * s;
        xh[2 * j + 1] = x1 * c + x0 * s;
      }
    }
  }
}
