/*
 * core/diffusion.h - the diffusion sampler of MAR's head (LTH14/mar diffusion/
 * gaussian_diffusion.py and respace.py, as DiffLoss builds it): a cosine noise schedule
 * over 1000 steps respaced to K, epsilon prediction, learned-range variance, no clipping.
 *
 * Constants are computed in double and kept as float, as the reference's
 * _extract_into_tensor casts them; the per-step arithmetic is float in the reference's
 * order, so C and PyTorch agree to float precision.
 */
#ifndef VS_DIFFUSION_H
#define VS_DIFFUSION_H

#include <stdint.h>

typedef struct vs_diffusion {
  int base;          /* the training diffusion's steps (1000) */
  int steps;         /* K, the respaced sampler's steps */
  int32_t *timestep; /* [K] original step index of respaced step k (what the net sees) */
  float *sqrt_recip_abar, *sqrt_recipm1_abar, *coef1, *coef2, *log_beta, *post_log_var;
} vs_diffusion;

/* The cosine schedule of `base` steps respaced to `steps` (respace.py's single section).
 * Returns 0 or VSPEC_EINVAL / VSPEC_ENOMEM. */
int vs_diffusion_init(vs_diffusion *d, int base, int steps);
void vs_diffusion_free(vs_diffusion *d);

/* p_mean_variance at respaced step k for one token of c values: from the state x, the
 * network's (guided) noise prediction eps and its variance interpolation v, the mean and
 * log variance of x_{k-1}. clip: clip_denoised, the x0 estimate clamped to [-1, 1] first
 * (pixel-space tokens; MAR's latents are not clamped). */
void vs_diffusion_mean_logvar(const vs_diffusion *d, int k, const float *x, const float *eps,
                              const float *v, int c, int clip, float *mean, float *logvar);

#endif /* VS_DIFFUSION_H */
