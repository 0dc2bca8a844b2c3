/*
 * core/safetensors.c - safetensors reader (see safetensors.h): files read into memory, tensors
 * handed out; the header is parsed in safetensors_header.c.
 *
 * Layout and validation rules follow the huggingface/safetensors README ("Format") and its
 * Rust reader (safetensors/src/tensor.rs: SafeTensors::read_metadata, Metadata::validate):
 *
 *   bytes 0..7      N, unsigned 64-bit little-endian
 *   bytes 8..8+N-1  UTF-8 JSON object, may be right-padded with spaces
 *   bytes 8+N..EOF  data buffer; tensors tile it exactly, offsets relative to its start
 *
 * Everything read from the file is untrusted: the header is checked completely at open
 * (sizes, types, overflow, tiling), so nothing after open needs to re-check an offset.
 */
#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/safetensors_internal.h"
#include "core/status.h"
#include "kernels/vs_kernels.h"

/* Zero copy hands out the file's little-endian bytes as host floats. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "core/safetensors.c assumes a little-endian host"
#endif

#define VS_ST_SETTLED_S 2
static pthread_mutex_t vs_st_shared_lock = PTHREAD_MUTEX_INITIALIZER;
static vs_st_bytes *vs_st_shared_list;

/* Half and bfloat16 to float (IEEE 754 binary16; bfloat16 is the top half of a binary32,
 * widened by a 16-bit shift). Kept private so the loader does not depend on the kernels'
 * helpers. */
static inline float vs_st_bits_f32(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline float vs_st_bf16_to_f32(uint16_t h) { return vs_st_bits_f32((uint32_t)h << 16); }

static inline float vs_st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return vs_st_bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
  if (exp != 0) return vs_st_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return vs_st_bits_f32(sign);
  /* subnormal half: a normal float once the leading 1 is shifted into place */
  exp = 113;
  while (!(mant & 0x400u)) {
    mant <<= 1;
    exp--;
  }
  return vs_st_bits_f32(sign | (exp << 23) | ((mant & 0x3ffu) << 13));
}

/* Converts n elements of `src` (little-endian file bytes, any alignment) into dst. */
static void vs_st_convert(const vs_st_entry *e, const unsigned char *src, float *dst) {
  size_t n = (size_t)e->numel;
  switch (e->dtype) {
  case VSPEC_DTYPE_F32:
    memcpy(dst, src, n * sizeof(float));
    break;
  case VSPEC_DTYPE_F16:
    for (size_t i = 0; i < n; i++)
      dst[i] = vs_st_f16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
    break;
  case VSPEC_DTYPE_BF16:
    for (size_t i = 0; i < n; i++)
      dst[i] = vs_st_bf16_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
    break;
  default:
    break; /* excluded by the caller */
  }
}
/* ---- reading a file into private memory ---------------------------------------------- */

static int vs_st_same_file(const vs_st_bytes *b, const struct stat *st) {
  return b->dev == st->st_dev && b->ino == st->st_ino && b->size == st->st_size &&
         b->mtim.tv_sec == st->st_mtim.tv_sec && b->mtim.tv_nsec == st->st_mtim.tv_nsec &&
         b->ctim.tv_sec == st->st_ctim.tv_sec && b->ctim.tv_nsec == st->st_ctim.tv_nsec;
}

/* The bytes of an earlier open of this very file, unchanged since, with a new reference. */
static vs_st_bytes *vs_st_bytes_find(const struct stat *st) {
  pthread_mutex_lock(&vs_st_shared_lock);
  vs_st_bytes *b = vs_st_shared_list;
  while (b && !vs_st_same_file(b, st)) b = b->next;
  if (b) b->refs++;
  pthread_mutex_unlock(&vs_st_shared_lock);
  return b;
}

/* Offers bytes read from `read_start` on to later opens, if the file had settled by then
 * (see vs_st_bytes). */
static void vs_st_bytes_share(vs_st_bytes *b, const struct timespec *read_start) {
  if (b->ctim.tv_sec + VS_ST_SETTLED_S > read_start->tv_sec) return;
  pthread_mutex_lock(&vs_st_shared_lock);
  b->shared = 1;
  b->next = vs_st_shared_list;
  vs_st_shared_list = b;
  pthread_mutex_unlock(&vs_st_shared_lock);
}

