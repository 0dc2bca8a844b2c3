/*
 * The LlamaGen VQ decoder: token grid -> RGB (tokenizer/tokenizer_image/vq_model.py:
 * VQModel.decode_code, Decoder).
 *
 * The structure is read from the checkpoint's keys rather than from a preset: the number
 * of stages, res blocks per stage (num_res_blocks + 1), where attention and upsampling
 * sit, and every channel count come from the weights, because the reference hard-codes
 * ch = 128 and our small models use other widths.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lg_internal.h"

#define LG_GN_GROUPS 32
#define LG_GN_EPS 1e-6f /* vq_model.py Normalize (the GPT's RMSNorm uses 1e-5) */

static int lg__find(vspec_model *m, vspec_tensor_file *f, const char *name, vspec_tensor *t) {
  memset(t, 0, sizeof *t);
  t->struct_size = sizeof *t;
  return m->host->tensors_find(f, name, t);
}

static int lg__has(vspec_model *m, vspec_tensor_file *f, const char *name) {
  vspec_tensor t;
  return lg__find(m, f, name, &t) == 0;
}

static int lg__conv(vspec_model *m, vspec_tensor_file *f, const char *prefix, lg_conv *c,
                    char *err, size_t errlen) {
  char key[160];
  vspec_tensor t;
  snprintf(key, sizeof key, "%s.weight", prefix);
  int rc = lg__find(m, f, key, &t);
  if (rc || t.ndim != 4 || t.shape[2] != t.shape[3]) {
    snprintf(err, errlen, "VQ tensor '%s' %s", key,
             rc ? "not found" : "must be a square conv kernel [cout, cin, k, k]");
    return rc ? rc : VSPEC_ESHAPE;
  }
  c->cout = (int)t.shape[0];
  c->cin = (int)t.shape[1];
  c->k = (int)t.shape[2];
  int64_t ws[] = {c->cout, c->cin, c->k, c->k}, bs[] = {c->cout};
  if ((rc = m->host->tensors_get_f32(f, m->load_dev, key, 4, ws, &c->w, err, errlen))) return rc;
  snprintf(key, sizeof key, "%s.bias", prefix);
  return m->host->tensors_get_f32(f, m->load_dev, key, 1, bs, &c->b, err, errlen);
}

static int lg__gn(vspec_model *m, vspec_tensor_file *f, const char *prefix, int channels,
                  lg_norm *n, char *err, size_t errlen) {
  char key[160];
  int64_t s[] = {channels};
  if (channels % LG_GN_GROUPS) {
    snprintf(err, errlen, "VQ GroupNorm '%s' has %d channels, not divisible by %d groups", prefix,
             channels, LG_GN_GROUPS);
    return VSPEC_ESHAPE;
  }
  n->c = channels;
  snprintf(key, sizeof key, "%s.weight", prefix);
  int rc = m->host->tensors_get_f32(f, m->load_dev, key, 1, s, &n->g, err, errlen);
  if (rc) return rc;
  snprintf(key, sizeof key, "%s.bias", prefix);
  return m->host->tensors_get_f32(f, m->load_dev, key, 1, s, &n->b, err, errlen);
}

static int lg__res(vspec_model *m, vspec_tensor_file *f, const char *prefix, lg_res *r, char *err,
                   size_t errlen) {
  char key[160];
  int rc;
  snprintf(key, sizeof key, "%s.conv1", prefix);
  if ((rc = lg__conv(m, f, key, &r->conv1, err, errlen))) return rc;
  snprintf(key, sizeof key, "%s.conv2", prefix);
  if ((rc = lg__conv(m, f, key, &r->conv2, err, errlen))) return rc;
  snprintf(key, sizeof key, "%s.norm1", prefix);
  if ((rc = lg__gn(m, f, key, r->conv1.cin, &r->norm1, err, errlen))) return rc;
  snprintf(key, sizeof key, "%s.norm2", prefix);
  if ((rc = lg__gn(m, f, key, r->conv1.cout, &r->norm2, err, errlen))) return rc;
  memset(&r->nin, 0, sizeof r->nin);
  if (r->conv1.cin != r->conv1.cout) {
    /* A channel change goes through the 1x1 nin_shortcut (ResnetBlock; the 3x3
     * conv_shortcut variant is never used). */
    snprintf(key, sizeof key, "%s.nin_shortcut", prefix);
    if ((rc = lg__conv(m, f, key, &r->nin, err, errlen))) return rc;
  }
  if (r->conv2.cin != r->conv1.cout || r->conv2.cout != r->conv1.cout) {
    snprintf(err, errlen, "VQ res block '%s': conv1/conv2 channel counts disagree", prefix);
    return VSPEC_ESHAPE;
  }
  return VSPEC_OK;
}

