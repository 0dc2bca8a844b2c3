/*
 * bench/kid.h - Kernel Inception Distance with its standard error.
 *
 * KID (M. Binkowski, D. J. Sutherland, M. Arbel, A. Gretton, "Demystifying MMD GANs",
 * arXiv 1801.01401) is the squared maximum mean discrepancy between generated and real
 * features under the cubic polynomial kernel k(x, y) = (x.y / d + 1)^3, estimated by the
 * unbiased U-statistic
 *
 *   MMD^2_u = sum_{i != j} k(x_i, x_j) / (m (m - 1)) + sum_{i != j} k(y_i, y_j) / (m (m - 1))
 *             - 2 sum_{i, j} k(x_i, y_j) / m^2,
 *
 * and, as the paper's code does, averaged over `subsets` random subsets of m =
 * min(subset_size, n, n_ref) generated and m real features drawn without replacement. Unlike
 * FID it has no bias at finite n (its expectation does not depend on n), so a set of
 * images repeated in a bootstrap resample is not needed to get its noise:
 *
 * Standard error: a delete-a-group jackknife over the generated images (groups of
 * consecutive images; each subset's sums are recomputed without the group's rows, with the
 * same real subsets), which is consistent for U-statistics (Arvesen 1969), plus the
 * variance of the mean over subsets (the Monte Carlo noise of the real subsets). A
 * difference of two KIDs on images with the same indices (eval's methods share seeds and
 * classes), or on independent sets, takes the jackknife of the difference over the same
 * groups, so what the two share cancels.
 *
 * Deterministic: the subsets come from the Philox generator with the reference's seed, and
 * every KID computed against one reference uses the same real subsets.
 */
#ifndef VS_BENCH_KID_H
#define VS_BENCH_KID_H

#include <stddef.h>
#include <stdint.h>

#define VS_KID_SUBSETS 100     /* the paper's code: 100 subsets of 1000 */
#define VS_KID_SUBSET_SIZE 1000
#define VS_KID_GROUPS 20       /* jackknife groups of generated images */

typedef struct vs_kid_ref vs_kid_ref;

typedef struct vs_kid_opts {
  int subsets;     /* 0: VS_KID_SUBSETS (at most that) */
  int subset_size; /* 0: VS_KID_SUBSET_SIZE */
  uint64_t seed;
} vs_kid_opts;

typedef struct vs_kid {
  double kid; /* mean over subsets of MMD^2_u */
  double se;  /* standard error of kid */
  int subsets, groups, m;
  double sub[VS_KID_SUBSETS]; /* each subset's MMD^2_u */
  double jack[VS_KID_GROUPS]; /* kid without group g of the generated images */
} vs_kid;

/* The real features ref [n_ref, d] (kept, not copied: they must outlive r). o may be NULL.
 * The real subsets' sums are computed at the first KID of each subset size and kept. */
int vs_kid_ref_open(const float *ref, int n_ref, int d, const vs_kid_opts *o, vs_kid_ref **r,
                    char *err, size_t errlen);
void vs_kid_ref_close(vs_kid_ref *r);

/* KID of the generated features x [n, d] (n >= 2 * VS_KID_GROUPS) against r. */
int vs_kid_compute(vs_kid_ref *r, const float *x, int n, vs_kid *out, char *err,
                   size_t errlen);

/* Standard error of a->kid - b->kid (both against the same reference, same n). */
double vs_kid_diff_se(const vs_kid *a, const vs_kid *b);

#endif /* VS_BENCH_KID_H */
