/*
 * bench/quality_eval.c - reference data, feature cache and evaluation of generated images
 * (see quality_eval.h).
 */
#include "bench/quality_eval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/classifier.h"
#include "bench/fmnist_data.h"
#include "bench/quality.h"
#include "core/safetensors.h"
#include "core/status.h"

#define VS_QE_N_FLOOR 10000
#define VS_QE_CACHE_DIR "build/cache"
/* Images converted to floats per classifier call in eval and feature extraction. */
#define VS_QE_CHUNK 256
/* Golden check tolerances. Inputs: both sides compute x/127.5 - 1 in float32, at most an
 * ulp apart. Outputs: PyTorch's and BLIS's float convolutions sum in different orders;
 * 1e-3 of the array's scale is far above that noise and far below what a wrong layout,
 * padding or missing layer produces. */
#define VS_QE_GOLDEN_INPUT_TOL 1e-5
#define VS_QE_GOLDEN_REL_TOL 1e-3

#define VS_QC_MAGIC "VSQCACHE"
#define VS_QC_VERSION 1u

struct vs_quality {
  vspec_dev *dev;
  vs_classifier *clf;
  int d, ncls;
  vs_quality_info info;
  int n_test, n_train;
  uint8_t *test_labels;  /* [n_test] */
  float *test_feat;      /* [n_test, d] */
  float *test_logits;    /* [n_test, ncls] */
  float *train_feat;     /* [n_train, d] */
  uint8_t *train_labels; /* [n_train], for the class-balanced floor at n */
  double *test_radii2;   /* [n_test], k = VS_PR_K */
  double *ref_mu, *ref_cov; /* reference test statistics used by every FID */
  float *in_buf;         /* [VS_QE_CHUNK, 1, 32, 32] */
  int floor_pr_done;
  double floor_p, floor_r;
};

static double vs_qe_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- hashing ------------------------------------------------------------------------- */

/* FNV-1a 64: a cache key, not a security boundary; collisions between two classifier
 * files of the same size are not a practical concern. */
#define VS_FNV_OFFSET 0xcbf29ce484222325ull
#define VS_FNV_PRIME 0x100000001b3ull

static uint64_t vs_fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= VS_FNV_PRIME;
  }
  return h;
}

static int vs_qe_hash_file(const char *path, uint64_t *size, uint64_t *hash, char *err,
                           size_t errlen) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return vs_fail(err, errlen, VSPEC_EIO, "%s: cannot open: %s", path, strerror(errno));
  unsigned char buf[1 << 16];
  uint64_t h = VS_FNV_OFFSET, total = 0;
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, fp)) > 0) {
    h = vs_fnv1a(h, buf, got);
    total += got;
  }
  int bad = ferror(fp);
  fclose(fp);
  if (bad) return vs_fail(err, errlen, VSPEC_EIO, "%s: read error", path);
  *size = total;
  *hash = h;
  return VSPEC_OK;
}

/* ---- features ------------------------------------------------------------------------ */

/* Classifier outputs of n 28x28 images, converted a chunk at a time. */
static int vs_qe_features_u8(vs_quality *q, const uint8_t *images, int n, float *feat,
                             float *logits, char *err, size_t errlen) {
  for (int i0 = 0; i0 < n; i0 += VS_QE_CHUNK) {
    int m = n - i0 < VS_QE_CHUNK ? n - i0 : VS_QE_CHUNK;
    vs_fmnist_to_input(images + (size_t)i0 * VS_FMNIST_SIDE * VS_FMNIST_SIDE, m, q->in_buf);
    int rc = vs_classifier_run(q->clf, q->in_buf, m, feat + (size_t)i0 * q->d,
                               logits ? logits + (size_t)i0 * q->ncls : NULL, err, errlen);
    if (rc) return rc;
  }
  return VSPEC_OK;
}

/* ---- cache ------------------------------------------------------------------------------- */

typedef struct vs_qc_header {
  char magic[8];
  uint32_t version, k;
  uint64_t clf_size, clf_hash, data_hash;
  int32_t n_test, n_train, dim, classes;
} vs_qc_header;
_Static_assert(sizeof(vs_qc_header) == 56, "cache header has no padding");

typedef struct vs_qc_part {
  void *data;
  size_t bytes;
} vs_qc_part;

