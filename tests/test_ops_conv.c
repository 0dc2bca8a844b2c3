/* tests/test_ops_conv.c - conv2d and nearest x2 upsampling (LlamaGen vq_model.py: ResnetBlock,
 * Upsample). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tests/support/kernels_testutil.h"

typedef struct {
  int cin, h, w, cout, kh, kw, stride, pt, pl, pb, pr, bias;
} conv_case;

/* direct definition: y[co][oy][ox] = b + sum x[ci][oy*s - pt + ki][ox*s - pl + kj] w[...] */
static void ref_conv(const conv_case *c, const float *x, const float *wt, const float *b,
                     int ho, int wo, double *y) {
  for (int co = 0; co < c->cout; co++)
    for (int oy = 0; oy < ho; oy++)
      for (int ox = 0; ox < wo; ox++) {
        double s = c->bias ? b[co] : 0.0;
        for (int ci = 0; ci < c->cin; ci++)
          for (int ki = 0; ki < c->kh; ki++)
            for (int kj = 0; kj < c->kw; kj++) {
              int iy = oy * c->stride - c->pt + ki, ix = ox * c->stride - c->pl + kj;
              if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w) continue;
              s += (double)x[((size_t)ci * c->h + iy) * c->w + ix] *
                   wt[(((size_t)co * c->cin + ci) * c->kh + ki) * c->kw + kj];
            }
        y[((size_t)co * ho + oy) * wo + ox] = s;
      }
}

static void check(vspec_dev *dev, const conv_case *c, uint64_t seed) {
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  int ho = (c->h + c->pt + c->pb - c->kh) / c->stride + 1;
  int wo = (c->w + c->pl + c->pr - c->kw) / c->stride + 1;
  size_t nx = (size_t)c->cin * c->h * c->w, nw = (size_t)c->cout * c->cin * c->kh * c->kw;
  size_t ny = (size_t)c->cout * ho * wo;
  float *x = vt_malloc(nx * sizeof(float)), *wt = vt_malloc(nw * sizeof(float));
  float *b = vt_malloc(c->cout * sizeof(float)), *y = vt_malloc(ny * sizeof(float));
  double *ref = vt_malloc(ny * sizeof(double));
  vt_fill(&rng, x, nx, -1, 1);
  vt_fill(&rng, wt, nw, -0.5f, 0.5f);
  vt_fill(&rng, b, c->cout, -1, 1);
  for (size_t i = 0; i < ny; i++) y[i] = NAN; /* y is output only */
  ref_conv(c, x, wt, b, ho, wo, ref);
  vs_dev_ops(dev)->conv2d(dev, x, c->cin, c->h, c->w, wt, c->bias ? b : NULL, c->cout, c->kh,
                          c->kw, c->stride, c->pt, c->pl, c->pb, c->pr, y);
  char what[128];
  snprintf(what, sizeof what, "conv %dx%dx%d -> %d k%dx%d s%d pad %d,%d,%d,%d", c->cin, c->h, c->w,
           c->cout, c->kh, c->kw, c->stride, c->pt, c->pl, c->pb, c->pr);
  vt_assert_close_scaled(y, ref, ny, 1e-5, what);
  free(x);
  free(wt);
  free(b);
  free(y);
  free(ref);
}

static void test_conv_3x3(void **state) {
  vspec_dev *dev = vt_dev(1);
  const conv_case cases[] = {
      {5, 9, 11, 7, 3, 3, 1, 1, 1, 1, 1, 1}, /* ResnetBlock / conv_in style */
      {5, 9, 11, 7, 3, 3, 1, 1, 1, 1, 1, 0},
      {3, 1, 1, 4, 3, 3, 1, 1, 1, 1, 1, 1}, /* a single pixel sees only the centre tap */
      {2, 5, 4, 3, 3, 3, 1, 0, 0, 0, 0, 1}, /* valid convolution */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check(dev, &cases[i], 60 + i);
  vs_dev_destroy(dev);
}

/* LlamaGen Downsample: F.pad(x, (0, 1, 0, 1)) then 3x3 stride 2 pad 0, i.e. padding
 * top 0, left 0, bottom 1, right 1 */
static void test_conv_downsample(void **state) {
  vspec_dev *dev = vt_dev(1);
  const conv_case cases[] = {
      {4, 8, 8, 4, 3, 3, 2, 0, 0, 1, 1, 1},
      {3, 9, 7, 5, 3, 3, 2, 0, 0, 1, 1, 1}, /* odd sizes */
      {6, 16, 16, 6, 3, 3, 2, 0, 0, 1, 1, 0},
      {2, 7, 10, 3, 4, 2, 3, 2, 1, 0, 3, 1}, /* odd kernel shape, stride 3, ragged pads */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check(dev, &cases[i], 70 + i);
  /* output size follows (h + pt + pb - kh)/stride + 1 = (8 + 1 - 3)/2 + 1 = 4 */
  float x[64], w[9], y[16 + 1];
  for (int i = 0; i < 64; i++) x[i] = 1.0f;
  for (int i = 0; i < 9; i++) w[i] = 1.0f;
  y[16] = 12345.0f; /* guard: nothing written past ho*wo */
  vs_dev_ops(dev)->conv2d(dev, x, 1, 8, 8, w, NULL, 1, 3, 3, 2, 0, 0, 1, 1, y);
  assert_true(y[16] == 12345.0f);
  assert_true(y[0] == 9.0f && y[3] == 6.0f && y[15] == 4.0f); /* right/bottom edge in padding */
  vs_dev_destroy(dev);
}

static void test_conv_1x1(void **state) {
  vspec_dev *dev = vt_dev(1);
  const conv_case cases[] = {
      {8, 6, 5, 12, 1, 1, 1, 0, 0, 0, 0, 1}, /* nin_shortcut / q,k,v / post_quant_conv */
      {8, 6, 5, 12, 1, 1, 1, 0, 0, 0, 0, 0},
      {3, 7, 7, 2, 1, 1, 2, 0, 0, 0, 0, 1},  /* strided 1x1 takes the im2col path */
      {3, 4, 4, 2, 1, 1, 1, 1, 1, 1, 1, 1},  /* padded 1x1: border is just the bias */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check(dev, &cases[i], 80 + i);
  vs_dev_destroy(dev);
}

/* big enough that the im2col buffer is built in several bands of output rows */
static void test_conv_banded(void **state) {
  vspec_dev *dev = vt_dev(1);
  const conv_case c = {64, 128, 128, 4, 3, 3, 1, 1, 1, 1, 1, 1};
  check(dev, &c, 90);
  vs_dev_destroy(dev);
}

static void test_upsample(void **state) {
  vspec_dev *dev = vt_dev(1);
  const int ch = 3, h = 4, w = 5;
  float x[3 * 4 * 5], y[3 * 8 * 10];
  for (int i = 0; i < ch * h * w; i++) x[i] = (float)i;
  vs_dev_ops(dev)->upsample_nearest2x(dev, x, ch, h, w, y);
  for (int c = 0; c < ch; c++)
    for (int i = 0; i < 2 * h; i++)
      for (int j = 0; j < 2 * w; j++)
        assert_true(y[(c * 2 * h + i) * 2 * w + j] == x[(c * h + i / 2) * w + j / 2]);
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conv_3x3),     cmocka_unit_test(test_conv_downsample),
      cmocka_unit_test(test_conv_1x1),     cmocka_unit_test(test_conv_banded),
      cmocka_unit_test(test_upsample),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
