/*
 * core/safetensors.c - safetensors reader (see safetensors.h).
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

#include "core/status.h"
#include "kernels/vs_kernels.h"

/* Zero copy hands out the file's little-endian bytes as host floats. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "core/safetensors.c assumes a little-endian host"
#endif

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

#define VS_ST_SETTLED_S 2
static pthread_mutex_t vs_st_shared_lock = PTHREAD_MUTEX_INITIALIZER;
static vs_st_bytes *vs_st_shared_list;

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

/* ---- small helpers ------------------------------------------------------------------ */

static const struct {
  const char *name;
  uint32_t dtype;
  uint32_t size;
} vs_st_dtypes[] = {
    {"F32", VSPEC_DTYPE_F32, 4}, {"F16", VSPEC_DTYPE_F16, 2},   {"BF16", VSPEC_DTYPE_BF16, 2},
    {"F64", VSPEC_DTYPE_F64, 8}, {"I64", VSPEC_DTYPE_I64, 8},   {"I32", VSPEC_DTYPE_I32, 4},
    {"I16", VSPEC_DTYPE_I16, 2}, {"I8", VSPEC_DTYPE_I8, 1},     {"U8", VSPEC_DTYPE_U8, 1},
    {"U16", VSPEC_DTYPE_U16, 2}, {"BOOL", VSPEC_DTYPE_BOOL, 1},
};
#define VS_ST_NDTYPES (sizeof vs_st_dtypes / sizeof vs_st_dtypes[0])

static const char *vs_st_dtype_name(uint32_t dtype) {
  for (size_t i = 0; i < VS_ST_NDTYPES; i++)
    if (vs_st_dtypes[i].dtype == dtype) return vs_st_dtypes[i].name;
  return "?";
}

static const char *vs_st_json_type(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "an unknown JSON value";
}

/* "[3,4]"; dims < 0 (wildcards in an expected shape) print as "*". */
static const char *vs_st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
  size_t used = 0;
  buf[0] = '\0';
  used += (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < ndim && used < len; i++) {
    if (shape[i] < 0)
      used += (size_t)snprintf(buf + used, len - used, "%s*", i ? "," : "");
    else
      used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? "," : "",
                               (long long)shape[i]);
  }
  if (used < len) snprintf(buf + used, len - used, "]");
  return buf;
}

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

/* ---- compact JSON text of config.json values ------------------------------------------ */

/* json_dumps prints reals with 17 digits (1e-05 -> 1.0000000000000001e-05); config values
 * are read by people and by strtod alike, so print the shortest text that round-trips. */
typedef struct vs_st_buf {
  char *p;
  size_t len, cap;
  int oom;
} vs_st_buf;

static void vs_st_buf_add(vs_st_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void vs_st_buf_str(vs_st_buf *b, const char *s) { vs_st_buf_add(b, s, strlen(s)); }

static void vs_st_buf_quoted(vs_st_buf *b, const char *s, size_t n) {
  vs_st_buf_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      vs_st_buf_add(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      vs_st_buf_add(b, esc, 6);
    } else {
      vs_st_buf_add(b, (const char *)&s[i], 1);
    }
  }
  vs_st_buf_add(b, "\"", 1);
}

static void vs_st_dump(vs_st_buf *b, json_t *v) {
  char num[40];
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    const char *key;
    json_t *item;
    int first = 1;
    vs_st_buf_add(b, "{", 1);
    json_object_foreach(v, key, item) {
      if (!first) vs_st_buf_add(b, ",", 1);
      first = 0;
      vs_st_buf_quoted(b, key, strlen(key));
      vs_st_buf_add(b, ":", 1);
      vs_st_dump(b, item);
    }
    vs_st_buf_add(b, "}", 1);
    break;
  }
  case JSON_ARRAY: {
    size_t i;
    json_t *item;
    vs_st_buf_add(b, "[", 1);
    json_array_foreach(v, i, item) {
      if (i) vs_st_buf_add(b, ",", 1);
      vs_st_dump(b, item);
    }
    vs_st_buf_add(b, "]", 1);
    break;
  }
  case JSON_STRING:
    vs_st_buf_quoted(b, json_string_value(v), json_string_length(v));
    break;
  case JSON_INTEGER:
    snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    vs_st_buf_str(b, num);
    break;
  case JSON_REAL: {
    double d = json_real_value(v); /* finite: jansson rejects inf/nan */
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(num, sizeof num, "%.*g", prec, d);
      if (strtod(num, NULL) == d) break;
    }
    /* keep it a real to a JSON reader: 1.0 stays "1.0", not "1" */
    if (!strpbrk(num, ".eEn")) strcat(num, ".0");
    vs_st_buf_str(b, num);
    break;
  }
  case JSON_TRUE: vs_st_buf_str(b, "true"); break;
  case JSON_FALSE: vs_st_buf_str(b, "false"); break;
  case JSON_NULL: vs_st_buf_str(b, "null"); break;
  }
}

