/*
 * tests/test_safetensors.c - the safetensors loader (core/safetensors.c).
 *
 * Files are written byte by byte from C so that every kind of corruption can be produced;
 * each error case checks the status code and that the message names the file and the
 * tensor or field at fault, since that message is all a user gets. ST_SHOW=1 in the
 * environment prints every open error message and the fuzz loop's success count. A file
 * truncated or rewritten in place under an open file changes nothing for it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "kernels/cpu/cpu_weights.h"
#include "kernels/vs_kernels.h"

static char g_dir[64];   /* mkdtemp directory, removed at the end */
static vspec_dev *g_dev; /* CPU device */

/* ---- writing test files ----------------------------------------------------------------- */

static void path_in(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", g_dir, name);
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  if (n) assert_int_equal(fwrite(bytes, 1, n, fp), n);
  assert_int_equal(fclose(fp), 0);
}

/* u64 LE `declared` header length, the header text, then `data` (NULL = zero bytes). */
static size_t build_st(unsigned char **out, uint64_t declared, const char *header, size_t hlen,
                       const void *data, size_t dlen) {
  size_t n = 8 + hlen + dlen;
  unsigned char *b = calloc(1, n);
  assert_non_null(b);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(declared >> (8 * i));
  memcpy(b + 8, header, hlen);
  if (data) memcpy(b + 8 + hlen, data, dlen);
  *out = b;
  return n;
}

/* Writes a file whose header length field is the true length of `header`. */
static void write_st(const char *path, const char *header, const void *data, size_t dlen) {
  unsigned char *b;
  size_t n = build_st(&b, strlen(header), header, strlen(header), data, dlen);
  write_bytes(path, b, n);
  free(b);
}

/* Header padded with spaces to a multiple of 8, as the Rust and Python writers do. */
static char *padded(const char *header, size_t mult) {
  size_t n = strlen(header), p = (n + mult - 1) / mult * mult;
  char *s = malloc(p + 1);
  assert_non_null(s);
  memcpy(s, header, n);
  memset(s + n, ' ', p - n);
  s[p] = '\0';
  return s;
}

static void le16(unsigned char *p, uint16_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
}

/* ---- the valid file --------------------------------------------------------------------- */

/* w.f32 F32 [2,3] 1..6; w.f16 F16 [6]; w.bf16 BF16 [2,2]; ids I32 [3]; empty F32 [0,5];
 * scalar F32 []. */
static const char *k_valid_header =
    "{\"__metadata__\":{\"arch\":\"test\",\"grid\":\"16\"},"
    "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[24,36]},"
    "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[36,44]},"
    "\"ids\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[44,56]},"
    "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[56,60]},"
    "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[56,56]}}";

/* Exactly representable halves: 1, -2.5, smallest normal, smallest subnormal, max, inf. */
static const uint16_t k_f16[6] = {0x3c00, 0xc100, 0x0400, 0x0001, 0x7bff, 0x7c00};
static const float k_f16_val[6] = {1.0f, -2.5f, 6.103515625e-05f, 5.9604644775390625e-08f,
                                   65504.0f, INFINITY};
static const uint16_t k_bf16[4] = {0x3f80, 0xc040, 0x3f00, 0x8000};
static const float k_bf16_val[4] = {1.0f, -3.0f, 0.5f, -0.0f};

static size_t valid_data(unsigned char data[60]) {
  for (int i = 0; i < 6; i++) {
    float v = (float)(i + 1);
    memcpy(data + 4 * i, &v, 4);
  }
  for (int i = 0; i < 6; i++) le16(data + 24 + 2 * i, k_f16[i]);
  for (int i = 0; i < 4; i++) le16(data + 36 + 2 * i, k_bf16[i]);
  const int32_t ids[3] = {7, -1, 42};
  memcpy(data + 44, ids, sizeof ids);
  float s = 3.25f;
  memcpy(data + 56, &s, 4);
  return 60;
}

/* The valid file as bytes (header padded to 8, so every tensor is aligned). */
static size_t valid_file(unsigned char **out) {
  unsigned char data[60];
  size_t dlen = valid_data(data);
  char *h = padded(k_valid_header, 8);
  size_t n = build_st(out, strlen(h), h, strlen(h), data, dlen);
  free(h);
  return n;
}

