/*
 * daemon/preview_fit.c - the preview colour table from a few decodes (daemon/preview_fit.h).
 */
#include "daemon/preview_fit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Feature vector of code row e [d]: 1, e/|e|, and (quadratic) the products of the
 * normalised components. The decoder sees unit rows for LlamaGen's tokenizers (codebook
 * l2 norm); the raw rows are added so that a tokenizer without the norm is fitted too. */
static int pf_n_features(int d, int quadratic) {
  return 1 + 2 * d + (quadratic ? d * (d + 1) / 2 : 0);
}

static void pf_features(const float *e, int d, int quadratic, double *f) {
  double ss = 0;
  for (int j = 0; j < d; j++) ss += (double)e[j] * e[j];
  double inv = 1.0 / (sqrt(ss) > 1e-12 ? sqrt(ss) : 1e-12);
  int o = 0;
  f[o++] = 1.0;
  for (int j = 0; j < d; j++) f[o++] = e[j] * inv;
  for (int j = 0; j < d; j++) f[o++] = e[j];
  if (!quadratic) return;
  for (int a = 0; a < d; a++)
    for (int b = a; b < d; b++) f[o++] = e[a] * inv * e[b] * inv;
}

/* Solves the n x n symmetric positive definite system A x = b in place (Cholesky; A is
 * overwritten, x returned in b). Returns 0, or -1 when A is not positive definite. */
static int pf_cholesky_solve(double *A, double *b, int n) {
  for (int j = 0; j < n; j++) {
    double s = A[j * n + j];
    for (int k = 0; k < j; k++) s -= A[j * n + k] * A[j * n + k];
    if (!(s > 0)) return -1;
    A[j * n + j] = sqrt(s);
    for (int i = j + 1; i < n; i++) {
      double t = A[i * n + j];
      for (int k = 0; k < j; k++) t -= A[i * n + k] * A[j * n + k];
      A[i * n + j] = t / A[j * n + j];
    }
  }
  for (int i = 0; i < n; i++) {
    double s = b[i];
    for (int k = 0; k < i; k++) s -= A[i * n + k] * b[k];
    b[i] = s / A[i * n + i];
  }
  for (int i = n - 1; i >= 0; i--) {
    double s = b[i];
    for (int k = i + 1; k < n; k++) s -= A[k * n + i] * b[k];
    b[i] = s / A[i * n + i];
  }
  return 0;
}

/* Sample i of n: evenly spread code indices (distinct for n <= vocab). A trained
 * codebook's order is that of its random initialisation, so this is a uniform sample. */
static int pf_sample_code(int i, int n, int vocab) {
  return (int)((int64_t)i * vocab / n);
}

/* Mean colour of every tile of one decoded image; tile t covers grid rows/columns
 * [t / per * gh / per, ...). */
static void pf_tile_means(const uint8_t *rgb, const vspec_model_info *in, int per, double *out) {
  int H = in->image_h, W = in->image_w;
  for (int ty = 0; ty < per; ty++)
    for (int tx = 0; tx < per; tx++) {
      int y0 = ty * H / per, y1 = (ty + 1) * H / per, x0 = tx * W / per, x1 = (tx + 1) * W / per;
      double s[3] = {0, 0, 0};
      for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++)
          for (int ch = 0; ch < 3; ch++) s[ch] += rgb[((size_t)y * W + x) * 3 + ch];
      double px = (double)(y1 - y0) * (x1 - x0);
      for (int ch = 0; ch < 3; ch++) out[(ty * per + tx) * 3 + ch] = s[ch] / px;
    }
}

/* Decodes the sample codes, per x per of them to a grid, into y [n, 3]. */
static int pf_sample(const vs_backend_model *t, vspec_dev *dev, int n, int per, double *y,
                     char *err, size_t errlen) {
  const vspec_model_info *in = &t->info;
  int gh = in->grid_h, gw = in->grid_w, per_grid = per * per, rc = VSPEC_OK;
  int32_t *grid = malloc((size_t)gh * gw * sizeof *grid);
  uint8_t *rgb = malloc((size_t)in->image_h * in->image_w * 3);
  double *means = malloc((size_t)per_grid * 3 * sizeof *means);
  if (!grid || !rgb || !means) {
    snprintf(err, errlen, "out of memory for the preview colour table");
    rc = VSPEC_ENOMEM;
  }
  for (int first = 0; !rc && first < n; first += per_grid) {
    for (int r = 0; r < gh; r++)
      for (int c = 0; c < gw; c++) {
        int i = first + (r * per / gh) * per + c * per / gw;
        grid[r * gw + c] = pf_sample_code(i < n ? i : first, n, in->vocab);
      }
    char inner[VSPEC_ERRLEN] = "";
    if ((rc = t->vt->decode(t->model, dev, grid, rgb, inner, sizeof inner))) {
      snprintf(err, errlen, "decoding sample codes for the colour table: %s", inner);
      break;
    }
    pf_tile_means(rgb, in, per, means);
    for (int k = 0; k < per_grid && first + k < n; k++)
      memcpy(y + (size_t)(first + k) * 3, means + k * 3, 3 * sizeof *y);
  }
  free(grid);
  free(rgb);
  free(means);
  return rc;
}

