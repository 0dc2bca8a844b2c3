/*
 * `mar` backend: loading, model info, sessions, the patch tokenizer's decoder, and the
 * plugin's vtable (plugins/backend/mar/mar.h).
 *
 * Shapes come from the weights wherever the checkpoint holds them (seq_len from
 * diffusion_pos_embed_learned, the buffer from the position tables, widths from the linear
 * layers, depths by counting blocks); only the head counts must come from the metadata
 * (tools/convert_mar.py writes them for the released configs).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mar.h"

int mar_meta_int(vspec_model *m, const char *key, long def, long *out, char *err, size_t errlen) {
  const char *v = m->host->tensors_meta(m->f, key);
  if (!v || !*v) {
    *out = def;
    return VSPEC_OK;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end || errno) {
    snprintf(err, errlen, "MAR metadata '%s' = '%s' is not an integer", key, v);
    return VSPEC_EFORMAT;
  }
  *out = x;
  return VSPEC_OK;
}

static int mar__dims(vspec_model *m, const char *name, vspec_tensor *t) {
  memset(t, 0, sizeof *t);
  t->struct_size = sizeof *t;
  return m->host->tensors_find(m->f, name, t);
}

/* A weight of the given shape (a negative entry matches any size). */
static int mar__get(vspec_model *m, const char *name, int ndim, const int64_t *shape,
                    const float **out, char *err, size_t errlen) {
  return m->host->tensors_get_f32(m->f, m->load_dev, name, ndim, shape, out, err, errlen);
}

#define MAR_GET(ptr, name, ...)                                                        \
  do {                                                                                 \
    int64_t shp_[] = {__VA_ARGS__};                                                    \
    if ((rc = mar__get(m, name, (int)(sizeof shp_ / sizeof shp_[0]), shp_, &(ptr), err, \
                       errlen)))                                                       \
      return rc;                                                                       \
  } while (0)

static int mar_load_block(vspec_model *m, const char *prefix, int i, int d, int f, mar_block *b,
                      char *err, size_t errlen) {
  char k[160];
  int rc;
#define MAR_BLK(field, suffix, ...)                    \
  do {                                                 \
    snprintf(k, sizeof k, "%s.%d.%s", prefix, i, suffix); \
    MAR_GET(b->field, k, __VA_ARGS__);                 \
  } while (0)
  MAR_BLK(norm1_w, "norm1.weight", d);
  MAR_BLK(norm1_b, "norm1.bias", d);
  MAR_BLK(qkv_w, "attn.qkv.weight", 3 * d, d);
  MAR_BLK(qkv_b, "attn.qkv.bias", 3 * d);
  MAR_BLK(proj_w, "attn.proj.weight", d, d);
  MAR_BLK(proj_b, "attn.proj.bias", d);
  MAR_BLK(norm2_w, "norm2.weight", d);
  MAR_BLK(norm2_b, "norm2.bias", d);
  MAR_BLK(fc1_w, "mlp.fc1.weight", f, d);
  MAR_BLK(fc1_b, "mlp.fc1.bias", f);
  MAR_BLK(fc2_w, "mlp.fc2.weight", d, f);
  MAR_BLK(fc2_b, "mlp.fc2.bias", d);
#undef MAR_BLK
  return VSPEC_OK;
}

static int mar__count(vspec_model *m, const char *fmt, int max) {
  int n = 0;
  vspec_tensor t;
  char k[160];
  for (; n < max; n++) {
    snprintf(k, sizeof k, fmt, n);
    if (mar__dims(m, k, &t)) break;
  }
  return n;
}

