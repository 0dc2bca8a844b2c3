/*
 * MAR's diffusion head, SimpleMLPAdaLN (LTH14/mar models/diffloss.py): one evaluation for
 * a batch of noisy tokens.
 *
 *   y = time_embed(t) + cond_embed(c)            time_embed = Linear -> SiLU -> Linear
 *   h = input_proj(x)
 *   per ResBlock: (shift, scale, gate) = Linear(SiLU(y)) split in three;
 *                 h += gate * mlp(LN(h) * (1 + scale) + shift),  mlp = Linear -> SiLU -> Linear
 *   final: (shift, scale) = Linear(SiLU(y)); out = Linear(LN_no_affine(h) * (1 + scale) + shift)
 *
 * The adaLN projections are computed as separate products over consecutive row blocks of
 * their weight ([3W, W] row-major: shift rows, then scale, then gate), which is the chunk()
 * of the reference without a copy.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mar.h"

#define F sizeof(float)

void mar_timestep_embedding(const int32_t *t, int n, float *out) {
  /* TimestepEmbedder.timestep_embedding in float32: freqs = exp(-ln(10000) * k / half),
   * args = t * freqs, [cos(args), sin(args)] (cos first). */
  int half = MAR_FREQ_DIM / 2;
  const float neg_log = -(float)log(10000.0);
  for (int i = 0; i < n; i++) {
    float *e = out + (size_t)i * MAR_FREQ_DIM;
    for (int k = 0; k < half; k++) {
      float freq = expf(neg_log * (float)k / (float)half);
      float arg = (float)t[i] * freq;
      e[k] = cosf(arg);
      e[half + k] = sinf(arg);
    }
  }
}

void mar_head_free(vspec_session *s) {
  float *bufs[] = {s->hx, s->hc, s->ht, s->hy, s->hsy, s->hh, s->hu, s->hu2, s->hshift,
                   s->hscale, s->hgate, s->hout, s->htemb};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) s->ops->free(s->dev, bufs[i]);
  s->hx = s->hc = s->ht = s->hy = s->hsy = s->hh = s->hu = s->hu2 = NULL;
  s->hshift = s->hscale = s->hgate = s->hout = s->htemb = NULL;
  s->host->free(s->host_temb);
  s->host_temb = NULL;
  s->max_head_rows = 0;
}

int mar_head_reserve(vspec_session *s, int n) {
  if (n <= s->max_head_rows) return VSPEC_OK;
  mar_head_free(s);
  const vspec_model *m = s->m;
  const vspec_ops *o = s->ops;
  size_t N = (size_t)n, W = (size_t)m->head_width, C = (size_t)m->token_dim;
  size_t Dd = (size_t)m->dec_dim;
  s->hx = o->alloc(s->dev, N * C * F);
  s->hc = o->alloc(s->dev, N * (Dd > W ? Dd : W) * F); /* the condition in, then its embedding */
  s->ht = o->alloc(s->dev, N * W * F);
  s->hy = o->alloc(s->dev, N * W * F);
  s->hsy = o->alloc(s->dev, N * W * F);
  s->hh = o->alloc(s->dev, N * W * F);
  s->hu = o->alloc(s->dev, N * W * F);
  s->hu2 = o->alloc(s->dev, N * W * F);
  s->hshift = o->alloc(s->dev, N * W * F);
  s->hscale = o->alloc(s->dev, N * W * F);
  s->hgate = o->alloc(s->dev, N * W * F);
  s->hout = o->alloc(s->dev, N * 2 * C * F);
  s->htemb = o->alloc(s->dev, N * MAR_FREQ_DIM * F);
  s->host_temb = s->host->alloc(N * MAR_FREQ_DIM * F);
  if (!s->hx || !s->hc || !s->ht || !s->hy || !s->hsy || !s->hh || !s->hu || !s->hu2 ||
      !s->hshift || !s->hscale || !s->hgate || !s->hout || !s->htemb || !s->host_temb) {
    mar_head_free(s);
    return VSPEC_ENOMEM;
  }
  s->max_head_rows = n;
  return VSPEC_OK;
}

