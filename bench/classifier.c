/*
 * bench/classifier.c - interpreter for the layer list of classifier.safetensors (see
 * classifier.h).
 */
#include "bench/classifier.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "kernels/vs_kernels.h"

/* Samples per call of the batched (post-pooling) layers. The spatial layers run one
 * sample at a time because ops->conv2d takes one sample; the linear layers get a whole
 * batch as one matrix product. */
#define VS_CLF_BATCH 64
/* Sanity bound on any one activation, in floats per sample. */
#define VS_CLF_MAX_ACT ((size_t)1 << 26)

typedef enum vs_clf_op { VS_CLF_CONV, VS_CLF_RELU, VS_CLF_GAP, VS_CLF_LINEAR } vs_clf_op;

typedef struct vs_clf_layer {
  vs_clf_op op;
  const float *w, *b; /* conv / linear; b may be NULL */
  int in, out;        /* channels (conv) or features (linear) */
  int kh, kw, stride, ph, pw;
  int c, h, w_out;    /* output: channels and spatial size (h = w_out = 0 once pooled) */
} vs_clf_layer;

struct vs_classifier {
  vspec_tensor_file *file;
  vspec_dev *dev;
  const vspec_ops *ops;
  int in_c, in_h, in_w;
  int n_layers;
  vs_clf_layer *layers;
  int gap;                   /* index of the global_avg_pool layer */
  int feature_dim, num_classes;
  size_t max_act;            /* floats of the largest spatial activation of one sample */
  int max_vec;               /* widest vector after pooling */
  float *act[2];             /* one sample's spatial activations, ping-pong */
  float *vec[2];             /* [VS_CLF_BATCH, max_vec] vectors after pooling */
};

/* A positive int field; absent -> def (def < 0: required). */
static int vs_clf_int(const json_t *o, const char *key, int def, int lo, int *out) {
  const json_t *v = json_object_get(o, key);
  if (!v) {
    *out = def;
    return def >= 0;
  }
  if (!json_is_integer(v)) return 0;
  json_int_t x = json_integer_value(v);
  if (x < lo || x > (1 << 20)) return 0;
  *out = (int)x;
  return 1;
}

/* An int or [h, w] field (kernel, stride, padding). */
static int vs_clf_pair(const json_t *o, const char *key, int def, int lo, int *a, int *b) {
  const json_t *v = json_object_get(o, key);
  if (!v) {
    *a = *b = def;
    return def >= 0;
  }
  if (json_is_integer(v)) {
    json_int_t x = json_integer_value(v);
    if (x < lo || x > (1 << 20)) return 0;
    *a = *b = (int)x;
    return 1;
  }
  if (!json_is_array(v) || json_array_size(v) != 2) return 0;
  const json_t *x0 = json_array_get(v, 0), *x1 = json_array_get(v, 1);
  if (!json_is_integer(x0) || !json_is_integer(x1)) return 0;
  json_int_t i0 = json_integer_value(x0), i1 = json_integer_value(x1);
  if (i0 < lo || i1 < lo || i0 > (1 << 20) || i1 > (1 << 20)) return 0;
  *a = (int)i0;
  *b = (int)i1;
  return 1;
}

/* Keys a layer may carry; anything else (groups, dilation, a new op's option) is refused
 * because ignoring it would compute a different network. */
static int vs_clf_check_keys(const json_t *o, const char *const *allowed, const char **bad) {
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    /* "note" and "name" are documentation the exporter may add. */
    int ok = strcmp(key, "op") == 0 || strcmp(key, "name") == 0 || strcmp(key, "note") == 0;
    for (int i = 0; !ok && allowed[i]; i++) ok = strcmp(key, allowed[i]) == 0;
    /* groups = 1 and dilation = 1 are the defaults and harmless to state */
    if (!ok && (strcmp(key, "groups") == 0 || strcmp(key, "dilation") == 0)) {
      int a, b;
      ok = vs_clf_pair(o, key, 1, 1, &a, &b) && a == 1 && b == 1;
    }
    if (!ok) {
      *bad = key;
      return 0;
    }
  }
  return 1;
}