static void test_valid(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  path_in(path, sizeof path, "valid.safetensors");
  unsigned char *b;
  size_t n = valid_file(&b);
  write_bytes(path, b, n);
  free(b);

  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  assert_non_null(f);
  assert_string_equal(vs_st_path(f), path);
  assert_int_equal(vs_st_count(f), 6);
  /* file order of offsets; the zero-size tensor sorts before the scalar at the same begin */
  const char *order[] = {"w.f32", "w.f16", "w.bf16", "ids", "empty", "scalar"};
  for (size_t i = 0; i < 6; i++) assert_string_equal(vs_st_name(f, i), order[i]);
  assert_null(vs_st_name(f, 6));
  assert_string_equal(vs_st_meta(f, "arch"), "test");
  assert_string_equal(vs_st_meta(f, "grid"), "16");
  assert_null(vs_st_meta(f, "nope"));

  vspec_tensor t;
  assert_int_equal(vs_st_find(f, "ids", &t), 0);
  assert_int_equal(t.struct_size, sizeof t);
  assert_string_equal(t.name, "ids");
  assert_int_equal(t.dtype, VSPEC_DTYPE_I32);
  assert_int_equal(t.ndim, 1);
  assert_int_equal(t.shape[0], 3);
  assert_int_equal(t.numel, 3);
  assert_int_equal(t.nbytes, 12);
  int32_t ids[3];
  memcpy(ids, t.data, sizeof ids);
  assert_int_equal(ids[0], 7);
  assert_int_equal(ids[1], -1);
  assert_int_equal(ids[2], 42);
  assert_int_equal(vs_st_find(f, "__metadata__", &t), VSPEC_ENOENT);
  assert_int_equal(vs_st_find(f, "nope", NULL), VSPEC_ENOENT);
  assert_int_equal(vs_st_find(f, "w.bf16", NULL), 0);

  /* F32 on the CPU: a pointer into the file's bytes, no copy */
  const float *w = NULL;
  const int64_t s23[2] = {2, 3}, sany3[2] = {-1, 3};
  assert_int_equal(vs_st_find(f, "w.f32", &t), 0);
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, s23, &w, err, sizeof err), 0);
  assert_ptr_equal(w, t.data);
  for (int i = 0; i < 6; i++) assert_true(w[i] == (float)(i + 1));
  const float *w2 = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, sany3, &w2, err, sizeof err), 0);
  assert_ptr_equal(w2, w);

  /* F16 and BF16 convert exactly; a second get returns the cached copy */
  const int64_t s6[1] = {6}, s22[2] = {2, 2};
  const float *h = NULL, *h2 = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f16", 1, s6, &h, err, sizeof err), 0);
  assert_int_equal(vs_st_find(f, "w.f16", &t), 0);
  assert_ptr_not_equal((const void *)h, t.data);
  for (int i = 0; i < 6; i++) assert_true(h[i] == k_f16_val[i]);
  assert_true(isinf(h[5]) && h[5] > 0);
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f16", 1, s6, &h2, err, sizeof err), 0);
  assert_ptr_equal(h2, h);
  const float *bf = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.bf16", 2, s22, &bf, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) assert_true(bf[i] == k_bf16_val[i]);
  assert_true(signbit(bf[3]));

  /* zero-size and scalar tensors */
  const int64_t s05[2] = {0, 5};
  const float *e = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "empty", 2, s05, &e, err, sizeof err), 0);
  assert_non_null(e);
  const float *sc = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "scalar", 0, NULL, &sc, err, sizeof err), 0);
  assert_true(*sc == 3.25f);

  /* integer tensors are not floats */
  const int64_t s3[1] = {3};
  const float *x = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "ids", 1, s3, &x, err, sizeof err), VSPEC_ESHAPE);
  assert_null(x);
  assert_non_null(strstr(err, "valid.safetensors"));
  assert_non_null(strstr(err, "'ids'"));
  assert_non_null(strstr(err, "I32"));

  /* wrong expected shape: both shapes and the tensor are named */
  const int64_t s32[2] = {3, 2};
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, s32, &x, err, sizeof err), VSPEC_ESHAPE);
  assert_non_null(strstr(err, "valid.safetensors"));
  assert_non_null(strstr(err, "'w.f32'"));
  assert_non_null(strstr(err, "[2,3]"));
  assert_non_null(strstr(err, "[3,2]"));
  const int64_t s2x[3] = {2, 3, -1};
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 3, s2x, &x, err, sizeof err), VSPEC_ESHAPE);
  assert_non_null(strstr(err, "[2,3,*]"));

  /* missing tensor */
  assert_int_equal(vs_st_get_f32(f, g_dev, "layers.9.w", 2, s23, &x, err, sizeof err),
                   VSPEC_ENOENT);
  assert_non_null(strstr(err, "valid.safetensors"));
  assert_non_null(strstr(err, "'layers.9.w'"));
  assert_non_null(strstr(err, "not found"));

  vs_st_close(f);
  vs_st_close(NULL);
}

/* F32 data at an address that is not 4-aligned is copied rather than handed out. */
static void test_unaligned_f32(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  path_in(path, sizeof path, "unaligned.safetensors");
  /* pad the header so that the data buffer starts at 2 mod 4 */
  const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
  char h[128];
  snprintf(h, sizeof h, "%s", hdr);
  while ((8 + strlen(h)) % 4 != 2) strcat(h, " ");
  const float v[3] = {0.5f, -7.0f, 1e30f};
  write_st(path, h, v, sizeof v);

  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  vspec_tensor t;
  assert_int_equal(vs_st_find(f, "a", &t), 0);
  assert_int_not_equal((uintptr_t)t.data % 4, 0);
  const float *a = NULL, *a2 = NULL;
  const int64_t s3[1] = {3};
  assert_int_equal(vs_st_get_f32(f, g_dev, "a", 1, s3, &a, err, sizeof err), 0);
  assert_ptr_not_equal((const void *)a, t.data);
  assert_int_equal((uintptr_t)a % 4, 0);
  for (int i = 0; i < 3; i++) assert_true(a[i] == v[i]);
  assert_int_equal(vs_st_get_f32(f, g_dev, "a", 1, s3, &a2, err, sizeof err), 0);
  assert_ptr_equal(a2, a);
  vs_st_close(f);
}

