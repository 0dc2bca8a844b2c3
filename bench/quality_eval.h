/*
 * bench/quality_eval.h - quality of generated images against the Fashion-MNIST test set.
 *
 * One vs_quality holds what every evaluation compares against: the classifier, the
 * reference statistics of the 10k test images in its feature space, the test features
 * themselves (for precision/recall) and the real-data floor. Typical use (eval command):
 *
 *   vs_quality *q;
 *   if (vs_quality_open("models/fmnist", dev, &q, err, sizeof err)) ...;
 *   printf("real-data floor FID %.3f\n", vs_quality_floor(q));   // next to every table
 *   vs_quality_result r;
 *   vs_quality_eval(q, rgb, labels, n, &r, err, sizeof err);     // per method / row
 *   vs_quality_close(q);
 *
 * Files in the model directory:
 *   classifier.safetensors          required (format: bench/classifier.h)
 *   fid_ref.safetensors             reference mean/covariance (F64 or F32) of the test
 *                                   features, and of the 60k training features; tensor
 *                                   names from a small alias table (test.mean/test.cov,
 *                                   test_mu/test_sigma, ...). When the file is absent the
 *                                   test statistics are computed here from the IDX data
 *                                   with the C classifier.
 *   classifier_golden.safetensors   optional: images [G,1,32,32], features, logits from
 *                                   PyTorch for the first G test images. When present,
 *                                   open checks that vspec's preprocessing reproduces the
 *                                   images and the C classifier the features and logits,
 *                                   and fails if not: metrics from a classifier that does
 *                                   not match the trained one would be meaningless.
 *
 * Definitions (quality.h): FID against the reference test statistics; class accuracy
 * under the classifier; precision/recall with k = 3 NN manifolds against the 10k test
 * features. The real-data floor is the FID of the first n_floor (10k) training images
 * against the same test statistics: the value a perfect generator would get at that
 * sample size, since FID is biased upward for finite samples. Compare a generated set with
 * the floor only at the same number of images (10k), and rows of a table with each other
 * only at equal n; precision/recall also depend on n.
 *
 * Cost and cache: the classifier features cost about 35 s of CPU time per 10k images on
 * the 2-core development machine (measured with a random 7-conv 32/64/128-channel net in
 * the exporter's format), and open needs them for the 10k test and 10k training images.
 * So they are cached, with the test k-NN radii, in
 *   <cache_dir>/quality-<FNV-1a 64 of the classifier bytes>-<classifier size>.bin
 * (cache_dir default build/cache, relative to the working directory). The file also
 * records a hash of the image and label bytes used, n_floor, k, the array sizes and a
 * format version, and ends with a checksum of its arrays; any mismatch or a damaged file
 * means recompute and rewrite (to a temporary name, then renamed, so a reader never sees
 * half a file). Retraining the classifier changes its bytes, hence the key, so a stale
 * cache is never used; fid_ref.safetensors is not part of the key because it is read at
 * every open. Deleting build/cache is always safe.
 *
 * Not thread-safe: one vs_quality per thread (the classifier holds scratch buffers).
 */
#ifndef VS_BENCH_QUALITY_EVAL_H
#define VS_BENCH_QUALITY_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "vspec/ops.h"

typedef struct vs_quality vs_quality;

typedef struct vs_quality_result {
  int n;            /* images evaluated */
  double fid;       /* against the reference test statistics */
  double class_acc; /* fraction classified as their label; NAN when labels == NULL */
  double precision; /* k = VS_PR_K manifolds, against the test features */
  double recall;
} vs_quality_result;

typedef struct vs_quality_opts {
  const char *data_dir;  /* IDX files; NULL: VS_FMNIST_DIR */
  const char *cache_dir; /* NULL: "build/cache"; "": no cache */
  int n_floor;           /* training images for the floor; 0: 10000 */
  int verbose;           /* progress lines on stderr */
} vs_quality_opts;

