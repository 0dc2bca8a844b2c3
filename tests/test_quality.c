/*
 * tests/test_quality.c - quality metrics (bench/quality.c), the classifier interpreter
 * (bench/classifier.c) and the evaluation object with its cache (bench/quality_eval.c).
 *
 * The bench sources are not part of libvspec.a, so they are compiled into this test
 * directly. The trained classifier does not exist yet, so everything runs on a tiny
 * random classifier written here as safetensors with the exporter's layer metadata, and
 * is compared with independent code:
 *  - the interpreter against a naive double-precision conv/relu/pool/linear;
 *  - FID against closed forms (diagonal statistics; 2x2 via tr sqrt(M) =
 *    sqrt(tr M + 2 sqrt(det M))) and against a Denman-Beavers square root;
 *  - precision/recall on point sets whose answer is known by hand, and against a naive
 *    O(n^2) implementation with tiny tiles;
 *  - the evaluation object on hand-made IDX data: generated = real gives FID 0 and
 *    P = R = 1, generated = training images gives exactly the floor, the cache round-trips
 *    and is recomputed when damaged, fid_ref aliases and the golden check work and fail.
 * When models/fmnist/classifier.safetensors exists, the shipped classifier is also checked
 * against its golden file (skipped otherwise).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bench/classifier.h"
#include "bench/fmnist_data.h"
#include "bench/quality.h"
#include "bench/quality_eval.h"
#include "tests/support/kernels_testutil.h"

static char g_dir[64];
static vspec_dev *g_dev;

static void path_in(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", g_dir, name);
}

static void assert_err_has(const char *err, const char *a, const char *b) {
  if (!strstr(err, a) || (b && !strstr(err, b)))
    fail_msg("error message '%s' lacks '%s'%s%s", err, a, b ? " or " : "", b ? b : "");
}

static void assert_near(double got, double want, double tol, const char *what) {
  if (!(fabs(got - want) <= tol))
    fail_msg("%s: got %.12g want %.12g (tol %g)", what, got, want, tol);
}

/* ---- safetensors writer ------------------------------------------------------------------ */

typedef struct st_tensor {
  char name[64];
  const char *dtype; /* "F32" or "F64" */
  int ndim;
  int64_t shape[4];
  const void *data;
  size_t bytes;
} st_tensor;

/* Writes tensors and a __metadata__ object (stolen; may be NULL). */
static void write_st(const char *path, const st_tensor *t, int n, json_t *meta) {
  json_t *h = json_object();
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    json_t *e = json_object(), *shape = json_array();
    for (int k = 0; k < t[i].ndim; k++) json_array_append_new(shape, json_integer(t[i].shape[k]));
    json_object_set_new(e, "dtype", json_string(t[i].dtype));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets",
                        json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + t[i].bytes)));
    json_object_set_new(h, t[i].name, e);
    off += t[i].bytes;
  }
  if (meta) json_object_set_new(h, "__metadata__", meta);
  char *text = json_dumps(h, JSON_COMPACT);
  assert_non_null(text);
  size_t len = strlen(text), padded = (len + 7) / 8 * 8;
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  unsigned char n8[8];
  for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  assert_int_equal(fwrite(n8, 1, 8, fp), 8);
  assert_int_equal(fwrite(text, 1, len, fp), len);
  for (size_t i = len; i < padded; i++) fputc(' ', fp);
  for (int i = 0; i < n; i++)
    if (t[i].bytes) assert_int_equal(fwrite(t[i].data, 1, t[i].bytes, fp), t[i].bytes);
  assert_int_equal(fclose(fp), 0);
  free(text);
  json_decref(h);
}

/* ---- the test network ----------------------------------------------------------------------- */

typedef struct tnet_layer {
  char op; /* 'c' conv2d, 'r' relu, 'g' global_avg_pool, 'l' linear */
  int in, out, kh, kw, stride, ph, pw, bias;
} tnet_layer;

/* Covers: odd and even strides, a non-square kernel and padding given as [h, w], a layer
 * without bias, ReLU on both sides of the pooling and two linear layers. */
static const tnet_layer k_net[] = {
    {'c', 1, 4, 3, 3, 1, 1, 1, 1}, {'r', 0, 0, 0, 0, 0, 0, 0, 0}, {'c', 4, 6, 3, 3, 2, 1, 1, 1},
    {'r', 0, 0, 0, 0, 0, 0, 0, 0}, {'c', 6, 8, 3, 1, 2, 1, 0, 0}, {'r', 0, 0, 0, 0, 0, 0, 0, 0},
    {'g', 0, 0, 0, 0, 0, 0, 0, 0}, {'l', 8, 5, 0, 0, 0, 0, 0, 1}, {'r', 0, 0, 0, 0, 0, 0, 0, 0},
    {'l', 5, 10, 0, 0, 0, 0, 0, 1},
};
#define K_NET_N ((int)(sizeof k_net / sizeof k_net[0]))
#define K_NET_FEAT 8
#define K_NET_CLASSES 10

typedef struct tnet {
  const tnet_layer *L;
  int n;
  float *w[16], *b[16];
  size_t wn[16];
} tnet;

static void tnet_init(tnet *t, uint64_t seed) {
  memset(t, 0, sizeof *t);
  t->L = k_net;
  t->n = K_NET_N;
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  for (int i = 0; i < t->n; i++) {
    const tnet_layer *L = &t->L[i];
    if (L->op != 'c' && L->op != 'l') continue;
    size_t fan = L->op == 'c' ? (size_t)L->in * L->kh * L->kw : (size_t)L->in;
    t->wn[i] = (size_t)L->out * fan;
    t->w[i] = vt_malloc(t->wn[i] * sizeof(float));
    float a = 2.45f / sqrtf((float)fan); /* sqrt(6 / fan_in): activations stay O(1) */
    vt_fill(&rng, t->w[i], t->wn[i], -a, a);
    if (L->bias) {
      t->b[i] = vt_malloc((size_t)L->out * sizeof(float));
      vt_fill(&rng, t->b[i], (size_t)L->out, -0.5f, 0.5f);
      /* pooled features are small and positive; biases of both signs make sure the ReLU
       * between the linear layers actually clips */
      if (L->op == 'l')
        for (int o = 0; o < L->out; o++) t->b[i][o] += o % 2 ? -0.6f : 0.2f;
    }
  }
}

static void tnet_free(tnet *t) {
  for (int i = 0; i < 16; i++) {
    free(t->w[i]);
    free(t->b[i]);
  }
}

static json_t *json_pair(int a, int b) {
  return a == b ? json_integer(a) : json_pack("[i,i]", a, b);
}

static json_t *tnet_layers_json(const tnet *t) {
  json_t *arr = json_array();
  for (int i = 0; i < t->n; i++) {
    const tnet_layer *L = &t->L[i];
    json_t *o = json_object();
    char wn[32], bn[32];
    snprintf(wn, sizeof wn, "%s%d.weight", L->op == 'c' ? "conv" : "fc", i);
    snprintf(bn, sizeof bn, "%s%d.bias", L->op == 'c' ? "conv" : "fc", i);
    switch (L->op) {
      case 'c':
        json_object_set_new(o, "op", json_string("conv2d"));
        json_object_set_new(o, "weight", json_string(wn));
        json_object_set_new(o, "bias", L->bias ? json_string(bn) : json_null());
        json_object_set_new(o, "in", json_integer(L->in));
        json_object_set_new(o, "out", json_integer(L->out));
        json_object_set_new(o, "kernel", json_pair(L->kh, L->kw));
        json_object_set_new(o, "stride", json_integer(L->stride));
        json_object_set_new(o, "padding", json_pair(L->ph, L->pw));
        break;
      case 'l':
        json_object_set_new(o, "op", json_string("linear"));
        json_object_set_new(o, "weight", json_string(wn));
        if (L->bias) json_object_set_new(o, "bias", json_string(bn));
        json_object_set_new(o, "in", json_integer(L->in));
        json_object_set_new(o, "out", json_integer(L->out));
        break;
      case 'r': json_object_set_new(o, "op", json_string("relu")); break;
      default: json_object_set_new(o, "op", json_string("global_avg_pool")); break;
    }
    json_array_append_new(arr, o);
  }
  return arr;
}

