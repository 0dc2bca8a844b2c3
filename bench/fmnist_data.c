/*
 * bench/fmnist_data.c - IDX reader for Fashion-MNIST (see fmnist_data.h).
 *
 * zlib's gz* interface is used because it reads gzip and plain files alike and streams,
 * so the 47 MB training set never needs a second, compressed copy in memory.
 */
#include "bench/fmnist_data.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/status.h"
#include "vspec/types.h"

/* Far above any real data set, low enough that n * rows * cols cannot overflow. */
#define VS_IDX_MAX_ITEMS 100000000u
#define VS_IDX_MAX_SIDE 65536u
#define VS_IDX_MAX_BYTES ((uint64_t)1 << 34)

/* Reads exactly `len` bytes or explains why not: a clean end of file is truncation, a
 * zlib error is a corrupt (or truncated) compressed stream. `what` names the part being
 * read for the message. */
static int vs_idx_read_exact(gzFile gz, const char *path, void *dst, uint64_t len,
                             const char *what, char *err, size_t errlen) {
  unsigned char *p = dst;
  uint64_t done = 0;
  while (done < len) {
    uint64_t want = len - done;
    unsigned chunk = want > (1u << 30) ? (1u << 30) : (unsigned)want;
    int got = gzread(gz, p + done, chunk);
    if (got < 0 || (got == 0 && !gzeof(gz))) {
      int zerr = 0;
      const char *msg = gzerror(gz, &zerr);
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: truncated or corrupt gzip stream while reading %s (%llu of %llu "
                     "bytes read): %s",
                     path, what, (unsigned long long)done, (unsigned long long)len,
                     msg && *msg ? msg : "read error");
    }
    if (got == 0) {
      /* zlib reports a gzip stream cut short as end of file plus Z_BUF_ERROR */
      int zerr = 0;
      const char *msg = gzerror(gz, &zerr);
      if (zerr != Z_OK)
        return vs_fail(err, errlen, VSPEC_EFORMAT,
                       "%s: truncated or corrupt gzip stream while reading %s "
                       "(%llu of %llu bytes read): %s",
                       path, what, (unsigned long long)done, (unsigned long long)len, msg);
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: truncated: %s needs %llu bytes but the file ends after %llu", path,
                     what, (unsigned long long)len, (unsigned long long)done);
    }
    done += (uint64_t)got;
  }
  return VSPEC_OK;
}

