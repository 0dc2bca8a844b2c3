#include "tests/support/stats.h"

#include <math.h>

/* Regularised upper incomplete gamma Q(a, x): series below a + 1, continued fraction
 * above (the classic split for accuracy; written from the textbook definitions). */
static double vs__gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  double lg = lgamma(a);
  if (x < a + 1.0) {
    double sum = 1.0 / a, term = sum, ap = a;
    for (int i = 0; i < 10000; i++) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
      if (fabs(term) < fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * exp(-x + a * log(x) - lg);
  }
  /* Lentz's method for the continued fraction of Q. */
  double b = x + 1.0 - a, c = 1.0 / 1e-300, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; i++) {
    double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    double del = d * c;
    h *= del;
    if (fabs(del - 1.0) < 1e-15) break;
  }
  return exp(-x + a * log(x) - lg) * h;
}

double vs_chi2_sf(double x, double k) { return vs__gamma_q(k / 2.0, x / 2.0); }

double vs_chi2_test(const int64_t *observed, const double *prob, int n, int64_t total,
                    double min_expected, double *stat, int *dof) {
  double chi = 0.0, pooled_e = 0.0, pooled_o = 0.0;
  int cells = 0;
  for (int i = 0; i < n; i++) {
    double e = prob[i] * (double)total;
    if (e < min_expected) {
      pooled_e += e;
      pooled_o += (double)observed[i];
      continue;
    }
    double d = (double)observed[i] - e;
    chi += d * d / e;
    cells++;
  }
  if (pooled_e > 0.0) {
    double d = pooled_o - pooled_e;
    chi += d * d / (pooled_e > 1e-12 ? pooled_e : 1e-12);
    cells++;
  }
  *stat = chi;
  *dof = cells - 1;
  return vs_chi2_sf(chi, cells - 1);
}

double vs_tv(const double *a, const double *b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += fabs(a[i] - b[i]);
  return 0.5 * s;
}