static int lg__attn(vspec_model *m, vspec_tensor_file *f, const char *prefix, lg_attn *a,
                    char *err, size_t errlen) {
  char key[160];
  int rc;
  const char *names[] = {"q", "k", "v", "proj_out"};
  lg_conv *convs[] = {&a->q, &a->k, &a->v, &a->proj};
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "%s.%s", prefix, names[i]);
    if ((rc = lg__conv(m, f, key, convs[i], err, errlen))) return rc;
  }
  snprintf(key, sizeof key, "%s.norm", prefix);
  return lg__gn(m, f, key, a->q.cin, &a->norm, err, errlen);
}

int lg_vq_load(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_vq *q = &m->vq;
  const vspec_host *H = m->host;
  vspec_tensor t;
  int rc;
  memset(q, 0, sizeof *q);
  if ((rc = lg__find(m, f, "quantize.embedding.weight", &t)) || t.ndim != 2) {
    snprintf(err, errlen, "VQ weights need 'quantize.embedding.weight' [codebook_size, dim]");
    return rc ? rc : VSPEC_ESHAPE;
  }
  q->codebook_size = (int)t.shape[0];
  q->embed_dim = (int)t.shape[1];
  const float *cb;
  int64_t cs[] = {q->codebook_size, q->embed_dim};
  if ((rc = H->tensors_get_f32(f, m->load_dev, "quantize.embedding.weight", 2, cs, &cb, err,
                               errlen)))
    return rc;
  size_t cb_bytes = (size_t)q->codebook_size * q->embed_dim * sizeof(float);
  q->codebook_raw = H->alloc(cb_bytes);
  if (!q->codebook_raw) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  H->dev_ops(m->load_dev)->download(m->load_dev, q->codebook_raw, cb, cb_bytes);

  if ((rc = lg__conv(m, f, "post_quant_conv", &q->post_quant, err, errlen))) return rc;
  if ((rc = lg__conv(m, f, "decoder.conv_in", &q->conv_in, err, errlen))) return rc;
  if (q->post_quant.cin != q->embed_dim || q->conv_in.cin != q->post_quant.cout) {
    snprintf(err, errlen, "VQ: post_quant_conv/conv_in channels do not chain from the codebook "
             "dimension %d", q->embed_dim);
    return VSPEC_ESHAPE;
  }
  if ((rc = lg__res(m, f, "decoder.mid.0", &q->mid_res[0], err, errlen))) return rc;
  if ((rc = lg__attn(m, f, "decoder.mid.1", &q->mid_attn, err, errlen))) return rc;
  if ((rc = lg__res(m, f, "decoder.mid.2", &q->mid_res[1], err, errlen))) return rc;

  int channels = q->mid_res[1].conv1.cout;
  q->max_channels = q->conv_in.cout > channels ? q->conv_in.cout : channels;
  char key[160];
  for (q->n_stages = 0; q->n_stages < LG_MAX_STAGES; q->n_stages++) {
    int s = q->n_stages;
    snprintf(key, sizeof key, "decoder.conv_blocks.%d.res.0.conv1.weight", s);
    if (!lg__has(m, f, key)) break;
    lg_stage *st = &q->stages[s];
    for (st->n_res = 0; st->n_res < LG_MAX_RES; st->n_res++) {
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.res.%d.conv1.weight", s, st->n_res);
      if (!lg__has(m, f, key)) break;
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.res.%d", s, st->n_res);
      if ((rc = lg__res(m, f, key, &st->res[st->n_res], err, errlen))) return rc;
      if (st->res[st->n_res].conv1.cin != channels) {
        snprintf(err, errlen, "VQ: '%s' expects %d input channels, the previous layer gives %d",
                 key, st->res[st->n_res].conv1.cin, channels);
        return VSPEC_ESHAPE;
      }
      channels = st->res[st->n_res].conv1.cout;
      if (channels > q->max_channels) q->max_channels = channels;
    }
    for (st->n_attn = 0; st->n_attn < st->n_res; st->n_attn++) {
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.attn.%d.q.weight", s, st->n_attn);
      if (!lg__has(m, f, key)) break;
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.attn.%d", s, st->n_attn);
      if ((rc = lg__attn(m, f, key, &st->attn[st->n_attn], err, errlen))) return rc;
    }
    if (st->n_attn && st->n_attn != st->n_res) {
      snprintf(err, errlen, "VQ stage %d has %d attention blocks for %d res blocks", s, st->n_attn,
               st->n_res);
      return VSPEC_ESHAPE;
    }
    snprintf(key, sizeof key, "decoder.conv_blocks.%d.upsample.conv.weight", s);
    st->has_upsample = lg__has(m, f, key);
    if (st->has_upsample) {
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.upsample.conv", s);
      if ((rc = lg__conv(m, f, key, &st->upsample, err, errlen))) return rc;
    }
  }
  if (q->n_stages == 0) {
    snprintf(err, errlen, "VQ weights have no 'decoder.conv_blocks.0.res.0'");
    return VSPEC_ENOENT;
  }
  if ((rc = lg__gn(m, f, "decoder.norm_out", channels, &q->norm_out, err, errlen))) return rc;
  if ((rc = lg__conv(m, f, "decoder.conv_out", &q->conv_out, err, errlen))) return rc;
  if (q->conv_out.cout != 3 || q->conv_out.cin != channels) {
    snprintf(err, errlen, "VQ conv_out must map %d channels to 3 (RGB)", channels);
    return VSPEC_ESHAPE;
  }
  const char *l2 = H->tensors_meta(f, "codebook_l2_norm");
  /* LlamaGen's released tokenizers normalise codebook rows at lookup
   * (VectorQuantizer.get_codebook_entry); the stored rows need not be unit length. */
  int normalise = !l2 || strcmp(l2, "false") != 0;
  q->codebook_norm = H->alloc(cb_bytes);
  if (!q->codebook_norm) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  for (int v = 0; v < q->codebook_size; v++) {
    const float *src = q->codebook_raw + (size_t)v * q->embed_dim;
    float *dst = q->codebook_norm + (size_t)v * q->embed_dim;
    double ss = 0;
    for (int c = 0; c < q->embed_dim; c++) ss += (double)src[c] * src[c];
    /* F.normalize: x / max(||x||, 1e-12). */
    double nrm = sqrt(ss);
    float inv = normalise ? (float)(1.0 / (nrm > 1e-12 ? nrm : 1e-12)) : 1.0f;
    for (int c = 0; c < q->embed_dim; c++) dst[c] = src[c] * inv;
  }
  return VSPEC_OK;
}

