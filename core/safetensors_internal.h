/*
 * core/safetensors_internal.h - what the two files of the safetensors reader share (not a
 * public API; the reader is core/safetensors.h): safetensors_header.c parses and validates
 * the header (tensor entries, tiling, config.json and __metadata__), safetensors.c reads
 * files into memory and hands tensors out (lookups, float copies on a device).
 */
#ifndef VS_SAFETENSORS_INTERNAL_H
#define VS_SAFETENSORS_INTERNAL_H

#include <jansson.h>
#include <sys/stat.h>
#include <time.h>

#include "core/safetensors.h"
#include "kernels/vs_kernels.h"

/* A float copy of one tensor on one device, made by vs_st_get_f32. */
typedef struct vs_st_copy {
  struct vs_st_copy *next;
  vspec_dev *dev;
  const vspec_ops *ops; /* remembered so close does not depend on vs_dev_ops */
  float *data;
} vs_st_copy;

typedef struct vs_st_entry {
  char *name;
  uint32_t dtype; /* vspec_dtype */
  uint32_t elem;  /* bytes per element */
  int32_t ndim;
  int64_t shape[VSPEC_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end; /* relative to the data buffer */
  vs_st_copy *copies;
} vs_st_entry;

/* The bytes of one file, read into private anonymous memory (read-only once loaded). Opens
 * of the same unchanged file share them (a target and the EAGLE head that reads its
 * embeddings, the old and new model sets of a backend reload), so no file is held twice.
 * "Unchanged" is the inode's identity, size, mtime and ctime; since timestamps are coarse,
 * only a file whose ctime was already VS_ST_SETTLED_S old when it was read is shared: any
 * later write, even one that restores the mtime (cp -p), moves the ctime past that. */
typedef struct vs_st_bytes {
  struct vs_st_bytes *next; /* in the shared list once fully read */
  int refs;                 /* under vs_st_shared_lock */
  int shared;
  /* identity of the file as read: a file rewritten since gets a new mtime/ctime */
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtim, ctim;
  unsigned char *mem;
  size_t len;
} vs_st_bytes;

struct vspec_tensor_file {
  char *path;
  vs_st_bytes *bytes;
  const unsigned char *data; /* start of the data buffer inside bytes->mem */
  uint64_t data_len;
  vs_st_entry *entries; /* sorted by data offsets */
  size_t n;
  vs_st_entry **by_name; /* sorted by name, for lookups */
  json_t *meta;          /* key -> JSON string: config.json overlaid by __metadata__ */
  int from_memory;       /* opened from a buffer (vs_st_open_memory): no file, no config.json */
};

/* "F32", "BF16", ...: the file's spelling of a dtype. */
const char *vs__st_dtype_name(uint32_t dtype);
/* "[3,4]"; dims < 0 (wildcards in an expected shape) print as "*". */
const char *vs__st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);
/* The JSON header hdr[0..hlen) into f's entries (sorted by offset and by name, checked to
 * tile f->data exactly) and its metadata (config.json next to the file, overlaid by
 * __metadata__). */
int vs__st_parse_header(vspec_tensor_file *f, const char *hdr, size_t hlen, char *err,
                        size_t errlen);

#endif /* VS_SAFETENSORS_INTERNAL_H */
