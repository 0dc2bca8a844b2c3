/*
 * core/png_write.h - 8-bit RGB PNG encoding with text chunks (libpng).
 *
 * Output bytes depend only on the pixels and the text: no timestamps, a fixed
 * compression level, so the same seed gives a byte-identical file.
 */
#ifndef VS_PNG_WRITE_H
#define VS_PNG_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct vs_png_text {
  const char *key; /* 1-79 Latin-1 characters, e.g. "vspec" */
  const char *text;
} vs_png_text;

/* rgb: [height, width, 3]. Writes to `path` (atomically: a temp file renamed into place). */
int vs_png_write_file(const char *path, const uint8_t *rgb, int width, int height,
                      const vs_png_text *texts, int n_texts, char *err, size_t errlen);
/* The same into a malloc'd buffer (*out, *out_len); the caller frees it. */
int vs_png_encode(const uint8_t *rgb, int width, int height, const vs_png_text *texts,
                  int n_texts, uint8_t **out, size_t *out_len, char *err, size_t errlen);
/* Nearest-neighbour enlargement by an integer factor (for grids people look at). */
int vs_rgb_upscale(const uint8_t *rgb, int width, int height, int factor, uint8_t **out);

#endif /* VS_PNG_WRITE_H */