/* Looks up the weight (and bias) tensors of layer i with their expected shapes. */
static int vs_clf_tensors(vs_classifier *c, const json_t *o, int i, const char *opname,
                          int ndim, const int64_t *wshape, int n_bias, vs_clf_layer *L,
                          char *err, size_t errlen) {
  const char *path = vs_st_path(c->file);
  const json_t *wn = json_object_get(o, "weight"), *bn = json_object_get(o, "bias");
  if (!json_is_string(wn))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (%s): \"weight\" must name a tensor", path, i, opname);
  if (bn && !json_is_null(bn) && !json_is_string(bn))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (%s): \"bias\" must name a tensor or be null", path, i,
                   opname);
  char sub[VSPEC_ERRLEN];
  int rc = vs_st_get_f32(c->file, c->dev, json_string_value(wn), ndim, wshape, &L->w, sub,
                         sizeof sub);
  if (!rc && json_is_string(bn)) {
    int64_t bshape[1] = {n_bias};
    rc = vs_st_get_f32(c->file, c->dev, json_string_value(bn), 1, bshape, &L->b, sub,
                       sizeof sub);
  }
  if (rc) return vs_fail(err, errlen, rc, "layer %d (%s): %s", i, opname, sub);
  return VSPEC_OK;
}

/* The shape that flows through the graph: channels and, until pooled, height and width
 * (h = w = 0 once pooled). */
typedef struct vs_clf_flow {
  int ch, h, w;
} vs_clf_flow;

static int vs_clf_bad_key(const char *path, int i, const char *op, const char *bad, char *err,
                          size_t errlen) {
  return vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: layer %d (%s): unsupported key \"%s\" (or a value other than 1)", path, i,
                 op, bad);
}

static int vs_clf_conv_layer(vs_classifier *c, const json_t *o, int i, vs_clf_layer *L,
                             vs_clf_flow *f, char *err, size_t errlen) {
  const char *path = vs_st_path(c->file), *bad = NULL;
  static const char *const keys[] = {"weight", "bias", "in", "out", "kernel", "stride",
                                     "padding", NULL};
  L->op = VS_CLF_CONV;
  if (!vs_clf_check_keys(o, keys, &bad)) return vs_clf_bad_key(path, i, "conv2d", bad, err, errlen);
  if (!(f->h > 0))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (conv2d) comes after global_avg_pool; it needs a "
                   "spatial input",
                   path, i);
  int sh, sw;
  if (!vs_clf_int(o, "in", -1, 1, &L->in) || !vs_clf_int(o, "out", -1, 1, &L->out) ||
      !vs_clf_pair(o, "kernel", -1, 1, &L->kh, &L->kw) ||
      !vs_clf_pair(o, "stride", 1, 1, &sh, &sw) ||
      !vs_clf_pair(o, "padding", 0, 0, &L->ph, &L->pw))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (conv2d): needs positive integers in, out, kernel "
                   "(int or [h,w]) and optional stride >= 1, padding >= 0",
                   path, i);
  if (sh != sw)
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "%s: layer %d (conv2d): stride [%d,%d] differs per axis, which the "
                   "conv2d op does not support",
                   path, i, sh, sw);
  L->stride = sh;
  if (L->in != f->ch)
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: layer %d (conv2d): \"in\" is %d but its input has %d channels",
                   path, i, L->in, f->ch);
  int hs = f->h + 2 * L->ph - L->kh, ws = f->w + 2 * L->pw - L->kw;
  if (hs < 0 || ws < 0)
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: layer %d (conv2d): kernel %dx%d does not fit its %dx%d input "
                   "padded by %d,%d",
                   path, i, L->kh, L->kw, f->h, f->w, L->ph, L->pw);
  int64_t wshape[4] = {L->out, L->in, L->kh, L->kw};
  int rc = vs_clf_tensors(c, o, i, "conv2d", 4, wshape, L->out, L, err, errlen);
  if (rc) return rc;
  f->ch = L->out;
  f->h = hs / L->stride + 1;
  f->w = ws / L->stride + 1;
  size_t act = (size_t)f->ch * f->h * f->w;
  if (act > VS_CLF_MAX_ACT)
    return vs_fail(err, errlen, VSPEC_ERANGE,
                   "%s: layer %d (conv2d): output %dx%dx%d is unreasonably large", path, i,
                   f->ch, f->h, f->w);
  if (act > c->max_act) c->max_act = act;
  return VSPEC_OK;
}