static void vs_qc_expect(const vs_quality *q, uint64_t data_hash, vs_qc_header *h) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, VS_QC_MAGIC, 8);
  h->version = VS_QC_VERSION;
  h->k = VS_PR_K;
  h->clf_size = q->info.classifier_bytes;
  h->clf_hash = q->info.classifier_hash;
  h->data_hash = data_hash;
  h->n_test = q->n_test;
  h->n_train = q->n_train;
  h->dim = q->d;
  h->classes = q->ncls;
}

static void vs_qc_parts(vs_quality *q, vs_qc_part parts[4]) {
  parts[0] = (vs_qc_part){q->test_feat, sizeof(float) * (size_t)q->n_test * q->d};
  parts[1] = (vs_qc_part){q->test_logits, sizeof(float) * (size_t)q->n_test * q->ncls};
  parts[2] = (vs_qc_part){q->train_feat, sizeof(float) * (size_t)q->n_train * q->d};
  parts[3] = (vs_qc_part){q->test_radii2, sizeof(double) * (size_t)q->n_test};
}

/* 1 when the cache held exactly what `want` describes and the arrays are filled. */
static int vs_qc_read(vs_quality *q, const vs_qc_header *want) {
  FILE *fp = fopen(q->info.cache_path, "rb");
  if (!fp) return 0;
  vs_qc_header h;
  int ok = fread(&h, sizeof h, 1, fp) == 1 && memcmp(&h, want, sizeof h) == 0;
  vs_qc_part parts[4];
  vs_qc_parts(q, parts);
  uint64_t sum = VS_FNV_OFFSET, stored = 0;
  for (int i = 0; ok && i < 4; i++) {
    ok = fread(parts[i].data, 1, parts[i].bytes, fp) == parts[i].bytes;
    if (ok) sum = vs_fnv1a(sum, parts[i].data, parts[i].bytes);
  }
  unsigned char extra;
  ok = ok && fread(&stored, sizeof stored, 1, fp) == 1 && stored == sum &&
       fread(&extra, 1, 1, fp) == 0;
  fclose(fp);
  return ok;
}