void lg_vq_unload(vspec_model *m) {
  m->host->free(m->vq.codebook_raw);
  m->host->free(m->vq.codebook_norm);
  m->vq.codebook_raw = m->vq.codebook_norm = NULL;
}

/* Work buffers of one decode. */
typedef struct lg__bufs {
  float *a, *t1, *t2, *t3, *q, *k, *v, *s;
} lg__bufs;

static void lg__conv_run(vspec_model *m, vspec_dev *dev, const lg_conv *c, const float *x, int h,
                         int w, float *y) {
  int pad = c->k / 2;
  m->host->dev_ops(dev)->conv2d(dev, x, c->cin, h, w, c->w, c->b, c->cout, c->k, c->k, 1, pad,
                                pad, pad, pad, y);
}

/* x (in b->a, cin channels) -> ResnetBlock -> b->a (cout channels). */
static void lg__res_run(vspec_model *m, vspec_dev *dev, const lg_res *r, lg__bufs *b, int h,
                        int w) {
  const vspec_ops *ops = m->host->dev_ops(dev);
  size_t hw = (size_t)h * w;
  ops->groupnorm(dev, b->a, r->conv1.cin, (int)hw, LG_GN_GROUPS, LG_GN_EPS, r->norm1.g, r->norm1.b,
                 b->t1);
  ops->silu(dev, b->t1, (size_t)r->conv1.cin * hw);
  lg__conv_run(m, dev, &r->conv1, b->t1, h, w, b->t2);
  ops->groupnorm(dev, b->t2, r->conv1.cout, (int)hw, LG_GN_GROUPS, LG_GN_EPS, r->norm2.g,
                 r->norm2.b, b->t1);
  ops->silu(dev, b->t1, (size_t)r->conv1.cout * hw);
  lg__conv_run(m, dev, &r->conv2, b->t1, h, w, b->t2);
  if (r->nin.w) {
    lg__conv_run(m, dev, &r->nin, b->a, h, w, b->t1);
    ops->add(dev, b->t1, b->t2, (size_t)r->conv1.cout * hw);
    ops->copy(dev, b->a, b->t1, (size_t)r->conv1.cout * hw * sizeof(float));
  } else {
    ops->add(dev, b->a, b->t2, (size_t)r->conv1.cout * hw);
  }
}

