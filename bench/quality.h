/*
 * bench/quality.h - image-quality metrics on classifier features.
 *
 *  - Feature statistics: mean and unbiased covariance (divisor n - 1, as numpy.cov and the
 *    reference FID code use), accumulated in double.
 *  - FID (Heusel et al. 2017, "GANs Trained by a Two Time-Scale Update Rule Converge to a
 *    Local Nash Equilibrium", eq. 6): the Frechet distance of the Gaussians fitted to two
 *    feature sets,
 *        FID = ||mu1 - mu2||^2 + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^{1/2}).
 *    Tr((S1 S2)^{1/2}) is computed without a non-symmetric matrix square root: with
 *    A = S1^{1/2} (symmetric, from an eigendecomposition), S1 S2 = A (A S2 A) A^{-1} is
 *    similar to the symmetric PSD matrix M = A S2 A, so Tr((S1 S2)^{1/2}) is the sum of
 *    sqrt(eig(M)). Both eigendecompositions use LAPACK's dsyevd; eigenvalues that rounding
 *    made slightly negative are clamped to 0, clearly negative ones (not a covariance) are
 *    an error. This also works for singular covariances (fewer samples than dimensions).
 *  - Class accuracy: the fraction of samples whose argmax logit is their label.
 *  - Precision and recall with k-NN manifolds (Kynkaanniemi et al. 2019, "Improved
 *    Precision and Recall Metric for Assessing Generative Models", eqs. 1-3): each real
 *    feature r gets the radius of its k-th nearest neighbour among the other real
 *    features; precision is the fraction of generated features inside at least one real
 *    ball, recall the fraction of real features inside at least one generated ball
 *    (radii among the generated features). The paper and VS_PR_K use k = 3.
 *
 * Distances, ties and duplicates: squared Euclidean distances come from a double GEMM as
 * ||a||^2 + ||b||^2 - 2 a.b over blocks of rows (memory O(block^2), not O(n^2)), after
 * subtracting a common centre so the norms stay small; where that expansion cancels to
 * below 1e-8 of the norms, the distance is recomputed directly as sum (a - b)^2, so exact
 * duplicates are exactly 0 apart. A sample is "inside" a ball when its distance is <= the
 * radius (a tie counts as inside, as in the authors' code). Only a sample itself is left
 * out of its own neighbour search: a duplicate of it is an ordinary neighbour at distance
 * 0, so k + 1 identical samples have radius 0 and still contain each other.
 */
#ifndef VS_BENCH_QUALITY_H
#define VS_BENCH_QUALITY_H

#include <stddef.h>
#include <stdint.h>

/* Neighbourhood size of the k-NN manifolds (Kynkaanniemi et al. 2019 use k = 3). */
#define VS_PR_K 3

/* mu [d], cov [d, d] (row-major, symmetric) of x [n, d]; n >= 2. Fails on NaN/inf. */
int vs_feature_stats(const float *x, int n, int d, double *mu, double *cov, char *err,
                     size_t errlen);

/* Frechet distance between N(mu1, cov1) and N(mu2, cov2) of dimension d. */
int vs_fid(const double *mu1, const double *cov1, const double *mu2, const double *cov2, int d,
           double *fid, char *err, size_t errlen);

/* Fraction of the n samples whose first maximal logit (of num_classes) equals labels[i].
 * A label outside 0..num_classes-1 counts as wrong. n = 0 gives NAN. */
double vs_class_accuracy(const float *logits, int n, int num_classes, const int32_t *labels);

/* Squared k-NN radii of the rows of x [n, d] among themselves (n > k). block <= 0 picks
 * the default tile size (the tests pass small ones to exercise the tiling). */
int vs_knn_radii2(const float *x, int n, int d, int k, int block, double *radii2, char *err,
                  size_t errlen);

/* Precision and recall of `fake` [n_fake, d] against `real` [n_real, d] with k-NN
 * manifolds. real_radii2 may be NULL (computed here) or the output of vs_knn_radii2 on
 * the same real rows with the same k, so a fixed reference set is searched only once. */
int vs_precision_recall(const float *real, int n_real, const double *real_radii2,
                        const float *fake, int n_fake, int d, int k, int block,
                        double *precision, double *recall, char *err, size_t errlen);

#endif /* VS_BENCH_QUALITY_H */