static void vs_st_bytes_release(vs_st_bytes *b) {
  if (!b) return;
  pthread_mutex_lock(&vs_st_shared_lock);
  int last = --b->refs == 0;
  if (last && b->shared) {
    vs_st_bytes **pp = &vs_st_shared_list;
    while (*pp != b) pp = &(*pp)->next;
    *pp = b->next;
  }
  pthread_mutex_unlock(&vs_st_shared_lock);
  if (!last) return;
  vs_cpu_memory_release(b->mem, b->len); /* converted copies of lent tensors */
  if (b->mem) munmap(b->mem, b->len);
  free(b);
}

/* Anonymous memory for `len` bytes: committed page by page as the reads fill it, and
 * page-aligned like a mapping, so zero-copy alignment is what the file gives. */
static int vs_st_bytes_alloc(vspec_tensor_file *f, size_t len, char *err, size_t errlen) {
  vs_st_bytes *b = calloc(1, sizeof *b);
  if (!b) return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", f->path);
  void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    free(b);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: cannot allocate %llu bytes to load it: %s",
                   f->path, (unsigned long long)len, strerror(errno));
  }
#ifdef MADV_HUGEPAGE
  /* Transparent huge pages, asked before the reads fault the pages in: on the CPU, fp32
   * tensors are used in place, and decoding streams them once per token; with 4 KiB pages
   * one thread's stream ran at 20-25 GB/s, with 2 MiB pages at 30-31 GB/s on an AMD EPYC
   * (Zen 4) (docs/BENCHMARKS.md, issue 33 item 4). The reads touch every page anyway, so no
   * more memory is resident; a refusal (THP off) only leaves small pages. */
  (void)madvise(mem, len, MADV_HUGEPAGE);
#endif
  b->refs = 1;
  b->mem = mem;
  b->len = len;
  f->bytes = b;
  return 0;
}

/* The same for the file `st` describes, remembering its identity for sharing. */
static int vs_st_bytes_new(vspec_tensor_file *f, const struct stat *st, char *err, size_t errlen) {
  int rc = vs_st_bytes_alloc(f, (size_t)st->st_size, err, errlen);
  if (rc) return rc;
  vs_st_bytes *b = f->bytes;
  b->dev = st->st_dev;
  b->ino = st->st_ino;
  b->size = st->st_size;
  b->mtim = st->st_mtim;
  b->ctim = st->st_ctim;
  return 0;
}

/* Reads bytes [off, off + n) of the open file into memory. A short read means the file
 * shrank since it was opened: someone is replacing it in place. */
static int vs_st_pread(vspec_tensor_file *f, int fd, uint64_t off, uint64_t n, char *err,
                       size_t errlen) {
  unsigned char *dst = f->bytes->mem + off;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
    ssize_t got = pread(fd, dst, chunk, (off_t)off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return vs_fail(err, errlen, VSPEC_EIO, "%s: read failed at byte %llu: %s", f->path,
                     (unsigned long long)off, strerror(errno));
    if (got == 0)
      return vs_fail(err, errlen, VSPEC_EIO,
                     "%s: file ended at byte %llu while being read: it is being replaced in "
                     "place (write the new file beside it and rename it over the old one)",
                     f->path, (unsigned long long)off);
    dst += got;
    off += (uint64_t)got;
    n -= (uint64_t)got;
  }
  return 0;
}

/* A file written to while it was read may give a mix of old and new bytes: refuse it rather
 * than serve weights nobody wrote. */
static int vs_st_unchanged(const vspec_tensor_file *f, int fd, char *err, size_t errlen) {
  struct stat now;
  if (fstat(fd, &now) != 0)
    return vs_fail(err, errlen, VSPEC_EIO, "%s: cannot stat: %s", f->path, strerror(errno));
  if (!vs_st_same_file(f->bytes, &now))
    return vs_fail(err, errlen, VSPEC_EIO,
                   "%s: file changed while it was being read: it is being replaced in place "
                   "(write the new file beside it and rename it over the old one)", f->path);
  return 0;
}

