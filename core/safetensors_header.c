/*
 * core/safetensors_header.c - the safetensors header: parsed and validated completely at
 * open (sizes, types, overflow, tiling), with config.json's values as compact JSON text
 * (see safetensors.c for the format's layout and safetensors.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors_internal.h"
#include "core/status.h"

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

const char *vs__st_dtype_name(uint32_t dtype) {
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
const char *vs__st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
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
                   vs__st_shape_str(sbuf, sizeof sbuf, e->ndim, e->shape), dts);
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
                      vs__st_shape_str(sbuf, sizeof sbuf, e->ndim, e->shape), dts,
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

int vs__st_parse_header(vspec_tensor_file *f, const char *hdr, size_t hlen, char *err,
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
