/*
 * bench/quality.c - feature statistics, FID, class accuracy, k-NN precision/recall
 * (definitions and references in quality.h).
 *
 * Everything here is double precision on the host. The products are small (FID: 128x128
 * matrices) or dominated by one distance GEMM per pair of row blocks, and double makes
 * the radius comparisons of precision/recall free of float rounding (measured on the
 * 2-core development machine: one pass over 10k x 10k pairs of 128-d features, GEMM and
 * neighbour bookkeeping, costs about 1.5 s of CPU time).
 * The GEMMs go through BLIS's CBLAS (already linked for the kernels); the eigensolver is
 * LAPACKE_dsyevd from Debian's reference LAPACK, which the Makefile links statically so
 * that the shared libblas.so.3/liblapack.so.3 alternatives (possibly OpenBLAS) are never
 * loaded next to BLIS.
 */
#include "bench/quality.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* BLIS's cblas.h defines unused static functions that -Wextra -Werror rejects (as its
 * blis.h does, see kernels/cpu/cpu_gemm.c). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wtype-limits"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <cblas.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#include <lapacke.h>

#include "core/status.h"
#include "vspec/types.h"

/* Rows per distance tile: a 1024 x 1024 double tile is 8 MiB. */
#define VS_Q_BLOCK 1024
/* Below this fraction of ||a||^2 + ||b||^2 the GEMM expansion of ||a - b||^2 has lost
 * most of its digits to cancellation; such pairs are recomputed directly. */
#define VS_Q_EXACT_REL 1e-8
/* Eigenvalues below -VS_Q_NEG_REL * max|eig| mean the matrix is not a covariance. */
#define VS_Q_NEG_REL 1e-6

/* ---- statistics ---------------------------------------------------------------------- */

int vs_feature_stats(const float *x, int n, int d, double *mu, double *cov, char *err,
                     size_t errlen) {
  if (n < 2 || d < 1)
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "feature statistics need at least 2 samples of dimension >= 1 (got %d x %d)",
                   n, d);
  for (int j = 0; j < d; j++) mu[j] = 0.0;
  for (int i = 0; i < n; i++) {
    const float *r = x + (size_t)i * d;
    for (int j = 0; j < d; j++) {
      if (!isfinite(r[j]))
        return vs_fail(err, errlen, VSPEC_ERANGE, "feature %d of sample %d is not finite", j,
                       i);
      mu[j] += r[j];
    }
  }
  for (int j = 0; j < d; j++) mu[j] /= n;
  /* Two passes (centre, then X^T X) rather than sum x x^T - n mu mu^T, which cancels badly
   * when the mean is large against the spread, as it is for post-ReLU features. */
  enum { ROWS = 256 };
  double *buf = malloc(sizeof(double) * ROWS * (size_t)d);
  if (!buf) return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
  memset(cov, 0, sizeof(double) * (size_t)d * d);
  for (int i0 = 0; i0 < n; i0 += ROWS) {
    int m = n - i0 < ROWS ? n - i0 : ROWS;
    for (int i = 0; i < m; i++)
      for (int j = 0; j < d; j++)
        buf[(size_t)i * d + j] = (double)x[(size_t)(i0 + i) * d + j] - mu[j];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, m, 1.0, buf, d, 1.0, cov, d);
  }
  free(buf);
  for (int i = 0; i < d; i++)
    for (int j = i; j < d; j++) {
      double v = cov[(size_t)i * d + j] / (n - 1);
      cov[(size_t)i * d + j] = cov[(size_t)j * d + i] = v;
    }
  return VSPEC_OK;
}

/* ---- FID ----------------------------------------------------------------------------- */

/* Eigenvalues (ascending) and, when vecs, eigenvectors (columns of m) of the symmetric
 * matrix m [d, d], overwritten. */
