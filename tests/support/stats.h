/*
 * tests/support/stats.h - statistics for the distribution tests.
 */
#ifndef VS_TEST_STATS_H
#define VS_TEST_STATS_H

#include <stdint.h>

/* Upper tail P(X >= x) of the chi-square distribution with k degrees of freedom. */
double vs_chi2_sf(double x, double k);

/* Pearson's chi-square test of observed counts against expected probabilities. Cells whose
 * expected count is below `min_expected` are pooled into one cell. Returns the p-value;
 * *stat and *dof receive the statistic and degrees of freedom. */
double vs_chi2_test(const int64_t *observed, const double *prob, int n, int64_t total,
                    double min_expected, double *stat, int *dof);

/* Total variation between two distributions over n outcomes. */
double vs_tv(const double *a, const double *b, int n);

#endif /* VS_TEST_STATS_H */