/* Shapes from the weights and the metadata. */
static int mar__shapes(vspec_model *m, char *err, size_t errlen) {
  vspec_tensor t;
  int rc;
  long v;
  if (mar__dims(m, "diffusion_pos_embed_learned", &t) || t.ndim != 3) {
    snprintf(err, errlen, "MAR weights need 'diffusion_pos_embed_learned' [1, seq_len, dim]");
    return VSPEC_ENOENT;
  }
  m->seq = (int)t.shape[1];
  m->dec_dim = (int)t.shape[2];
  m->grid = (int)lround(sqrt((double)m->seq));
  if (m->grid * m->grid != m->seq) {
    snprintf(err, errlen, "MAR seq_len %d is not a square grid", m->seq);
    return VSPEC_ESHAPE;
  }
  if (mar__dims(m, "z_proj.weight", &t) || t.ndim != 2) {
    snprintf(err, errlen, "MAR weights need 'z_proj.weight' [dim, token_dim]");
    return VSPEC_ENOENT;
  }
  m->enc_dim = (int)t.shape[0];
  m->token_dim = (int)t.shape[1];
  if (mar__dims(m, "encoder_pos_embed_learned", &t) || t.ndim != 3 || t.shape[1] <= m->seq) {
    snprintf(err, errlen, "MAR weights need 'encoder_pos_embed_learned' [1, buffer + %d, %d]",
             m->seq, m->enc_dim);
    return VSPEC_ESHAPE;
  }
  m->buffer = (int)t.shape[1] - m->seq;
  if (mar__dims(m, "class_emb.weight", &t) || t.ndim != 2) {
    snprintf(err, errlen, "MAR weights need 'class_emb.weight' [classes, dim]");
    return VSPEC_ENOENT;
  }
  m->num_classes = (int)t.shape[0];
  if (mar__dims(m, "encoder_blocks.0.mlp.fc1.weight", &t) || t.ndim != 2) {
    snprintf(err, errlen, "MAR weights need 'encoder_blocks.0.mlp.fc1.weight'");
    return VSPEC_ENOENT;
  }
  m->enc_hidden = (int)t.shape[0];
  if (mar__dims(m, "decoder_blocks.0.mlp.fc1.weight", &t) || t.ndim != 2) {
    snprintf(err, errlen, "MAR weights need 'decoder_blocks.0.mlp.fc1.weight'");
    return VSPEC_ENOENT;
  }
  m->dec_hidden = (int)t.shape[0];
  m->enc_depth = mar__count(m, "encoder_blocks.%d.attn.qkv.weight", MAR_MAX_BLOCKS);
  m->dec_depth = mar__count(m, "decoder_blocks.%d.attn.qkv.weight", MAR_MAX_BLOCKS);
  m->head_depth = mar__count(m, "diffloss.net.res_blocks.%d.mlp.0.weight", MAR_MAX_HEAD_BLOCKS);
  if (mar__dims(m, "diffloss.net.input_proj.weight", &t) || t.ndim != 2) {
    snprintf(err, errlen, "MAR weights need 'diffloss.net.input_proj.weight' [width, token_dim]");
    return VSPEC_ENOENT;
  }
  m->head_width = (int)t.shape[0];
  if (!m->enc_depth || !m->dec_depth || !m->head_depth) {
    snprintf(err, errlen, "MAR weights have %d encoder, %d decoder and %d diffusion-head blocks: "
             "each needs at least one", m->enc_depth, m->dec_depth, m->head_depth);
    return VSPEC_ESHAPE;
  }
  /* Head counts are not in the weights. */
  if ((rc = mar_meta_int(m, "encoder_num_heads", -1, &v, err, errlen))) return rc;
  m->enc_heads = (int)v;
  if ((rc = mar_meta_int(m, "decoder_num_heads", m->enc_heads, &v, err, errlen))) return rc;
  m->dec_heads = (int)v;
  if (m->enc_heads <= 0 || m->enc_dim % m->enc_heads || m->dec_heads <= 0 ||
      m->dec_dim % m->dec_heads) {
    snprintf(err, errlen, "MAR metadata 'encoder_num_heads' / 'decoder_num_heads' (%d / %d) "
             "must divide the widths %d / %d (convert with tools/convert_mar.py)",
             m->enc_heads, m->dec_heads, m->enc_dim, m->dec_dim);
    return VSPEC_EINVAL;
  }
  /* MAR trains its head on a 1000-step cosine schedule (diffloss.py create_diffusion); a
   * model trained on another length says so (the CSpD test worlds use 10). */
  if ((rc = mar_meta_int(m, "diffusion_steps", 1000, &v, err, errlen))) return rc;
  m->diffusion_steps = (int)v;
  if ((rc = mar_meta_int(m, "num_sampling_steps", 100, &v, err, errlen))) return rc;
  m->sampling_steps = (int)v;
  if ((rc = mar_meta_int(m, "num_iter", m->seq, &v, err, errlen))) return rc;
  m->num_iter = (int)v;
  if (m->diffusion_steps < 2 || m->diffusion_steps > 100000 || m->sampling_steps < 2 ||
      m->sampling_steps > m->diffusion_steps || m->num_iter < 1 || m->num_iter > m->seq) {
    snprintf(err, errlen, "MAR metadata: diffusion_steps %d (2..100000), num_sampling_steps "
             "%d (2..diffusion_steps) or num_iter %d (1..%d) out of range", m->diffusion_steps,
             m->sampling_steps, m->num_iter, m->seq);
    return VSPEC_ERANGE;
  }
  if ((rc = mar_meta_int(m, "clip_denoised", 0, &v, err, errlen))) return rc;
  m->clip_denoised = v != 0;
  /* The patch tokenizer (models/fmnist-mar): token = a PxP patch of a grey image in [-1,1]. */
  const char *tok = m->host->tensors_meta(m->f, "tokenizer");
  if (tok && strcmp(tok, "patch4") == 0) {
    m->patch = 4;
    m->image_size = m->grid * m->patch;
    if (m->token_dim != m->patch * m->patch) {
      snprintf(err, errlen, "MAR tokenizer patch4 needs 16-d tokens, the weights have %d",
               m->token_dim);
      return VSPEC_ESHAPE;
    }
  }
  return VSPEC_OK;
}