/* A non-CPU device gets copies made with alloc + upload, freed at close. */
static int g_uploads, g_fail_upload;
static const vspec_ops *g_real_ops;
static int fake_upload(vspec_dev *dev, void *dst, const void *src, size_t bytes) {
  g_uploads++;
  if (g_fail_upload) return VSPEC_EDEVICE;
  return g_real_ops->upload(dev, dst, src, bytes);
}

static void test_non_cpu_device(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  g_real_ops = vs_cpu_ops();
  vspec_ops fake = *g_real_ops;
  fake.device = VSPEC_DEVICE_CUDA;
  fake.name = "fakegpu";
  fake.upload = fake_upload;
  vspec_dev *dev = NULL;
  if (vs_dev_create(&fake, 1, &dev, err, sizeof err) != 0) skip(); /* kernels may refuse */

  path_in(path, sizeof path, "valid.safetensors");
  unsigned char *b;
  size_t n = valid_file(&b);
  write_bytes(path, b, n);
  free(b);
  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  vspec_tensor t;
  assert_int_equal(vs_st_find(f, "w.f32", &t), 0);
  const float *w = NULL, *w2 = NULL, *h = NULL;
  const int64_t s23[2] = {2, 3}, s6[1] = {6};
  g_uploads = 0;
  assert_int_equal(vs_st_get_f32(f, dev, "w.f32", 2, s23, &w, err, sizeof err), 0);
  assert_ptr_not_equal((const void *)w, t.data);
  for (int i = 0; i < 6; i++) assert_true(w[i] == (float)(i + 1));
  assert_int_equal(vs_st_get_f32(f, dev, "w.f32", 2, s23, &w2, err, sizeof err), 0);
  assert_ptr_equal(w2, w);
  assert_int_equal(g_uploads, 1);
  assert_int_equal(vs_st_get_f32(f, dev, "w.f16", 1, s6, &h, err, sizeof err), 0);
  for (int i = 0; i < 6; i++) assert_true(h[i] == k_f16_val[i]);
  assert_int_equal(g_uploads, 2);
  /* the CPU device still gets its zero-copy pointer */
  const float *c = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, s23, &c, err, sizeof err), 0);
  assert_ptr_equal(c, t.data);

  g_fail_upload = 1;
  const float *bf = NULL;
  const int64_t s22[2] = {2, 2};
  assert_int_equal(vs_st_get_f32(f, dev, "w.bf16", 2, s22, &bf, err, sizeof err), VSPEC_EDEVICE);
  assert_null(bf);
  assert_non_null(strstr(err, "valid.safetensors"));
  assert_non_null(strstr(err, "'w.bf16'"));
  g_fail_upload = 0;
  vs_st_close(f);
  vs_dev_destroy(dev);
}

/* ---- open errors ------------------------------------------------------------------------ */

static void expect_open_fail(const char *name, int rc, const char *needle1, const char *needle2) {
  char path[128], err[VSPEC_ERRLEN];
  path_in(path, sizeof path, name);
  vspec_tensor_file *f = (vspec_tensor_file *)(uintptr_t)1;
  memset(err, 0, sizeof err);
  int got = vs_st_open(path, &f, err, sizeof err);
  if (got != rc || !strstr(err, name) || (needle1 && !strstr(err, needle1)) ||
      (needle2 && !strstr(err, needle2)))
    print_error("%s: rc %d (want %d), message: %s\n", name, got, rc, err);
  if (getenv("ST_SHOW")) print_message("%s\n", err);
  assert_int_equal(got, rc);
  assert_null(f);
  assert_non_null(strstr(err, name));
  if (needle1) assert_non_null(strstr(err, needle1));
  if (needle2) assert_non_null(strstr(err, needle2));
}