static int vs_clf_linear_layer(vs_classifier *c, const json_t *o, int i, vs_clf_layer *L,
                               vs_clf_flow *f, char *err, size_t errlen) {
  const char *path = vs_st_path(c->file), *bad = NULL;
  static const char *const keys[] = {"weight", "bias", "in", "out", NULL};
  L->op = VS_CLF_LINEAR;
  if (!vs_clf_check_keys(o, keys, &bad)) return vs_clf_bad_key(path, i, "linear", bad, err, errlen);
  if (f->h > 0)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (linear) needs a vector input; put it after "
                   "global_avg_pool",
                   path, i);
  if (!vs_clf_int(o, "in", -1, 1, &L->in) || !vs_clf_int(o, "out", -1, 1, &L->out))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d (linear): needs positive integers in, out", path, i);
  if (L->in != f->ch)
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: layer %d (linear): \"in\" is %d but its input has %d features",
                   path, i, L->in, f->ch);
  int64_t wshape[2] = {L->out, L->in};
  int rc = vs_clf_tensors(c, o, i, "linear", 2, wshape, L->out, L, err, errlen);
  if (rc) return rc;
  f->ch = L->out;
  return VSPEC_OK;
}

/* relu and global_avg_pool: no tensors, no keys. */
static int vs_clf_plain_layer(vs_classifier *c, const json_t *o, int i, const char *op,
                              vs_clf_layer *L, vs_clf_flow *f, char *err, size_t errlen) {
  const char *path = vs_st_path(c->file), *bad = NULL;
  static const char *const keys[] = {NULL};
  L->op = strcmp(op, "relu") == 0 ? VS_CLF_RELU : VS_CLF_GAP;
  if (!vs_clf_check_keys(o, keys, &bad)) return vs_clf_bad_key(path, i, op, bad, err, errlen);
  if (L->op == VS_CLF_RELU) return VSPEC_OK;
  if (!(f->h > 0))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d: a second global_avg_pool (the features are defined by "
                   "the one pooling layer)",
                   path, i);
  c->gap = i;
  f->h = f->w = 0;
  return VSPEC_OK;
}

/* Layer i, checked against the shape f that reaches it; f becomes its output's. */
static int vs_clf_one_layer(vs_classifier *c, const json_t *o, int i, vs_clf_flow *f, char *err,
                            size_t errlen) {
  vs_clf_layer *L = &c->layers[i];
  const char *path = vs_st_path(c->file);
  const json_t *opv = json_is_object(o) ? json_object_get(o, "op") : NULL;
  if (!json_is_string(opv))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: layer %d is not an object with a string \"op\"", path, i);
  const char *op = json_string_value(opv);
  int rc;
  if (strcmp(op, "conv2d") == 0)
    rc = vs_clf_conv_layer(c, o, i, L, f, err, errlen);
  else if (strcmp(op, "relu") == 0 || strcmp(op, "global_avg_pool") == 0)
    rc = vs_clf_plain_layer(c, o, i, op, L, f, err, errlen);
  else if (strcmp(op, "linear") == 0)
    rc = vs_clf_linear_layer(c, o, i, L, f, err, errlen);
  else
    rc = vs_fail(err, errlen, VSPEC_ENOTSUP,
                 "%s: layer %d: unknown op '%s' (supported: conv2d, relu, "
                 "global_avg_pool, linear)",
                 path, i, op);
  if (rc) return rc;
  L->c = f->ch;
  L->h = f->h;
  L->w_out = f->w;
  if (!f->h && f->ch > c->max_vec) c->max_vec = f->ch;
  return VSPEC_OK;
}