/* What open found and computed, for reports (vspec-bench quality prints all of it). */
typedef struct vs_quality_info {
  char classifier_path[1100];
  uint64_t classifier_bytes, classifier_hash; /* hash: FNV-1a 64 of the file */
  int feature_dim, num_classes;
  int n_test, n_floor;
  int ref_shipped;          /* 1: test statistics from fid_ref.safetensors */
  char ref_source[1400];    /* where the reference statistics came from, for printing */
  double ref_check_fid;     /* FID(C-computed test stats, shipped test stats): ~0 when the
                             * C classifier reproduces PyTorch; NAN when not shipped */
  double train_ref_fid;     /* FID(shipped train stats, shipped test stats); NAN if absent */
  char train_ref_note[512]; /* why train_ref_fid is NAN, or which tensors were used */
  int golden_images;        /* images checked against classifier_golden; 0 = no file */
  double golden_input_err;  /* max |preprocessing - golden image| */
  double golden_feat_err;   /* max |C - golden| / max(1, max |golden|), features */
  double golden_logit_err;  /* the same for logits */
  char cache_path[1200];    /* "" when caching is off */
  int from_cache;           /* 1: features loaded from cache_path */
  double features_s;        /* seconds spent computing features (0 on a cache hit) */
  double test_acc;          /* classifier accuracy on the test images */
  double floor_fid;         /* FID(first n_floor training images, reference test stats) */
} vs_quality_info;

/* Opens model_dir/classifier.safetensors (and fid_ref, classifier_golden when present),
 * loads the Fashion-MNIST test and training images, and computes or loads from the cache
 * the real features. dev: a CPU device that outlives q. opts may be NULL (defaults).
 * Returns 0 or a negative vspec_status with a message. */
int vs_quality_open(const char *model_dir, vspec_dev *dev, vs_quality **out, char *err,
                    size_t errlen);
int vs_quality_open_opts(const char *model_dir, vspec_dev *dev, const vs_quality_opts *opts,
                         vs_quality **out, char *err, size_t errlen);

/* Metrics of n generated images rgb [n, 32, 32, 3] (the VQ decoder's bytes) with their
 * class labels [n] (NULL: no accuracy). n must exceed VS_PR_K; use n = 10000 to compare
 * with the floor. Allocates O(n) memory per call. */
int vs_quality_eval(vs_quality *q, const uint8_t *rgb_images, const int32_t *labels, int n,
                    vs_quality_result *res, char *err, size_t errlen);

/* The real-data floor: FID of the first n_floor training images against the test
 * reference statistics. */
/* The same in two steps, for callers that reuse the features (bootstrap intervals resample
 * them): classifier features [n, feature_dim] and logits [n, num_classes] of n generated
 * images, then the metrics of features already computed; and FID alone of n feature rows. */
void vs_quality_dims(const vs_quality *q, int *feature_dim, int *num_classes);
int vs_quality_features(vs_quality *q, const uint8_t *rgb_images, int n, float *feat,
                        float *logits, char *err, size_t errlen);
int vs_quality_eval_features(vs_quality *q, const float *feat, const float *logits,
                             const int32_t *labels, int n, vs_quality_result *res, char *err,
                             size_t errlen);
int vs_quality_fid_features(const vs_quality *q, const float *feat, int n, double *fid,
                            char *err, size_t errlen);

/* The reference features [n_test, feature_dim] (the test images'): KID's real sample. */
void vs_quality_ref_features(const vs_quality *q, const float **feat, int *n);

double vs_quality_floor(const vs_quality *q);
/* The floor at n images: FID of n class-balanced floor images (n <= the floor's image count;
 * vs_fmnist_balanced: n / 10 per class, the first of each class in file order, the rest to
 * the first classes, as vspec-bench eval spreads its images over classes) against the test
 * statistics. FID is biased upwards at small n, so a table of n generated images is
 * compared with this, not only with the 10k floor. */
int vs_quality_floor_at(const vs_quality *q, int n, double *fid, char *err, size_t errlen);

/* Precision/recall of the first n_floor training images against the test images (k-NN
 * radii of the training features are computed on the first call, ~2 s for 10k). */
int vs_quality_floor_pr(vs_quality *q, double *precision, double *recall, char *err,
                        size_t errlen);

const vs_quality_info *vs_quality_get_info(const vs_quality *q);

void vs_quality_close(vs_quality *q);

/* Only the check of a classifier against its golden file (the first test images' inputs,
 * features and logits from PyTorch); fills info's golden_* fields. */
int vs_quality_check_golden(const char *classifier, const char *golden, vspec_dev *dev,
                            vs_quality_info *info, char *err, size_t errlen);

#endif /* VS_BENCH_QUALITY_EVAL_H */
