#include "core/png_read.h"

#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/types.h"

int vs_png_decode_rgb(const void *png, size_t len, uint8_t **rgb, int *width, int *height,
                      char *err, size_t errlen) {
  *rgb = NULL;
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, png, len)) {
    snprintf(err, errlen, "not a readable PNG: %s", img.message);
    return VSPEC_EINVAL;
  }
  if (img.width == 0 || img.height == 0 ||
      (uint64_t)img.width * img.height > VS_PNG_READ_MAX_PIXELS) {
    snprintf(err, errlen, "PNG of %ux%u pixels: outside 1 to %u pixels", img.width,
             img.height, VS_PNG_READ_MAX_PIXELS);
    png_image_free(&img);
    return VSPEC_EINVAL;
  }
  img.format = PNG_FORMAT_RGB;
  uint8_t *buf = malloc(PNG_IMAGE_SIZE(img));
  if (!buf) {
    snprintf(err, errlen, "out of memory for a %ux%u PNG", img.width, img.height);
    png_image_free(&img);
    return VSPEC_ENOMEM;
  }
  if (!png_image_finish_read(&img, NULL, buf, 0, NULL)) {
    snprintf(err, errlen, "corrupt PNG: %s", img.message);
    free(buf);
    png_image_free(&img);
    return VSPEC_EINVAL;
  }
  *rgb = buf;
  *width = (int)img.width;
  *height = (int)img.height;
  return VSPEC_OK;
}
