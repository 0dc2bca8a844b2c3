/*
 * The MAE-style encoder/decoder of MAR (LTH14/mar models/mar.py forward_mae_encoder,
 * forward_mae_decoder): the condition vectors the diffusion head samples tokens from.
 *
 * Rows are [conditional ; unconditional] with CFG; buffers are row-major by (row, token).
 * The sequence is `buffer` slots (every one holding the class embedding, or the learned
 * fake latent for the unconditional row) followed by the grid's tokens; unknown tokens are
 * zeros before z_proj, as in the reference. Only buffer slots and known tokens enter the
 * encoder; the decoder sees every slot, with mask_token at the unknown ones.
 */
#include <stdio.h>
#include <string.h>

#include "mar.h"

#define F sizeof(float)

/* One timm ViT block in place on x [rows * n, d] (per-row self-attention over n tokens,
 * no mask). */
static void mar_run_block(vspec_session *s, const mar_block *b, float *x, int n, int d, int heads,
                       int hidden) {
  const vspec_ops *o = s->ops;
  vspec_dev *dev = s->dev;
  int M = s->rows * n, hd = d / heads;
  o->layernorm(dev, x, b->norm1_w, b->norm1_b, M, d, MAR_LN_EPS, s->h);
  o->linear(dev, s->h, M, d, b->qkv_w, 3 * d, b->qkv_b, s->qkv);
  for (int r = 0; r < s->rows; r++) {
    const float *q = s->qkv + (size_t)r * n * 3 * d;
    /* keys and values into the attention op's layout [heads][n][hd] */
    o->copy3d(dev, s->kbuf, (size_t)n * hd * F, (size_t)hd * F, q + d, (size_t)hd * F,
              (size_t)3 * d * F, (size_t)hd * F, heads, n);
    o->copy3d(dev, s->vbuf, (size_t)n * hd * F, (size_t)hd * F, q + 2 * d, (size_t)hd * F,
              (size_t)3 * d * F, (size_t)hd * F, heads, n);
    o->attention(dev, q, n, 3 * d, heads, heads, hd, s->kbuf, s->vbuf, n, n, NULL,
                 s->att + (size_t)r * n * d);
  }
  o->linear(dev, s->att, M, d, b->proj_w, d, b->proj_b, s->h);
  o->add(dev, x, s->h, (size_t)M * d);
  o->layernorm(dev, x, b->norm2_w, b->norm2_b, M, d, MAR_LN_EPS, s->h);
  o->linear(dev, s->h, M, d, b->fc1_w, hidden, b->fc1_b, s->ff);
  o->gelu(dev, s->ff, (size_t)M * hidden);
  o->linear(dev, s->ff, M, hidden, b->fc2_w, d, b->fc2_b, s->h);
  o->add(dev, x, s->h, (size_t)M * d);
}

/* Copies the sequence slots listed in kept[0..n) (ascending) between a full layout
 * [rows, L, d] and a packed one [rows, n, d], one strided copy per run of consecutive
 * slots. to_packed = 0 scatters back. */
static void mar__move_kept(vspec_session *s, const int32_t *kept, int n, int L, int d,
                           float *full, float *packed, int to_packed) {
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && kept[j] == kept[j - 1] + 1) j++;
    size_t fa = (size_t)L * d * F, pa = (size_t)n * d * F, w = (size_t)(j - i) * d * F;
    float *f = full + (size_t)kept[i] * d, *p = packed + (size_t)i * d;
    if (to_packed)
      s->ops->copy3d(s->dev, p, pa, w, f, fa, w, w, s->rows, 1);
    else
      s->ops->copy3d(s->dev, f, fa, w, p, pa, w, w, s->rows, 1);
    i = j;
  }
}

