#include "core/diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/types.h"

void vs_diffusion_free(vs_diffusion *d) {
  free(d->timestep);
  free(d->sqrt_recip_abar);
  free(d->sqrt_recipm1_abar);
  free(d->coef1);
  free(d->coef2);
  free(d->log_beta);
  free(d->post_log_var);
  memset(d, 0, sizeof *d);
}

/* get_named_beta_schedule("cosine"): alpha_bar(s) = cos^2((s + 0.008) / 1.008 * pi / 2),
 * beta_i = min(1 - alpha_bar((i+1)/n) / alpha_bar(i/n), 0.999). */
static double df_abar(double s) {
  double c = cos((s + 0.008) / 1.008 * M_PI / 2.0);
  return c * c;
}

int vs_diffusion_init(vs_diffusion *d, int base, int steps) {
  memset(d, 0, sizeof *d);
  if (base < 2 || steps < 2 || steps > base) return VSPEC_EINVAL;
  d->base = base;
  d->steps = steps;
  double *abar = malloc((size_t)base * sizeof(double));
  double *beta = malloc((size_t)steps * sizeof(double));
  d->timestep = malloc((size_t)steps * sizeof(int32_t));
  float **arr[] = {&d->sqrt_recip_abar, &d->sqrt_recipm1_abar, &d->coef1, &d->coef2,
                   &d->log_beta, &d->post_log_var};
  int ok = abar && beta && d->timestep;
  for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++)
    ok = (*arr[i] = malloc((size_t)steps * sizeof(float))) && ok;
  if (!ok) {
    free(abar);
    free(beta);
    vs_diffusion_free(d);
    return VSPEC_ENOMEM;
  }
  double cum = 1.0;
  for (int i = 0; i < base; i++) {
    double b = 1.0 - df_abar((double)(i + 1) / base) / df_abar((double)i / base);
    if (b > 0.999) b = 0.999;
    cum *= 1.0 - b;
    abar[i] = cum;
  }
  /* space_timesteps(base, [steps]): stride (base-1)/(steps-1) accumulated, rounded half to
   * even as Python's round() (no exact .5 occurs for the released settings) */
  double stride = (double)(base - 1) / (steps - 1), cur = 0.0;
  for (int k = 0; k < steps; k++) {
    d->timestep[k] = (int32_t)nearbyint(cur);
    cur += stride;
  }
  /* respaced betas: 1 - abar[t_k] / abar[t_{k-1}]; everything else from them */
  double last = 1.0;
  for (int k = 0; k < steps; k++) {
    beta[k] = 1.0 - abar[d->timestep[k]] / last;
    last = abar[d->timestep[k]];
  }
  double ab = 1.0, ab_prev = 1.0, pv1 = 0.0;
  for (int k = 0; k < steps; k++) {
    ab_prev = ab;
    ab *= 1.0 - beta[k];
    double post_var = beta[k] * (1.0 - ab_prev) / (1.0 - ab);
    if (k == 1) pv1 = post_var;
    d->sqrt_recip_abar[k] = (float)sqrt(1.0 / ab);
    d->sqrt_recipm1_abar[k] = (float)sqrt(1.0 / ab - 1.0);
    d->coef1[k] = (float)(beta[k] * sqrt(ab_prev) / (1.0 - ab));
    d->coef2[k] = (float)((1.0 - ab_prev) * sqrt(1.0 - beta[k]) / (1.0 - ab));
    d->log_beta[k] = (float)log(beta[k]);
    d->post_log_var[k] = k == 0 ? 0.0f : (float)log(post_var);
  }
  /* posterior_log_variance_clipped: step 0's variance is 0, so it takes step 1's */
  d->post_log_var[0] = (float)log(pv1);
  free(abar);
  free(beta);
  return VSPEC_OK;
}

void vs_diffusion_mean_logvar(const vs_diffusion *d, int k, const float *x, const float *eps,
                              const float *v, int c, int clip, float *mean, float *logvar) {
  float min_log = d->post_log_var[k], max_log = d->log_beta[k];
  for (int i = 0; i < c; i++) {
    float frac = (v[i] + 1.0f) / 2.0f; /* v is not clamped */
    logvar[i] = frac * max_log + (1.0f - frac) * min_log;
    float x0 = d->sqrt_recip_abar[k] * x[i] - d->sqrt_recipm1_abar[k] * eps[i];
    if (clip) x0 = x0 < -1.0f ? -1.0f : x0 > 1.0f ? 1.0f : x0;
    mean[i] = d->coef1[k] * x0 + d->coef2[k] * x[i];
  }
}