/* ---- header parsing ------------------------------------------------------------------ */

/* A non-negative JSON integer, or -1 with a description of what was there instead. */
static int vs_st_uint(const json_t *v, uint64_t *out, char *what, size_t whatlen) {
  if (json_is_integer(v) && json_integer_value(v) >= 0) {
    *out = (uint64_t)json_integer_value(v);
    return 0;
  }
  if (json_is_integer(v))
    snprintf(what, whatlen, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
  else
    snprintf(what, whatlen, "%s", vs_st_json_type(v));
  return -1;
}

static int vs_st_parse_entry(const char *path, const char *name, json_t *v, vs_st_entry *e,
                             char *err, size_t errlen) {
  char what[64], sbuf[256];
  if (!json_is_object(v))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': header entry is %s, expected an object", path, name,
                   vs_st_json_type(v));

  json_t *dt = json_object_get(v, "dtype");
  if (!dt || !json_is_string(dt))
    return vs_fail(err, errlen, VSPEC_EFORMAT, "%s: tensor '%s': \"dtype\" is %s, expected a string",
                   path, name, dt ? vs_st_json_type(dt) : "missing");
  const char *dts = json_string_value(dt);
  size_t k = 0;
  while (k < VS_ST_NDTYPES && strcmp(vs_st_dtypes[k].name, dts) != 0) k++;
  if (k == VS_ST_NDTYPES)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': unsupported dtype '%.32s' (supported: F32 F16 BF16 F64 "
                   "I64 I32 I16 I8 U8 U16 BOOL)",
                   path, name, dts);
  e->dtype = vs_st_dtypes[k].dtype;
  e->elem = vs_st_dtypes[k].size;

  json_t *sh = json_object_get(v, "shape");
  if (!sh || !json_is_array(sh))
    return vs_fail(err, errlen, VSPEC_EFORMAT, "%s: tensor '%s': \"shape\" is %s, expected an array",
                   path, name, sh ? vs_st_json_type(sh) : "missing");
  size_t nd = json_array_size(sh);
  if (nd > VSPEC_MAX_DIMS)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': \"shape\" has %zu dims, at most %d are supported", path, name,
                   nd, VSPEC_MAX_DIMS);
  /* Overflow is checked on the element count and the byte count, as the reference reader
   * does (ValidationOverflow); counts must also fit int64_t for vspec_tensor.numel. */
  uint64_t numel = 1;
  int overflow = 0;
  for (size_t i = 0; i < nd; i++) {
    uint64_t d;
    if (vs_st_uint(json_array_get(sh, i), &d, what, sizeof what) != 0)
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: tensor '%s': shape[%zu] is %s, expected a non-negative integer", path,
                     name, i, what);
    e->shape[i] = (int64_t)d;
    if (__builtin_mul_overflow(numel, d, &numel)) overflow = 1;
  }
  e->ndim = (int32_t)nd;
  uint64_t nbytes = 0;
  if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, e->elem, &nbytes))
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': shape %s of %s overflows a 64-bit byte count", path, name,
                   vs_st_shape_str(sbuf, sizeof sbuf, e->ndim, e->shape), dts);
  e->numel = (int64_t)numel;

  json_t *off = json_object_get(v, "data_offsets");
  if (!off || !json_is_array(off) || json_array_size(off) != 2)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': \"data_offsets\" is %s, expected [begin, end]", path, name,
                   !off ? "missing" : json_is_array(off) ? "an array of the wrong length"
                                                            : vs_st_json_type(off));
  for (int i = 0; i < 2; i++) {
    uint64_t x;
    if (vs_st_uint(json_array_get(off, (size_t)i), &x, what, sizeof what) != 0)
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: tensor '%s': data_offsets[%d] is %s, expected a non-negative integer",
                     path, name, i, what);
    if (i == 0) e->begin = x;
    else e->end = x;
  }
  if (e->begin > e->end)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': data_offsets [%llu, %llu) end before they begin", path, name,
                      (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end - e->begin != nbytes)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but shape %s of "
                      "%s needs %llu",
                      path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                      (unsigned long long)(e->end - e->begin),
                      vs_st_shape_str(sbuf, sizeof sbuf, e->ndim, e->shape), dts,
                      (unsigned long long)nbytes);

  e->name = strdup(name);
  if (!e->name) return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", path);
  return 0;
}

