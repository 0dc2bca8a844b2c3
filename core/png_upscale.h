/*
 * core/png_upscale.h - the daemon's PNG enlarged by an integer factor, nearest neighbour, its
 * text chunks kept ("vspec" and "parameters", which image browsers read).
 *
 * The daemon makes images at the model's size; a client that wants them larger (`vspec
 * generate --upscale`, an HTTP request whose size is a multiple of the model's) enlarges
 * them on its side, with no protocol change and for any daemon or gateway.
 */
#ifndef VS_PNG_UPSCALE_H
#define VS_PNG_UPSCALE_H

#include <stddef.h>
#include <stdint.h>

/* png[0..len) enlarged `factor` times (>= 2) into a malloc'd *out (*out_len bytes), *w x *h
 * pixels. 0, or VSPEC_EINVAL (not a PNG, too large) / VSPEC_ENOMEM with a message. */
int vs_png_upscale(const void *png, size_t len, int factor, uint8_t **out, size_t *out_len,
                   int *w, int *h, char *err, size_t errlen);

#endif /* VS_PNG_UPSCALE_H */