static int vs_q_eigh(double *m, int d, int vecs, double *w, const char *what, char *err,
                     size_t errlen) {
  lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, vecs ? 'V' : 'N', 'U', d, m, d, w);
  if (info != 0)
    return vs_fail(err, errlen, info < 0 ? VSPEC_EINVAL : VSPEC_ERANGE,
                   "FID: LAPACKE_dsyevd on %s failed (info %d)", what, (int)info);
  double big = fmax(fabs(w[0]), fabs(w[d - 1]));
  if (w[0] < -VS_Q_NEG_REL * big)
    return vs_fail(err, errlen, VSPEC_ERANGE,
                   "FID: %s has eigenvalue %.3g (largest %.3g): not positive semi-definite, "
                   "so not a covariance",
                   what, w[0], big);
  return VSPEC_OK;
}

int vs_fid(const double *mu1, const double *cov1, const double *mu2, const double *cov2, int d,
           double *fid, char *err, size_t errlen) {
  *fid = NAN;
  if (d < 1) return vs_fail(err, errlen, VSPEC_EINVAL, "FID: dimension %d", d);
  size_t dd = (size_t)d * d;
  double diff = 0.0, tr1 = 0.0, tr2 = 0.0;
  for (int i = 0; i < d; i++) {
    double t = mu1[i] - mu2[i];
    diff += t * t;
    tr1 += cov1[(size_t)i * d + i];
    tr2 += cov2[(size_t)i * d + i];
  }
  for (size_t i = 0; i < dd; i++)
    if (!isfinite(cov1[i]) || !isfinite(cov2[i]))
      return vs_fail(err, errlen, VSPEC_ERANGE, "FID: covariance entry %zu is not finite", i);
  if (!isfinite(diff))
    return vs_fail(err, errlen, VSPEC_ERANGE, "FID: a mean is not finite");

  double *v = malloc(sizeof(double) * dd), *a = malloc(sizeof(double) * dd);
  double *t = malloc(sizeof(double) * dd), *w = malloc(sizeof(double) * (size_t)d);
  int rc = VSPEC_OK;
  if (!v || !a || !t || !w) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
    goto done;
  }
  /* A = S1^{1/2} = V diag(sqrt(l)) V^T; symmetrising first so that the "U" triangle
   * LAPACK reads is the average of both. */
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++)
      v[(size_t)i * d + j] = 0.5 * (cov1[(size_t)i * d + j] + cov1[(size_t)j * d + i]);
  rc = vs_q_eigh(v, d, 1, w, "the first covariance", err, errlen);
  if (rc) goto done;
  for (int j = 0; j < d; j++) {
    double s = sqrt(fmax(w[j], 0.0));
    for (int i = 0; i < d; i++) t[(size_t)i * d + j] = v[(size_t)i * d + j] * s;
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, d, 1.0, t, d, v, d, 0.0, a, d);
  /* M = A S2 A */
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, a, d, cov2, d, 0.0, t,
              d);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, t, d, a, d, 0.0, v, d);
  for (int i = 0; i < d; i++)
    for (int j = i + 1; j < d; j++) {
      double s = 0.5 * (v[(size_t)i * d + j] + v[(size_t)j * d + i]);
      v[(size_t)i * d + j] = v[(size_t)j * d + i] = s;
    }
  rc = vs_q_eigh(v, d, 0, w, "S1^1/2 S2 S1^1/2", err, errlen);
  if (rc) goto done;
  double tr_sqrt = 0.0;
  for (int j = 0; j < d; j++) tr_sqrt += sqrt(fmax(w[j], 0.0));
  double f = diff + tr1 + tr2 - 2.0 * tr_sqrt;
  /* The exact value is a squared distance, >= 0; a tiny negative result is rounding in
   * the trace terms (identical statistics). */
  *fid = f > 0.0 ? f : 0.0;
done:
  free(v);
  free(a);
  free(t);
  free(w);
  return rc;
}

/* ---- accuracy ------------------------------------------------------------------------ */

double vs_class_accuracy(const float *logits, int n, int num_classes, const int32_t *labels) {
  if (n <= 0) return NAN;
  long correct = 0;
  for (int i = 0; i < n; i++) {
    const float *l = logits + (size_t)i * num_classes;
    int best = 0;
    for (int j = 1; j < num_classes; j++)
      if (l[j] > l[best]) best = j;
    correct += labels[i] == best;
  }
  return (double)correct / n;
}

/* ---- k-NN precision and recall --------------------------------------------------------- */