static int vs_st_cmp_offsets(const void *pa, const void *pb) {
  const vs_st_entry *a = pa, *b = pb;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return strcmp(a->name, b->name); /* zero-size tensors share offsets: keep order stable */
}

static int vs_st_cmp_names(const void *pa, const void *pb) {
  const vs_st_entry *const *a = pa, *const *b = pb;
  return strcmp((*a)->name, (*b)->name);
}

/* Tensors sorted by offset must cover [0, data_len) exactly: no gap, no overlap, nothing
 * past the end, nothing left over (Metadata::validate + MetadataIncompleteBuffer). */
static int vs_st_check_tiling(const vspec_tensor_file *f, char *err, size_t errlen) {
  uint64_t pos = 0;
  for (size_t i = 0; i < f->n; i++) {
    const vs_st_entry *e = &f->entries[i];
    if (e->begin > pos)
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: gap in the data buffer: bytes [%llu, %llu) belong to no tensor "
                        "(tensor '%s' starts at %llu)",
                        f->path, (unsigned long long)pos, (unsigned long long)e->begin, e->name,
                        (unsigned long long)e->begin);
    if (e->begin < pos)
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s', which "
                        "ends at %llu",
                        f->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        f->entries[i - 1].name, (unsigned long long)pos);
    if (e->end > f->data_len)
      return vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: tensor '%s': data_offsets [%llu, %llu) run past the end of the "
                        "%llu-byte data buffer (file truncated?)",
                        f->path, e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
                        (unsigned long long)f->data_len);
    pos = e->end;
  }
  if (pos != f->data_len)
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: the data buffer holds %llu bytes but the tensors cover only %llu",
                   f->path, (unsigned long long)f->data_len, (unsigned long long)pos);
  return 0;
}

/* Stores `value` under `key` in f->meta as a JSON string (non-strings as compact text). */
static int vs_st_meta_put(vspec_tensor_file *f, const char *key, json_t *value) {
  json_t *s;
  if (json_is_string(value)) {
    s = json_incref(value);
  } else {
    vs_st_buf b = {0};
    vs_st_dump(&b, value);
    s = b.oom ? NULL : json_stringn(b.p, b.len);
    free(b.p);
  }
  if (!s || json_object_set_new(f->meta, key, s) != 0) return VSPEC_ENOMEM;
  return 0;
}

/* config.json beside the file supplies hyper-parameters the header metadata lacks
 * (DESIGN.md, "Models and formats"). Missing is fine; unreadable or malformed is not,
 * because silently ignoring it would load a model with the wrong shape. */
static int vs_st_load_config(vspec_tensor_file *f, char *err, size_t errlen) {
  if (f->from_memory) return 0; /* a buffer has no directory to hold a config.json */
  const char *slash = strrchr(f->path, '/');
  size_t dirlen = slash ? (size_t)(slash - f->path) + 1 : 0;
  char *cfg = malloc(dirlen + sizeof "config.json");
  if (!cfg) return vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", f->path);
  memcpy(cfg, f->path, dirlen);
  memcpy(cfg + dirlen, "config.json", sizeof "config.json");

  int rc = 0;
  FILE *fp = fopen(cfg, "rb");
  if (!fp) {
    if (errno != ENOENT)
      rc = vs_fail(err, errlen, VSPEC_EIO, "%s: cannot open (beside %s): %s", cfg, f->path,
                   strerror(errno));
    free(cfg);
    return rc;
  }
  json_error_t jerr;
  json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
  fclose(fp);
  if (!root) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: invalid JSON (beside %s): %s (line %d, column %d)", cfg, f->path,
                 jerr.text, jerr.line, jerr.column);
  } else if (!json_is_object(root)) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT, "%s: top level is %s, expected an object", cfg,
                 vs_st_json_type(root));
  } else {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
      if (vs_st_meta_put(f, key, v) != 0) {
        rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", cfg);
        break;
      }
    }
  }
  json_decref(root);
  free(cfg);
  return rc;
}

