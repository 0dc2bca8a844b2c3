/*
 * core/png_upscale.c - a PNG enlarged by an integer factor (core/png_upscale.h).
 */
#include "core/png_upscale.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/png_read.h"
#include "core/png_write.h"
#include "vspec/types.h"

int vs_png_upscale(const void *png, size_t len, int factor, uint8_t **out, size_t *out_len,
                   int *w, int *h, char *err, size_t errlen) {
  uint8_t *rgb = NULL, *big = NULL;
  int width, height, rc = vs_png_decode_rgb(png, len, &rgb, &width, &height, err, errlen);
  if (rc) return rc;
  if ((uint64_t)width * height * (uint64_t)factor * factor > VS_PNG_READ_MAX_PIXELS) {
    snprintf(err, errlen, "enlarging %d times would make a %dx%d image: too large", factor,
             width * factor, height * factor);
    free(rgb);
    return VSPEC_EINVAL;
  }
  if (vs_rgb_upscale(rgb, width, height, factor, &big)) {
    snprintf(err, errlen, "out of memory for an image enlarged %d times", factor);
    free(rgb);
    return VSPEC_ENOMEM;
  }
  /* the text chunks the daemon writes, written again */
  char describe[2048], params[2048], inner[256];
  vs_png_text text[3] = {{"Software", "vspecd"}};
  int nt = 1;
  if (vs_png_text_get(png, len, "vspec", describe, sizeof describe, inner, sizeof inner) == 1)
    text[nt++] = (vs_png_text){"vspec", describe};
  if (vs_png_text_get(png, len, "parameters", params, sizeof params, inner, sizeof inner) == 1)
    text[nt++] = (vs_png_text){"parameters", params};
  rc = vs_png_encode(big, width * factor, height * factor, text, nt, out, out_len, err, errlen);
  *w = width * factor;
  *h = height * factor;
  free(rgb);
  free(big);
  return rc;
}