/* Rows in double, shifted by a common centre, with their squared norms. */
typedef struct vs_q_points {
  double *x;  /* [n, d] */
  double *n2; /* [n] */
  int n;
} vs_q_points;

static void vs_q_points_free(vs_q_points *p) {
  free(p->x);
  free(p->n2);
  memset(p, 0, sizeof *p);
}

static int vs_q_points_make(const float *x, int n, int d, const double *centre, vs_q_points *p,
                            char *err, size_t errlen) {
  p->n = n;
  p->x = malloc(sizeof(double) * (size_t)n * d);
  p->n2 = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  if (!p->x || !p->n2) {
    vs_q_points_free(p);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory for %d x %d features", n, d);
  }
  for (int i = 0; i < n; i++) {
    double s = 0.0;
    for (int j = 0; j < d; j++) {
      double v = (double)x[(size_t)i * d + j] - centre[j];
      p->x[(size_t)i * d + j] = v;
      s += v * v;
    }
    if (!isfinite(s)) {
      vs_q_points_free(p);
      return vs_fail(err, errlen, VSPEC_ERANGE, "feature row %d is not finite", i);
    }
    p->n2[i] = s;
  }
  return VSPEC_OK;
}

static void vs_q_mean(const float *x, int n, int d, double *mu) {
  for (int j = 0; j < d; j++) mu[j] = 0.0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++) mu[j] += x[(size_t)i * d + j];
  for (int j = 0; j < d; j++) mu[j] /= n > 0 ? n : 1;
}

/* Squared distances of rows a[i0, i0 + ni) to b[j0, j0 + nj) into out [ni, nj]. */
static void vs_q_dist2(const vs_q_points *a, int i0, int ni, const vs_q_points *b, int j0, int nj,
                       int d, double *out) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ni, nj, d, -2.0, a->x + (size_t)i0 * d, d,
              b->x + (size_t)j0 * d, d, 0.0, out, nj);
  for (int i = 0; i < ni; i++) {
    double na = a->n2[i0 + i];
    double *row = out + (size_t)i * nj;
    for (int j = 0; j < nj; j++) {
      double nb = b->n2[j0 + j], v = row[j] + na + nb;
      if (v <= VS_Q_EXACT_REL * (na + nb)) {
        const double *pa = a->x + (size_t)(i0 + i) * d, *pb = b->x + (size_t)(j0 + j) * d;
        v = 0.0;
        for (int k = 0; k < d; k++) v += (pa[k] - pb[k]) * (pa[k] - pb[k]);
      }
      row[j] = v;
    }
  }
}

/* Keeps best[0..k) as the k smallest values seen, ascending. */
static inline void vs_q_push(double *best, int k, double v) {
  if (!(v < best[k - 1])) return;
  int i = k - 1;
  while (i > 0 && best[i - 1] > v) {
    best[i] = best[i - 1];
    i--;
  }
  best[i] = v;
}

/* Squared k-NN radii of p's rows among themselves. Each unordered pair is computed once:
 * only tiles on or above the diagonal, each distance offered to both rows. */
static int vs_q_knn(const vs_q_points *p, int d, int k, int block, double *radii2, char *err,
                    size_t errlen) {
  int n = p->n;
  if (k < 1 || n <= k)
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "k-NN radii need more than k = %d samples (got %d)", k, n);
  double *best = malloc(sizeof(double) * (size_t)n * k);
  double *tile = malloc(sizeof(double) * (size_t)block * block);
  if (!best || !tile) {
    free(best);
    free(tile);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory for k-NN radii");
  }
  for (size_t i = 0; i < (size_t)n * k; i++) best[i] = INFINITY;
  for (int i0 = 0; i0 < n; i0 += block) {
    int ni = n - i0 < block ? n - i0 : block;
    for (int j0 = i0; j0 < n; j0 += block) {
      int nj = n - j0 < block ? n - j0 : block;
      vs_q_dist2(p, i0, ni, p, j0, nj, d, tile);
      for (int i = 0; i < ni; i++) {
        const double *row = tile + (size_t)i * nj;
        double *bi = best + (size_t)(i0 + i) * k;
        /* on a diagonal tile, pairs j > i only: a row is not its own neighbour */
        for (int j = j0 == i0 ? i + 1 : 0; j < nj; j++) {
          vs_q_push(bi, k, row[j]);
          vs_q_push(best + (size_t)(j0 + j) * k, k, row[j]);
        }
      }
    }
  }
  for (int i = 0; i < n; i++) radii2[i] = best[(size_t)i * k + k - 1];
  free(best);
  free(tile);
  return VSPEC_OK;
}