static void test_missing_and_short(void **state) {
  (void)state;
  char path[128];
  expect_open_fail("nope.safetensors", VSPEC_ENOENT, NULL, NULL);

  path_in(path, sizeof path, "empty.safetensors");
  write_bytes(path, "", 0);
  expect_open_fail("empty.safetensors", VSPEC_EFORMAT, "0 bytes", NULL);

  path_in(path, sizeof path, "five.safetensors");
  write_bytes(path, "\x10\0\0\0\0", 5);
  expect_open_fail("five.safetensors", VSPEC_EFORMAT, "5 bytes", NULL);

  /* header length says 100, 40 bytes follow */
  unsigned char *b;
  const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data\"";
  size_t n = build_st(&b, 100, h, strlen(h), NULL, 0);
  path_in(path, sizeof path, "trunc_header.safetensors");
  write_bytes(path, b, n);
  free(b);
  expect_open_fail("trunc_header.safetensors", VSPEC_EFORMAT, "header length 100", "truncated");

  n = build_st(&b, 200000000ull, "{}", 2, NULL, 0);
  path_in(path, sizeof path, "huge_header.safetensors");
  write_bytes(path, b, n);
  free(b);
  expect_open_fail("huge_header.safetensors", VSPEC_EFORMAT, "header length 200000000", "limit");

  n = build_st(&b, UINT64_MAX, "{}", 2, NULL, 0);
  path_in(path, sizeof path, "max_header.safetensors");
  write_bytes(path, b, n);
  free(b);
  expect_open_fail("max_header.safetensors", VSPEC_EFORMAT, "header length", NULL);

  /* a directory is not a safetensors file */
  path_in(path, sizeof path, "adir.safetensors");
  assert_int_equal(mkdir(path, 0700), 0);
  expect_open_fail("adir.safetensors", VSPEC_EIO, "regular file", NULL);
  rmdir(path);

  /* arguments */
  char err[VSPEC_ERRLEN];
  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(NULL, &f, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_st_open(path, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_st_open("nope", &f, NULL, 0), VSPEC_ENOENT); /* no message buffer */
}

/* Header-only corruptions: header text, data buffer length (zero-filled), expected status
 * and two strings the message must contain besides the file name. */
typedef struct bad_case {
  const char *file;
  const char *header;
  size_t dlen;
  int rc;
  const char *needle1, *needle2;
} bad_case;

#define T(name, dt, shape, off) "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

static const bad_case k_bad[] = {
    {"not_json.safetensors", "{not json}", 0, VSPEC_EFORMAT, "invalid header JSON", NULL},
    {"no_brace.safetensors", "hello world", 0, VSPEC_EFORMAT, "header", "'{'"},
    {"array.safetensors", "[{\"a\":1}]", 0, VSPEC_EFORMAT, "header", "'{'"},
    {"trailing.safetensors", "{} x", 0, VSPEC_EFORMAT, "invalid header JSON", NULL},
    {"bad_utf8.safetensors", "{\"\xff\xfe\":1}", 0, VSPEC_EFORMAT, "invalid header JSON", NULL},
    {"nul_name.safetensors", "{\"a\\u0000b\":1}", 0, VSPEC_EFORMAT, "invalid header JSON", NULL},
    {"bad_dtype.safetensors", "{" T("layers.0.w", "F8_E4M3", "[2]", "[0,2]") "}", 2,
     VSPEC_EFORMAT, "'layers.0.w'", "F8_E4M3"},
    {"dtype_num.safetensors", "{" T("w", "F32", "[1]", "[0,4]") ",\"v\":{\"dtype\":7,"
     "\"shape\":[1],\"data_offsets\":[4,8]}}", 8, VSPEC_EFORMAT, "'v'", "dtype"},
    {"no_dtype.safetensors", "{\"v\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, VSPEC_EFORMAT,
     "'v'", "dtype"},
    {"entry_str.safetensors", "{\"v\":\"F32\"}", 0, VSPEC_EFORMAT, "'v'", "a string"},
    {"neg_shape.safetensors", "{" T("w.neg", "F32", "[-1,3]", "[0,12]") "}", 12, VSPEC_EFORMAT,
     "'w.neg'", "shape[0] is -1"},
    {"real_shape.safetensors", "{" T("w.real", "F32", "[2.0]", "[0,8]") "}", 8, VSPEC_EFORMAT,
     "'w.real'", "shape[0] is a real"},
    {"str_shape.safetensors", "{" T("w.s", "F32", "\"[2]\"", "[0,8]") "}", 8, VSPEC_EFORMAT,
     "'w.s'", "shape"},
    {"many_dims.safetensors", "{" T("w.9d", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1,
     VSPEC_EFORMAT, "'w.9d'", "9 dims"},
    {"huge_shape.safetensors",
     "{" T("w.big", "F32", "[4294967296,4294967296,16]", "[0,0]") "}", 0, VSPEC_EFORMAT,
     "'w.big'", "overflow"},
    {"huge_bytes.safetensors", "{" T("w.big2", "F64", "[2305843009213693952]", "[0,0]") "}", 0,
     VSPEC_EFORMAT, "'w.big2'", "overflow"},
    {"too_big_int.safetensors", "{" T("w", "F32", "[99999999999999999999]", "[0,4]") "}", 4,
     VSPEC_EFORMAT, "invalid header JSON", "99999999999999999999"},
    {"offs_huge.safetensors",
     "{" T("w.off", "F32", "[1]", "[9223372036854775800,9223372036854775807]") "}", 4,
     VSPEC_EFORMAT, "'w.off'", "needs 4"},
    {"offs_far.safetensors",
     "{" T("w.far", "F32", "[1]", "[9223372036854775803,9223372036854775807]") "}", 4,
     VSPEC_EFORMAT, "'w.far'", "9223372036854775803"},
    {"offs_rev.safetensors", "{" T("w.rev", "F32", "[0]", "[8,4]") "}", 8, VSPEC_EFORMAT,
     "'w.rev'", "[8, 4)"},
    {"offs_neg.safetensors", "{" T("w.n", "F32", "[1]", "[-4,0]") "}", 4, VSPEC_EFORMAT, "'w.n'",
     "data_offsets[0] is -4"},
    {"offs_len.safetensors", "{" T("w.l", "F32", "[1]", "[0,4,8]") "}", 4, VSPEC_EFORMAT, "'w.l'",
     "data_offsets"},
    {"offs_missing.safetensors", "{\"w.m\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, VSPEC_EFORMAT,
     "'w.m'", "data_offsets"},
    {"size_mismatch.safetensors",
     "{" T("layers.0.attention.wqkv.weight", "F32", "[3,4]", "[0,100]") "}", 100,
     VSPEC_EFORMAT, "'layers.0.attention.wqkv.weight'", "[0, 100) hold 100 bytes but shape [3,4] of F32 needs 48"},
    {"gap.safetensors", "{" T("a", "F32", "[2]", "[0,8]") "," T("b.gap", "F32", "[2]", "[12,20]") "}",
     20, VSPEC_EFORMAT, "gap", "'b.gap'"},
    {"gap_start.safetensors", "{" T("a.first", "F32", "[2]", "[4,12]") "}", 12, VSPEC_EFORMAT,
     "gap", "'a.first'"},
    {"overlap.safetensors",
     "{" T("a.one", "F32", "[2]", "[0,8]") "," T("b.two", "F32", "[2]", "[4,12]") "}", 12,
     VSPEC_EFORMAT, "'b.two'", "overlap tensor 'a.one'"},
    {"same_offsets.safetensors",
     "{" T("a.one", "F32", "[2]", "[0,8]") "," T("b.two", "F32", "[2]", "[0,8]") "}", 8,
     VSPEC_EFORMAT, "'b.two'", "overlap"},
    {"trunc_data.safetensors", "{" T("w.t", "F32", "[6]", "[0,24]") "}", 10, VSPEC_EFORMAT,
     "'w.t'", "truncated"},
    {"trailing_data.safetensors", "{" T("w", "F32", "[2]", "[0,8]") "}", 12, VSPEC_EFORMAT,
     "12 bytes", "only 8"},
    {"no_tensors_data.safetensors", "{}", 4, VSPEC_EFORMAT, "4 bytes", "only 0"},
    {"dup.safetensors", "{" T("w.dup", "F32", "[1]", "[0,4]") "," T("w.dup", "F32", "[1]", "[4,8]") "}",
     8, VSPEC_EFORMAT, "duplicate", "w.dup"},
    {"meta_num.safetensors", "{\"__metadata__\":{\"dim\":5}}", 0, VSPEC_EFORMAT, "__metadata__",
     "'dim'"},
    {"meta_arr.safetensors", "{\"__metadata__\":[\"a\"]}", 0, VSPEC_EFORMAT, "__metadata__",
     "an array"},
    {"meta_dup.safetensors", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, VSPEC_EFORMAT,
     "duplicate", "\"k\""},
};

static void test_bad_headers(void **state) {
  (void)state;
  char path[128];
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case *c = &k_bad[i];
    unsigned char *zeros = calloc(1, c->dlen + 1);
    assert_non_null(zeros);
    path_in(path, sizeof path, c->file);
    write_st(path, c->header, zeros, c->dlen);
    free(zeros);
    expect_open_fail(c->file, c->rc, c->needle1, c->needle2);
  }
}

/* The bytes of a file in memory (the fuzz target's entry point) get the same checks and the
 * same tensors as the file; only config.json, which a buffer has no directory for, is not
 * read. */
static void test_open_memory(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  unsigned char *b;
  size_t n = valid_file(&b);
  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open_memory(b, n, "buf", &f, err, sizeof err), 0);
  assert_string_equal(vs_st_path(f), "buf");
  assert_int_equal(vs_st_count(f), 6);
  assert_string_equal(vs_st_meta(f, "arch"), "test");
  const float *w = NULL;
  const int64_t s23[2] = {2, 3};
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, s23, &w, err, sizeof err), 0);
  for (int i = 0; i < 6; i++) assert_true(w[i] == (float)(i + 1));
  vs_st_close(f);
  /* the buffer was copied: the caller may reuse it */
  memset(b, 0, n);
  free(b);
  f = (vspec_tensor_file *)(uintptr_t)1;
  assert_int_equal(vs_st_open_memory("1234567", 7, "buf", &f, err, sizeof err), VSPEC_EFORMAT);
  assert_null(f);
  assert_non_null(strstr(err, "buf"));
  for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
    const bad_case *c = &k_bad[i];
    unsigned char *zeros = calloc(1, c->dlen + 1);
    assert_non_null(zeros);
    n = build_st(&b, strlen(c->header), c->header, strlen(c->header), zeros, c->dlen);
    free(zeros);
    assert_int_equal(vs_st_open_memory(b, n, c->file, &f, err, sizeof err), c->rc);
    assert_non_null(strstr(err, c->file));
    if (c->needle1) assert_non_null(strstr(err, c->needle1));
    free(b);
  }
}