static uint32_t vs_idx_be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* Shared by both readers: magic, `ndim` dimensions, then n items of item_bytes each. */
static int vs_idx_read(const char *path, uint32_t magic, int ndim, int max_n, uint8_t **out,
                       uint32_t *dims, char *err, size_t errlen) {
  *out = NULL;
  errno = 0;
  gzFile gz = gzopen(path, "rb");
  if (!gz)
    return vs_fail(err, errlen, errno == ENOENT ? VSPEC_ENOENT : VSPEC_EIO,
                   "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
  gzbuffer(gz, 1u << 17);
  int rc;
  unsigned char head[4 + 4 * 3];
  /* the magic alone first, so a wrong file type is reported as such even when it is
   * shorter than the expected header */
  rc = vs_idx_read_exact(gz, path, head, 4, "the IDX magic", err, errlen);
  if (rc) goto fail;
  uint32_t got_magic = vs_idx_be32(head);
  if (got_magic != magic) {
    const char *hint = got_magic == VS_IDX_MAGIC_U8_1D   ? " (a label file)"
                       : got_magic == VS_IDX_MAGIC_U8_3D ? " (an image file)"
                                                         : "";
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: bad IDX magic 0x%08x%s, expected 0x%08x (%s)", path, got_magic, hint,
                 magic, ndim == 3 ? "u8 images [n, rows, cols]" : "u8 labels [n]");
    goto fail;
  }
  rc = vs_idx_read_exact(gz, path, head + 4, 4 * (uint64_t)ndim, "the IDX header", err, errlen);
  if (rc) goto fail;
  uint64_t item = 1;
  for (int i = 0; i < ndim; i++) {
    dims[i] = vs_idx_be32(head + 4 + 4 * i);
    uint32_t lim = i == 0 ? VS_IDX_MAX_ITEMS : VS_IDX_MAX_SIDE;
    if (dims[i] == 0 || dims[i] > lim) {
      rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: IDX dimension %d is %u (allowed 1..%u); not a sane data file", path,
                   i, dims[i], lim);
      goto fail;
    }
    if (i > 0) item *= dims[i];
  }
  uint32_t n = dims[0];
  int partial = max_n > 0 && (uint32_t)max_n < n;
  if (partial) n = (uint32_t)max_n;
  uint64_t bytes = (uint64_t)n * item;
  if (bytes > VS_IDX_MAX_BYTES || bytes > SIZE_MAX) {
    rc = vs_fail(err, errlen, VSPEC_ERANGE, "%s: %llu bytes of data is too large", path,
                 (unsigned long long)bytes);
    goto fail;
  }
  *out = malloc(bytes ? (size_t)bytes : 1);
  if (!*out) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory for %llu bytes", path,
                 (unsigned long long)bytes);
    goto fail;
  }
  char what[96];
  snprintf(what, sizeof what, "%u %s", n, ndim == 3 ? "images" : "labels");
  rc = vs_idx_read_exact(gz, path, *out, bytes, what, err, errlen);
  if (rc) goto fail;
  if (!partial) {
    /* Extra bytes mean the header and the data disagree: better to refuse than to guess
     * which of them is wrong. */
    unsigned char extra;
    int got = gzread(gz, &extra, 1);
    if (got != 0) {
      int zerr = 0;
      const char *msg = gzerror(gz, &zerr);
      rc = got > 0 ? vs_fail(err, errlen, VSPEC_EFORMAT,
                             "%s: trailing bytes after the %u items the header declares",
                             path, dims[0])
                   : vs_fail(err, errlen, VSPEC_EFORMAT, "%s: corrupt gzip stream: %s",
                             path, msg);
      goto fail;
    }
    int zerr = 0;
    const char *msg = gzerror(gz, &zerr);
    if (zerr != Z_OK) {
      rc = vs_fail(err, errlen, VSPEC_EFORMAT, "%s: truncated or corrupt gzip stream: %s",
                   path, msg);
      goto fail;
    }
  }
  dims[0] = n;
  if (gzclose_r(gz) != Z_OK) {
    gz = NULL;
    rc = vs_fail(err, errlen, VSPEC_EIO, "%s: error closing the gzip stream", path);
    goto fail;
  }
  return VSPEC_OK;
fail:
  if (gz) gzclose_r(gz);
  free(*out);
  *out = NULL;
  return rc;
}

int vs_idx_read_images(const char *path, int max_n, uint8_t **pixels, int *n, int *rows,
                       int *cols, char *err, size_t errlen) {
  uint32_t dims[3];
  int rc = vs_idx_read(path, VS_IDX_MAGIC_U8_3D, 3, max_n, pixels, dims, err, errlen);
  if (rc) return rc;
  *n = (int)dims[0];
  *rows = (int)dims[1];
  *cols = (int)dims[2];
  return VSPEC_OK;
}

int vs_idx_read_labels(const char *path, int max_n, uint8_t **labels, int *n, char *err,
                       size_t errlen) {
  uint32_t dims[1];
  int rc = vs_idx_read(path, VS_IDX_MAGIC_U8_1D, 1, max_n, labels, dims, err, errlen);
  if (rc) return rc;
  *n = (int)dims[0];
  return VSPEC_OK;
}