static int vs_qe_mkdirs(const char *dir) {
  char path[1024];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  return mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* A cache that can not be written only costs time next run: warn, do not fail. */
static void vs_qc_write(vs_quality *q, const vs_qc_header *h, const char *dir) {
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", q->info.cache_path, (long)getpid());
  FILE *fp = NULL;
  if (vs_qe_mkdirs(dir) == 0) fp = fopen(tmp, "wb");
  if (!fp) {
    fprintf(stderr, "quality: warning: cannot write the feature cache %s: %s\n",
            q->info.cache_path, strerror(errno));
    return;
  }
  vs_qc_part parts[4];
  vs_qc_parts(q, parts);
  uint64_t sum = VS_FNV_OFFSET;
  int ok = fwrite(h, sizeof *h, 1, fp) == 1;
  for (int i = 0; ok && i < 4; i++) {
    ok = fwrite(parts[i].data, 1, parts[i].bytes, fp) == parts[i].bytes;
    sum = vs_fnv1a(sum, parts[i].data, parts[i].bytes);
  }
  ok = ok && fwrite(&sum, sizeof sum, 1, fp) == 1;
  ok = (fclose(fp) == 0) && ok;
  if (!ok || rename(tmp, q->info.cache_path) != 0) {
    fprintf(stderr, "quality: warning: cannot write the feature cache %s: %s\n",
            q->info.cache_path, strerror(errno));
    unlink(tmp);
  }
}

/* ---- reference statistics ------------------------------------------------------------- */

/* Names the Python exporter might use; the first present one wins. */
static const char *const vs_qe_names_test_mean[] = {"test.mean", "test_mu", "test.mu",
                                                    "test_mean", "mu_test", NULL};
static const char *const vs_qe_names_test_cov[] = {"test.cov", "test_sigma", "test.sigma",
                                                   "test_cov", "sigma_test", NULL};
static const char *const vs_qe_names_train_mean[] = {"train.mean", "train_mu", "train.mu",
                                                     "train_mean", "mu_train", NULL};
static const char *const vs_qe_names_train_cov[] = {"train.cov", "train_sigma", "train.sigma",
                                                    "train_cov", "sigma_train", NULL};
static const char *const vs_qe_names_images[] = {"images", "inputs", "input", "x", NULL};
static const char *const vs_qe_names_features[] = {"features", "feats", "feature",
                                                   "penultimate", NULL};
static const char *const vs_qe_names_logits[] = {"logits", "outputs", "output", "y", NULL};

static void vs_qe_names_list(const char *const *names, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; names[i] && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
}

/* The first of `names` present in f, or NULL. */
static const char *vs_qe_find(const vspec_tensor_file *f, const char *const *names,
                              vspec_tensor *t) {
  for (int i = 0; names[i]; i++) {
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    if (vs_st_find(f, names[i], t) == VSPEC_OK) return names[i];
  }
  return NULL;
}

static const char *vs_qe_dtype(uint32_t dtype) {
  switch (dtype) {
  case VSPEC_DTYPE_F64: return "F64";
  case VSPEC_DTYPE_F32: return "F32";
  case VSPEC_DTYPE_F16: return "F16";
  case VSPEC_DTYPE_BF16: return "BF16";
  default: return "(not floating point)";
  }
}

/* Tensor (F64 or F32) of exactly `numel` elements with the given leading dims into out. */
static int vs_qe_read_f64(const vspec_tensor_file *f, const char *const *names, int ndim,
                          const int64_t *shape, double *out, const char **found, char *err,
                          size_t errlen) {
  vspec_tensor t;
  const char *name = vs_qe_find(f, names, &t);
  *found = name;
  if (!name) {
    char list[256];
    vs_qe_names_list(names, list, sizeof list);
    return vs_fail(err, errlen, VSPEC_ENOENT, "%s: none of the tensors %s is present",
                   vs_st_path(f), list);
  }
  int match = t.ndim == ndim;
  for (int i = 0; match && i < ndim; i++) match = t.shape[i] == shape[i];
  if (!match || (t.dtype != VSPEC_DTYPE_F64 && t.dtype != VSPEC_DTYPE_F32)) {
    char have[128] = "";
    size_t used = 0;
    for (int i = 0; i < t.ndim && used < sizeof have; i++)
      used += (size_t)snprintf(have + used, sizeof have - used, "%s%lld", i ? "," : "",
                               (long long)t.shape[i]);
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: tensor '%s' has shape [%s] and dtype %s; expected F64 (or F32) "
                   "of shape %s with d = %lld, the classifier's feature_dim",
                   vs_st_path(f), name, have, vs_qe_dtype(t.dtype), ndim == 1 ? "[d]" : "[d,d]",
                   (long long)shape[0]);
  }
  size_t n = (size_t)t.numel;
  const unsigned char *src = t.data;
  /* memcpy per element: the data need not be aligned inside the file */
  for (size_t i = 0; i < n; i++) {
    if (t.dtype == VSPEC_DTYPE_F64) {
      memcpy(&out[i], src + 8 * i, 8);
    } else {
      float v;
      memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    }
  }
  return VSPEC_OK;
}

static int vs_qe_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- golden check ---------------------------------------------------------------------- */

static double vs_qe_max_rel_err(const float *got, const float *want, size_t n) {
  double scale = 1.0, worst = 0.0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e == e)) e = INFINITY;
    worst = fmax(worst, e);
  }
  return worst / scale;
}

