#include "daemon/preview.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vs_preview_lut_build(const vs_backend_model *t, vspec_dev *dev, vs_preview_lut *out,
                         char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const vspec_model_info *in = &t->info;
  if (in->token_kind == VSPEC_TOKENS_CONTINUOUS) {
    snprintf(err, errlen, "continuous tokens have no codes: no colour table (previews decode "
             "the latents)");
    return VSPEC_ENOTSUP;
  }
  if (!in->image_h || !in->image_w || in->vocab <= 0) {
    snprintf(err, errlen, "the model has no image decoder: no colour table");
    return VSPEC_ENOTSUP;
  }
  int n = in->grid_h * in->grid_w;
  size_t px = (size_t)in->image_h * in->image_w;
  int32_t *grid = malloc((size_t)n * sizeof *grid);
  uint8_t *rgb = malloc(px * 3);
  out->rgb = malloc((size_t)in->vocab * 3);
  if (!grid || !rgb || !out->rgb) {
    free(grid);
    free(rgb);
    free(out->rgb);
    out->rgb = NULL;
    snprintf(err, errlen, "out of memory for the preview colour table");
    return VSPEC_ENOMEM;
  }
  out->vocab = in->vocab;
  int rc = VSPEC_OK;
  for (int c = 0; c < in->vocab && !rc; c++) {
    for (int i = 0; i < n; i++) grid[i] = c;
    char inner[VSPEC_ERRLEN] = "";
    rc = t->vt->decode(t->model, dev, grid, rgb, inner, sizeof inner);
    if (rc) {
      snprintf(err, errlen, "decoding code %d for the colour table: %s", c, inner);
      break;
    }
    for (int ch = 0; ch < 3; ch++) {
      uint64_t s = 0;
      for (size_t p = 0; p < px; p++) s += rgb[p * 3 + (size_t)ch];
      out->rgb[c * 3 + ch] = (uint8_t)((s + px / 2) / px);
    }
  }
  free(grid);
  free(rgb);
  if (rc) {
    vs_preview_lut_free(out);
    return rc;
  }
  vs_preview_lut_set_neutral(out);
  return VSPEC_OK;
}

void vs_preview_lut_set_neutral(vs_preview_lut *l) {
  double mean[3] = {0, 0, 0};
  for (int c = 0; c < l->vocab; c++)
    for (int ch = 0; ch < 3; ch++) mean[ch] += l->rgb[c * 3 + ch];
  for (int ch = 0; ch < 3; ch++) mean[ch] /= l->vocab;
  double best = 1e300;
  for (int c = 0; c < l->vocab; c++) {
    double d = 0;
    for (int ch = 0; ch < 3; ch++) {
      double x = l->rgb[c * 3 + ch] - mean[ch];
      d += x * x;
    }
    if (d < best) {
      best = d;
      l->neutral = c;
    }
  }
}

void vs_preview_lut_free(vs_preview_lut *l) {
  free(l->rgb);
  memset(l, 0, sizeof *l);
}

void vs_preview_render_lut(const vs_preview_lut *l, const vspec_model_info *in,
                           const int32_t *tokens, int n_done, uint8_t *rgb) {
  int H = in->image_h, W = in->image_w, gh = in->grid_h, gw = in->grid_w;
  for (int y = 0; y < H; y++) {
    int r = (int)((int64_t)y * gh / H);
    for (int x = 0; x < W; x++) {
      int c = (int)((int64_t)x * gw / W);
      int i = r * gw + c;
      int code = i < n_done ? tokens[i] : l->neutral;
      if (code < 0 || code >= l->vocab) code = l->neutral;
      uint8_t *p = rgb + ((size_t)y * W + x) * 3;
      p[0] = l->rgb[code * 3];
      p[1] = l->rgb[code * 3 + 1];
      p[2] = l->rgb[code * 3 + 2];
    }
  }
}

int vs_preview_render_decode(const vs_preview_lut *l, const vs_backend_model *t, vspec_dev *dev,
                             const int32_t *tokens, int n_done, int32_t *grid, uint8_t *rgb,
                             char *err, size_t errlen) {
  int n = t->info.grid_h * t->info.grid_w;
  if (n_done > n) n_done = n;
  memcpy(grid, tokens, (size_t)n_done * sizeof *grid);
  for (int i = n_done; i < n; i++) grid[i] = l->neutral;
  return t->vt->decode(t->model, dev, grid, rgb, err, errlen);
}

int vs_preview_render_latents(const vs_models *m, vspec_dev *dev, const float *latents,
                              uint8_t *rgb, char *err, size_t errlen) {
  return vs_models_decode(m, dev, NULL, latents, rgb, err, errlen);
}