/* Header length, header and tiling checks; reads the first 8 + N bytes from fd first unless
 * the bytes are already there (fd < 0). Data are not read yet, so a file that is not
 * safetensors costs no more than its header. */
static int vs_st_header(vspec_tensor_file *f, int fd, char *err, size_t errlen) {
  const unsigned char *b = f->bytes->mem;
  uint64_t size = f->bytes->len;
  int rc = fd >= 0 ? vs_st_pread(f, fd, 0, 8, err, errlen) : 0;
  if (rc) return rc;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
  if (hlen > VS_ST_MAX_HEADER)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: header length %llu exceeds the %llu-byte limit", f->path,
                   (unsigned long long)hlen, (unsigned long long)VS_ST_MAX_HEADER);
  if (hlen > size - 8)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: header length %llu runs past the end of the %llu-byte file (truncated?)",
                   f->path, (unsigned long long)hlen, (unsigned long long)size);
  if (fd >= 0 && (rc = vs_st_pread(f, fd, 8, hlen, err, errlen))) return rc;
  f->data = b + 8 + hlen;
  f->data_len = size - 8 - hlen;
  return vs__st_parse_header(f, (const char *)b + 8, (size_t)hlen, err, errlen);
}

/* The whole file goes into private memory, never a mapping of the live file: a model file
 * truncated or rewritten in place (`cp new old`) must neither kill the process with SIGBUS
 * nor change the weights of a loaded model under running jobs (docs/RELIABILITY.md). */
static int vs_st_load(vspec_tensor_file *f, int fd, char *err, size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return vs_fail(err, errlen, VSPEC_EIO, "%s: cannot stat: %s", f->path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return vs_fail(err, errlen, VSPEC_EIO, "%s: not a regular file", f->path);
  if (st.st_size < 8)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: file is %llu bytes, too short for the 8-byte header length", f->path,
                   (unsigned long long)st.st_size);
  if ((uint64_t)st.st_size > SIZE_MAX)
    return vs_fail(err, errlen, VSPEC_EIO, "%s: file too large to load", f->path);
  if ((f->bytes = vs_st_bytes_find(&st))) return vs_st_header(f, -1, err, errlen);
  struct timespec read_start;
  clock_gettime(CLOCK_REALTIME, &read_start);
  int rc = vs_st_bytes_new(f, &st, err, errlen);
  if (rc || (rc = vs_st_header(f, fd, err, errlen))) return rc;
  uint64_t off = (uint64_t)(f->data - f->bytes->mem);
  posix_fadvise(fd, (off_t)off, 0, POSIX_FADV_SEQUENTIAL);
  if ((rc = vs_st_pread(f, fd, off, f->data_len, err, errlen)) ||
      (rc = vs_st_unchanged(f, fd, err, errlen)))
    return rc;
  /* Read-only, as the file mapping this replaces was: a stray write faults at the writer. */
  if (mprotect(f->bytes->mem, f->bytes->len, PROT_READ) != 0)
    return vs_fail(err, errlen, VSPEC_EIO, "%s: mprotect failed: %s", f->path, strerror(errno));
  vs_st_bytes_share(f->bytes, &read_start);
  return 0;
}

/* ---- public entry points ------------------------------------------------------------- */

int vs_st_open(const char *path, vspec_tensor_file **out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!out) return vs_fail(err, errlen, VSPEC_EINVAL, "vs_st_open: out is NULL");
  *out = NULL;
  if (!path) return vs_fail(err, errlen, VSPEC_EINVAL, "vs_st_open: path is NULL");

  vspec_tensor_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path)) || !(f->meta = json_object())) {
    vs_st_close(f);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", path);
  }
  /* O_NONBLOCK: a FIFO named like a model must not hang the open (it is refused as not a
   * regular file); it has no effect on reading a regular file. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    int rc = vs_fail(err, errlen, e == ENOENT ? VSPEC_ENOENT : VSPEC_EIO, "%s: cannot open: %s",
                     path, strerror(e));
    vs_st_close(f);
    return rc;
  }
  int rc = vs_st_load(f, fd, err, errlen);
  close(fd);
  if (rc) {
    vs_st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

/* The buffer is copied into private memory of its own, exactly as a file's bytes are, so
 * everything after the copy is the code path of vs_st_open. */
