/*
 * kernels/host/host_rope.c - LlamaGen's 2-D rotary position table (gpt.py,
 * precompute_freqs_cis_2d), built
 * on the host and uploaded by the backends to whatever device they run on.
 *
 * head_dim must be a multiple of 4 (two axes, each of head_dim/4 interleaved pairs); the
 * reference cannot build its table otherwise either.
 */
#include <math.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/host/host_math.h"

void vs_host_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table) {
  int half = head_dim / 2; /* pairs per head */
  int quarter = half / 2;  /* frequencies per axis */
  if (half <= 0) return;
  size_t row_floats = (size_t)half * 2;
  /* Condition rows are (cos, sin) = (0, 0), not the identity: this zeroes condition
   * queries and keys, a quirk the released checkpoints were trained with (upstream prepends
   * zeros(cls_token_num, head_dim / 2, 2) to the table, in training too). */
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