/* Writes the classifier with `layers` (stolen) as its "layers" metadata; feature_dim and
 * num_classes as given (NULL: left out). */
static void tnet_write(const tnet *t, const char *path, json_t *layers, const char *feature_dim,
                       const char *num_classes) {
  st_tensor ts[32];
  int n = 0;
  for (int i = 0; i < t->n; i++) {
    const tnet_layer *L = &t->L[i];
    if (!t->w[i]) continue;
    const char *pre = L->op == 'c' ? "conv" : "fc";
    st_tensor *w = &ts[n++];
    snprintf(w->name, sizeof w->name, "%s%d.weight", pre, i);
    w->dtype = "F32";
    w->data = t->w[i];
    w->bytes = t->wn[i] * sizeof(float);
    if (L->op == 'c') {
      w->ndim = 4;
      w->shape[0] = L->out, w->shape[1] = L->in, w->shape[2] = L->kh, w->shape[3] = L->kw;
    } else {
      w->ndim = 2;
      w->shape[0] = L->out, w->shape[1] = L->in;
    }
    if (t->b[i]) {
      st_tensor *b = &ts[n++];
      snprintf(b->name, sizeof b->name, "%s%d.bias", pre, i);
      b->dtype = "F32";
      b->ndim = 1;
      b->shape[0] = L->out;
      b->data = t->b[i];
      b->bytes = (size_t)L->out * sizeof(float);
    }
  }
  json_t *meta = json_object();
  char *text = json_dumps(layers, JSON_COMPACT);
  json_object_set_new(meta, "layers", json_string(text));
  free(text);
  json_decref(layers);
  if (feature_dim) json_object_set_new(meta, "feature_dim", json_string(feature_dim));
  if (num_classes) json_object_set_new(meta, "num_classes", json_string(num_classes));
  write_st(path, ts, n, meta);
}

/* Independent forward pass in double, straight from the definitions. */
static void tnet_forward(const tnet *t, const float *x, double *feat, double *logits) {
  int c = 1, h = 32, w = 32;
  double *cur = malloc(sizeof(double) * 32 * 32);
  assert_non_null(cur);
  for (int i = 0; i < 32 * 32; i++) cur[i] = x[i];
  for (int li = 0; li < t->n; li++) {
    const tnet_layer *L = &t->L[li];
    if (L->op == 'c') {
      int ho = (h + 2 * L->ph - L->kh) / L->stride + 1, wo = (w + 2 * L->pw - L->kw) / L->stride + 1;
      double *y = malloc(sizeof(double) * (size_t)L->out * ho * wo);
      assert_non_null(y);
      for (int co = 0; co < L->out; co++)
        for (int oy = 0; oy < ho; oy++)
          for (int ox = 0; ox < wo; ox++) {
            double s = t->b[li] ? t->b[li][co] : 0.0;
            for (int ci = 0; ci < L->in; ci++)
              for (int ky = 0; ky < L->kh; ky++)
                for (int kx = 0; kx < L->kw; kx++) {
                  int iy = oy * L->stride - L->ph + ky, ix = ox * L->stride - L->pw + kx;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  s += cur[((size_t)ci * h + iy) * w + ix] *
                       t->w[li][(((size_t)co * L->in + ci) * L->kh + ky) * L->kw + kx];
                }
            y[((size_t)co * ho + oy) * wo + ox] = s;
          }
      free(cur);
      cur = y;
      c = L->out, h = ho, w = wo;
    } else if (L->op == 'r') {
      for (int i = 0; i < c * h * w; i++) cur[i] = cur[i] > 0 ? cur[i] : 0;
    } else if (L->op == 'g') {
      double *y = malloc(sizeof(double) * (size_t)c);
      assert_non_null(y);
      for (int ci = 0; ci < c; ci++) {
        double s = 0;
        for (int i = 0; i < h * w; i++) s += cur[(size_t)ci * h * w + i];
        y[ci] = s / (h * w);
      }
      for (int ci = 0; ci < c; ci++) feat[ci] = y[ci];
      free(cur);
      cur = y;
      h = w = 1;
    } else {
      double *y = malloc(sizeof(double) * (size_t)L->out);
      assert_non_null(y);
      for (int o = 0; o < L->out; o++) {
        double s = t->b[li] ? t->b[li][o] : 0.0;
        for (int i = 0; i < L->in; i++) s += cur[i] * t->w[li][(size_t)o * L->in + i];
        y[o] = s;
      }
      free(cur);
      cur = y;
      c = L->out;
    }
  }
  for (int i = 0; i < c; i++) logits[i] = cur[i];
  free(cur);
}

/* ---- classifier interpreter ----------------------------------------------------------------- */

static void test_classifier_matches_naive(void **state) {
  (void)state;
  tnet t;
  tnet_init(&t, 11);
  char path[256], err[VSPEC_ERRLEN] = "";
  path_in(path, sizeof path, "clf_ok.safetensors");
  tnet_write(&t, path, tnet_layers_json(&t), "8", "10");
  vs_classifier *c = NULL;
  int rc = vs_classifier_open(path, g_dev, &c, err, sizeof err);
  if (rc) fail_msg("open: %s", err);
  assert_int_equal(vs_classifier_feature_dim(c), K_NET_FEAT);
  assert_int_equal(vs_classifier_num_classes(c), K_NET_CLASSES);
  assert_int_equal(vs_classifier_input_size(c), 1024);

  enum { N = 70 }; /* more than one internal batch of 64 */
  vspec_rng rng;
  vs_rng_init(&rng, 12, 0);
  float *x = vt_malloc(sizeof(float) * N * 1024), *x0 = vt_malloc(sizeof(float) * N * 1024);
  vt_fill(&rng, x, (size_t)N * 1024, -1, 1);
  memcpy(x0, x, sizeof(float) * N * 1024);
  float *feat = vt_malloc(sizeof(float) * N * K_NET_FEAT);
  float *logits = vt_malloc(sizeof(float) * N * K_NET_CLASSES);
  double *rf = vt_malloc(sizeof(double) * N * K_NET_FEAT);
  double *rl = vt_malloc(sizeof(double) * N * K_NET_CLASSES);
  for (int i = 0; i < N * K_NET_FEAT; i++) feat[i] = NAN;
  rc = vs_classifier_run(c, x, N, feat, logits, err, sizeof err);
  if (rc) fail_msg("run: %s", err);
  assert_memory_equal(x, x0, sizeof(float) * N * 1024); /* input untouched */
  for (int i = 0; i < N; i++)
    tnet_forward(&t, x + (size_t)i * 1024, rf + (size_t)i * K_NET_FEAT,
                 rl + (size_t)i * K_NET_CLASSES);
  vt_assert_close_scaled(feat, rf, (size_t)N * K_NET_FEAT, 1e-5, "features");
  vt_assert_close_scaled(logits, rl, (size_t)N * K_NET_CLASSES, 1e-5, "logits");
  /* the features must not be trivially zero (dead network) */
  assert_true(vt_max_abs(rf, (size_t)N * K_NET_FEAT) > 1e-3);
  /* logits only, and a run of 1 */
  float one[K_NET_CLASSES];
  rc = vs_classifier_run(c, x + 5 * 1024, 1, NULL, one, err, sizeof err);
  assert_int_equal(rc, 0);
  vt_assert_close_scaled(one, rl + 5 * K_NET_CLASSES, K_NET_CLASSES, 1e-5, "single logits");
  vs_classifier_close(c);
  free(x);
  free(x0);
  free(feat);
  free(logits);
  free(rf);
  free(rl);
  tnet_free(&t);
}

/* Opens a classifier whose layer list was edited by `edit`, expects status and message. */
static void expect_bad_classifier(const tnet *t, const char *name, void (*edit)(json_t *),
                                  const char *feature_dim, int status, const char *m1,
                                  const char *m2) {
  char path[256], err[VSPEC_ERRLEN] = "";
  path_in(path, sizeof path, name);
  json_t *layers = tnet_layers_json(t);
  if (edit) edit(layers);
  tnet_write(t, path, layers, feature_dim, "10");
  vs_classifier *c = (vs_classifier *)1;
  int rc = vs_classifier_open(path, g_dev, &c, err, sizeof err);
  if (rc != status) fail_msg("%s: status %d, want %d (%s)", name, rc, status, err);
  assert_null(c);
  assert_err_has(err, m1, m2);
}