int vs_fmnist_load(const char *dir, const char *split, int max_n, vs_fmnist *out, char *err,
                   size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!dir) dir = VS_FMNIST_DIR;
  char ipath[1024], lpath[1024];
  snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split);
  snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split);
  int n = 0, rows = 0, cols = 0, nl = 0;
  int rc = vs_idx_read_images(ipath, max_n, &out->images, &n, &rows, &cols, err, errlen);
  if (rc == VSPEC_ENOENT) {
    size_t used = strlen(err);
    snprintf(err + used, errlen - used,
             " (Fashion-MNIST comes from Debian's dataset-fashion-mnist: make deps)");
  }
  if (rc) return rc;
  if (rows != VS_FMNIST_SIDE || cols != VS_FMNIST_SIDE) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE, "%s: images are %dx%d, Fashion-MNIST is %dx%d",
                 ipath, rows, cols, VS_FMNIST_SIDE, VS_FMNIST_SIDE);
    goto fail;
  }
  rc = vs_idx_read_labels(lpath, max_n, &out->labels, &nl, err, errlen);
  if (rc) goto fail;
  if (nl != n) {
    rc = vs_fail(err, errlen, VSPEC_ESHAPE, "%s holds %d labels but %s holds %d images",
                 lpath, nl, ipath, n);
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    if (out->labels[i] >= VS_FMNIST_CLASSES) {
      rc = vs_fail(err, errlen, VSPEC_EFORMAT, "%s: label %d of item %d is not a class 0..%d",
                   lpath, out->labels[i], i, VS_FMNIST_CLASSES - 1);
      goto fail;
    }
  }
  out->n = n;
  return VSPEC_OK;
fail:
  vs_fmnist_free(out);
  return rc;
}

void vs_fmnist_free(vs_fmnist *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  memset(d, 0, sizeof *d);
}

void vs_fmnist_to_input(const uint8_t *images, int n, float *out) {
  const float bg = vs_fmnist_byte_to_input(0);
  for (int i = 0; i < n; i++) {
    const uint8_t *src = images + (size_t)i * VS_FMNIST_SIDE * VS_FMNIST_SIDE;
    float *dst = out + (size_t)i * VS_CLF_SIDE * VS_CLF_SIDE;
    for (int y = 0; y < VS_CLF_SIDE; y++) {
      int sy = y - VS_FMNIST_PAD;
      for (int x = 0; x < VS_CLF_SIDE; x++) {
        int sx = x - VS_FMNIST_PAD;
        int inside = sy >= 0 && sy < VS_FMNIST_SIDE && sx >= 0 && sx < VS_FMNIST_SIDE;
        dst[y * VS_CLF_SIDE + x] =
            inside ? vs_fmnist_byte_to_input(src[sy * VS_FMNIST_SIDE + sx]) : bg;
      }
    }
  }
}

void vs_fmnist_rgb_to_input(const uint8_t *rgb, int n, float *out) {
  size_t px = (size_t)n * VS_CLF_SIDE * VS_CLF_SIDE;
  for (size_t i = 0; i < px; i++) {
    unsigned sum = (unsigned)rgb[3 * i] + rgb[3 * i + 1] + rgb[3 * i + 2];
    out[i] = vs_fmnist_byte_to_input((uint8_t)((sum + 1) / 3));
  }
}

int vs_fmnist_balanced(const uint8_t *labels, int n_labels, int classes, int n, int32_t *idx) {
  if (n < 0 || n_labels < 0 || classes < 1 || classes > 256) return VSPEC_EINVAL;
  int avail[256] = {0}, quota[256], taken[256] = {0};
  for (int i = 0; i < n_labels; i++)
    if (labels[i] < classes) avail[labels[i]]++;
  int excess = 0;
  for (int c = 0; c < classes; c++) {
    quota[c] = n / classes + (c < n % classes);
    if (quota[c] > avail[c]) {
      excess += quota[c] - avail[c];
      quota[c] = avail[c];
    }
  }
  /* Spread a shortfall one image at a time over the classes with images to spare, so the
   * choice stays as balanced as the data allow. */
  while (excess > 0) {
    int moved = 0;
    for (int c = 0; c < classes && excess > 0; c++)
      if (quota[c] < avail[c]) {
        quota[c]++;
        excess--;
        moved = 1;
      }
    if (!moved) return VSPEC_EINVAL;
  }
  int k = 0;
  for (int i = 0; i < n_labels && k < n; i++) {
    int c = labels[i];
    if (c < classes && taken[c] < quota[c]) {
      taken[c]++;
      idx[k++] = i;
    }
  }
  return VSPEC_OK;
}
