#include "core/png_write.h"

#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vspec/types.h"

typedef struct vs__membuf {
  uint8_t *data;
  size_t len, cap;
  int failed;
} vs__membuf;

static void pw_png_mem_write(png_structp png, png_bytep data, png_size_t n) {
  vs__membuf *b = png_get_io_ptr(png);
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->data = p;
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, n);
  b->len += n;
}

static void pw_png_flush(png_structp png) { (void)png; }

int vs_png_encode(const uint8_t *rgb, int width, int height, const vs_png_text *texts,
                  int n_texts, uint8_t **out, size_t *out_len, char *err, size_t errlen) {
  if (width <= 0 || height <= 0 || !rgb) {
    snprintf(err, errlen, "PNG: invalid image %dx%d", width, height);
    return VSPEC_EINVAL;
  }
  vs__membuf buf = {0};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  png_text *pt = n_texts > 0 ? calloc((size_t)n_texts, sizeof *pt) : NULL;
  png_bytep *rows = malloc((size_t)height * sizeof *rows);
  if (!png || !info || !rows || (n_texts > 0 && !pt)) {
    png_destroy_write_struct(&png, &info);
    free(pt);
    free(rows);
    snprintf(err, errlen, "PNG: out of memory");
    return VSPEC_ENOMEM;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    free(pt);
    free(rows);
    free(buf.data);
    snprintf(err, errlen, "PNG: libpng failed while encoding");
    return VSPEC_EIO;
  }
  png_set_write_fn(png, &buf, pw_png_mem_write, pw_png_flush);
  png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(png, 6);
  for (int i = 0; i < n_texts; i++) {
    pt[i].compression = PNG_TEXT_COMPRESSION_NONE;
    pt[i].key = (png_charp)texts[i].key;
    pt[i].text = (png_charp)texts[i].text;
  }
  if (n_texts > 0) png_set_text(png, info, pt, n_texts);
  for (int y = 0; y < height; y++) rows[y] = (png_bytep)(rgb + (size_t)y * width * 3);
  png_set_rows(png, info, rows);
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
  png_destroy_write_struct(&png, &info);
  free(pt);
  free(rows);
  if (buf.failed) {
    free(buf.data);
    snprintf(err, errlen, "PNG: out of memory");
    return VSPEC_ENOMEM;
  }
  *out = buf.data;
  *out_len = buf.len;
  return VSPEC_OK;
}

int vs_png_write_file(const char *path, const uint8_t *rgb, int width, int height,
                      const vs_png_text *texts, int n_texts, char *err, size_t errlen) {
  uint8_t *data;
  size_t len;
  int rc = vs_png_encode(rgb, width, height, texts, n_texts, &data, &len, err, errlen);
  if (rc) return rc;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    free(data);
    return VSPEC_EIO;
  }
  size_t w = fwrite(data, 1, len, f);
  int close_rc = fclose(f);
  free(data);
  if (w != len || close_rc != 0 || rename(tmp, path) != 0) {
    snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
    unlink(tmp);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

int vs_rgb_upscale(const uint8_t *rgb, int width, int height, int factor, uint8_t **out) {
  if (factor < 1) return VSPEC_EINVAL;
  size_t W = (size_t)width * factor, Hh = (size_t)height * factor;
  uint8_t *o = malloc(W * Hh * 3);
  if (!o) return VSPEC_ENOMEM;
  for (size_t y = 0; y < Hh; y++)
    for (size_t x = 0; x < W; x++)
      memcpy(o + (y * W + x) * 3, rgb + ((y / factor) * width + x / factor) * 3, 3);
  *out = o;
  return VSPEC_OK;
}