static void edit_unknown_op(json_t *l) {
  json_object_set_new(json_array_get(l, 1), "op", json_string("batchnorm"));
}
static void edit_out_mismatch(json_t *l) {
  json_object_set_new(json_array_get(l, 0), "out", json_integer(5));
}
static void edit_in_mismatch(json_t *l) {
  json_object_set_new(json_array_get(l, 2), "in", json_integer(5));
}
static void edit_groups(json_t *l) {
  json_object_set_new(json_array_get(l, 2), "groups", json_integer(2));
}
static void edit_groups_one(json_t *l) {
  json_object_set_new(json_array_get(l, 2), "groups", json_integer(1));
}
static void edit_linear_first(json_t *l) {
  json_t *fc = json_incref(json_array_get(l, 7));
  json_array_insert_new(l, 0, fc);
}
static void edit_no_pool(json_t *l) {
  while (json_array_size(l) > 6) json_array_remove(l, 6);
}
static void edit_missing_tensor(json_t *l) {
  json_object_set_new(json_array_get(l, 9), "weight", json_string("fc.weight"));
}

static void test_classifier_errors(void **state) {
  (void)state;
  tnet t;
  tnet_init(&t, 13);
  expect_bad_classifier(&t, "e_op.safetensors", edit_unknown_op, "8", VSPEC_ENOTSUP,
                        "layer 1: unknown op 'batchnorm'", "supported: conv2d");
  expect_bad_classifier(&t, "e_out.safetensors", edit_out_mismatch, "8", VSPEC_ESHAPE,
                        "layer 0 (conv2d)", "conv0.weight' has shape [4,1,3,3]");
  expect_bad_classifier(&t, "e_in.safetensors", edit_in_mismatch, "8", VSPEC_ESHAPE,
                        "layer 2 (conv2d): \"in\" is 5", "4 channels");
  expect_bad_classifier(&t, "e_groups.safetensors", edit_groups, "8", VSPEC_EFORMAT,
                        "layer 2 (conv2d)", "\"groups\"");
  expect_bad_classifier(&t, "e_lin.safetensors", edit_linear_first, "8", VSPEC_EFORMAT,
                        "layer 0 (linear) needs a vector input", NULL);
  expect_bad_classifier(&t, "e_pool.safetensors", edit_no_pool, "8", VSPEC_EFORMAT,
                        "no global_avg_pool", NULL);
  expect_bad_classifier(&t, "e_tensor.safetensors", edit_missing_tensor, "8", VSPEC_ENOENT,
                        "layer 9 (linear)", "'fc.weight' not found");
  expect_bad_classifier(&t, "e_fdim.safetensors", NULL, "128", VSPEC_ESHAPE, "feature_dim '128'",
                        "8 channels");
  /* groups = 1 is the default and accepted */
  char path[256], err[VSPEC_ERRLEN] = "";
  path_in(path, sizeof path, "ok_groups.safetensors");
  json_t *layers = tnet_layers_json(&t);
  edit_groups_one(layers);
  tnet_write(&t, path, layers, NULL, NULL);
  vs_classifier *c = NULL;
  if (vs_classifier_open(path, g_dev, &c, err, sizeof err)) fail_msg("groups=1: %s", err);
  vs_classifier_close(c);
  /* no layers metadata at all */
  path_in(path, sizeof path, "e_nolayers.safetensors");
  float one = 1.0f;
  st_tensor ts[1] = {{"w", "F32", 1, {1, 0, 0, 0}, &one, 4}};
  write_st(path, ts, 1, NULL);
  assert_int_equal(vs_classifier_open(path, g_dev, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, path, "no \"layers\" metadata");
  tnet_free(&t);
}

/* ---- statistics and FID -------------------------------------------------------------------- */

static void naive_stats(const float *x, int n, int d, double *mu, double *cov) {
  for (int j = 0; j < d; j++) {
    mu[j] = 0;
    for (int i = 0; i < n; i++) mu[j] += x[(size_t)i * d + j];
    mu[j] /= n;
  }
  for (int a = 0; a < d; a++)
    for (int b = 0; b < d; b++) {
      double s = 0;
      for (int i = 0; i < n; i++)
        s += (x[(size_t)i * d + a] - mu[a]) * (x[(size_t)i * d + b] - mu[b]);
      cov[(size_t)a * d + b] = s / (n - 1);
    }
}

static void test_feature_stats(void **state) {
  (void)state;
  enum { N = 600, D = 7 }; /* N spans several 256-row blocks */
  vspec_rng rng;
  vs_rng_init(&rng, 21, 0);
  float *x = vt_malloc(sizeof(float) * N * D);
  vt_fill(&rng, x, (size_t)N * D, -1, 1);
  /* a large common offset: the one-pass formula would lose digits here */
  for (int i = 0; i < N; i++)
    for (int j = 0; j < D; j++) x[(size_t)i * D + j] += 1000.0f + (float)(j * (i % 3));
  double mu[D], cov[D * D], rmu[D], rcov[D * D];
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_feature_stats(x, N, D, mu, cov, err, sizeof err), 0);
  naive_stats(x, N, D, rmu, rcov);
  for (int j = 0; j < D; j++) assert_near(mu[j], rmu[j], 1e-9 * fabs(rmu[j]), "mean");
  for (int j = 0; j < D * D; j++) assert_near(cov[j], rcov[j], 1e-9, "cov");
  x[5] = NAN;
  assert_int_equal(vs_feature_stats(x, N, D, mu, cov, err, sizeof err), VSPEC_ERANGE);
  assert_int_equal(vs_feature_stats(x, 1, D, mu, cov, err, sizeof err), VSPEC_EINVAL);
  free(x);
}

/* Random SPD matrix G G^T / d + ridge I. */
static void random_spd(vspec_rng *rng, int d, double ridge, double *s) {
  double *g = vt_malloc(sizeof(double) * (size_t)d * d);
  for (int i = 0; i < d * d; i++) g[i] = 2.0 * vs_rng_uniform(rng) - 1.0;
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++) {
      double v = 0;
      for (int k = 0; k < d; k++) v += g[i * d + k] * g[j * d + k];
      s[i * d + j] = v / d + (i == j ? ridge : 0.0);
    }
  free(g);
}

static void matmul(int d, const double *a, const double *b, double *c) {
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++) {
      double s = 0;
      for (int k = 0; k < d; k++) s += a[i * d + k] * b[k * d + j];
      c[i * d + j] = s;
    }
}

/* Gauss-Jordan with partial pivoting. */
static void invert(int d, const double *a, double *inv) {
  double *m = vt_malloc(sizeof(double) * (size_t)d * 2 * d);
  for (int i = 0; i < d; i++)
    for (int j = 0; j < 2 * d; j++)
      m[i * 2 * d + j] = j < d ? a[i * d + j] : (j - d == i ? 1.0 : 0.0);
  for (int col = 0; col < d; col++) {
    int p = col;
    for (int r = col + 1; r < d; r++)
      if (fabs(m[r * 2 * d + col]) > fabs(m[p * 2 * d + col])) p = r;
    for (int j = 0; j < 2 * d; j++) {
      double tmp = m[col * 2 * d + j];
      m[col * 2 * d + j] = m[p * 2 * d + j];
      m[p * 2 * d + j] = tmp;
    }
    double piv = m[col * 2 * d + col];
    assert_true(fabs(piv) > 1e-300);
    for (int j = 0; j < 2 * d; j++) m[col * 2 * d + j] /= piv;
    for (int r = 0; r < d; r++) {
      if (r == col) continue;
      double f = m[r * 2 * d + col];
      for (int j = 0; j < 2 * d; j++) m[r * 2 * d + j] -= f * m[col * 2 * d + j];
    }
  }
  for (int i = 0; i < d; i++)
    for (int j = 0; j < d; j++) inv[i * d + j] = m[i * 2 * d + d + j];
  free(m);
}

/* Tr sqrt(M) by the Denman-Beavers iteration (converges for M without eigenvalues on the
 * closed negative real axis; S1 S2 has positive real eigenvalues). */