static int vs_st_parse_header(vspec_tensor_file *f, const char *hdr, size_t hlen, char *err,
                              size_t errlen) {
  /* The reference reader insists on '{' first (InvalidHeaderStart): it rules out a JSON
   * scalar and lets a bogus length fail fast. */
  if (hlen == 0 || hdr[0] != '{')
    return vs_fail(err, errlen, VSPEC_EFORMAT,
                   "%s: header does not start with '{' (not a safetensors file?)", f->path);
  json_error_t jerr;
  /* jansson keeps the last of duplicate keys by default; the format forbids them. */
  json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return vs_fail(err, errlen, VSPEC_EFORMAT, "%s: invalid header JSON: %s (byte %d)",
                   f->path, jerr.text, jerr.position);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = vs_fail(err, errlen, VSPEC_EFORMAT, "%s: header is %s, expected an object", f->path,
                 vs_st_json_type(root));
    goto out;
  }

  json_t *md = json_object_get(root, "__metadata__");
  /* null is accepted as absent, like the reference reader's Option<HashMap>. */
  if (md && !json_is_null(md)) {
    if (!json_is_object(md)) {
      rc = vs_fail(err, errlen, VSPEC_EFORMAT, "%s: __metadata__ is %s, expected an object",
                   f->path, vs_st_json_type(md));
      goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(md, key, v) {
      if (!json_is_string(v)) {
        rc = vs_fail(err, errlen, VSPEC_EFORMAT,
                     "%s: __metadata__ value of '%s' is %s, expected a string", f->path, key,
                     vs_st_json_type(v));
        goto out;
      }
    }
  }

  size_t cap = json_object_size(root);
  f->entries = calloc(cap ? cap : 1, sizeof *f->entries);
  if (!f->entries) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", f->path);
    goto out;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) continue;
    rc = vs_st_parse_entry(f->path, key, v, &f->entries[f->n], err, errlen);
    if (rc != 0) goto out;
    f->n++;
  }
  qsort(f->entries, f->n, sizeof *f->entries, vs_st_cmp_offsets);
  rc = vs_st_check_tiling(f, err, errlen);
  if (rc != 0) goto out;

  f->by_name = malloc((f->n ? f->n : 1) * sizeof *f->by_name);
  if (!f->by_name) {
    rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", f->path);
    goto out;
  }
  for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->entries[i];
  qsort(f->by_name, f->n, sizeof *f->by_name, vs_st_cmp_names);

  /* config.json first so that the file's own metadata wins. */
  rc = vs_st_load_config(f, err, errlen);
  if (rc != 0) goto out;
  if (md && json_is_object(md)) {
    json_object_foreach(md, key, v) {
      if (vs_st_meta_put(f, key, v) != 0) {
        rc = vs_fail(err, errlen, VSPEC_ENOMEM, "%s: out of memory", f->path);
        goto out;
      }
    }
  }
out:
  json_decref(root);
  return rc;
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
  return vs_st_parse_header(f, (const char *)b + 8, (size_t)hlen, err, errlen);
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
                   f->path, name, vs_st_shape_str(have, sizeof have, e->ndim, e->shape),
                   vs_st_shape_str(want, sizeof want, ndim, shape));
  if (e->dtype != VSPEC_DTYPE_F32 && e->dtype != VSPEC_DTYPE_F16 && e->dtype != VSPEC_DTYPE_BF16)
    return vs_fail(err, errlen, VSPEC_ESHAPE,
                   "%s: tensor '%s' has dtype %s; expected F32, F16 or BF16", f->path, name,
                   vs_st_dtype_name(e->dtype));

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