static int mar__weights(vspec_model *m, char *err, size_t errlen) {
  int rc, D = m->enc_dim, Dd = m->dec_dim, C = m->token_dim, S = m->seq, B = m->buffer;
  int W = m->head_width;
  MAR_GET(m->class_emb, "class_emb.weight", m->num_classes, D);
  MAR_GET(m->fake_latent, "fake_latent", 1, D);
  MAR_GET(m->z_proj_w, "z_proj.weight", D, C);
  MAR_GET(m->z_proj_b, "z_proj.bias", D);
  MAR_GET(m->z_ln_w, "z_proj_ln.weight", D);
  MAR_GET(m->z_ln_b, "z_proj_ln.bias", D);
  MAR_GET(m->enc_pos, "encoder_pos_embed_learned", 1, S + B, D);
  MAR_GET(m->enc_norm_w, "encoder_norm.weight", D);
  MAR_GET(m->enc_norm_b, "encoder_norm.bias", D);
  MAR_GET(m->dec_embed_w, "decoder_embed.weight", Dd, D);
  MAR_GET(m->dec_embed_b, "decoder_embed.bias", Dd);
  MAR_GET(m->mask_token, "mask_token", 1, 1, Dd);
  MAR_GET(m->dec_pos, "decoder_pos_embed_learned", 1, S + B, Dd);
  MAR_GET(m->dec_norm_w, "decoder_norm.weight", Dd);
  MAR_GET(m->dec_norm_b, "decoder_norm.bias", Dd);
  MAR_GET(m->diff_pos, "diffusion_pos_embed_learned", 1, S, Dd);
  for (int i = 0; i < m->enc_depth; i++)
    if ((rc = mar_load_block(m, "encoder_blocks", i, D, m->enc_hidden, &m->enc[i], err, errlen)))
      return rc;
  for (int i = 0; i < m->dec_depth; i++)
    if ((rc = mar_load_block(m, "decoder_blocks", i, Dd, m->dec_hidden, &m->dec[i], err, errlen)))
      return rc;
  MAR_GET(m->t_w0, "diffloss.net.time_embed.mlp.0.weight", W, MAR_FREQ_DIM);
  MAR_GET(m->t_b0, "diffloss.net.time_embed.mlp.0.bias", W);
  MAR_GET(m->t_w2, "diffloss.net.time_embed.mlp.2.weight", W, W);
  MAR_GET(m->t_b2, "diffloss.net.time_embed.mlp.2.bias", W);
  MAR_GET(m->cond_w, "diffloss.net.cond_embed.weight", W, Dd);
  MAR_GET(m->cond_b, "diffloss.net.cond_embed.bias", W);
  MAR_GET(m->in_w, "diffloss.net.input_proj.weight", W, C);
  MAR_GET(m->in_b, "diffloss.net.input_proj.bias", W);
  for (int i = 0; i < m->head_depth; i++) {
    mar_head_block *h = &m->head[i];
    char k[160];
#define MAR_HB(field, suffix, ...)                                          \
  do {                                                                      \
    snprintf(k, sizeof k, "diffloss.net.res_blocks.%d.%s", i, suffix);      \
    MAR_GET(h->field, k, __VA_ARGS__);                                      \
  } while (0)
    MAR_HB(ln_w, "in_ln.weight", W);
    MAR_HB(ln_b, "in_ln.bias", W);
    MAR_HB(mlp0_w, "mlp.0.weight", W, W);
    MAR_HB(mlp0_b, "mlp.0.bias", W);
    MAR_HB(mlp2_w, "mlp.2.weight", W, W);
    MAR_HB(mlp2_b, "mlp.2.bias", W);
    MAR_HB(ada_w, "adaLN_modulation.1.weight", 3 * W, W);
    MAR_HB(ada_b, "adaLN_modulation.1.bias", 3 * W);
#undef MAR_HB
  }
  MAR_GET(m->fin_ada_w, "diffloss.net.final_layer.adaLN_modulation.1.weight", 2 * W, W);
  MAR_GET(m->fin_ada_b, "diffloss.net.final_layer.adaLN_modulation.1.bias", 2 * W);
  MAR_GET(m->fin_w, "diffloss.net.final_layer.linear.weight", 2 * C, W);
  MAR_GET(m->fin_b, "diffloss.net.final_layer.linear.bias", 2 * C);
  return VSPEC_OK;
}