static double trace_sqrtm_db(int d, const double *m) {
  size_t dd = (size_t)d * d;
  double *y = vt_malloc(sizeof(double) * dd), *z = vt_malloc(sizeof(double) * dd);
  double *yi = vt_malloc(sizeof(double) * dd), *zi = vt_malloc(sizeof(double) * dd);
  memcpy(y, m, sizeof(double) * dd);
  for (size_t i = 0; i < dd; i++) z[i] = (i % (size_t)(d + 1)) == 0 ? 1.0 : 0.0;
  for (int it = 0; it < 60; it++) {
    invert(d, y, yi);
    invert(d, z, zi);
    for (size_t i = 0; i < dd; i++) {
      y[i] = 0.5 * (y[i] + zi[i]);
      z[i] = 0.5 * (z[i] + yi[i]);
    }
  }
  /* check it converged: Y^2 = M */
  matmul(d, y, y, yi);
  for (size_t i = 0; i < dd; i++) assert_near(yi[i], m[i], 1e-9 * (1 + fabs(m[i])), "DB Y^2");
  double tr = 0;
  for (int i = 0; i < d; i++) tr += y[i * d + i];
  free(y);
  free(z);
  free(yi);
  free(zi);
  return tr;
}

static void test_fid_identical(void **state) {
  (void)state;
  enum { N = 300, D = 6 };
  vspec_rng rng;
  vs_rng_init(&rng, 31, 0);
  float *x = vt_malloc(sizeof(float) * N * D);
  vt_fill(&rng, x, (size_t)N * D, 0, 3);
  double mu[D], cov[D * D], fid = -1;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_feature_stats(x, N, D, mu, cov, err, sizeof err), 0);
  assert_int_equal(vs_fid(mu, cov, mu, cov, D, &fid, err, sizeof err), 0);
  assert_near(fid, 0.0, 1e-10, "FID(s, s)");
  /* a mean shift adds exactly its squared norm */
  double mu2[D];
  for (int j = 0; j < D; j++) mu2[j] = mu[j] + (j == 2 ? 0.5 : 0.0);
  assert_int_equal(vs_fid(mu, cov, mu2, cov, D, &fid, err, sizeof err), 0);
  assert_near(fid, 0.25, 1e-10, "FID mean shift");
  free(x);
}

static void test_fid_diagonal(void **state) {
  (void)state;
  enum { D = 5 };
  const double mu1[D] = {0.1, -2, 3, 0, 1.5}, mu2[D] = {0.3, -1, 2.5, 0.2, 1.5};
  const double s1[D] = {1, 4, 0.25, 2, 0}, s2[D] = {9, 1, 0.25, 0.5, 3};
  double c1[D * D] = {0}, c2[D * D] = {0}, want = 0;
  for (int i = 0; i < D; i++) {
    c1[i * D + i] = s1[i];
    c2[i * D + i] = s2[i];
    want += (mu1[i] - mu2[i]) * (mu1[i] - mu2[i]) + s1[i] + s2[i] - 2 * sqrt(s1[i] * s2[i]);
  }
  double fid = -1;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_fid(mu1, c1, mu2, c2, D, &fid, err, sizeof err), 0);
  assert_near(fid, want, 1e-10 * want, "diagonal FID");
  assert_true(want > 1.0);
}

static void test_fid_two_by_two(void **state) {
  (void)state;
  /* M = S1 S2 has eigenvalues l1, l2 > 0 and tr sqrt(M) = sqrt(l1) + sqrt(l2)
   * = sqrt(tr M + 2 sqrt(det M)). */
  const double s1[4] = {2.0, 0.7, 0.7, 1.0}, s2[4] = {0.5, -0.3, -0.3, 3.0};
  const double mu1[2] = {1, 2}, mu2[2] = {0, 0};
  double m[4];
  matmul(2, s1, s2, m);
  double tr = m[0] + m[3], det = m[0] * m[3] - m[1] * m[2];
  double want = 5.0 + (s1[0] + s1[3]) + (s2[0] + s2[3]) - 2 * sqrt(tr + 2 * sqrt(det));
  double fid = -1;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_fid(mu1, s1, mu2, s2, 2, &fid, err, sizeof err), 0);
  assert_near(fid, want, 1e-12 * want, "2x2 FID");
}

static void test_fid_general(void **state) {
  (void)state;
  enum { D = 6 };
  vspec_rng rng;
  vs_rng_init(&rng, 41, 0);
  for (int rep = 0; rep < 3; rep++) {
    double s1[D * D], s2[D * D], m[D * D], mu1[D], mu2[D];
    random_spd(&rng, D, 0.1 * (rep + 1), s1);
    random_spd(&rng, D, 0.05, s2);
    for (int j = 0; j < D; j++) {
      mu1[j] = vs_rng_uniform(&rng);
      mu2[j] = vs_rng_uniform(&rng);
    }
    matmul(D, s1, s2, m);
    double want = 0;
    for (int j = 0; j < D; j++) want += (mu1[j] - mu2[j]) * (mu1[j] - mu2[j]);
    for (int j = 0; j < D; j++) want += s1[j * D + j] + s2[j * D + j];
    want -= 2 * trace_sqrtm_db(D, m);
    double fid = -1, fid_rev = -1;
    char err[VSPEC_ERRLEN] = "";
    assert_int_equal(vs_fid(mu1, s1, mu2, s2, D, &fid, err, sizeof err), 0);
    assert_int_equal(vs_fid(mu2, s2, mu1, s1, D, &fid_rev, err, sizeof err), 0);
    assert_near(fid, want, 1e-9 * fabs(want) + 1e-12, "general FID vs Denman-Beavers");
    assert_near(fid_rev, fid, 1e-9 * fabs(fid), "FID symmetric");
  }
}

static void test_fid_singular_and_invalid(void **state) {
  (void)state;
  enum { N = 4, D = 6 }; /* fewer samples than dimensions: rank-deficient covariances */
  vspec_rng rng;
  vs_rng_init(&rng, 51, 0);
  float a[N * D], b[N * D];
  vt_fill(&rng, a, N * D, -1, 1);
  vt_fill(&rng, b, N * D, -1, 1);
  double mua[D], ca[D * D], mub[D], cb[D * D], f1, f2, f0;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_feature_stats(a, N, D, mua, ca, err, sizeof err), 0);
  assert_int_equal(vs_feature_stats(b, N, D, mub, cb, err, sizeof err), 0);
  assert_int_equal(vs_fid(mua, ca, mub, cb, D, &f1, err, sizeof err), 0);
  assert_int_equal(vs_fid(mub, cb, mua, ca, D, &f2, err, sizeof err), 0);
  assert_int_equal(vs_fid(mua, ca, mua, ca, D, &f0, err, sizeof err), 0);
  assert_true(isfinite(f1) && f1 > 0.1);
  assert_near(f2, f1, 1e-8 * f1, "singular FID symmetric");
  assert_near(f0, 0.0, 1e-8, "singular FID(s, s)");
  /* not a covariance */
  double bad[4] = {1, 0, 0, -1}, mu[2] = {0, 0}, fid;
  assert_int_equal(vs_fid(mu, bad, mu, bad, 2, &fid, err, sizeof err), VSPEC_ERANGE);
  assert_err_has(err, "not positive semi-definite", NULL);
  assert_true(isnan(fid));
  double nan_cov[4] = {1, NAN, NAN, 1};
  assert_int_equal(vs_fid(mu, nan_cov, mu, bad, 2, &fid, err, sizeof err), VSPEC_ERANGE);
}

static void test_class_accuracy(void **state) {
  (void)state;
  const float logits[4 * 3] = {0, 1, 2, /* 2 */ 5, 5, 1, /* tie: first max 0 */
                               -1, -3, -2, /* 0 */ 0, 9, 0 /* 1 */};
  const int32_t ok[4] = {2, 0, 0, 1}, some[4] = {2, 1, 0, 7};
  assert_near(vs_class_accuracy(logits, 4, 3, ok), 1.0, 0, "all right");
  assert_near(vs_class_accuracy(logits, 4, 3, some), 0.5, 0, "two right");
  assert_true(isnan(vs_class_accuracy(logits, 0, 3, ok)));
}

