/*
 * daemon/preview_cache.h - the preview colour table kept on disk between starts.
 *
 * Building the exact table decodes one grid per code (daemon/preview.h): hours for a
 * 16384-code VQ; even the fitted one (daemon/preview_fit.h) is most of a load. Its result depends only on the model's files and on
 * the device that decoded (numerics differ between the CPU and a GPU in bf16), so it is
 * stored under a key that hashes both, and read back at the next load of the same files.
 *
 * Where: the cache directory of core/disk_cache.h. A file is `lut-<key>.bin`: "VSLUT1\n", the vocabulary and the neutral code
 * (4 bytes each, little-endian), then vocab x RGB. One that does not read back exactly so is
 * ignored (and rebuilt); a cache that cannot be written costs only the next start's time.
 */
#ifndef VS_PREVIEW_CACHE_H
#define VS_PREVIEW_CACHE_H

#include <stddef.h>

#include "core/disk_cache.h"
#include "daemon/preview.h"

#define VS_LUT_KEY_LEN VS_CACHE_KEY_LEN

/* The key of model directory `dir` decoded on a device described by `device` (its name and
 * precision): a hash of that text and of every file of the directory (names and contents, in
 * name order). Returns 0 or a negative status (an unreadable directory or file). */
int vs_preview_cache_key(const char *dir, const char *device, char key[VS_LUT_KEY_LEN + 1]);

/* 1 when a table for `key` with `vocab` codes was read into *out (free with
 * vs_preview_lut_free), 0 when there is none or it does not read back exactly. */
int vs_preview_cache_load(const char *cache_dir, const char *key, int vocab, vs_preview_lut *out);

/* Writes the table (to a temporary file renamed into place). Returns 0 or a negative
 * status; callers carry on either way. */
int vs_preview_cache_store(const char *cache_dir, const char *key, const vs_preview_lut *lut);

#endif /* VS_PREVIEW_CACHE_H */