int vs_st_open_memory(const void *buf, size_t len, const char *name, vspec_tensor_file **out,
                      char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (!out) return vs_fail(err, errlen, VSPEC_EINVAL, "vs_st_open_memory: out is NULL");
  *out = NULL;
  if (!name) name = "(memory)";
  if (!buf && len) return vs_fail(err, errlen, VSPEC_EINVAL, "%s: buffer is NULL", name);
  if (len < 8)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: %zu bytes, too short for the 8-byte header length", name, len);
  vspec_tensor_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(name)) || !(f->meta = json_object())) {
    vs_st_close(f);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", name);
  }
  f->from_memory = 1;
  int rc = vs_st_bytes_alloc(f, len, err, errlen);
  if (!rc) {
    memcpy(f->bytes->mem, buf, len);
    rc = vs_st_header(f, -1, err, errlen);
  }
  if (!rc && mprotect(f->bytes->mem, f->bytes->len, PROT_READ) != 0)
    rc = vs_fail(err, errlen, VSPEC_EIO, "%s: mprotect failed: %s", name, strerror(errno));
  if (rc) {
    vs_st_close(f);
    return rc;
  }
  *out = f;
  return 0;
}

void vs_st_close(vspec_tensor_file *f) {
  if (!f) return;
  for (size_t i = 0; f->entries && i < f->n; i++) {
    vs_st_copy *c = f->entries[i].copies;
    while (c) {
      vs_st_copy *next = c->next;
      c->ops->free(c->dev, c->data);
      free(c);
      c = next;
    }
  }
  if (f->entries) {
    for (size_t i = 0; i < f->n; i++) free(f->entries[i].name);
    free(f->entries);
  }
  free(f->by_name);
  json_decref(f->meta);
  vs_st_bytes_release(f->bytes);
  free(f->path);
  free(f);
}

const char *vs_st_path(const vspec_tensor_file *f) { return f ? f->path : NULL; }

size_t vs_st_count(const vspec_tensor_file *f) { return f ? f->n : 0; }

const char *vs_st_name(const vspec_tensor_file *f, size_t i) {
  return f && i < f->n ? f->entries[i].name : NULL;
}

const char *vs_st_meta(const vspec_tensor_file *f, const char *key) {
  if (!f || !key) return NULL;
  return json_string_value(json_object_get(f->meta, key));
}