/* ---- precision and recall ------------------------------------------------------------------ */

static void test_pr_identical_and_disjoint(void **state) {
  (void)state;
  enum { N = 50, D = 4 };
  vspec_rng rng;
  vs_rng_init(&rng, 61, 0);
  float *a = vt_malloc(sizeof(float) * N * D), *b = vt_malloc(sizeof(float) * N * D);
  vt_fill(&rng, a, N * D, -1, 1);
  double p = -1, r = -1;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_precision_recall(a, N, NULL, a, N, D, 3, 16, &p, &r, err, sizeof err), 0);
  assert_near(p, 1.0, 0, "identical precision");
  assert_near(r, 1.0, 0, "identical recall");
  /* a far, tight cluster */
  vt_fill(&rng, b, N * D, 99, 100);
  assert_int_equal(vs_precision_recall(a, N, NULL, b, N, D, 3, 16, &p, &r, err, sizeof err), 0);
  assert_near(p, 0.0, 0, "disjoint precision");
  assert_near(r, 0.0, 0, "disjoint recall");
  assert_int_equal(vs_precision_recall(a, 3, NULL, a, N, D, 3, 0, &p, &r, err, sizeof err),
                   VSPEC_EINVAL);
  assert_err_has(err, "more than 3", NULL);
  free(a);
  free(b);
}

/* Points on a line (spacing 1) embedded in 3-D with an offset; all arithmetic is exact.
 * Real: 0..19. Generated: 0..9 and 1000..1009.
 * Real radii (3rd NN): 2 inside, 3 at the ends. Generated radii: the same within each run.
 * Precision: 0..9 lie on real points (distance 0) -> 10 of 20; the far run is outside.
 * Recall: real x is covered if |x - g| <= r_g for a generated g; g = 9 has radius 3 and
 * covers up to 12 exactly (a tie, which counts), g = 8 (radius 2) up to 10 -> 0..12 is
 * 13 of 20. */
static void test_pr_line(void **state) {
  (void)state;
  enum { D = 3 };
  float real[20 * D], fake[20 * D];
  for (int i = 0; i < 20; i++) {
    real[i * D + 0] = (float)i + 5, real[i * D + 1] = -7, real[i * D + 2] = 3;
    float g = i < 10 ? (float)i : (float)(1000 + i - 10);
    fake[i * D + 0] = g + 5, fake[i * D + 1] = -7, fake[i * D + 2] = 3;
  }
  double p = -1, r = -1, radii[20];
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_knn_radii2(real, 20, D, 3, 0, radii, err, sizeof err), 0);
  for (int i = 0; i < 20; i++)
    assert_near(radii[i], (i == 0 || i == 19) ? 9.0 : 4.0, 0, "line radius^2");
  for (int block = 1; block <= 32; block *= 4) {
    assert_int_equal(
        vs_precision_recall(real, 20, NULL, fake, 20, D, 3, block, &p, &r, err, sizeof err), 0);
    assert_near(p, 0.5, 0, "line precision");
    assert_near(r, 13.0 / 20.0, 0, "line recall");
  }
}

/* k + 1 copies of a point have radius 0 and still contain each other (a duplicate is an
 * ordinary neighbour at distance 0, a tie counts as inside). */
static void test_pr_duplicates(void **state) {
  (void)state;
  enum { D = 2, NR = 12 };
  float real[NR * D];
  for (int i = 0; i < NR; i++) {
    real[i * D] = i < 4 ? 0.3f : (float)(10 * i);
    real[i * D + 1] = i < 4 ? -0.7f : 1.0f;
  }
  double radii[NR];
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_knn_radii2(real, NR, D, 3, 0, radii, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) assert_near(radii[i], 0.0, 0, "duplicate radius");
  float fake[5 * D] = {0.3f, -0.7f, 0.3f, -0.7f, 0.3f, -0.7f, 0.3f, -0.7f, 0.31f, -0.7f};
  double p, r;
  assert_int_equal(vs_precision_recall(real, NR, radii, fake, 5, D, 3, 0, &p, &r, err, sizeof err),
                   0);
  /* the four exact copies count, 0.31 is outside every ball of radius 0 ... and outside
   * the balls of the far points too */
  assert_near(p, 4.0 / 5.0, 0, "duplicates precision");
  /* generated radii: the 4 copies have 3rd NN distance 0; the 5th point's is 0.01.
   * Covered real points: the 4 copies only. */
  assert_near(r, 4.0 / NR, 0, "duplicates recall");
}

/* Naive reference: direct distances, k-th smallest among the others. */
static void naive_radii2(const float *x, int n, int d, int k, double *out) {
  double *dist = vt_malloc(sizeof(double) * (size_t)n);
  for (int i = 0; i < n; i++) {
    int m = 0;
    for (int j = 0; j < n; j++) {
      if (j == i) continue;
      double s = 0;
      for (int c = 0; c < d; c++) {
        double t = (double)x[i * d + c] - x[j * d + c];
        s += t * t;
      }
      dist[m++] = s;
    }
    /* selection of the k-th smallest by partial sorting */
    for (int a = 0; a < k; a++)
      for (int b = a + 1; b < m; b++)
        if (dist[b] < dist[a]) {
          double t = dist[a];
          dist[a] = dist[b];
          dist[b] = t;
        }
    out[i] = dist[k - 1];
  }
  free(dist);
}

static int naive_inside(const float *p, const float *set, const double *r2, int n, int d) {
  for (int j = 0; j < n; j++) {
    double s = 0;
    for (int c = 0; c < d; c++) {
      double t = (double)p[c] - set[j * d + c];
      s += t * t;
    }
    if (s <= r2[j]) return 1;
  }
  return 0;
}

static void test_pr_against_naive(void **state) {
  (void)state;
  enum { NR = 150, NF = 110, D = 5, K = 3 };
  vspec_rng rng;
  vs_rng_init(&rng, 71, 0);
  float *real = vt_malloc(sizeof(float) * NR * D), *fake = vt_malloc(sizeof(float) * NF * D);
  vt_fill(&rng, real, NR * D, -1, 1);
  vt_fill(&rng, fake, NF * D, -0.2f, 1.5f); /* shifted and denser: partial overlap */
  /* duplicates inside each set and across the sets */
  for (int i = 0; i < 6; i++) memcpy(real + (size_t)(100 + i) * D, real + 3 * D, sizeof(float) * D);
  for (int i = 0; i < 10; i++) memcpy(fake + (size_t)i * D, real + (size_t)(7 * i) * D, sizeof(float) * D);
  memcpy(fake + 50 * D, fake + 51 * D, sizeof(float) * D);
  double *rr = vt_malloc(sizeof(double) * NR), *fr = vt_malloc(sizeof(double) * NF);
  double *got = vt_malloc(sizeof(double) * NR);
  naive_radii2(real, NR, D, K, rr);
  naive_radii2(fake, NF, D, K, fr);
  int np = 0, nr = 0;
  for (int j = 0; j < NF; j++) np += naive_inside(fake + (size_t)j * D, real, rr, NR, D);
  for (int i = 0; i < NR; i++) nr += naive_inside(real + (size_t)i * D, fake, fr, NF, D);
  assert_true(np > 10 && np < NF - 10); /* a case that is neither 0 nor 1 */
  assert_true(nr > 10 && nr < NR - 10);
  char err[VSPEC_ERRLEN] = "";
  const int blocks[] = {1, 7, 16, 64, 0};
  for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
    assert_int_equal(vs_knn_radii2(real, NR, D, K, blocks[bi], got, err, sizeof err), 0);
    for (int i = 0; i < NR; i++) assert_near(got[i], rr[i], 1e-12 + 1e-9 * rr[i], "k-NN radius^2");
    double p, r, p2, r2;
    assert_int_equal(
        vs_precision_recall(real, NR, NULL, fake, NF, D, K, blocks[bi], &p, &r, err, sizeof err),
        0);
    assert_near(p, (double)np / NF, 0, "precision vs naive");
    assert_near(r, (double)nr / NR, 0, "recall vs naive");
    /* precomputed real radii give the same */
    assert_int_equal(
        vs_precision_recall(real, NR, got, fake, NF, D, K, blocks[bi], &p2, &r2, err, sizeof err),
        0);
    assert_near(p2, p, 0, "precision with given radii");
    assert_near(r2, r, 0, "recall with given radii");
  }
  free(real);
  free(fake);
  free(rr);
  free(fr);
  free(got);
}