/* Things the format allows must still open. */
static void test_edge_valid(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  vspec_tensor_file *f = NULL;

  path_in(path, sizeof path, "no_tensors.safetensors");
  write_st(path, "{}", NULL, 0);
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  assert_int_equal(vs_st_count(f), 0);
  assert_null(vs_st_name(f, 0));
  assert_int_equal(vs_st_find(f, "x", NULL), VSPEC_ENOENT);
  vs_st_close(f);

  /* null metadata (the reference reader's Option), extra entry fields, padding spaces,
   * keys in any order */
  path_in(path, sizeof path, "edge.safetensors");
  const char *h = "{\"__metadata__\":null,\"b\":{\"data_offsets\":[4,6],\"shape\":[1],"
                  "\"dtype\":\"U16\",\"extra\":[1]},\"a\":{\"dtype\":\"I64\",\"shape\":[0],"
                  "\"data_offsets\":[0,0]},\"c\":{\"dtype\":\"BOOL\",\"shape\":[2,1],"
                  "\"data_offsets\":[6,8]},\"z\":{\"dtype\":\"F32\",\"shape\":[1],"
                  "\"data_offsets\":[0,4]}}      ";
  unsigned char data[8] = {0};
  write_st(path, h, data, sizeof data);
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  assert_int_equal(vs_st_count(f), 4);
  assert_string_equal(vs_st_name(f, 0), "a");
  assert_string_equal(vs_st_name(f, 1), "z");
  assert_string_equal(vs_st_name(f, 2), "b");
  assert_string_equal(vs_st_name(f, 3), "c");
  assert_null(vs_st_meta(f, "a"));
  vspec_tensor t;
  assert_int_equal(vs_st_find(f, "c", &t), 0);
  assert_int_equal(t.dtype, VSPEC_DTYPE_BOOL);
  assert_int_equal(t.ndim, 2);
  assert_int_equal(t.numel, 2);
  const float *x = NULL;
  const int64_t any[1] = {-1};
  assert_int_equal(vs_st_get_f32(f, g_dev, "b", 1, any, &x, err, sizeof err), VSPEC_ESHAPE);
  assert_non_null(strstr(err, "U16"));
  assert_non_null(strstr(err, "'b'"));
  vs_st_close(f);
}

