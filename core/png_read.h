/*
 * core/png_read.h - decoding a PNG in memory to 8-bit RGB (libpng's simplified API).
 *
 * For clients that receive the daemon's PNG and change it (vspec generate --upscale): any
 * colour type or bit depth libpng reads comes out as [height, width, 3] bytes. And for
 * whoever reads what a PNG says about itself: its text chunks (core/png_meta.h).
 */
#ifndef VS_PNG_READ_H
#define VS_PNG_READ_H

#include <stddef.h>
#include <stdint.h>

/* Images larger than this many pixels are refused (a corrupt or hostile header must not
 * make us allocate gigabytes). */
#define VS_PNG_READ_MAX_PIXELS (1u << 26)

/* Decodes png[0..len) into a malloc'd *rgb (the caller frees it), *width, *height. Returns
 * 0, or VSPEC_EINVAL (not a PNG, corrupt, too large) / VSPEC_ENOMEM with a message. */
int vs_png_decode_rgb(const void *png, size_t len, uint8_t **rgb, int *width, int *height,
                      char *err, size_t errlen);

/* The text of png[0..len)'s first text chunk (tEXt, zTXt or iTXt) named `key` into out
 * (cut to cap - 1 bytes). Returns 1 when found, 0 when the PNG has no such chunk, or
 * VSPEC_EINVAL (not a PNG, corrupt) / VSPEC_ENOMEM with a message. */
int vs_png_text_get(const void *png, size_t len, const char *key, char *out, size_t cap,
                    char *err, size_t errlen);

#endif /* VS_PNG_READ_H */