int mar_condition(vspec_session *s, const float *tokens, const uint8_t *known,
                  const int32_t *out_pos, int32_t n_out, float *cond, char *err, size_t errlen) {
  const vspec_model *m = s->m;
  const vspec_ops *o = s->ops;
  vspec_dev *dev = s->dev;
  int S = m->seq, B = m->buffer, L = S + B, C = m->token_dim, D = m->enc_dim, Dd = m->dec_dim;
  if (n_out < 0 || n_out > S) {
    snprintf(err, errlen, "condition: %d output positions for a grid of %d", n_out, S);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < n_out; i++)
    if (out_pos[i] < 0 || out_pos[i] >= S) {
      snprintf(err, errlen, "condition: output position %d is outside the grid 0..%d",
               out_pos[i], S - 1);
      return VSPEC_ERANGE;
    }
  /* z_proj over the grid, unknown tokens as zeros */
  int n_keep = 0;
  for (int b = 0; b < B; b++) s->kept[n_keep++] = b;
  for (int p = 0; p < S; p++) {
    const float *src = tokens + (size_t)p * C;
    float *dst = s->host_tok + (size_t)p * C;
    if (known[p]) {
      memcpy(dst, src, (size_t)C * F);
      s->kept[n_keep++] = B + p;
    } else {
      memset(dst, 0, (size_t)C * F);
    }
  }
  if (o->upload(dev, s->tok, s->host_tok, (size_t)S * C * F)) {
    snprintf(err, errlen, "condition: upload failed");
    return VSPEC_EDEVICE;
  }
  o->linear(dev, s->tok, S, C, m->z_proj_w, D, m->z_proj_b, s->z);
  /* [buffer of class embeddings | z] per row, position embedding, z_proj_ln */
  for (int r = 0; r < s->rows; r++) {
    float *row = s->full + (size_t)r * L * D;
    const float *cls = r == 0 ? m->class_emb + (size_t)s->class_label * D : m->fake_latent;
    o->copy3d(dev, row, (size_t)D * F, (size_t)D * F, cls, 0, (size_t)D * F, (size_t)D * F, B, 1);
    o->copy(dev, row + (size_t)B * D, s->z, (size_t)S * D * F);
    o->add(dev, row, m->enc_pos, (size_t)L * D);
  }
  o->layernorm(dev, s->full, m->z_ln_w, m->z_ln_b, s->rows * L, D, MAR_LN_EPS, s->full);
  /* the encoder on buffer + known tokens */
  mar__move_kept(s, s->kept, n_keep, L, D, s->full, s->enc, 1);
  for (int i = 0; i < m->enc_depth; i++)
    mar_run_block(s, &m->enc[i], s->enc, n_keep, D, m->enc_heads, m->enc_hidden);
  o->layernorm(dev, s->enc, m->enc_norm_w, m->enc_norm_b, s->rows * n_keep, D, MAR_LN_EPS,
               s->enc);
  /* the decoder on every slot: mask_token where the encoder saw nothing */
  o->linear(dev, s->enc, s->rows * n_keep, D, m->dec_embed_w, Dd, m->dec_embed_b, s->h);
  o->copy3d(dev, s->dec, (size_t)Dd * F, (size_t)Dd * F, m->mask_token, 0, (size_t)Dd * F,
            (size_t)Dd * F, s->rows * L, 1);
  mar__move_kept(s, s->kept, n_keep, L, Dd, s->dec, s->h, 0);
  for (int r = 0; r < s->rows; r++)
    o->add(dev, s->dec + (size_t)r * L * Dd, m->dec_pos, (size_t)L * Dd);
  for (int i = 0; i < m->dec_depth; i++)
    mar_run_block(s, &m->dec[i], s->dec, L, Dd, m->dec_heads, m->dec_hidden);
  o->layernorm(dev, s->dec, m->dec_norm_w, m->dec_norm_b, s->rows * L, Dd, MAR_LN_EPS, s->dec);
  /* the requested positions, (position, row) ordered, plus diffusion_pos_embed_learned */
  for (int i = 0; i < n_out; i++) {
    int p = out_pos[i];
    float *dst = s->h + (size_t)i * s->rows * Dd;
    o->copy3d(dev, dst, (size_t)Dd * F, (size_t)Dd * F, s->dec + (size_t)(B + p) * Dd,
              (size_t)L * Dd * F, (size_t)Dd * F, (size_t)Dd * F, s->rows, 1);
    o->copy3d(dev, s->att + (size_t)i * s->rows * Dd, (size_t)Dd * F, (size_t)Dd * F,
              m->diff_pos + (size_t)p * Dd, 0, (size_t)Dd * F, (size_t)Dd * F, s->rows, 1);
  }
  o->add(dev, s->h, s->att, (size_t)n_out * s->rows * Dd);
  if (n_out && o->download(dev, cond, s->h, (size_t)n_out * s->rows * Dd * F)) {
    snprintf(err, errlen, "condition: download failed");
    return VSPEC_EDEVICE;
  }
  return VSPEC_OK;
}