/* u = u * (1 + scale) + shift, as u + u * scale + shift (hu2 is scratch). */
static void mar__modulate(vspec_session *s, float *u, size_t n) {
  const vspec_ops *o = s->ops;
  o->copy(s->dev, s->hu2, u, n * F);
  o->mul(s->dev, s->hu2, s->hscale, n);
  o->add(s->dev, u, s->hu2, n);
  o->add(s->dev, u, s->hshift, n);
}

int mar_denoise(vspec_session *s, const float *x, const int32_t *timestep, const float *cond,
                int32_t n, float *out, char *err, size_t errlen) {
  const vspec_model *m = s->m;
  const vspec_ops *o = s->ops;
  vspec_dev *dev = s->dev;
  if (n <= 0) return VSPEC_OK;
  if (mar_head_reserve(s, n)) {
    snprintf(err, errlen, "denoise: out of memory for %d rows", n);
    return VSPEC_ENOMEM;
  }
  int W = m->head_width, C = m->token_dim, Dd = m->dec_dim;
  size_t NW = (size_t)n * W, WW = (size_t)W * W;
  for (int i = 0; i < n; i++)
    if (timestep[i] < 0 || timestep[i] >= 1000) {
      snprintf(err, errlen, "denoise: timestep %d is outside 0..999", timestep[i]);
      return VSPEC_ERANGE;
    }
  mar_timestep_embedding(timestep, n, s->host_temb);
  if (o->upload(dev, s->hx, x, (size_t)n * C * F) ||
      o->upload(dev, s->hc, cond, (size_t)n * Dd * F) ||
      o->upload(dev, s->htemb, s->host_temb, (size_t)n * MAR_FREQ_DIM * F)) {
    snprintf(err, errlen, "denoise: upload failed");
    return VSPEC_EDEVICE;
  }
  /* y = time_embed(t) + cond_embed(c); silu(y) feeds every adaLN projection */
  o->linear(dev, s->htemb, n, MAR_FREQ_DIM, m->t_w0, W, m->t_b0, s->ht);
  o->silu(dev, s->ht, NW);
  o->linear(dev, s->ht, n, W, m->t_w2, W, m->t_b2, s->hy);
  o->linear(dev, s->hc, n, Dd, m->cond_w, W, m->cond_b, s->ht);
  o->add(dev, s->hy, s->ht, NW);
  o->copy(dev, s->hsy, s->hy, NW * F);
  o->silu(dev, s->hsy, NW);
  o->linear(dev, s->hx, n, C, m->in_w, W, m->in_b, s->hh);
  for (int b = 0; b < m->head_depth; b++) {
    const mar_head_block *hb = &m->head[b];
    o->linear(dev, s->hsy, n, W, hb->ada_w, W, hb->ada_b, s->hshift);
    o->linear(dev, s->hsy, n, W, hb->ada_w + WW, W, hb->ada_b + W, s->hscale);
    o->linear(dev, s->hsy, n, W, hb->ada_w + 2 * WW, W, hb->ada_b + 2 * W, s->hgate);
    o->layernorm(dev, s->hh, hb->ln_w, hb->ln_b, n, W, MAR_LN_EPS, s->hu);
    mar__modulate(s, s->hu, NW);
    o->linear(dev, s->hu, n, W, hb->mlp0_w, W, hb->mlp0_b, s->hu2);
    o->silu(dev, s->hu2, NW);
    o->linear(dev, s->hu2, n, W, hb->mlp2_w, W, hb->mlp2_b, s->hu);
    o->mul(dev, s->hu, s->hgate, NW);
    o->add(dev, s->hh, s->hu, NW);
  }
  o->linear(dev, s->hsy, n, W, m->fin_ada_w, W, m->fin_ada_b, s->hshift);
  o->linear(dev, s->hsy, n, W, m->fin_ada_w + WW, W, m->fin_ada_b + W, s->hscale);
  o->layernorm(dev, s->hh, NULL, NULL, n, W, MAR_LN_EPS, s->hu);
  mar__modulate(s, s->hu, NW);
  o->linear(dev, s->hu, n, W, m->fin_w, 2 * C, m->fin_b, s->hout);
  if (o->download(dev, out, s->hout, (size_t)n * 2 * C * F)) {
    snprintf(err, errlen, "denoise: download failed");
    return VSPEC_EDEVICE;
  }
  return VSPEC_OK;
}