/* Duplicates far from the centre: the GEMM expansion of ||a - b||^2 cancels there and
 * leaves rounding noise instead of 0, which would make the radius and the membership of
 * copies a coin flip; the exact recomputation must give 0 and the naive answer. */
static void test_pr_far_duplicates(void **state) {
  (void)state;
  enum { D = 16, NR = 24, NF = 20, K = 3 };
  vspec_rng rng;
  vs_rng_init(&rng, 75, 0);
  float *real = vt_malloc(sizeof(float) * NR * D), *fake = vt_malloc(sizeof(float) * NF * D);
  float far[D];
  vt_fill(&rng, far, D, 500, 1500);
  vt_fill(&rng, real, NR * D, -1, 1);
  vt_fill(&rng, fake, NF * D, -1, 1);
  for (int i = 0; i < 4; i++) memcpy(real + (size_t)i * D, far, sizeof far);
  for (int i = 0; i < 5; i++) memcpy(fake + (size_t)i * D, far, sizeof far);
  /* near-duplicates: 1..4 ulps away in one coordinate, distances ~1e-4 at norms ~1e3 */
  for (int i = 4; i < 8; i++) {
    memcpy(real + (size_t)i * D, far, sizeof far);
    for (int u = 3; u < i; u++) real[(size_t)i * D] = nextafterf(real[(size_t)i * D], 1e9f);
  }
  double rr[NR], fr[NF], got[NR];
  naive_radii2(real, NR, D, K, rr);
  naive_radii2(fake, NF, D, K, fr);
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_knn_radii2(real, NR, D, K, 0, got, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) assert_near(got[i], 0.0, 0, "far duplicate radius");
  for (int i = 4; i < NR; i++) assert_near(got[i], rr[i], 1e-6 * rr[i], "near-duplicate radius");
  assert_true(rr[7] > 0 && rr[7] < 1e-6);
  int np = 0, nr = 0;
  for (int j = 0; j < NF; j++) np += naive_inside(fake + (size_t)j * D, real, rr, NR, D);
  for (int i = 0; i < NR; i++) nr += naive_inside(real + (size_t)i * D, fake, fr, NF, D);
  double p, r;
  assert_int_equal(vs_precision_recall(real, NR, NULL, fake, NF, D, K, 8, &p, &r, err, sizeof err),
                   0);
  assert_true(np >= 5 && nr >= 4);
  assert_near(p, (double)np / NF, 0, "precision with far duplicates");
  assert_near(r, (double)nr / NR, 0, "recall with far duplicates");
  free(real);
  free(fake);
}

/* ---- the evaluation object ------------------------------------------------------------------ */

enum { E_TEST = 40, E_TRAIN = 50, E_FLOOR = 30 };

typedef struct e2e {
  char model[256], data[256], cache[256];
  tnet net;
  uint8_t test_img[E_TEST * 784], train_img[E_TRAIN * 784];
  uint8_t test_lab[E_TEST], train_lab[E_TRAIN];
} e2e;

static void write_idx_gz(const char *path, uint32_t magic, const uint32_t *dims, int ndim,
                         const uint8_t *data, size_t len) {
  unsigned char head[16];
  for (int i = 0; i < 4; i++) head[i] = (unsigned char)(magic >> (24 - 8 * i));
  for (int k = 0; k < ndim; k++)
    for (int i = 0; i < 4; i++) head[4 + 4 * k + i] = (unsigned char)(dims[k] >> (24 - 8 * i));
  gzFile f = gzopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(gzwrite(f, head, 4 + 4 * (unsigned)ndim), 4 + 4 * ndim);
  assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
  assert_int_equal(gzclose(f), Z_OK);
}

/* Images with some structure (a bright blob at a random place over noise), so the
 * features spread out. */
static void make_images(vspec_rng *rng, uint8_t *img, uint8_t *lab, int n) {
  for (int k = 0; k < n; k++) {
    int cy = 4 + (int)(vs_rng_uniform(rng) * 20), cx = 4 + (int)(vs_rng_uniform(rng) * 20);
    double rad = 2 + vs_rng_uniform(rng) * 6;
    for (int y = 0; y < 28; y++)
      for (int x = 0; x < 28; x++) {
        double d2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
        double v = 40 * vs_rng_uniform(rng) + (d2 < rad * rad ? 200 : 0);
        img[k * 784 + y * 28 + x] = (uint8_t)(v > 255 ? 255 : v);
      }
    lab[k] = (uint8_t)(vs_rng_next_u32(rng) % 10);
  }
}

static void e2e_setup(e2e *e, const char *name) {
  memset(e, 0, sizeof *e);
  char base[256];
  path_in(base, sizeof base, name);
  snprintf(e->model, sizeof e->model, "%s/model", base);
  snprintf(e->data, sizeof e->data, "%s/data", base);
  snprintf(e->cache, sizeof e->cache, "%s/cache/sub", base); /* created on demand */
  assert_int_equal(mkdir(base, 0777), 0);
  assert_int_equal(mkdir(e->model, 0777), 0);
  assert_int_equal(mkdir(e->data, 0777), 0);
  vspec_rng rng;
  vs_rng_init(&rng, 81, 0);
  make_images(&rng, e->test_img, e->test_lab, E_TEST);
  make_images(&rng, e->train_img, e->train_lab, E_TRAIN);
  /* runs of three per class: the first 20 images are not class-balanced, 2 per class are */
  for (int k = 0; k < E_TRAIN; k++) e->train_lab[k] = (uint8_t)(k / 3 % 10);
  char p[512];
  uint32_t d3[3] = {E_TEST, 28, 28}, d1[1] = {E_TEST};
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", e->data);
  write_idx_gz(p, VS_IDX_MAGIC_U8_3D, d3, 3, e->test_img, sizeof e->test_img);
  snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", e->data);
  write_idx_gz(p, VS_IDX_MAGIC_U8_1D, d1, 1, e->test_lab, sizeof e->test_lab);
  d3[0] = d1[0] = E_TRAIN;
  snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", e->data);
  write_idx_gz(p, VS_IDX_MAGIC_U8_3D, d3, 3, e->train_img, sizeof e->train_img);
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", e->data);
  write_idx_gz(p, VS_IDX_MAGIC_U8_1D, d1, 1, e->train_lab, sizeof e->train_lab);
  tnet_init(&e->net, 91);
  snprintf(p, sizeof p, "%s/classifier.safetensors", e->model);
  tnet_write(&e->net, p, tnet_layers_json(&e->net), "8", "10");
}

static int e2e_open(const e2e *e, vs_quality **q, char *err, size_t errlen) {
  vs_quality_opts o = {.data_dir = e->data, .cache_dir = e->cache, .n_floor = E_FLOOR};
  return vs_quality_open_opts(e->model, g_dev, &o, q, err, errlen);
}

/* 28x28 bytes -> the decoder's 32x32 RGB layout (grey, background 0 around). */
static uint8_t *to_rgb(const uint8_t *img, int n) {
  uint8_t *rgb = calloc((size_t)n * 1024 * 3, 1);
  assert_non_null(rgb);
  for (int k = 0; k < n; k++)
    for (int y = 0; y < 28; y++)
      for (int x = 0; x < 28; x++)
        for (int c = 0; c < 3; c++)
          rgb[(((size_t)k * 32 + y + 2) * 32 + x + 2) * 3 + c] = img[k * 784 + y * 28 + x];
  return rgb;
}

/* Features and logits of 28x28 images through the classifier alone. */
static void features_of(const e2e *e, const uint8_t *img, int n, float *feat, float *logits) {
  char path[512], err[VSPEC_ERRLEN] = "";
  snprintf(path, sizeof path, "%s/classifier.safetensors", e->model);
  vs_classifier *c = NULL;
  if (vs_classifier_open(path, g_dev, &c, err, sizeof err)) fail_msg("%s", err);
  float *x = vt_malloc(sizeof(float) * (size_t)n * 1024);
  vs_fmnist_to_input(img, n, x);
  assert_int_equal(vs_classifier_run(c, x, n, feat, logits, err, sizeof err), 0);
  free(x);
  vs_classifier_close(c);
}