/* ---- config.json beside the file ------------------------------------------------------- */

static void make_subdir(char *dir, size_t len, const char *name) {
  snprintf(dir, len, "%s/%s", g_dir, name);
  assert_int_equal(mkdir(dir, 0700), 0);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  write_bytes(path, text, strlen(text));
}

static void test_config_fallback(void **state) {
  (void)state;
  char dir[128], path[256], err[VSPEC_ERRLEN];
  make_subdir(dir, sizeof dir, "cfg_ok");
  write_text(dir, "config.json",
             "{\"dim\": 10, \"ch_mult\": [1, 2, 2], \"arch\": \"from-config\", \"name\": "
             "\"x\\ty\", \"flag\": true, \"off\": false, \"eps\": 1e-05, \"half\": 0.5, "
             "\"one\": 1.0, \"none\": null, \"nested\": {\"a\": [1.5, \"q\\\"\"], \"b\": {}}}");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  write_st(path, "{\"__metadata__\":{\"arch\":\"from-header\"}}", NULL, 0);

  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  assert_string_equal(vs_st_meta(f, "arch"), "from-header"); /* the header wins */
  assert_string_equal(vs_st_meta(f, "dim"), "10");
  assert_string_equal(vs_st_meta(f, "ch_mult"), "[1,2,2]");
  assert_string_equal(vs_st_meta(f, "name"), "x\ty");
  assert_string_equal(vs_st_meta(f, "flag"), "true");
  assert_string_equal(vs_st_meta(f, "off"), "false");
  assert_string_equal(vs_st_meta(f, "eps"), "1e-05");
  assert_string_equal(vs_st_meta(f, "half"), "0.5");
  assert_string_equal(vs_st_meta(f, "one"), "1.0");
  assert_string_equal(vs_st_meta(f, "none"), "null");
  assert_string_equal(vs_st_meta(f, "nested"), "{\"a\":[1.5,\"q\\\"\"],\"b\":{}}");
  assert_null(vs_st_meta(f, "missing"));
  vs_st_close(f);

  /* a relative path without a directory looks in the current directory */
  char cwd[512];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);
  assert_int_equal(vs_st_open("model.safetensors", &f, err, sizeof err), 0);
  assert_string_equal(vs_st_meta(f, "dim"), "10");
  vs_st_close(f);
  assert_int_equal(chdir(cwd), 0);
}

static void test_config_malformed(void **state) {
  (void)state;
  const char *bad[][2] = {
      {"cfg_bad1", "{\"dim\": 10,"},
      {"cfg_bad2", "[1, 2]"},
      {"cfg_bad3", "{\"dim\": 1, \"dim\": 2}"},
      {"cfg_bad4", ""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char dir[128], path[256], err[VSPEC_ERRLEN];
    make_subdir(dir, sizeof dir, bad[i][0]);
    write_text(dir, "config.json", bad[i][1]);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, "{}", NULL, 0);
    vspec_tensor_file *f = (vspec_tensor_file *)(uintptr_t)1;
    err[0] = '\0';
    assert_int_equal(vs_st_open(path, &f, err, sizeof err), VSPEC_EFORMAT);
    assert_null(f);
    assert_non_null(strstr(err, bad[i][0]));
    assert_non_null(strstr(err, "config.json"));
  }
}