/* Parses "layers" and checks the whole graph against the tensors and the input shape. */
static int vs_clf_build(vs_classifier *c, const char *layers_text, char *err, size_t errlen) {
  const char *path = vs_st_path(c->file);
  json_error_t jerr;
  json_t *root = json_loads(layers_text, 0, &jerr);
  if (!root)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: metadata \"layers\" is not valid JSON: %s (line %d, column %d)", path,
                   jerr.text, jerr.line, jerr.column);
  int rc = VSPEC_OK;
  if (!json_is_array(root) || json_array_size(root) == 0 || json_array_size(root) > 4096) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: metadata \"layers\" must be a non-empty JSON list of layers", path);
    goto done;
  }
  c->n_layers = (int)json_array_size(root);
  c->layers = calloc((size_t)c->n_layers, sizeof *c->layers);
  if (!c->layers) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
    goto done;
  }
  vs_clf_flow f = {c->in_c, c->in_h, c->in_w};
  c->gap = -1;
  c->max_act = (size_t)f.ch * f.h * f.w;
  c->max_vec = 0;
  for (int i = 0; !rc && i < c->n_layers; i++)
    rc = vs_clf_one_layer(c, json_array_get(root, (size_t)i), i, &f, err, errlen);
  if (rc) goto done;
  if (c->gap < 0) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: \"layers\" has no global_avg_pool, so there is no feature vector",
                 path);
    goto done;
  }
  c->feature_dim = c->layers[c->gap].c;
  c->num_classes = f.ch;
  if (c->gap == c->n_layers - 1)
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: \"layers\" ends with global_avg_pool; the logits need a final linear",
                 path);
done:
  json_decref(root);
  return rc;
}

/* "128" -> 128; absent -> 0 (no check); anything else -> -1. */
static int vs_clf_meta_int(const vspec_tensor_file *f, const char *key) {
  const char *s = vs_st_meta(f, key);
  if (!s) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v <= 0 || v > INT_MAX) return -1;
  return (int)v;
}

int vs_classifier_open(const char *path, vspec_dev *dev, vs_classifier **out, char *err,
                       size_t errlen) {
  *out = NULL;
  const vspec_ops *ops = dev ? vs_dev_ops(dev) : NULL;
  if (!ops || ops->device != VSPEC_DEVICE_CPU)
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "%s: the quality classifier runs on the CPU device only", path);
  vs_classifier *c = calloc(1, sizeof *c);
  if (!c) return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
  c->dev = dev;
  c->ops = ops;
  int rc = vs_st_open(path, &c->file, err, errlen);
  if (rc) goto fail;

  c->in_c = 1;
  c->in_h = c->in_w = 32;
  const char *shape = vs_st_meta(c->file, "input_shape");
  if (shape) {
    json_t *js = json_loads(shape, JSON_DECODE_ANY, NULL);
    int ok = json_is_array(js) && json_array_size(js) == 3;
    int dims[3] = {0, 0, 0};
    for (int i = 0; ok && i < 3; i++) {
      const json_t *v = json_array_get(js, (size_t)i);
      ok = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= 4096;
      if (ok) dims[i] = (int)json_integer_value(v);
    }
    json_decref(js);
    if (!ok) {
      rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: metadata \"input_shape\" must be a JSON list [c, h, w], got '%s'",
                   path, shape);
      goto fail;
    }
    c->in_c = dims[0];
    c->in_h = dims[1];
    c->in_w = dims[2];
  }
  const char *layers = vs_st_meta(c->file, "layers");
  if (!layers) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: no \"layers\" metadata describing the network (see "
                 "bench/classifier.h for the format)",
                 path);
    goto fail;
  }
  rc = vs_clf_build(c, layers, err, errlen);
  if (rc) goto fail;

  int fd = vs_clf_meta_int(c->file, "feature_dim"), nc = vs_clf_meta_int(c->file, "num_classes");
  if (fd < 0 || (fd > 0 && fd != c->feature_dim)) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE,
                 "%s: metadata feature_dim '%s' disagrees with the %d channels that "
                 "global_avg_pool outputs",
                 path, vs_st_meta(c->file, "feature_dim"), c->feature_dim);
    goto fail;
  }
  if (nc < 0 || (nc > 0 && nc != c->num_classes)) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE,
                 "%s: metadata num_classes '%s' disagrees with the %d outputs of the last "
                 "layer",
                 path, vs_st_meta(c->file, "num_classes"), c->num_classes);
    goto fail;
  }

  for (int k = 0; k < 2; k++) {
    c->act[k] = ops->alloc(dev, c->max_act * sizeof(float));
    c->vec[k] = ops->alloc(dev, (size_t)VS_CLF_BATCH * c->max_vec * sizeof(float));
    if (!c->act[k] || !c->vec[k]) {
      rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory for activations", path);
      goto fail;
    }
  }
  *out = c;
  return VSPEC_OK;