static void mar_unload(vspec_model *m) {
  if (!m) return;
  if (m->f) m->host->tensors_close(m->f);
  m->host->free(m);
}

static int mar_load(const vspec_host *H, vspec_dev *dev, const char *path,
                    const vspec_params *params, vspec_model **out, char *err, size_t errlen) {
  static const char *const known[] = {NULL};
  int rc = H->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_model *m = H->calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  m->host = H;
  m->load_dev = dev;
  m->ops = H->dev_ops(dev);
  snprintf(m->arch, sizeof m->arch, "mar");
  if ((rc = H->tensors_open(path, &m->f, err, errlen)) || (rc = mar__shapes(m, err, errlen)) ||
      (rc = mar__weights(m, err, errlen))) {
    mar_unload(m);
    return rc;
  }
  int64_t D = m->enc_dim, Dd = m->dec_dim, W = m->head_width, C = m->token_dim;
  int64_t eblk = 4 * D * D + 2 * D * (int64_t)m->enc_hidden;
  int64_t dblk = 4 * Dd * Dd + 2 * Dd * (int64_t)m->dec_hidden;
  m->params = m->num_classes * D + D + (C + 1) * D + (int64_t)(m->seq + m->buffer) * (D + Dd) +
              m->enc_depth * eblk + m->dec_depth * dblk + D * Dd + Dd + m->seq * Dd +
              W * (MAR_FREQ_DIM + W + Dd + C) + m->head_depth * 5 * W * W + 2 * W * W +
              2 * C * W;
  *out = m;
  return VSPEC_OK;
}