static void test_quality_end_to_end(void **state) {
  (void)state;
  static e2e e;
  e2e_setup(&e, "e2e");
  char err[VSPEC_ERRLEN] = "";
  vs_quality *q = NULL;
  int rc = e2e_open(&e, &q, err, sizeof err);
  if (rc) fail_msg("open: %s", err);
  const vs_quality_info *in = vs_quality_get_info(q);
  assert_int_equal(in->n_test, E_TEST);
  assert_int_equal(in->n_floor, E_FLOOR);
  assert_int_equal(in->feature_dim, K_NET_FEAT);
  assert_int_equal(in->from_cache, 0);
  assert_int_equal(in->ref_shipped, 0);
  assert_int_equal(in->golden_images, 0);
  assert_true(isnan(in->ref_check_fid) && isnan(in->train_ref_fid));
  assert_err_has(in->cache_path, e.cache, "quality-");
  assert_int_equal(access(in->cache_path, R_OK), 0);

  /* independent: features of the test and first E_FLOOR training images */
  float tf[E_TEST * K_NET_FEAT], tl[E_TEST * K_NET_CLASSES], rf[E_FLOOR * K_NET_FEAT];
  features_of(&e, e.test_img, E_TEST, tf, tl);
  features_of(&e, e.train_img, E_FLOOR, rf, NULL);
  double mt[K_NET_FEAT], ct[K_NET_FEAT * K_NET_FEAT], mr[K_NET_FEAT],
      cr[K_NET_FEAT * K_NET_FEAT], floor_want;
  assert_int_equal(vs_feature_stats(tf, E_TEST, K_NET_FEAT, mt, ct, err, sizeof err), 0);
  assert_int_equal(vs_feature_stats(rf, E_FLOOR, K_NET_FEAT, mr, cr, err, sizeof err), 0);
  assert_int_equal(vs_fid(mr, cr, mt, ct, K_NET_FEAT, &floor_want, err, sizeof err), 0);
  assert_true(floor_want > 1e-6);
  assert_near(vs_quality_floor(q), floor_want, 1e-9 * floor_want, "floor");
  /* the floor at n images: all of them is the floor; fewer is n class-balanced ones (2 per
   * class at 20), chosen here from the labels */
  double at;
  assert_int_equal(vs_quality_floor_at(q, E_FLOOR, &at, err, sizeof err), 0);
  assert_near(at, floor_want, 1e-9 * floor_want, "floor at every floor image");
  double m20[K_NET_FEAT], c20[K_NET_FEAT * K_NET_FEAT], want20;
  float bf[20 * K_NET_FEAT];
  int per[K_NET_CLASSES] = {0}, nb = 0;
  for (int i = 0; i < E_FLOOR && nb < 20; i++)
    if (per[e.train_lab[i]] < 2) {
      per[e.train_lab[i]]++;
      memcpy(bf + nb++ * K_NET_FEAT, rf + i * K_NET_FEAT, sizeof(float) * K_NET_FEAT);
    }
  assert_int_equal(nb, 20);
  assert_int_equal(vs_feature_stats(bf, 20, K_NET_FEAT, m20, c20, err, sizeof err), 0);
  assert_int_equal(vs_fid(m20, c20, mt, ct, K_NET_FEAT, &want20, err, sizeof err), 0);
  assert_int_equal(vs_quality_floor_at(q, 20, &at, err, sizeof err), 0);
  assert_near(at, want20, 1e-9 * want20, "floor at 20 images");
  assert_true(fabs(want20 - floor_want) > 1e-9);
  assert_int_equal(vs_quality_floor_at(q, E_FLOOR + 1, &at, err, sizeof err), VSPEC_EINVAL);
  assert_err_has(err, "between 2 and", "30");
  int32_t pred[E_TEST], lab[E_TEST];
  int correct = 0;
  for (int i = 0; i < E_TEST; i++) {
    int best = 0;
    for (int k = 1; k < K_NET_CLASSES; k++)
      if (tl[i * K_NET_CLASSES + k] > tl[i * K_NET_CLASSES + best]) best = k;
    pred[i] = best;
    lab[i] = e.test_lab[i];
    correct += best == lab[i];
  }
  assert_near(in->test_acc, (double)correct / E_TEST, 0, "test accuracy");

  /* generated = the test images themselves: FID 0, P = R = 1, accuracy as the labels */
  uint8_t *rgb = to_rgb(e.test_img, E_TEST);
  vs_quality_result res;
  rc = vs_quality_eval(q, rgb, pred, E_TEST, &res, err, sizeof err);
  if (rc) fail_msg("eval: %s", err);
  assert_int_equal(res.n, E_TEST);
  assert_near(res.fid, 0.0, 1e-8, "FID of the test set itself");
  assert_near(res.precision, 1.0, 0, "precision of the test set itself");
  assert_near(res.recall, 1.0, 0, "recall of the test set itself");
  assert_near(res.class_acc, 1.0, 0, "accuracy against predicted labels");
  assert_int_equal(vs_quality_eval(q, rgb, lab, E_TEST, &res, err, sizeof err), 0);
  assert_near(res.class_acc, (double)correct / E_TEST, 0, "accuracy against true labels");
  assert_int_equal(vs_quality_eval(q, rgb, NULL, E_TEST, &res, err, sizeof err), 0);
  assert_true(isnan(res.class_acc));
  assert_int_equal(vs_quality_eval(q, rgb, NULL, 3, &res, err, sizeof err), VSPEC_EINVAL);
  free(rgb);

  /* generated = the floor's training images: exactly the floor, and P/R as floor_pr */
  rgb = to_rgb(e.train_img, E_FLOOR);
  assert_int_equal(vs_quality_eval(q, rgb, NULL, E_FLOOR, &res, err, sizeof err), 0);
  assert_near(res.fid, floor_want, 1e-9 * floor_want, "eval of the floor images");
  double fp, fr;
  assert_int_equal(vs_quality_floor_pr(q, &fp, &fr, err, sizeof err), 0);
  assert_near(fp, res.precision, 0, "floor precision");
  assert_near(fr, res.recall, 0, "floor recall");
  vs_quality_close(q);

  /* second open: from the cache, same numbers */
  rc = e2e_open(&e, &q, err, sizeof err);
  if (rc) fail_msg("reopen: %s", err);
  in = vs_quality_get_info(q);
  assert_int_equal(in->from_cache, 1);
  assert_near(vs_quality_floor(q), floor_want, 1e-9 * floor_want, "floor from cache");
  vs_quality_result res2;
  assert_int_equal(vs_quality_eval(q, rgb, NULL, E_FLOOR, &res2, err, sizeof err), 0);
  assert_near(res2.fid, res.fid, 0, "eval from cache");
  assert_near(res2.precision, res.precision, 0, "precision from cache");
  char cache_path[1200];
  snprintf(cache_path, sizeof cache_path, "%s", in->cache_path);
  vs_quality_close(q);
  free(rgb);

  /* a damaged cache is recomputed, not trusted */
  FILE *fp_c = fopen(cache_path, "r+b");
  assert_non_null(fp_c);
  assert_int_equal(fseek(fp_c, 100, SEEK_SET), 0);
  int ch = fgetc(fp_c);
  assert_int_equal(fseek(fp_c, 100, SEEK_SET), 0);
  fputc(ch ^ 0x40, fp_c);
  fclose(fp_c);
  rc = e2e_open(&e, &q, err, sizeof err);
  if (rc) fail_msg("open after damage: %s", err);
  assert_int_equal(vs_quality_get_info(q)->from_cache, 0);
  assert_near(vs_quality_floor(q), floor_want, 1e-9 * floor_want, "floor after damage");
  vs_quality_close(q);
  /* a different n_floor does not reuse the cache */
  vs_quality_opts o = {.data_dir = e.data, .cache_dir = e.cache, .n_floor = E_TRAIN};
  assert_int_equal(vs_quality_open_opts(e.model, g_dev, &o, &q, err, sizeof err), 0);
  assert_int_equal(vs_quality_get_info(q)->from_cache, 0);
  assert_int_equal(vs_quality_get_info(q)->n_floor, E_TRAIN);
  vs_quality_close(q);
  /* caching off */
  o.cache_dir = "";
  assert_int_equal(vs_quality_open_opts(e.model, g_dev, &o, &q, err, sizeof err), 0);
  assert_string_equal(vs_quality_get_info(q)->cache_path, "");
  vs_quality_close(q);

  /* ---- shipped reference statistics under alias names ---- */
  char p[512];
  snprintf(p, sizeof p, "%s/fid_ref.safetensors", e.model);
  double mall[K_NET_FEAT], call[K_NET_FEAT * K_NET_FEAT];
  {
    float all[E_TRAIN * K_NET_FEAT];
    features_of(&e, e.train_img, E_TRAIN, all, NULL);
    assert_int_equal(vs_feature_stats(all, E_TRAIN, K_NET_FEAT, mall, call, err, sizeof err), 0);
  }
  st_tensor ts[4] = {
      {"test_mu", "F64", 1, {K_NET_FEAT}, mt, sizeof mt},
      {"test_sigma", "F64", 2, {K_NET_FEAT, K_NET_FEAT}, ct, sizeof ct},
      {"train.mean", "F64", 1, {K_NET_FEAT}, mall, sizeof mall},
      {"train.cov", "F64", 2, {K_NET_FEAT, K_NET_FEAT}, call, sizeof call},
  };
  write_st(p, ts, 4, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), 0);
  in = vs_quality_get_info(q);
  assert_int_equal(in->ref_shipped, 1);
  assert_err_has(in->ref_source, "test_mu", "test_sigma");
  assert_near(in->ref_check_fid, 0.0, 1e-6, "C vs shipped test stats");
  double train_want;
  assert_int_equal(vs_fid(mall, call, mt, ct, K_NET_FEAT, &train_want, err, sizeof err), 0);
  assert_near(in->train_ref_fid, train_want, 1e-9 * train_want, "train (all) vs test");
  assert_err_has(in->train_ref_note, "train.mean", "train.cov");
  vs_quality_close(q);
  /* shipped stats that differ: the FIDs follow them, the check shows the difference */
  double mt2[K_NET_FEAT];
  for (int j = 0; j < K_NET_FEAT; j++) mt2[j] = mt[j] + 0.25;
  ts[0].data = mt2;
  write_st(p, ts, 2, NULL); /* and no train statistics: informational only */
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), 0);
  in = vs_quality_get_info(q);
  assert_near(in->ref_check_fid, 0.25 * 0.25 * K_NET_FEAT, 1e-6, "check with shifted mean");
  assert_true(isnan(in->train_ref_fid));
  assert_err_has(in->train_ref_note, "train.mean", "train_mu");
  rgb = to_rgb(e.test_img, E_TEST);
  assert_int_equal(vs_quality_eval(q, rgb, NULL, E_TEST, &res, err, sizeof err), 0);
  assert_near(res.fid, 0.25 * 0.25 * K_NET_FEAT, 1e-6, "FID against shipped stats");
  free(rgb);
  vs_quality_close(q);
  /* unknown names: the error lists what was tried */
  snprintf(ts[0].name, sizeof ts[0].name, "mu");
  snprintf(ts[1].name, sizeof ts[1].name, "sigma");
  write_st(p, ts, 2, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), VSPEC_ENOENT);
  assert_null(q);
  assert_err_has(err, "fid_ref.safetensors", "test.mean, test_mu");
  /* wrong shape */
  snprintf(ts[0].name, sizeof ts[0].name, "test.mean");
  snprintf(ts[1].name, sizeof ts[1].name, "test.cov");
  ts[1].ndim = 1;
  ts[1].shape[0] = K_NET_FEAT * K_NET_FEAT;
  write_st(p, ts, 2, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), VSPEC_ESHAPE);
  assert_err_has(err, "'test.cov' has shape [64]", "[d,d]");
  unlink(p);

  /* ---- golden file: PyTorch's outputs on the first 16 test images ---- */
  enum { G = 16 };
  float gimg[G * 1024], gfeat[G * K_NET_FEAT], glog[G * K_NET_CLASSES];
  vs_fmnist_to_input(e.test_img, G, gimg);
  memcpy(gfeat, tf, sizeof gfeat);
  memcpy(glog, tl, sizeof glog);
  st_tensor gt[3] = {
      {"inputs", "F32", 4, {G, 1, 32, 32}, gimg, sizeof gimg},
      {"feats", "F32", 2, {G, K_NET_FEAT}, gfeat, sizeof gfeat},
      {"logits", "F32", 2, {G, K_NET_CLASSES}, glog, sizeof glog},
  };
  snprintf(p, sizeof p, "%s/classifier_golden.safetensors", e.model);
  write_st(p, gt, 3, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), 0);
  assert_int_equal(vs_quality_get_info(q)->golden_images, G);
  assert_true(vs_quality_get_info(q)->golden_feat_err < 1e-5);
  vs_quality_close(q);
  /* one feature off by 0.05 (the features are O(1): far above the tolerance) */
  gfeat[3] += 0.05f;
  write_st(p, gt, 3, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), VSPEC_ERANGE);
  assert_err_has(err, "does not reproduce PyTorch", "'feats'");
  gfeat[3] = tf[3];
  /* images preprocessed differently (no padding: shifted by 2 px) */
  for (int k = 0; k < G; k++)
    for (int y = 0; y < 32; y++)
      for (int x = 0; x < 32; x++)
        gimg[k * 1024 + y * 32 + x] =
            (y < 28 && x < 28) ? e.test_img[k * 784 + y * 28 + x] / 127.5f - 1.0f : -1.0f;
  write_st(p, gt, 3, NULL);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), VSPEC_ERANGE);
  assert_err_has(err, "preprocessing", "'inputs'");
  unlink(p);

  /* ---- missing pieces ---- */
  snprintf(p, sizeof p, "%s/classifier.safetensors", e.model);
  unlink(p);
  assert_int_equal(e2e_open(&e, &q, err, sizeof err), VSPEC_ENOENT);
  assert_err_has(err, p, "trained Fashion-MNIST classifier");
  tnet_free(&e.net);
}