int vs_knn_radii2(const float *x, int n, int d, int k, int block, double *radii2, char *err,
                  size_t errlen) {
  if (block <= 0) block = VS_Q_BLOCK;
  double *centre = malloc(sizeof(double) * (size_t)d);
  if (!centre) return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
  vs_q_mean(x, n, d, centre);
  vs_q_points p = {0};
  int rc = vs_q_points_make(x, n, d, centre, &p, err, errlen);
  if (!rc) rc = vs_q_knn(&p, d, k, block, radii2, err, errlen);
  vs_q_points_free(&p);
  free(centre);
  return rc;
}

int vs_precision_recall(const float *real, int n_real, const double *real_radii2,
                        const float *fake, int n_fake, int d, int k, int block,
                        double *precision, double *recall, char *err, size_t errlen) {
  *precision = *recall = NAN;
  if (block <= 0) block = VS_Q_BLOCK;
  if (n_real <= k || n_fake <= k)
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "precision/recall with k = %d need more than %d real and generated samples "
                   "(got %d and %d)",
                   k, k, n_real, n_fake);
  /* Translation does not change distances; the real mean as the common centre keeps the
   * norms in the GEMM expansion small for both sets. */
  double *centre = malloc(sizeof(double) * (size_t)d);
  double *rr2 = malloc(sizeof(double) * (size_t)n_real), *fr2 = malloc(sizeof(double) * (size_t)n_fake);
  double *tile = malloc(sizeof(double) * (size_t)block * block);
  unsigned char *fake_in = calloc((size_t)n_fake, 1), *real_in = calloc((size_t)n_real, 1);
  vs_q_points r = {0}, f = {0};
  int rc = VSPEC_OK;
  if (!centre || !rr2 || !fr2 || !tile || !fake_in || !real_in) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory for precision/recall");
    goto done;
  }
  vs_q_mean(real, n_real, d, centre);
  rc = vs_q_points_make(real, n_real, d, centre, &r, err, errlen);
  if (!rc) rc = vs_q_points_make(fake, n_fake, d, centre, &f, err, errlen);
  if (rc) goto done;
  if (real_radii2)
    memcpy(rr2, real_radii2, sizeof(double) * (size_t)n_real);
  else
    rc = vs_q_knn(&r, d, k, block, rr2, err, errlen);
  if (!rc) rc = vs_q_knn(&f, d, k, block, fr2, err, errlen);
  if (rc) goto done;
  /* One pass over all (fake, real) pairs answers both questions. */
  for (int j0 = 0; j0 < n_fake; j0 += block) {
    int nj = n_fake - j0 < block ? n_fake - j0 : block;
    for (int i0 = 0; i0 < n_real; i0 += block) {
      int ni = n_real - i0 < block ? n_real - i0 : block;
      vs_q_dist2(&f, j0, nj, &r, i0, ni, d, tile);
      for (int j = 0; j < nj; j++) {
        const double *row = tile + (size_t)j * ni;
        double fj = fr2[j0 + j];
        unsigned char in = fake_in[j0 + j];
        for (int i = 0; i < ni; i++) {
          double v = row[i];
          in |= v <= rr2[i0 + i];
          real_in[i0 + i] |= v <= fj;
        }
        fake_in[j0 + j] = in;
      }
    }
  }
  long np = 0, nr = 0;
  for (int j = 0; j < n_fake; j++) np += fake_in[j];
  for (int i = 0; i < n_real; i++) nr += real_in[i];
  *precision = (double)np / n_fake;
  *recall = (double)nr / n_real;
done:
  vs_q_points_free(&r);
  vs_q_points_free(&f);
  free(centre);
  free(rr2);
  free(fr2);
  free(tile);
  free(fake_in);
  free(real_in);
  return rc;
}