static int vs_qe_golden(vs_quality *q, const char *path, const vs_fmnist *test, char *err,
                        size_t errlen) {
  vspec_tensor_file *f = NULL;
  float *mine = NULL, *feat = NULL, *logits = NULL;
  int rc = vs_st_open(path, &f, err, errlen);
  if (rc) return rc;
  vspec_tensor t;
  const char *iname = vs_qe_find(f, vs_qe_names_images, &t);
  const char *fname = NULL, *lname = NULL;
  char list[256];
  if (!iname) {
    vs_qe_names_list(vs_qe_names_images, list, sizeof list);
    rc = vs_fail(err, errlen, VSPEC_ENOENT, "%s: no images tensor (tried %s)", path, list);
    goto done;
  }
  int g = t.ndim >= 1 ? (int)t.shape[0] : 0;
  size_t isz = vs_classifier_input_size(q->clf);
  if (g < 1 || g > test->n || (size_t)t.numel != (size_t)g * isz) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE,
                 "%s: '%s' must hold G (1..%d) images of %zu floats [G,1,32,32]", path, iname,
                 test->n, isz);
    goto done;
  }
  const float *gimg, *gfeat, *glog;
  int64_t ishape[4] = {g, 1, VS_CLF_SIDE, VS_CLF_SIDE};
  int64_t fshape[2] = {g, q->d}, lshape[2] = {g, q->ncls};
  vspec_tensor tf, tl;
  fname = vs_qe_find(f, vs_qe_names_features, &tf);
  lname = vs_qe_find(f, vs_qe_names_logits, &tl);
  if (!fname || !lname) {
    vs_qe_names_list(fname ? vs_qe_names_logits : vs_qe_names_features, list, sizeof list);
    rc = vs_fail(err, errlen, VSPEC_ENOENT, "%s: no %s tensor (tried %s)", path,
                 fname ? "logits" : "features", list);
    goto done;
  }
  rc = vs_st_get_f32(f, q->dev, iname, t.ndim == 4 ? 4 : t.ndim, t.ndim == 4 ? ishape : t.shape,
                     &gimg, err, errlen);
  if (!rc) rc = vs_st_get_f32(f, q->dev, fname, 2, fshape, &gfeat, err, errlen);
  if (!rc) rc = vs_st_get_f32(f, q->dev, lname, 2, lshape, &glog, err, errlen);
  if (rc) goto done;

  mine = malloc(sizeof(float) * (size_t)g * isz);
  feat = malloc(sizeof(float) * (size_t)g * q->d);
  logits = malloc(sizeof(float) * (size_t)g * q->ncls);
  if (!mine || !feat || !logits) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
    goto done;
  }
  /* 1. vspec's preprocessing of the first g test images gives PyTorch's inputs */
  vs_fmnist_to_input(test->images, g, mine);
  double in_err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < (size_t)g * isz; i++) {
    double e = fabs((double)mine[i] - gimg[i]);
    if (!(e == e)) e = INFINITY;
    if (e > in_err) {
      in_err = e;
      worst = i;
    }
  }
  q->info.golden_input_err = in_err;
  if (in_err > VS_QE_GOLDEN_INPUT_TOL) {
    rc = vs_fail(err, errlen, VSPEC_ERANGE,
                 "%s: '%s' differs from vspec's preprocessing of the first %d test images "
                 "(image %zu pixel %zu: golden %.6g, vspec %.6g); padding or scaling of the "
                 "classifier input disagree",
                 path, iname, g, worst / isz, worst % isz, (double)gimg[worst],
                 (double)mine[worst]);
    goto done;
  }
  /* 2. the C classifier gives PyTorch's features and logits on those inputs */
  rc = vs_classifier_run(q->clf, gimg, g, feat, logits, err, errlen);
  if (rc) goto done;
  q->info.golden_feat_err = vs_qe_max_rel_err(feat, gfeat, (size_t)g * q->d);
  q->info.golden_logit_err = vs_qe_max_rel_err(logits, glog, (size_t)g * q->ncls);
  if (!(q->info.golden_feat_err <= VS_QE_GOLDEN_REL_TOL) ||
      !(q->info.golden_logit_err <= VS_QE_GOLDEN_REL_TOL)) {
    rc = vs_fail(err, errlen, VSPEC_ERANGE,
                 "%s: the C classifier does not reproduce PyTorch: max error %.3g in the "
                 "features ('%s'), %.3g in the logits ('%s'), relative to their scale "
                 "(tolerance %g)",
                 path, q->info.golden_feat_err, fname, q->info.golden_logit_err, lname,
                 VS_QE_GOLDEN_REL_TOL);
    goto done;
  }
  q->info.golden_images = g;
done:
  free(mine);
  free(feat);
  free(logits);
  vs_st_close(f);
  return rc;
}

/* ---- open -------------------------------------------------------------------------------- */