static int mar_info(const vspec_model *m, vspec_model_info *out) {
  vspec_model_info i;
  memset(&i, 0, sizeof i);
  i.token_kind = VSPEC_TOKENS_CONTINUOUS;
  i.grid_h = i.grid_w = m->grid;
  i.vocab = 0;
  i.token_dim = m->token_dim;
  i.feature_dim = m->dec_dim;
  i.n_cond = 0;
  i.num_classes = m->num_classes;
  i.image_h = i.image_w = m->image_size;
  i.max_nodes = m->seq;
  i.codebook = NULL;
  i.arch = m->arch;
  i.params = m->params;
  i.stream_bytes = (int64_t)m->params * (int64_t)sizeof(float);
  i.diffusion_steps = m->diffusion_steps;
  i.sampling_steps = m->sampling_steps;
  i.num_iter = m->num_iter;
  i.clip_denoised = m->clip_denoised;
  size_t n = out->struct_size >= sizeof(uint32_t) && out->struct_size < sizeof i ? out->struct_size
                                                                                  : sizeof i;
  i.struct_size = (uint32_t)n;
  memcpy(out, &i, n);
  return VSPEC_OK;
}

/* ---- sessions --------------------------------------------------------------------------- */

static void mar_session_close(vspec_session *s) {
  if (!s) return;
  float *bufs[] = {s->tok, s->z, s->full, s->enc, s->h, s->qkv, s->kbuf, s->vbuf, s->att, s->ff,
                   s->dec};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) s->ops->free(s->dev, bufs[i]);
  mar_head_free(s);
  s->host->free(s->host_tok);
  s->host->free(s->host_temb);
  s->host->free(s->kept);
  s->host->free(s);
}

static int mar_session_open(vspec_model *m, vspec_dev *dev, const vspec_session_config *cfg,
                            vspec_session **out, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  if (cfg->rows != 1 && cfg->rows != 2) {
    snprintf(err, errlen, "session rows = %d: use 1 (conditional) or 2 (CFG)", cfg->rows);
    return VSPEC_EINVAL;
  }
  if (cfg->class_label < 0 || cfg->class_label >= m->num_classes) {
    snprintf(err, errlen, "class label %d is out of range: this model has classes 0..%d",
             cfg->class_label, m->num_classes - 1);
    return VSPEC_ERANGE;
  }
  if (H->dev_space(dev) != H->dev_space(m->load_dev)) {
    snprintf(err, errlen, "the MAR model was loaded on %s device memory and cannot run a "
             "session on %s", H->dev_ops(m->load_dev)->name, H->dev_ops(dev)->name);
    return VSPEC_EINVAL;
  }
  vspec_session *s = H->calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->m = m;
  s->host = H;
  s->ops = H->dev_ops(dev);
  s->dev = dev;
  s->rows = cfg->rows;
  s->class_label = cfg->class_label;
  const vspec_ops *o = s->ops;
  size_t R = (size_t)s->rows, L = (size_t)(m->seq + m->buffer), f = sizeof(float);
  size_t wide = (size_t)(m->enc_dim > m->dec_dim ? m->enc_dim : m->dec_dim);
  s->tok = o->alloc(dev, (size_t)m->seq * m->token_dim * f);
  s->z = o->alloc(dev, (size_t)m->seq * m->enc_dim * f);
  s->full = o->alloc(dev, R * L * m->enc_dim * f);
  s->enc = o->alloc(dev, R * L * m->enc_dim * f);
  s->h = o->alloc(dev, R * L * wide * f);
  s->qkv = o->alloc(dev, R * L * 3 * wide * f);
  s->kbuf = o->alloc(dev, L * wide * f);
  s->vbuf = o->alloc(dev, L * wide * f);
  s->att = o->alloc(dev, R * L * wide * f);
  size_t hidden = (size_t)(m->enc_hidden > m->dec_hidden ? m->enc_hidden : m->dec_hidden);
  s->ff = o->alloc(dev, R * L * hidden * f);
  s->dec = o->alloc(dev, R * L * m->dec_dim * f);
  s->host_tok = H->alloc((size_t)m->seq * m->token_dim * f);
  s->kept = H->alloc(L * sizeof(int32_t));
  int rc = s->tok && s->z && s->full && s->enc && s->h && s->qkv && s->kbuf && s->vbuf && s->att &&
                   s->ff && s->dec && s->host_tok && s->kept
               ? mar_head_reserve(s, 2 * (int)R * m->seq)
               : VSPEC_ENOMEM;
  if (rc) {
    mar_session_close(s);
    snprintf(err, errlen, "out of memory for a MAR session");
    return VSPEC_ENOMEM;
  }
  *out = s;
  return VSPEC_OK;
}