/* Single-head attention over all h*w positions (vq_model.py AttnBlock, scale 1/sqrt(C)). */
static void lg__attn_run(vspec_model *m, vspec_dev *dev, const lg_attn *a, lg__bufs *b, int h,
                         int w) {
  const vspec_ops *ops = m->host->dev_ops(dev);
  int C = a->q.cin, n = h * w;
  ops->groupnorm(dev, b->a, C, n, LG_GN_GROUPS, LG_GN_EPS, a->norm.g, a->norm.b, b->t1);
  lg__conv_run(m, dev, &a->q, b->t1, h, w, b->q);
  lg__conv_run(m, dev, &a->k, b->t1, h, w, b->k);
  lg__conv_run(m, dev, &a->v, b->t1, h, w, b->v);
  /* s[i][j] = sum_c q[c][i] k[c][j] / sqrt(C); softmax over j. */
  ops->gemm(dev, 1, 0, n, n, C, 1.0f / sqrtf((float)C), b->q, n, b->k, n, 0.0f, b->s, n);
  ops->softmax(dev, b->s, n, n);
  /* o[c][i] = sum_j v[c][j] s[i][j] */
  ops->gemm(dev, 0, 1, C, n, n, 1.0f, b->v, n, b->s, n, 0.0f, b->t2, n);
  lg__conv_run(m, dev, &a->proj, b->t2, h, w, b->t1);
  ops->add(dev, b->a, b->t1, (size_t)C * n);
}