/* ---- robustness ----------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

/* Whatever open accepts must be fully readable; whatever it refuses must say why. */
static void exercise(const char *path) {
  char err[VSPEC_ERRLEN];
  vspec_tensor_file *f = NULL;
  err[0] = '\0';
  int rc = vs_st_open(path, &f, err, sizeof err);
  if (rc != 0) {
    assert_true(rc < 0);
    assert_null(f);
    assert_true(err[0] != '\0');
    assert_non_null(strstr(err, "fuzz.safetensors"));
    return;
  }
  (void)vs_st_meta(f, "arch");
  for (size_t i = 0; i < vs_st_count(f); i++) {
    vspec_tensor t;
    const char *name = vs_st_name(f, i);
    assert_non_null(name);
    assert_int_equal(vs_st_find(f, name, &t), 0);
    volatile unsigned char sink = 0;
    for (size_t k = 0; k < t.nbytes; k++) sink ^= ((const unsigned char *)t.data)[k];
    (void)sink;
    int64_t any[VSPEC_MAX_DIMS];
    for (int d = 0; d < VSPEC_MAX_DIMS; d++) any[d] = -1;
    const float *x = NULL;
    err[0] = '\0';
    rc = vs_st_get_f32(f, g_dev, name, t.ndim, any, &x, err, sizeof err);
    if (rc == 0) {
      volatile float acc = 0;
      for (int64_t k = 0; k < t.numel; k++) acc += x[k];
      (void)acc;
    } else {
      assert_int_equal(rc, VSPEC_ESHAPE);
      assert_true(err[0] != '\0');
    }
  }
  vs_st_close(f);
}

static void test_fuzz(void **state) {
  (void)state;
  char path[128];
  path_in(path, sizeof path, "fuzz.safetensors");
  unsigned char *orig;
  size_t n = valid_file(&orig);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | orig[i];
  size_t hend = 8 + (size_t)hlen;
  unsigned char *b = malloc(n);
  assert_non_null(b);
  int opened = 0;
  for (int it = 0; it < 4000; it++) {
    memcpy(b, orig, n);
    size_t len = n;
    switch (rnd() % 4) {
    case 0: /* flip a few random bits anywhere */
      for (int k = 1 + (int)(rnd() % 4); k > 0; k--) b[rnd() % n] ^= (unsigned char)(1u << (rnd() % 8));
      break;
    case 1: /* random bytes in the length field or the header */
      for (int k = 1 + (int)(rnd() % 3); k > 0; k--) b[rnd() % hend] = (unsigned char)rnd();
      break;
    case 2: { /* rewrite a digit of the header: offsets and shapes that still parse */
      for (int tries = 0; tries < 50; tries++) {
        size_t p = 8 + rnd() % (hend - 8);
        if (b[p] >= '0' && b[p] <= '9') {
          static const char repl[] = "0123456789-9";
          b[p] = (unsigned char)repl[rnd() % (sizeof repl - 1)];
          break;
        }
      }
      break;
    }
    default: /* truncate */
      len = (size_t)(rnd() % n);
      break;
    }
    write_bytes(path, b, len);
    char err[VSPEC_ERRLEN];
    vspec_tensor_file *f = NULL;
    if (vs_st_open(path, &f, err, sizeof err) == 0) opened++;
    vs_st_close(f);
    exercise(path);
  }
  /* some mutations (padding, data bytes) keep the file valid: both paths were taken */
  if (getenv("ST_SHOW")) print_message("fuzz: %d of 4000 opened\n", opened);
  assert_true(opened > 0);
  assert_true(opened < 4000);
  free(b);
  free(orig);
}

/* ---- setup ------------------------------------------------------------------------------ */

/* ---- files replaced under an open file --------------------------------------------------- */

/* Every tensor's bytes, in file order, for comparing an open file with itself later. */
static unsigned char *snapshot(const vspec_tensor_file *f, size_t *len) {
  size_t total = 0;
  for (size_t i = 0; i < vs_st_count(f); i++) {
    vspec_tensor t = {.struct_size = sizeof t};
    assert_int_equal(vs_st_find(f, vs_st_name(f, i), &t), 0);
    total += t.nbytes;
  }
  unsigned char *b = malloc(total + 1), *p = b;
  assert_non_null(b);
  for (size_t i = 0; i < vs_st_count(f); i++) {
    vspec_tensor t = {.struct_size = sizeof t};
    assert_int_equal(vs_st_find(f, vs_st_name(f, i), &t), 0);
    memcpy(p, t.data, t.nbytes); /* touches every byte: SIGBUS if it were a dead mapping */
    p += t.nbytes;
  }
  *len = total;
  return b;
}

static void overwrite_in_place(const char *path, const void *bytes, size_t n) {
  FILE *fp = fopen(path, "r+b"); /* the same inode, as `cp new old` keeps it */
  assert_non_null(fp);
  assert_int_equal(fwrite(bytes, 1, n, fp), n);
  assert_int_equal(fclose(fp), 0);
}