static vs_st_entry *vs_st_lookup(const vspec_tensor_file *f, const char *name) {
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(name, f->by_name[mid]->name);
    if (c == 0) return f->by_name[mid];
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

int vs_st_find(const vspec_tensor_file *f, const char *name, vspec_tensor *out) {
  if (!f || !name) return VSPEC_EINVAL;
  const vs_st_entry *e = vs_st_lookup(f, name);
  if (!e) return VSPEC_ENOENT;
  if (out) {
    /* ABI rule for out-structs: the caller sets struct_size, the callee writes no more
     * than that (a caller built against an older header has a smaller struct). */
    vspec_tensor t;
    memset(&t, 0, sizeof t);
    t.name = e->name;
    t.dtype = e->dtype;
    t.ndim = e->ndim;
    memcpy(t.shape, e->shape, sizeof t.shape);
    t.numel = e->numel;
    t.data = f->data + e->begin;
    t.nbytes = (size_t)(e->end - e->begin);
    size_t n = out->struct_size >= sizeof(uint32_t) && out->struct_size < sizeof t
                   ? out->struct_size
                   : sizeof t;
    t.struct_size = (uint32_t)n;
    memcpy(out, &t, n);
  }
  return 0;
}

int vs_st_get_f32(vspec_tensor_file *f, vspec_dev *dev, const char *name, int ndim,
                  const int64_t *shape, const float **out, char *err, size_t errlen) {
  char want[256], have[256];
  if (err && errlen) err[0] = '\0';
  if (!f || !dev || !name || !out || ndim < 0 || ndim > VSPEC_MAX_DIMS || (ndim > 0 && !shape))
    return vs_fail(err, errlen, VSPEC_EINVAL, "%s: vs_st_get_f32: invalid arguments%s%s%s",
                   f ? f->path : "(null file)", name ? " for tensor '" : "", name ? name : "",
                   name ? "'" : "");
  *out = NULL;
  vs_st_entry *e = vs_st_lookup(f, name);
  if (!e) return vs_fail(err, errlen, VSPEC_ENOENT, "%s: tensor '%s' not found", f->path, name);

  int match = e->ndim == ndim;
  for (int i = 0; match && i < ndim; i++)
    if (shape[i] >= 0 && shape[i] != e->shape[i]) match = 0;
  if (!match)
    return vs_fail(err, errlen, VSPEC_ESHAPE, "%s: tensor '%s' has shape %s but %s was expected",
                   f->path, name, vs__st_shape_str(have, sizeof have, e->ndim, e->shape),
                   vs__st_shape_str(want, sizeof want, ndim, shape));
  if (e->dtype != VSPEC_DTYPE_F32 && e->dtype != VSPEC_DTYPE_F16 && e->dtype != VSPEC_DTYPE_BF16)
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", f->path, name,
                   vs__st_dtype_name(e->dtype));

  const vspec_ops *ops = vs_dev_ops(dev);
  if (!ops) return vs_fail(err, errlen, VSPEC_EINVAL, "%s: tensor '%s': device has no ops", f->path, name);
  const unsigned char *src = f->data + e->begin;
  int cpu = ops->device == VSPEC_DEVICE_CPU;
  /* Zero copy is only sound where a plain float load works: the CPU, little-endian F32 at
   * a 4-byte aligned address (the Rust writer aligns every tensor for its dtype; other
   * writers need not). */
  if (e->dtype == VSPEC_DTYPE_F32 && cpu && ((uintptr_t)src % sizeof(float)) == 0) {
    *out = (const float *)(const void *)src;
    vs_cpu_memory_lend(src, (size_t)e->numel * sizeof(float)); /* bf16 may convert it */
    return 0;
  }
  for (vs_st_copy *c = e->copies; c; c = c->next)
    if (c->dev == dev) {
      *out = c->data;
      return 0;
    }

  if (!ops->alloc || !ops->free || !ops->upload)
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "%s: tensor '%s': device '%s' lacks alloc/free/upload", f->path, name,
                   ops->name ? ops->name : "?");
  /* numel * 4 cannot overflow: numel * elem fit in 64 bits with elem >= 2 and the memory
   * holds numel * elem bytes. */
  size_t bytes = (size_t)e->numel * sizeof(float);
  vs_st_copy *c = calloc(1, sizeof *c);
  float *dst = ops->alloc(dev, bytes ? bytes : sizeof(float)); /* alloc(0) may give NULL */
  float *stage = NULL;
  if (!c || !dst) goto nomem;
  if (cpu) {
    vs_st_convert(e, src, dst); /* CPU device memory is host memory (ops.h) */
  } else {
    const void *host = src;
    if (e->dtype != VSPEC_DTYPE_F32) {
      stage = malloc(bytes ? bytes : sizeof(float));
      if (!stage) goto nomem;
      vs_st_convert(e, src, stage);
      host = stage;
    }
    int urc = ops->upload(dev, dst, host, bytes);
    free(stage);
    if (urc != 0) {
      ops->free(dev, dst);
      free(c);
      return vs_fail(err, errlen, urc < 0 ? urc : VSPEC_EDEVICE,
                     "%s: tensor '%s': upload of %zu bytes to device '%s' failed", f->path, name,
                     bytes, ops->name ? ops->name : "?");
    }
  }
  c->dev = dev;
  c->ops = ops;
  c->data = dst;
  c->next = e->copies;
  e->copies = c;
  *out = dst;
  return 0;

nomem:
  if (dst) ops->free(dev, dst);
  free(c);
  free(stage);
  return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: tensor '%s': cannot allocate %zu bytes",
                 f->path, name, bytes);
}