/* Sessions of a masked model have no prefix to prefill and no tree to forward. */
static int mar_prefill(vspec_session *s, vspec_forward_out *out, char *err, size_t errlen) {
  snprintf(err, errlen, "MAR is a masked model of continuous tokens: it has no prefill (the "
           "engine drives it through condition and denoise)");
  return VSPEC_ENOTSUP;
}

static int mar_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out,
                       char *err, size_t errlen) {
  snprintf(err, errlen, "MAR has no token-tree forward (use condition and denoise)");
  return VSPEC_ENOTSUP;
}

static int mar_commit(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen) {
  snprintf(err, errlen, "MAR has no KV cache to commit");
  return VSPEC_ENOTSUP;
}

static int32_t mar_committed(const vspec_session *s) { return 0; }

static int mar_decode(vspec_model *m, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb,
                      char *err, size_t errlen) {
  snprintf(err, errlen, "MAR tokens are continuous: decode them with decode_latents");
  return VSPEC_ENOTSUP;
}

/* The patch tokenizer's decoder: tokens back into their PxP patches, then LlamaGen's byte
 * rule (clamp to [-1, 1], (x + 1) / 2 * 255 + 0.5, truncate), grey into three channels. */
static int mar_decode_latents(vspec_model *m, vspec_dev *dev, const float *latents, uint8_t *rgb,
                              char *err, size_t errlen) {
  if (!m->patch) {
    snprintf(err, errlen, "this MAR model has no image decoder (a released MAR needs its KL-16 "
             "VAE, which vspec does not run yet; models with tokenizer=patch4 decode)");
    return VSPEC_ENOTSUP;
  }
  int G = m->grid, P = m->patch, side = G * P;
  for (int y = 0; y < side; y++)
    for (int x = 0; x < side; x++) {
      int tok = (y / P) * G + x / P, k = (y % P) * P + x % P;
      float v = latents[(size_t)tok * m->token_dim + k];
      v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
      v = (v + 1.0f) / 2.0f;
      v = v * 255.0f + 0.5f;
      v = v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v;
      uint8_t b = (uint8_t)v;
      uint8_t *px = rgb + ((size_t)y * side + x) * 3;
      px[0] = px[1] = px[2] = b;
    }
  return VSPEC_OK;
}

static const vspec_backend_vtable mar_vtable = {
    .struct_size = sizeof(vspec_backend_vtable),
    .load = mar_load,
    .unload = mar_unload,
    .info = mar_info,
    .session_open = mar_session_open,
    .session_close = mar_session_close,
    .prefill = mar_prefill,
    .forward = mar_forward,
    .commit = mar_commit,
    .committed = mar_committed,
    .decode = mar_decode,
    .condition = mar_condition,
    .denoise = mar_denoise,
    .decode_latents = mar_decode_latents,
};

static const vspec_plugin_desc mar_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_BACKEND, "mar", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "MAR (masked autoregressive model, continuous tokens, diffusion head)",
    .vtable = &mar_vtable,
};

VSPEC_PLUGIN_DEFINE(mar_desc)