static int vs_qe_alloc(vs_quality *q, char *err, size_t errlen) {
  size_t isz = vs_classifier_input_size(q->clf);
  q->test_feat = malloc(sizeof(float) * (size_t)q->n_test * q->d);
  q->test_logits = malloc(sizeof(float) * (size_t)q->n_test * q->ncls);
  q->train_feat = malloc(sizeof(float) * (size_t)q->n_train * q->d);
  q->test_radii2 = malloc(sizeof(double) * (size_t)q->n_test);
  q->ref_mu = malloc(sizeof(double) * (size_t)q->d);
  q->ref_cov = malloc(sizeof(double) * (size_t)q->d * q->d);
  q->in_buf = malloc(sizeof(float) * VS_QE_CHUNK * isz);
  if (!q->test_feat || !q->test_logits || !q->train_feat || !q->test_radii2 || !q->ref_mu ||
      !q->ref_cov || !q->in_buf)
    return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory for the reference features");
  return VSPEC_OK;
}

/* Reads fid_ref (test statistics required, train optional) or computes the test
 * statistics; then the consistency check and the floor. */
static int vs_qe_reference(vs_quality *q, const char *model_dir, char *err, size_t errlen) {
  int d = q->d, rc;
  double *mu = malloc(sizeof(double) * (size_t)d), *cov = malloc(sizeof(double) * (size_t)d * d);
  double *tmu = malloc(sizeof(double) * (size_t)d), *tcov = malloc(sizeof(double) * (size_t)d * d);
  vspec_tensor_file *f = NULL;
  if (!mu || !cov || !tmu || !tcov) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
    goto done;
  }
  /* the test statistics of vspec's own features, always: fallback or cross-check */
  rc = vs_feature_stats(q->test_feat, q->n_test, d, mu, cov, err, errlen);
  if (rc) goto done;
  char path[1100];
  snprintf(path, sizeof path, "%s/fid_ref.safetensors", model_dir);
  q->info.ref_check_fid = NAN;
  q->info.train_ref_fid = NAN;
  if (!vs_qe_exists(path)) {
    memcpy(q->ref_mu, mu, sizeof(double) * (size_t)d);
    memcpy(q->ref_cov, cov, sizeof(double) * (size_t)d * d);
    snprintf(q->info.ref_source, sizeof q->info.ref_source,
             "computed here from the %d test images (no %s)", q->n_test, path);
    snprintf(q->info.train_ref_note, sizeof q->info.train_ref_note, "no %s", path);
  } else {
    rc = vs_st_open(path, &f, err, errlen);
    if (rc) goto done;
    int64_t s1[1] = {d}, s2[2] = {d, d};
    const char *nm, *nc;
    rc = vs_qe_read_f64(f, vs_qe_names_test_mean, 1, s1, q->ref_mu, &nm, err, errlen);
    if (!rc) rc = vs_qe_read_f64(f, vs_qe_names_test_cov, 2, s2, q->ref_cov, &nc, err, errlen);
    if (rc) goto done;
    q->info.ref_shipped = 1;
    snprintf(q->info.ref_source, sizeof q->info.ref_source, "%s (%s, %s)", path, nm, nc);
    rc = vs_fid(mu, cov, q->ref_mu, q->ref_cov, d, &q->info.ref_check_fid, err, errlen);
    if (rc) goto done;
    /* the 60k training statistics are informational: their absence is not an error */
    char sub[VSPEC_ERRLEN];
    const char *tm, *tc;
    int trc = vs_qe_read_f64(f, vs_qe_names_train_mean, 1, s1, tmu, &tm, sub, sizeof sub);
    if (!trc) trc = vs_qe_read_f64(f, vs_qe_names_train_cov, 2, s2, tcov, &tc, sub, sizeof sub);
    if (!trc)
      trc = vs_fid(tmu, tcov, q->ref_mu, q->ref_cov, d, &q->info.train_ref_fid, sub, sizeof sub);
    if (trc)
      snprintf(q->info.train_ref_note, sizeof q->info.train_ref_note, "%s", sub);
    else
      snprintf(q->info.train_ref_note, sizeof q->info.train_ref_note, "%s, %s", tm, tc);
  }
  rc = vs_feature_stats(q->train_feat, q->n_train, d, mu, cov, err, errlen);
  if (!rc) rc = vs_fid(mu, cov, q->ref_mu, q->ref_cov, d, &q->info.floor_fid, err, errlen);
done:
  vs_st_close(f);
  free(mu);
  free(cov);
  free(tmu);
  free(tcov);
  return rc;
}

int vs_quality_open(const char *model_dir, vspec_dev *dev, vs_quality **out, char *err,
                    size_t errlen) {
  return vs_quality_open_opts(model_dir, dev, NULL, out, err, errlen);
}