/* The shipped classifier against its golden file, once models/fmnist exists. */
static void test_shipped_classifier_golden(void **state) {
  (void)state;
  const char *clf = "models/fmnist/classifier.safetensors";
  const char *gold = "models/fmnist/classifier_golden.safetensors";
  if (access(clf, R_OK) != 0 || access(gold, R_OK) != 0) {
    print_message("skipping: %s or %s not present yet\n", clf, gold);
    skip();
  }
  char err[VSPEC_ERRLEN] = "";
  vs_quality_info info;
  if (vs_quality_check_golden(clf, gold, g_dev, &info, err, sizeof err)) fail_msg("%s", err);
  assert_true(info.golden_images > 0);
  print_message("shipped classifier vs PyTorch: inputs %.2g, features %.2g, logits %.2g\n",
                info.golden_input_err, info.golden_feat_err, info.golden_logit_err);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/vspec_quality_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  char err[VSPEC_ERRLEN];
  return vs_dev_create(vs_cpu_ops(), 1, &g_dev, err, sizeof err) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  vs_dev_destroy(g_dev);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_classifier_matches_naive),
      cmocka_unit_test(test_classifier_errors),
      cmocka_unit_test(test_feature_stats),
      cmocka_unit_test(test_fid_identical),
      cmocka_unit_test(test_fid_diagonal),
      cmocka_unit_test(test_fid_two_by_two),
      cmocka_unit_test(test_fid_general),
      cmocka_unit_test(test_fid_singular_and_invalid),
      cmocka_unit_test(test_class_accuracy),
      cmocka_unit_test(test_pr_identical_and_disjoint),
      cmocka_unit_test(test_pr_line),
      cmocka_unit_test(test_pr_duplicates),
      cmocka_unit_test(test_pr_against_naive),
      cmocka_unit_test(test_pr_far_duplicates),
      cmocka_unit_test(test_quality_end_to_end),
      cmocka_unit_test(test_shipped_classifier_golden),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
