/*
 * core/disk_cache.h - results worth keeping between runs, stored under a key of the model.
 *
 * Some results take seconds to hours to compute and depend only on a model's files and on
 * where they were computed: the preview colour table (daemon/preview_cache.h), the codebook
 * neighbour table, the tuned draft size. They are stored as files named after a key that
 * hashes the model directory's files (names and contents, in name order), a purpose and a
 * salt (the device, the machine), and read back by the next run on the same files.
 *
 * Where: $VSPEC_CACHE_DIR, else $XDG_CACHE_HOME/vspec, else $HOME/.cache/vspec (made with
 * mode 0700). Writes go to a temporary file renamed into place, so a reader sees a whole
 * file or none. Callers check what they read back (a magic, sizes) and rebuild on any
 * doubt; a cache that cannot be written costs only the next run's time.
 */
#ifndef VS_DISK_CACHE_H
#define VS_DISK_CACHE_H

#include <stddef.h>

#define VS_CACHE_KEY_LEN 64 /* hex characters */

/* The cache directory as above, "" when there is none (no HOME either). */
void vs_cache_dir(char *out, size_t cap);

/* The key of model directory `dir` for `purpose` (e.g. "preview-lut/1") and `salt` (e.g.
 * the device's name; "" for none). Subdirectories of `dir` are not part of the model.
 * Returns 0 or a negative status (an unreadable directory or file). */
int vs_cache_key(const char *dir, const char *purpose, const char *salt,
                 char key[VS_CACHE_KEY_LEN + 1]);

/* Reads `cache_dir`/`name` whole into *buf (malloc'd, free it) when it exists and holds at
 * most `max_len` bytes. Returns 1 when read, 0 when absent, too long or unreadable. */
int vs_cache_read(const char *cache_dir, const char *name, size_t max_len, unsigned char **buf,
                  size_t *len);

/* Writes `cache_dir`/`name` atomically (the directory is made when missing). Returns 0 or a
 * negative status. */
int vs_cache_write(const char *cache_dir, const char *name, const void *buf, size_t len);

#endif /* VS_DISK_CACHE_H */