int vs_quality_open_opts(const char *model_dir, vspec_dev *dev, const vs_quality_opts *opts,
                         vs_quality **out, char *err, size_t errlen) {
  *out = NULL;
  vs_quality_opts o = {0};
  if (opts) o = *opts;
  if (!o.cache_dir) o.cache_dir = VS_QE_CACHE_DIR;
  if (o.n_floor <= 0) o.n_floor = VS_QE_N_FLOOR;
  vs_quality *q = calloc(1, sizeof *q);
  if (!q) return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
  q->dev = dev;
  vs_fmnist test = {0}, train = {0};
  vs_quality_info *in = &q->info;
  int rc;

  snprintf(in->classifier_path, sizeof in->classifier_path, "%s/classifier.safetensors",
           model_dir);
  if (!vs_qe_exists(in->classifier_path)) {
    rc = vs_fail(err, errlen, VSPEC_ENOENT,
                 "%s: no such file: the quality metrics need the trained Fashion-MNIST "
                 "classifier (with fid_ref.safetensors beside it) in the model directory",
                 in->classifier_path);
    goto fail;
  }
  rc = vs_classifier_open(in->classifier_path, dev, &q->clf, err, errlen);
  if (rc) goto fail;
  int ic, ih, iw;
  vs_classifier_input_shape(q->clf, &ic, &ih, &iw);
  if (ic != 1 || ih != VS_CLF_SIDE || iw != VS_CLF_SIDE) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE,
                 "%s: input shape [%d,%d,%d]; the quality metrics feed [1,%d,%d] images",
                 in->classifier_path, ic, ih, iw, VS_CLF_SIDE, VS_CLF_SIDE);
    goto fail;
  }
  q->d = vs_classifier_feature_dim(q->clf);
  q->ncls = vs_classifier_num_classes(q->clf);
  in->feature_dim = q->d;
  in->num_classes = q->ncls;
  rc = vs_qe_hash_file(in->classifier_path, &in->classifier_bytes, &in->classifier_hash, err,
                       errlen);
  if (rc) goto fail;

  rc = vs_fmnist_load(o.data_dir, "t10k", 0, &test, err, errlen);
  if (!rc) rc = vs_fmnist_load(o.data_dir, "train", o.n_floor, &train, err, errlen);
  if (rc) goto fail;
  if (test.n <= VS_PR_K || train.n <= VS_PR_K) {
    rc = vs_fail(err, errlen, VSPEC_EINVAL, "too few images (%d test, %d train)", test.n,
                 train.n);
    goto fail;
  }
  q->n_test = in->n_test = test.n;
  q->n_train = in->n_floor = train.n;
  q->test_labels = test.labels;
  test.labels = NULL;
  q->train_labels = train.labels;
  train.labels = NULL;
  rc = vs_qe_alloc(q, err, errlen);
  if (rc) goto fail;

  char golden[1100];
  snprintf(golden, sizeof golden, "%s/classifier_golden.safetensors", model_dir);
  if (vs_qe_exists(golden)) {
    rc = vs_qe_golden(q, golden, &test, err, errlen);
    if (rc) goto fail;
  }

  uint64_t data_hash = VS_FNV_OFFSET;
  data_hash = vs_fnv1a(data_hash, test.images, (size_t)test.n * VS_FMNIST_SIDE * VS_FMNIST_SIDE);
  data_hash = vs_fnv1a(data_hash, q->test_labels, (size_t)test.n);
  data_hash =
      vs_fnv1a(data_hash, train.images, (size_t)train.n * VS_FMNIST_SIDE * VS_FMNIST_SIDE);
  vs_qc_header want;
  vs_qc_expect(q, data_hash, &want);
  if (o.cache_dir[0])
    snprintf(in->cache_path, sizeof in->cache_path, "%s/quality-%016llx-%llu.bin", o.cache_dir,
             (unsigned long long)in->classifier_hash,
             (unsigned long long)in->classifier_bytes);
  if (in->cache_path[0] && vs_qc_read(q, &want)) {
    in->from_cache = 1;
  } else {
    double t0 = vs_qe_now();
    if (o.verbose)
      fprintf(stderr, "quality: computing classifier features of %d test and %d training images\n",
              test.n, train.n);
    rc = vs_qe_features_u8(q, test.images, test.n, q->test_feat, q->test_logits, err, errlen);
    if (!rc) rc = vs_qe_features_u8(q, train.images, train.n, q->train_feat, NULL, err, errlen);
    if (!rc)
      rc = vs_knn_radii2(q->test_feat, q->n_test, q->d, VS_PR_K, 0, q->test_radii2, err, errlen);
    if (rc) goto fail;
    in->features_s = vs_qe_now() - t0;
    if (o.verbose) fprintf(stderr, "quality: features took %.1f s\n", in->features_s);
    if (in->cache_path[0]) vs_qc_write(q, &want, o.cache_dir);
  }
  vs_fmnist_free(&test);
  vs_fmnist_free(&train);

  int32_t *labels = malloc(sizeof(int32_t) * (size_t)q->n_test);
  if (!labels) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
    goto fail;
  }
  for (int i = 0; i < q->n_test; i++) labels[i] = q->test_labels[i];
  in->test_acc = vs_class_accuracy(q->test_logits, q->n_test, q->ncls, labels);
  free(labels);

  rc = vs_qe_reference(q, model_dir, err, errlen);
  if (rc) goto fail;
  *out = q;
  return VSPEC_OK;