fail:
  vs_classifier_close(c);
  return rc;
}

void vs_classifier_close(vs_classifier *c) {
  if (!c) return;
  for (int k = 0; k < 2; k++) {
    if (c->act[k]) c->ops->free(c->dev, c->act[k]);
    if (c->vec[k]) c->ops->free(c->dev, c->vec[k]);
  }
  free(c->layers);
  vs_st_close(c->file);
  free(c);
}

int vs_classifier_feature_dim(const vs_classifier *c) { return c->feature_dim; }
int vs_classifier_num_classes(const vs_classifier *c) { return c->num_classes; }
size_t vs_classifier_input_size(const vs_classifier *c) {
  return (size_t)c->in_c * c->in_h * c->in_w;
}
void vs_classifier_input_shape(const vs_classifier *c, int *ch, int *h, int *w) {
  *ch = c->in_c;
  *h = c->in_h;
  *w = c->in_w;
}

static void vs_clf_relu(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

int vs_classifier_run(vs_classifier *c, const float *x, int n, float *features, float *logits,
                      char *err, size_t errlen) {
  if (n < 0 || (n > 0 && !x))
    return vs_fail(err, errlen, VSPEC_EINVAL, "vs_classifier_run: invalid arguments");
  size_t in_size = vs_classifier_input_size(c);
  for (int b0 = 0; b0 < n; b0 += VS_CLF_BATCH) {
    int m = n - b0 < VS_CLF_BATCH ? n - b0 : VS_CLF_BATCH;
    /* Spatial part, one sample at a time, ending in the pooled row vec[0][s]. cur is NULL
     * while the data still is the caller's input, which is never written. */
    for (int s = 0; s < m; s++) {
      const float *in = x + (size_t)(b0 + s) * in_size;
      float *cur = NULL;
      int ch = c->in_c, h = c->in_h, w = c->in_w, k = 0;
      for (int i = 0; i <= c->gap; i++) {
        const vs_clf_layer *L = &c->layers[i];
        size_t hw = (size_t)h * w;
        if (L->op == VS_CLF_CONV) {
          c->ops->conv2d(c->dev, cur ? cur : in, ch, h, w, L->w, L->b, L->out, L->kh, L->kw,
                         L->stride, L->ph, L->pw, L->ph, L->pw, c->act[k]);
          cur = c->act[k];
          k ^= 1;
        } else if (L->op == VS_CLF_RELU) {
          if (!cur) {
            memcpy(c->act[k], in, (size_t)ch * hw * sizeof(float));
            cur = c->act[k];
            k ^= 1;
          }
          vs_clf_relu(cur, (size_t)ch * hw);
        } else { /* VS_CLF_GAP; the sum in double so the mean does not depend on hw */
          const float *src = cur ? cur : in;
          float *dst = c->vec[0] + (size_t)s * ch;
          for (int ci = 0; ci < ch; ci++) {
            const float *p = src + (size_t)ci * hw;
            double sum = 0.0;
            for (size_t j = 0; j < hw; j++) sum += p[j];
            dst[ci] = (float)(sum / (double)hw);
          }
        }
        ch = L->c;
        h = L->h;
        w = L->w_out;
      }
    }
    if (features)
      memcpy(features + (size_t)b0 * c->feature_dim, c->vec[0],
             (size_t)m * c->feature_dim * sizeof(float));
    /* Vector part, the whole batch at once; rows are packed at the current width. */
    int k = 0, dim = c->feature_dim;
    for (int i = c->gap + 1; i < c->n_layers; i++) {
      const vs_clf_layer *L = &c->layers[i];
      if (L->op == VS_CLF_LINEAR) {
        c->ops->linear(c->dev, c->vec[k], m, L->in, L->w, L->out, L->b, c->vec[k ^ 1]);
        k ^= 1;
      } else { /* VS_CLF_RELU */
        vs_clf_relu(c->vec[k], (size_t)m * dim);
      }
      dim = L->c;
    }
    if (logits)
      memcpy(logits + (size_t)b0 * c->num_classes, c->vec[k],
             (size_t)m * c->num_classes * sizeof(float));
  }
  return VSPEC_OK;
}