int lg_vq_decode_raw(vspec_model *m, vspec_dev *dev, const int32_t *tokens, float *out_host,
                     char *err, size_t errlen) {
  lg_vq *q = &m->vq;
  const vspec_host *H = m->host;
  const vspec_ops *ops = H->dev_ops(dev);
  if (!m->has_vq) {
    snprintf(err, errlen, "this llamagen model has no VQ decoder loaded");
    return VSPEC_ENOTSUP;
  }
  if (H->dev_space(dev) != H->dev_space(m->load_dev)) {
    snprintf(err, errlen, "the VQ decoder was loaded on %s device memory and cannot decode on "
             "%s", H->dev_ops(m->load_dev)->name, H->dev_ops(dev)->name);
    return VSPEC_EINVAL;
  }
  int G = m->gpt.grid;
  for (int i = 0; i < G * G; i++)
    if (tokens[i] < 0 || tokens[i] >= q->codebook_size) {
      snprintf(err, errlen, "token %d at position %d is outside the codebook 0..%d", tokens[i], i,
               q->codebook_size - 1);
      return VSPEC_ERANGE;
    }
  int ups = 0;
  for (int s = 0; s < q->n_stages; s++) ups += q->stages[s].has_upsample;
  int out_side = G << ups;
  size_t big = (size_t)q->max_channels * out_side * out_side;
  if (big < (size_t)q->post_quant.cout * G * G) big = (size_t)q->post_quant.cout * G * G;
  /* Attention runs only at the grid resolution (stage 0 and mid). */
  size_t att_n = (size_t)G * G;
  lg__bufs b = {0};
  float **all[] = {&b.a, &b.t1, &b.t2, &b.t3, &b.q, &b.k, &b.v};
  int rc = VSPEC_OK;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!(*all[i] = ops->alloc(dev, big * sizeof(float)))) rc = VSPEC_ENOMEM;
  if (!(b.s = ops->alloc(dev, att_n * att_n * sizeof(float)))) rc = VSPEC_ENOMEM;
  float *z = H->alloc((size_t)q->embed_dim * G * G * sizeof(float));
  if (!z) rc = VSPEC_ENOMEM;
  if (rc) {
    snprintf(err, errlen, "out of memory for VQ decoding (%zu MiB)", 7 * big * 4 >> 20);
    goto done;
  }
  /* z[c, r, col] = normalised codebook row of token r*G + col (raster order). */
  for (int i = 0; i < G * G; i++)
    for (int c = 0; c < q->embed_dim; c++)
      z[(size_t)c * G * G + i] = q->codebook_norm[(size_t)tokens[i] * q->embed_dim + c];
  ops->upload(dev, b.t3, z, (size_t)q->embed_dim * G * G * sizeof(float));
  int h = G, w = G;
  lg__conv_run(m, dev, &q->post_quant, b.t3, h, w, b.t1);
  lg__conv_run(m, dev, &q->conv_in, b.t1, h, w, b.a);
  lg__res_run(m, dev, &q->mid_res[0], &b, h, w);
  lg__attn_run(m, dev, &q->mid_attn, &b, h, w);
  lg__res_run(m, dev, &q->mid_res[1], &b, h, w);
  int channels = q->mid_res[1].conv1.cout;
  for (int s = 0; s < q->n_stages; s++) {
    const lg_stage *st = &q->stages[s];
    for (int r = 0; r < st->n_res; r++) {
      lg__res_run(m, dev, &st->res[r], &b, h, w);
      channels = st->res[r].conv1.cout;
      if (st->n_attn) lg__attn_run(m, dev, &st->attn[r], &b, h, w);
    }
    if (st->has_upsample) {
      ops->upsample_nearest2x(dev, b.a, channels, h, w, b.t1);
      h *= 2;
      w *= 2;
      lg__conv_run(m, dev, &st->upsample, b.t1, h, w, b.a);
    }
  }
  ops->groupnorm(dev, b.a, channels, h * w, LG_GN_GROUPS, LG_GN_EPS, q->norm_out.g, q->norm_out.b,
                 b.t1);
  ops->silu(dev, b.t1, (size_t)channels * h * w);
  lg__conv_run(m, dev, &q->conv_out, b.t1, h, w, b.t2);
  ops->download(dev, out_host, b.t2, (size_t)3 * h * w * sizeof(float));
done:
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (*all[i]) ops->free(dev, *all[i]);
  if (b.s) ops->free(dev, b.s);
  H->free(z);
  return rc;
}

int lg_vq_decode(vspec_model *m, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb, char *err,
                 size_t errlen) {
  int ups = 0;
  for (int s = 0; s < m->vq.n_stages; s++) ups += m->vq.stages[s].has_upsample;
  int side = m->gpt.grid << ups;
  size_t n = (size_t)side * side;
  float *img = m->host->alloc(3 * n * sizeof(float));
  if (!img) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int rc = lg_vq_decode_raw(m, dev, tokens, img, err, errlen);
  if (rc == 0) {
    /* torchvision save_image(normalize=True, value_range=(-1, 1)): clamp, shift to [0, 1],
     * x*255 + 0.5, clamp, truncate - in float32 like the reference
     * (autoregressive/sample/sample_c2i.py). */
    for (size_t i = 0; i < n; i++)
      for (int c = 0; c < 3; c++) {
        float x = img[(size_t)c * n + i];
        x = x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
        x = (x + 1.0f) / 2.0f;
        x = x * 255.0f + 0.5f;
        x = x < 0.0f ? 0.0f : x > 255.0f ? 255.0f : x;
        rgb[i * 3 + (size_t)c] = (uint8_t)x;
      }
  }
  m->host->free(img);
  return rc;
}