/* `cp new old` truncates the old file and writes into it, the same inode: an open file keeps
 * every byte it had (no SIGBUS, no weights changing under a running job); a new open reads
 * the new file. */
static void test_replaced_in_place(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  path_in(path, sizeof path, "replaced.safetensors");
  unsigned char *b;
  size_t n = valid_file(&b);
  write_bytes(path, b, n);
  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  const int64_t s23[2] = {2, 3};
  const float *w = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, s23, &w, err, sizeof err), 0);
  size_t len0, len;
  unsigned char *before = snapshot(f, &len0);

  assert_int_equal(truncate(path, 0), 0);
  unsigned char *after = snapshot(f, &len);
  assert_int_equal(len, len0);
  assert_memory_equal(after, before, len);
  for (int i = 0; i < 6; i++) assert_true(w[i] == (float)(i + 1));
  free(after);

  /* the new build of the file: the same header, other weights */
  float other = 100.0f;
  size_t hdr = n - 60;
  for (int i = 0; i < 6; i++) memcpy(b + hdr + 4 * i, &other, 4);
  overwrite_in_place(path, b, n);
  after = snapshot(f, &len);
  assert_memory_equal(after, before, len);
  for (int i = 0; i < 6; i++) assert_true(w[i] == (float)(i + 1));
  free(after);

  vspec_tensor_file *g = NULL;
  const float *w2 = NULL;
  assert_int_equal(vs_st_open(path, &g, err, sizeof err), 0);
  assert_int_equal(vs_st_get_f32(g, g_dev, "w.f32", 2, s23, &w2, err, sizeof err), 0);
  assert_true(w2[0] == 100.0f);
  vs_st_close(g);
  vs_st_close(f);
  free(before);
  free(b);
}

/* Opens of one unchanged file share its bytes (the EAGLE head reads the target's file too);
 * each open keeps them alive on its own. */
static void test_shared_bytes(void **state) {
  (void)state;
  /* a committed file: old enough to be shared (fresh files are not, see safetensors.c) */
  const char *path = "tests/golden/micro_c2i/vq.safetensors";
  char err[VSPEC_ERRLEN];
  vspec_tensor_file *a = NULL, *b = NULL;
  assert_int_equal(vs_st_open(path, &a, err, sizeof err), 0);
  assert_int_equal(vs_st_open(path, &b, err, sizeof err), 0);
  const char *name = vs_st_name(a, 0);
  vspec_tensor ta = {.struct_size = sizeof ta}, tb = {.struct_size = sizeof tb};
  assert_int_equal(vs_st_find(a, name, &ta), 0);
  assert_int_equal(vs_st_find(b, name, &tb), 0);
  assert_ptr_equal(ta.data, tb.data);
  size_t len;
  unsigned char *before = snapshot(b, &len);
  vs_st_close(a);
  unsigned char *after = snapshot(b, &len);
  assert_memory_equal(after, before, len);
  free(before);
  free(after);
  vs_st_close(b);
}

static int rm_tree(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd);
}

static int setup(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  strcpy(g_dir, "/tmp/vspec_st_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  if (vs_dev_create(vs_cpu_ops(), 1, &g_dev, err, sizeof err) != 0) {
    fprintf(stderr, "vs_dev_create: %s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  vs_dev_destroy(g_dev);
  return rm_tree(g_dir) == 0 ? 0 : -1;
}

/* A zero-copy F32 tensor is lent to the CPU device (kernels/cpu/cpu_weights.h): bf16 precision
 * may convert it, and closing the file drops that copy before the bytes are unmapped (else a
 * later mapping at the same address would be served a stale copy). */
static void test_zero_copy_lent_and_released(void **state) {
  (void)state;
  char path[128], err[VSPEC_ERRLEN];
  path_in(path, sizeof path, "lent.safetensors");
  unsigned char *b;
  size_t n = valid_file(&b);
  write_bytes(path, b, n);
  free(b);
  size_t before, held;
  vs_cpu_weights_stats(NULL, &before);
  vspec_tensor_file *f = NULL;
  assert_int_equal(vs_st_open(path, &f, err, sizeof err), 0);
  const int64_t shape[2] = {2, 3};
  const float *w = NULL;
  assert_int_equal(vs_st_get_f32(f, g_dev, "w.f32", 2, shape, &w, err, sizeof err), 0);
  assert_non_null(vs_cpu_weights_amx(w, 2, 3));
  vs_cpu_weights_stats(NULL, &held);
  assert_true(held > before);
  vs_st_close(f);
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_zero_copy_lent_and_released),
      cmocka_unit_test(test_unaligned_f32),
      cmocka_unit_test(test_non_cpu_device),
      cmocka_unit_test(test_missing_and_short),
      cmocka_unit_test(test_bad_headers),
      cmocka_unit_test(test_open_memory),
      cmocka_unit_test(test_edge_valid),
      cmocka_unit_test(test_config_fallback),
      cmocka_unit_test(test_config_malformed),
      cmocka_unit_test(test_fuzz),
      cmocka_unit_test(test_replaced_in_place),
      cmocka_unit_test(test_shared_bytes),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