fail:
  vs_fmnist_free(&test);
  vs_fmnist_free(&train);
  vs_quality_close(q);
  return rc;
}

/* ---- evaluation ---------------------------------------------------------------------------- */

void vs_quality_dims(const vs_quality *q, int *feature_dim, int *num_classes) {
  if (feature_dim) *feature_dim = q->d;
  if (num_classes) *num_classes = q->ncls;
}

int vs_quality_features(vs_quality *q, const uint8_t *rgb_images, int n, float *feat,
                        float *logits, char *err, size_t errlen) {
  size_t rgb_size = (size_t)VS_CLF_SIDE * VS_CLF_SIDE * 3;
  for (int i0 = 0; i0 < n; i0 += VS_QE_CHUNK) {
    int m = n - i0 < VS_QE_CHUNK ? n - i0 : VS_QE_CHUNK;
    vs_fmnist_rgb_to_input(rgb_images + (size_t)i0 * rgb_size, m, q->in_buf);
    int rc = vs_classifier_run(q->clf, q->in_buf, m, feat + (size_t)i0 * q->d,
                               logits + (size_t)i0 * q->ncls, err, errlen);
    if (rc) return rc;
  }
  return VSPEC_OK;
}

int vs_quality_fid_features(const vs_quality *q, const float *feat, int n, double *fid,
                            char *err, size_t errlen) {
  int d = q->d;
  double *mu = malloc(sizeof(double) * (size_t)d), *cov = malloc(sizeof(double) * (size_t)d * d);
  int rc = mu && cov ? vs_feature_stats(feat, n, d, mu, cov, err, errlen)
                     : vs_fail(err, errlen, VSPEC_ENOMEM, "quality: out of memory");
  if (!rc) rc = vs_fid(mu, cov, q->ref_mu, q->ref_cov, d, fid, err, errlen);
  free(mu);
  free(cov);
  return rc;
}

int vs_quality_eval_features(vs_quality *q, const float *feat, const float *logits,
                             const int32_t *labels, int n, vs_quality_result *res, char *err,
                             size_t errlen) {
  memset(res, 0, sizeof *res);
  res->fid = res->class_acc = res->precision = res->recall = NAN;
  if (!feat || n <= VS_PR_K)
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "quality: need more than %d generated images (got %d)", VS_PR_K, n);
  int rc = vs_quality_fid_features(q, feat, n, &res->fid, err, errlen);
  if (!rc)
    rc = vs_precision_recall(q->test_feat, q->n_test, q->test_radii2, feat, n, q->d, VS_PR_K, 0,
                             &res->precision, &res->recall, err, errlen);
  if (rc) return rc;
  if (labels && logits) res->class_acc = vs_class_accuracy(logits, n, q->ncls, labels);
  res->n = n;
  return VSPEC_OK;
}

