/*
 * daemon/preview_fit.h - the preview colour table from a few decodes and the codebook.
 *
 * The exact table (daemon/preview.h) decodes one grid per code: 1024 decodes (9 s on the
 * CPU) for models/fmnist, hours for a 16384-code VQ. A code's mean colour is close to a
 * smooth function of its codebook row, as the latent-to-RGB projections of ComfyUI's and
 * stable-diffusion.cpp's previews assume: the table here decodes `samples` codes exactly
 * (or, with tiles_per_side > 1, several codes per decode, each on its own block of the
 * grid, a code's colour being its block's mean), fits RGB as a least-squares function of
 * the row (1, the unit row, the raw row and, with `quadratic`, the products of the unit
 * row's components), and applies it to every code. Codes decoded alone keep their exact
 * colour. Measured against the exact table on models/fmnist: docs/DESIGN.md "Model load".
 */
#ifndef VS_PREVIEW_FIT_H
#define VS_PREVIEW_FIT_H

#include "daemon/preview.h"

/* Quadratic features only for codebooks this narrow (LlamaGen's are 8 wide): the products
 * grow as d^2. */
#define VS_PREVIEW_FIT_MAX_QUAD_DIM 32

typedef struct vs_preview_fit_opts {
  int samples;        /* codes decoded (clamped to the vocabulary) */
  int tiles_per_side; /* 1: one code per decode (exact samples); k: k x k codes per decode */
  int quadratic;      /* add the quadratic features */
} vs_preview_fit_opts;

/* Samples of the default fit: models/fmnist's table within |8| of the exact one on average
 * (docs/DESIGN.md "Model load"); a vocabulary this small or smaller gets the exact table. */
#define VS_PREVIEW_FIT_SAMPLES 64

/* The daemon's choice for a model: VS_PREVIEW_FIT_SAMPLES samples, quadratic features, and
 * the decodes limited to those of 64 32 x 32 images (a bigger decoder takes its samples
 * several to a grid). */
void vs_preview_fit_default(const vspec_model_info *info, vs_preview_fit_opts *opts);

/* Fits the table of `target` on `dev`; VSPEC_ENOTSUP when the model exposes no codebook
 * (callers then build the exact table) or has no image decoder. */
int vs_preview_lut_fit(const vs_backend_model *target, vspec_dev *dev,
                       const vs_preview_fit_opts *opts, vs_preview_lut *out, char *err,
                       size_t errlen);

/* Mean and largest absolute difference of two tables' RGB values (over the shorter one). */
void vs_preview_lut_diff(const vs_preview_lut *a, const vs_preview_lut *b, double *mean_abs,
                         int *max_abs);

#endif /* VS_PREVIEW_FIT_H */
