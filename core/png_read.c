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

/* libpng's reader over a buffer. */
typedef struct vs__png_src {
  const uint8_t *p;
  size_t len, at;
} vs__png_src;

static void pr_png_mem_read(png_structp png, png_bytep out, png_size_t n) {
  vs__png_src *s = png_get_io_ptr(png);
  if (n > s->len - s->at) png_error(png, "truncated PNG");
  memcpy(out, s->p + s->at, n);
  s->at += n;
}

int vs_png_text_get(const void *png, size_t len, const char *key, char *out, size_t cap,
                    char *err, size_t errlen) {
  if (cap) out[0] = '\0';
  if (len < 8 || png_sig_cmp(png, 0, 8)) {
    snprintf(err, errlen, "not a PNG");
    return VSPEC_EINVAL;
  }
  png_structp rd = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = rd ? png_create_info_struct(rd) : NULL;
  png_infop end = rd ? png_create_info_struct(rd) : NULL;
  if (!rd || !info || !end) {
    png_destroy_read_struct(&rd, &info, &end);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  vs__png_src src = {png, len, 0};
  if (setjmp(png_jmpbuf(rd))) {
    png_destroy_read_struct(&rd, &info, &end);
    snprintf(err, errlen, "corrupt PNG");
    return VSPEC_EINVAL;
  }
  png_set_read_fn(rd, &src, pr_png_mem_read);
  png_read_info(rd, info); /* text chunks before the image data: ours are there */
  png_textp texts = NULL;
  int n = png_get_text(rd, info, &texts, NULL), found = 0;
  for (int i = 0; i < n && !found; i++) {
    if (strcmp(texts[i].key, key) != 0) continue;
    snprintf(out, cap, "%s", texts[i].text ? texts[i].text : "");
    found = 1;
  }
  png_destroy_read_struct(&rd, &info, &end);
  return found;
}
