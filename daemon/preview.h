/*
 * daemon/preview.h - progressive previews of a partial token grid, cheapest first.
 *
 *   tokens  the token map itself: progress events carry it; nothing is rendered
 *   lut     each generated code painted with its mean colour, one block of pixels per token;
 *           a code's mean colour is the average pixel of a grid filled with it, decoded:
 *           vs_preview_lut_build decodes every code; the daemon by default fits the table
 *           from a few decodes (daemon/preview_fit.h) and caches it (daemon/preview_cache.h)
 *   decode  the VQ decoder run on the partial grid, every ungenerated position filled with
 *           the model's *neutral code*
 *
 * The neutral code is the code whose mean colour is nearest (squared RGB distance, ties to
 * the lower index) to the mean of all codes' mean colours: it stands for "an average patch",
 * so the ungenerated area looks like a flat, typical background instead of a random texture.
 * The lut preview paints ungenerated cells with the same colour.
 *
 * Continuous-token (MAR) models have no codes and no table: both lut and decode previews
 * decode the partial latent grid, whose ungenerated positions are zeros (mid-grey for a
 * pixel-patch tokenizer). Their positions are revealed in a random order, so the preview fills
 * in scattered cells rather than rows.
 */
#ifndef VS_PREVIEW_H
#define VS_PREVIEW_H

#include <stdint.h>

#include "core/models.h"

typedef struct vs_preview_lut {
  int vocab;
  uint8_t *rgb; /* [vocab, 3] */
  int neutral;  /* the neutral code */
} vs_preview_lut;

/* Builds the table with the target's decoder on `dev` (vocab decodes); VSPEC_ENOTSUP for a
 * model without an image decoder or with continuous tokens. */
int vs_preview_lut_build(const vs_backend_model *target, vspec_dev *dev, vs_preview_lut *out,
                         char *err, size_t errlen);
void vs_preview_lut_free(vs_preview_lut *l);
/* Sets l->neutral from l->rgb (the rule above). */
void vs_preview_lut_set_neutral(vs_preview_lut *l);

/* rgb [image_h, image_w, 3]: token i (i < n_done) paints its grid cell with lut[token]. */
void vs_preview_render_lut(const vs_preview_lut *l, const vspec_model_info *info,
                           const int32_t *tokens, int n_done, uint8_t *rgb);
/* Decodes tokens[0..n_done) + neutral codes; `grid` is caller scratch [grid_h * grid_w]. */
int vs_preview_render_decode(const vs_preview_lut *l, const vs_backend_model *target,
                             vspec_dev *dev, const int32_t *tokens, int n_done, int32_t *grid,
                             uint8_t *rgb, char *err, size_t errlen);
/* Continuous-token models: decodes latents [grid, token_dim] (zeros where not generated). */
int vs_preview_render_latents(const vs_models *models, vspec_dev *dev, const float *latents,
                              uint8_t *rgb, char *err, size_t errlen);

#endif /* VS_PREVIEW_H */