/* Least squares with a small ridge, one weight vector per channel: w [3, nf]. */
static int pf_fit(const float *cb, int d, int quadratic, int n, int vocab, const double *y,
                  double *w) {
  int nf = pf_n_features(d, quadratic);
  double *A = calloc((size_t)nf * nf, sizeof *A), *f = malloc((size_t)nf * sizeof *f);
  double *A1 = malloc((size_t)nf * nf * sizeof *A1);
  int rc = A && f && A1 ? 0 : -1;
  memset(w, 0, (size_t)3 * nf * sizeof *w);
  for (int i = 0; !rc && i < n; i++) {
    pf_features(cb + (size_t)pf_sample_code(i, n, vocab) * d, d, quadratic, f);
    for (int a = 0; a < nf; a++) {
      for (int b = 0; b < nf; b++) A[a * nf + b] += f[a] * f[b];
      for (int ch = 0; ch < 3; ch++) w[ch * nf + a] += f[a] * y[i * 3 + ch];
    }
  }
  /* The ridge keeps a fit with fewer samples than features (or collinear ones, as the raw
   * and normalised rows of a unit codebook) solvable; it is small against n. */
  for (int a = 0; !rc && a < nf; a++) A[a * nf + a] += 1e-3 * (n > 0 ? n : 1);
  for (int ch = 0; !rc && ch < 3; ch++) {
    memcpy(A1, A, (size_t)nf * nf * sizeof *A1);
    rc = pf_cholesky_solve(A1, w + (size_t)ch * nf, nf);
  }
  free(A);
  free(A1);
  free(f);
  return rc;
}

static uint8_t pf_u8(double v) {
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : lround(v));
}

int vs_preview_lut_fit(const vs_backend_model *t, vspec_dev *dev, const vs_preview_fit_opts *o,
                       vs_preview_lut *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const vspec_model_info *in = &t->info;
  int d = in->token_dim, vocab = in->vocab;
  if (in->token_kind == VSPEC_TOKENS_CONTINUOUS || !in->image_h || !in->image_w || vocab <= 0)
    return vs_preview_lut_build(t, dev, out, err, errlen); /* its refusal names why */
  if (!in->codebook || d <= 0) {
    snprintf(err, errlen, "the model exposes no codebook: the colour table cannot be fitted");
    return VSPEC_ENOTSUP;
  }
  int per = o->tiles_per_side > 0 ? o->tiles_per_side : 1;
  if (per > in->grid_h) per = in->grid_h;
  if (per > in->grid_w) per = in->grid_w;
  int n = o->samples < vocab ? o->samples : vocab;
  if (n < 1) n = 1;
  int quadratic = o->quadratic && d <= VS_PREVIEW_FIT_MAX_QUAD_DIM;
  int nf = pf_n_features(d, quadratic);
  double *y = malloc((size_t)n * 3 * sizeof *y), *w = malloc((size_t)3 * nf * sizeof *w);
  double *f = malloc((size_t)nf * sizeof *f);
  out->rgb = malloc((size_t)vocab * 3);
  int rc = y && w && f && out->rgb ? VSPEC_OK : VSPEC_ENOMEM;
  if (rc) snprintf(err, errlen, "out of memory for the preview colour table");
  if (!rc) rc = pf_sample(t, dev, n, per, y, err, errlen);
  if (!rc && pf_fit(in->codebook, d, quadratic, n, vocab, y, w)) {
    snprintf(err, errlen, "the colour table's least-squares fit failed (out of memory or a "
             "degenerate codebook)");
    rc = VSPEC_EINVAL;
  }
  for (int c = 0; !rc && c < vocab; c++) {
    pf_features(in->codebook + (size_t)c * d, d, quadratic, f);
    for (int ch = 0; ch < 3; ch++) {
      double v = 0;
      for (int a = 0; a < nf; a++) v += w[ch * nf + a] * f[a];
      out->rgb[c * 3 + ch] = pf_u8(v);
    }
  }
  /* Codes decoded alone on a whole grid keep their exact colour. */
  for (int i = 0; !rc && per == 1 && i < n; i++)
    for (int ch = 0; ch < 3; ch++)
      out->rgb[pf_sample_code(i, n, vocab) * 3 + ch] = pf_u8(y[i * 3 + ch]);
  free(y);
  free(w);
  free(f);
  if (rc) {
    vs_preview_lut_free(out);
    return rc;
  }
  out->vocab = vocab;
  vs_preview_lut_set_neutral(out);
  return VSPEC_OK;
}

void vs_preview_lut_diff(const vs_preview_lut *a, const vs_preview_lut *b, double *mean_abs,
                         int *max_abs) {
  double s = 0;
  int mx = 0;
  int n = a->vocab < b->vocab ? a->vocab : b->vocab;
  for (int i = 0; i < n * 3; i++) {
    int dd = abs((int)a->rgb[i] - (int)b->rgb[i]);
    s += dd;
    if (dd > mx) mx = dd;
  }
  *mean_abs = n ? s / (3.0 * n) : 0;
  *max_abs = mx;
}

void vs_preview_fit_default(const vspec_model_info *in, vs_preview_fit_opts *o) {
  o->samples = VS_PREVIEW_FIT_SAMPLES;
  o->quadratic = 1;
  /* As many pixels decoded as VS_PREVIEW_FIT_SAMPLES decodes of a 32 x 32 image: models/fmnist
   * decodes its samples one per grid (exact samples); a 256 x 256 decoder gets one decode,
   * with the samples on blocks of its grid. */
  int64_t px = (int64_t)in->image_h * in->image_w;
  int64_t decodes = px > 0 ? (int64_t)VS_PREVIEW_FIT_SAMPLES * 32 * 32 / px : 1;
  if (decodes < 1) decodes = 1;
  int per = 1;
  while ((int64_t)per * per * decodes < o->samples) per++;
  o->tiles_per_side = per;
}
