/*
 * plugins/backend/mar/mar.h - internal types of the `mar` backend: MAR (LTH14/mar, arXiv
 * 2406.11838), a masked bidirectional transformer over continuous tokens with a small
 * diffusion head per token.
 *
 * The backend provides the two networks (include/vspec/plugin.h, ABI 1.1 continuous
 * entries): `condition` runs the MAE-style encoder/decoder over the token grid
 * (models/mar.py forward_mae_encoder / forward_mae_decoder) and `denoise` one evaluation of
 * the diffusion head (models/diffloss.py SimpleMLPAdaLN). The engine owns the generation
 * order, the mask schedule and the diffusion sampler (core/mar_loop.c, core/diffusion.c).
 * Parameter names are the released checkpoints' (tools/convert_mar.py).
 */
#ifndef MAR_H
#define MAR_H

#include "vspec/plugin.h"

#define MAR_MAX_BLOCKS 64
#define MAR_MAX_HEAD_BLOCKS 32
#define MAR_LN_EPS 1e-6f     /* every LayerNorm of MAR (norm_layer=partial(LayerNorm, 1e-6)) */
#define MAR_FREQ_DIM 256     /* TimestepEmbedder's frequency embedding */

/* A timm ViT block: pre-norm attention and MLP, LayerNorms with affine parameters. */
typedef struct mar_block {
  const float *norm1_w, *norm1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
  const float *norm2_w, *norm2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} mar_block;

typedef struct mar_head_block {
  const float *ln_w, *ln_b, *mlp0_w, *mlp0_b, *mlp2_w, *mlp2_b, *ada_w, *ada_b;
} mar_head_block;

struct vspec_model {
  const vspec_host *host;
  vspec_dev *load_dev;
  const vspec_ops *ops; /* of load_dev */
  vspec_tensor_file *f;
  /* shapes */
  int seq, grid, token_dim, buffer, num_classes;
  int enc_dim, enc_depth, enc_heads, dec_dim, dec_depth, dec_heads;
  int enc_hidden, dec_hidden; /* MLP widths (mlp_ratio x width) */
  int head_width, head_depth;
  int diffusion_steps, sampling_steps, num_iter;
  int patch, image_size; /* the patch tokenizer (tokenizer = patch4); 0 = no decoder */
  int clip_denoised;     /* metadata clip_denoised: the sampler clamps x0 to [-1, 1] */
  int64_t params;
  /* weights (device) */
  const float *class_emb, *fake_latent, *z_proj_w, *z_proj_b, *z_ln_w, *z_ln_b;
  const float *enc_pos, *enc_norm_w, *enc_norm_b;
  const float *dec_embed_w, *dec_embed_b, *mask_token, *dec_pos, *dec_norm_w, *dec_norm_b;
  const float *diff_pos;
  mar_block enc[MAR_MAX_BLOCKS], dec[MAR_MAX_BLOCKS];
  const float *t_w0, *t_b0, *t_w2, *t_b2, *cond_w, *cond_b, *in_w, *in_b;
  mar_head_block head[MAR_MAX_HEAD_BLOCKS];
  const float *fin_ada_w, *fin_ada_b, *fin_w, *fin_b;
  char arch[32];
};

struct vspec_session {
  vspec_model *m;
  const vspec_host *host;
  const vspec_ops *ops;
  vspec_dev *dev;
  int rows;     /* 1, or 2 = [conditional ; unconditional] */
  int32_t class_label;
  int max_head_rows; /* rows one denoise call may take without growing the buffers */
  /* transformer work buffers (device), sized for rows x (buffer + seq) tokens */
  float *tok, *z, *full, *enc, *h, *qkv, *kbuf, *vbuf, *att, *ff, *dec;
  /* diffusion-head work buffers (device), max_head_rows x ... */
  float *hx, *hc, *ht, *hy, *hsy, *hh, *hu, *hu2, *hshift, *hscale, *hgate, *hout, *htemb;
  /* host staging */
  float *host_tok, *host_temb;
  int32_t *kept;  /* host [buffer + seq]: sequence indices the encoder keeps */
};

/* mar.c */
int mar_meta_int(vspec_model *m, const char *key, long def, long *out, char *err, size_t errlen);

/* mar_transformer.c */
int mar_condition(vspec_session *s, const float *tokens, const uint8_t *known,
                  const int32_t *out_pos, int32_t n_out, float *cond, char *err, size_t errlen);

/* mar_head.c */
int mar_denoise(vspec_session *s, const float *x, const int32_t *timestep, const float *cond,
                int32_t n, float *out, char *err, size_t errlen);
/* Host [n, 256] frequency embedding of timesteps (cos first), as TimestepEmbedder computes
 * it in float32. */
void mar_timestep_embedding(const int32_t *t, int n, float *out);
/* (Re)sizes the head's buffers for n rows. */
int mar_head_reserve(vspec_session *s, int n);
void mar_head_free(vspec_session *s);

#endif /* MAR_H */