int vs_quality_eval(vs_quality *q, const uint8_t *rgb_images, const int32_t *labels, int n,
                    vs_quality_result *res, char *err, size_t errlen) {
  memset(res, 0, sizeof *res);
  res->fid = res->class_acc = res->precision = res->recall = NAN;
  if (!rgb_images || n <= VS_PR_K)
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "quality: need more than %d generated images (got %d)", VS_PR_K, n);
  float *feat = malloc(sizeof(float) * (size_t)n * q->d);
  float *logits = malloc(sizeof(float) * (size_t)n * q->ncls);
  int rc = feat && logits ? vs_quality_features(q, rgb_images, n, feat, logits, err, errlen)
                          : vs_fail(err, errlen, VSPEC_ENOMEM,
                                    "quality: out of memory for %d images", n);
  if (!rc) rc = vs_quality_eval_features(q, feat, logits, labels, n, res, err, errlen);
  free(feat);
  free(logits);
  return rc;
}

void vs_quality_ref_features(const vs_quality *q, const float **feat, int *n) {
  *feat = q->test_feat;
  *n = q->n_test;
}

double vs_quality_floor(const vs_quality *q) { return q->info.floor_fid; }

int vs_quality_floor_at(const vs_quality *q, int n, double *fid, char *err, size_t errlen) {
  if (n < 2 || n > q->n_train)
    return vs_fail(err, errlen, VSPEC_EINVAL, "floor at %d images: between 2 and %d", n,
                   q->n_train);
  int d = q->d;
  double *mu = malloc(sizeof(double) * (size_t)d), *cov = malloc(sizeof(double) * (size_t)d * d);
  int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
  float *feat = malloc(sizeof(float) * (size_t)n * d);
  int rc = !mu || !cov || !idx || !feat ? vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory")
                                        : VSPEC_OK;
  /* the generated images of a table are class-balanced (image i is class i mod classes): so
   * are the real ones they are compared with */
  if (!rc && vs_fmnist_balanced(q->train_labels, q->n_train, VS_FMNIST_CLASSES, n, idx))
    rc = vs_fail(err, errlen, VSPEC_EINVAL, "floor at %d images: too few labelled images",
                 n);
  for (int i = 0; !rc && i < n; i++)
    memcpy(feat + (size_t)i * d, q->train_feat + (size_t)idx[i] * d, sizeof(float) * (size_t)d);
  if (!rc) rc = vs_feature_stats(feat, n, d, mu, cov, err, errlen);
  if (!rc) rc = vs_fid(mu, cov, q->ref_mu, q->ref_cov, d, fid, err, errlen);
  free(mu);
  free(cov);
  free(idx);
  free(feat);
  return rc;
}

int vs_quality_floor_pr(vs_quality *q, double *precision, double *recall, char *err,
                        size_t errlen) {
  if (!q->floor_pr_done) {
    int rc = vs_precision_recall(q->test_feat, q->n_test, q->test_radii2, q->train_feat,
                                 q->n_train, q->d, VS_PR_K, 0, &q->floor_p, &q->floor_r, err,
                                 errlen);
    if (rc) return rc;
    q->floor_pr_done = 1;
  }
  *precision = q->floor_p;
  *recall = q->floor_r;
  return VSPEC_OK;
}

const vs_quality_info *vs_quality_get_info(const vs_quality *q) { return &q->info; }

void vs_quality_close(vs_quality *q) {
  if (!q) return;
  vs_classifier_close(q->clf);
  free(q->test_labels);
  free(q->test_feat);
  free(q->test_logits);
  free(q->train_feat);
  free(q->train_labels);
  free(q->test_radii2);
  free(q->ref_mu);
  free(q->ref_cov);
  free(q->in_buf);
  free(q);
}

int vs_quality_check_golden(const char *classifier, const char *golden, vspec_dev *dev,
                            vs_quality_info *info, char *err, size_t errlen) {
  vs_quality q;
  memset(&q, 0, sizeof q);
  q.dev = dev;
  int rc = vs_classifier_open(classifier, dev, &q.clf, err, errlen);
  if (rc) return rc;
  q.d = vs_classifier_feature_dim(q.clf);
  q.ncls = vs_classifier_num_classes(q.clf);
  vs_fmnist test;
  rc = vs_fmnist_load(NULL, "t10k", 64, &test, err, errlen);
  if (!rc) {
    rc = vs_qe_golden(&q, golden, &test, err, errlen);
    vs_fmnist_free(&test);
  }
  vs_classifier_close(q.clf);
  if (info) *info = q.info;
  return rc;
}
