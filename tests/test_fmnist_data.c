/*
 * tests/test_fmnist_data.c - the IDX reader and the classifier input layout
 * (bench/fmnist_data.c).
 *
 * The bench sources are not part of libvspec.a, so the file under test is compiled into
 * this test directly. Small IDX files are written with zlib in a temporary directory,
 * valid and corrupt; every error case checks the status and that the message names the
 * file, since that message is all a user gets. The real Debian data set is checked when
 * it is installed (skipped otherwise).
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
#include <zlib.h>

#include "bench/fmnist_data.h"
#include "vspec/types.h"

static char g_dir[64];

static void path_in(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", g_dir, name);
}

static void put_be32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
}

/* magic, dims, then `data_len` bytes of data; gzip-compressed when gz. */
static void write_idx(const char *path, uint32_t magic, const uint32_t *dims, int ndim,
                      const uint8_t *data, size_t data_len, int gz) {
  unsigned char head[16];
  put_be32(head, magic);
  for (int i = 0; i < ndim; i++) put_be32(head + 4 + 4 * i, dims[i]);
  size_t hlen = 4 + 4 * (size_t)ndim;
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, head, (unsigned)hlen), (int)hlen);
    if (data_len) assert_int_equal(gzwrite(f, data, (unsigned)data_len), (int)data_len);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, hlen, f), hlen);
    if (data_len) assert_int_equal(fwrite(data, 1, data_len, f), data_len);
    assert_int_equal(fclose(f), 0);
  }
}

static uint8_t *pattern(size_t n, unsigned seed) {
  uint8_t *p = malloc(n ? n : 1);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 31u + seed * 7u) ^ (i >> 5));
  return p;
}

static void assert_err_has(const char *err, const char *a, const char *b) {
  if (!strstr(err, a) || (b && !strstr(err, b)))
    fail_msg("error message '%s' lacks '%s'%s%s", err, a, b ? " or " : "", b ? b : "");
}

/* A valid 28x28 split "mini" with n images in g_dir. */
static void write_split(const char *split, int n, const uint8_t *labels, unsigned seed) {
  char ip[256], lp[256], name[128];
  snprintf(name, sizeof name, "%s-images-idx3-ubyte.gz", split);
  path_in(ip, sizeof ip, name);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte.gz", split);
  path_in(lp, sizeof lp, name);
  uint32_t d3[3] = {(uint32_t)n, 28, 28}, d1[1] = {(uint32_t)n};
  uint8_t *img = pattern((size_t)n * 784, seed);
  write_idx(ip, VS_IDX_MAGIC_U8_3D, d3, 3, img, (size_t)n * 784, 1);
  write_idx(lp, VS_IDX_MAGIC_U8_1D, d1, 1, labels, (size_t)n, 1);
  free(img);
}

static void test_valid_load(void **state) {
  (void)state;
  const uint8_t labels[5] = {0, 9, 3, 3, 7};
  write_split("mini", 5, labels, 1);
  vs_fmnist d;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_fmnist_load(g_dir, "mini", 0, &d, err, sizeof err);
  if (rc) fail_msg("load: %s", err);
  assert_int_equal(d.n, 5);
  uint8_t *want = pattern(5 * 784, 1);
  assert_memory_equal(d.images, want, 5 * 784);
  assert_memory_equal(d.labels, labels, 5);
  vs_fmnist_free(&d);
  /* max_n reads a prefix */
  rc = vs_fmnist_load(g_dir, "mini", 2, &d, err, sizeof err);
  if (rc) fail_msg("load max_n: %s", err);
  assert_int_equal(d.n, 2);
  assert_memory_equal(d.images, want, 2 * 784);
  assert_memory_equal(d.labels, labels, 2);
  vs_fmnist_free(&d);
  free(want);
}

static void test_generic_dims_and_plain_file(void **state) {
  (void)state;
  char p[256];
  path_in(p, sizeof p, "small.idx"); /* not gzip: zlib reads plain files too */
  uint32_t dims[3] = {2, 3, 4};
  uint8_t *data = pattern(24, 5);
  write_idx(p, VS_IDX_MAGIC_U8_3D, dims, 3, data, 24, 0);
  uint8_t *px = NULL;
  int n, r, c;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err);
  if (rc) fail_msg("read: %s", err);
  assert_int_equal(n, 2);
  assert_int_equal(r, 3);
  assert_int_equal(c, 4);
  assert_memory_equal(px, data, 24);
  free(px);
  free(data);
}

static void test_wrong_magic(void **state) {
  (void)state;
  char p[256];
  path_in(p, sizeof p, "labels-as-images.gz");
  uint32_t d1[1] = {4};
  uint8_t lab[4] = {1, 2, 3, 4};
  write_idx(p, VS_IDX_MAGIC_U8_1D, d1, 1, lab, 4, 1);
  uint8_t *px = (uint8_t *)1;
  int n, r, c;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_null(px);
  assert_err_has(err, p, NULL);
  assert_err_has(err, "magic 0x00000801", "label file");

  path_in(p, sizeof p, "garbage-magic.gz");
  uint32_t d3[3] = {1, 28, 28};
  uint8_t *img = pattern(784, 2);
  write_idx(p, 0x12345678u, d3, 3, img, 784, 1);
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, p, "0x12345678");
  free(img);
}

static void test_truncated_data(void **state) {
  (void)state;
  char p[256];
  path_in(p, sizeof p, "short.gz");
  uint32_t d3[3] = {5, 28, 28};
  uint8_t *img = pattern(3 * 784, 3);
  write_idx(p, VS_IDX_MAGIC_U8_3D, d3, 3, img, 3 * 784, 1); /* header claims 5 */
  uint8_t *px = NULL;
  int n, r, c;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_null(px);
  assert_err_has(err, p, "truncated");
  /* a prefix that is present reads fine */
  assert_int_equal(vs_idx_read_images(p, 3, &px, &n, &r, &c, err, sizeof err), VSPEC_OK);
  assert_int_equal(n, 3);
  free(px);
  /* a header cut short */
  path_in(p, sizeof p, "short-header.gz");
  write_idx(p, VS_IDX_MAGIC_U8_3D, d3, 1, NULL, 0, 1); /* magic + one dim only */
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, p, "header");
  free(img);
}

static void test_truncated_gzip(void **state) {
  (void)state;
  char p[256];
  path_in(p, sizeof p, "cut.gz");
  uint32_t d3[3] = {40, 28, 28};
  uint8_t *img = pattern(40 * 784, 4);
  write_idx(p, VS_IDX_MAGIC_U8_3D, d3, 3, img, 40 * 784, 1);
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(truncate(p, st.st_size / 2), 0);
  uint8_t *px = NULL;
  int n, r, c;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_null(px);
  assert_err_has(err, p, "truncated");
  free(img);
}

static void test_trailing_and_bad_dims(void **state) {
  (void)state;
  char p[256];
  path_in(p, sizeof p, "long.gz");
  uint32_t d3[3] = {2, 28, 28};
  uint8_t *img = pattern(3 * 784, 5);
  write_idx(p, VS_IDX_MAGIC_U8_3D, d3, 3, img, 3 * 784, 1); /* header claims 2, data 3 */
  uint8_t *px = NULL;
  int n, r, c;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, p, "trailing");
  path_in(p, sizeof p, "zero.gz");
  uint32_t dz[3] = {3, 0, 28};
  write_idx(p, VS_IDX_MAGIC_U8_3D, dz, 3, img, 0, 1);
  assert_int_equal(vs_idx_read_images(p, 0, &px, &n, &r, &c, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, p, "dimension 1 is 0");
  free(img);
}

static void test_split_errors(void **state) {
  (void)state;
  vs_fmnist d;
  char err[VSPEC_ERRLEN] = "", p[256];
  /* missing files */
  assert_int_equal(vs_fmnist_load(g_dir, "absent", 0, &d, err, sizeof err), VSPEC_ENOENT);
  assert_err_has(err, "absent-images-idx3-ubyte.gz", "dataset-fashion-mnist");
  /* counts disagree */
  const uint8_t labels[4] = {1, 2, 3, 4};
  write_split("mismatch", 4, labels, 6);
  path_in(p, sizeof p, "mismatch-labels-idx1-ubyte.gz");
  uint32_t d1[1] = {3};
  write_idx(p, VS_IDX_MAGIC_U8_1D, d1, 1, labels, 3, 1);
  assert_int_equal(vs_fmnist_load(g_dir, "mismatch", 0, &d, err, sizeof err), VSPEC_ESHAPE);
  assert_err_has(err, "3 labels", "4 images");
  assert_null(d.images);
  /* a label that is not a class */
  const uint8_t bad[3] = {0, 10, 2};
  write_split("badlabel", 3, bad, 7);
  assert_int_equal(vs_fmnist_load(g_dir, "badlabel", 0, &d, err, sizeof err), VSPEC_EFORMAT);
  assert_err_has(err, "badlabel-labels", "label 10 of item 1");
  /* images of the wrong size */
  path_in(p, sizeof p, "wrongsize-images-idx3-ubyte.gz");
  uint32_t d3[3] = {1, 32, 32};
  uint8_t *img = pattern(1024, 8);
  write_idx(p, VS_IDX_MAGIC_U8_3D, d3, 3, img, 1024, 1);
  assert_int_equal(vs_fmnist_load(g_dir, "wrongsize", 0, &d, err, sizeof err), VSPEC_ESHAPE);
  assert_err_has(err, "32x32", "28x28");
  free(img);
}

static void test_input_layout(void **state) {
  (void)state;
  uint8_t img[2 * 784];
  for (int i = 0; i < 2 * 784; i++) img[i] = (uint8_t)(i % 256);
  float *x = malloc(sizeof(float) * 2 * 1024);
  assert_non_null(x);
  vs_fmnist_to_input(img, 2, x);
  for (int k = 0; k < 2; k++)
    for (int y = 0; y < 32; y++)
      for (int c = 0; c < 32; c++) {
        int sy = y - 2, sx = c - 2;
        double want = (sy < 0 || sy >= 28 || sx < 0 || sx >= 28)
                          ? -1.0
                          : img[k * 784 + sy * 28 + sx] / 127.5 - 1.0;
        float got = x[k * 1024 + y * 32 + c];
        if (fabs(got - want) > 1e-6)
          fail_msg("image %d (%d,%d): got %g want %g", k, y, c, (double)got, want);
      }
  assert_true(x[0] == -1.0f);
  /* byte 255 -> exactly 1 */
  uint8_t white[784];
  memset(white, 255, sizeof white);
  vs_fmnist_to_input(white, 1, x);
  assert_true(x[2 * 32 + 2] == 1.0f);

  /* RGB: grey = round(mean), then the same map; r = g = b keeps the byte */
  uint8_t *rgb = calloc(1024 * 3, 1);
  assert_non_null(rgb);
  const uint8_t cases[][4] = {/* r, g, b, grey */ {10, 11, 13, 11}, {0, 0, 1, 0}, {0, 1, 1, 1},
                              {200, 200, 200, 200}, {255, 255, 254, 255}, {1, 2, 2, 2}};
  int nc = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < nc; i++) memcpy(rgb + 3 * i, cases[i], 3);
  vs_fmnist_rgb_to_input(rgb, 1, x);
  for (int i = 0; i < nc; i++) {
    float want = (float)cases[i][3] / 127.5f - 1.0f;
    if (x[i] != want) fail_msg("rgb case %d: got %g want %g", i, (double)x[i], (double)want);
  }
  assert_true(x[1023] == -1.0f);
  free(rgb);
  free(x);
}

/* The installed data set, when present: 10000 test images, 1000 of each class. */
static void test_real_dataset(void **state) {
  (void)state;
  char p[512];
  snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", VS_FMNIST_DIR);
  if (access(p, R_OK) != 0) {
    print_message("skipping: %s not installed\n", p);
    skip();
  }
  vs_fmnist d;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_fmnist_load(NULL, "t10k", 0, &d, err, sizeof err);
  if (rc) fail_msg("%s", err);
  assert_int_equal(d.n, 10000);
  int count[10] = {0};
  for (int i = 0; i < d.n; i++) {
    assert_true(d.labels[i] < 10);
    count[d.labels[i]]++;
  }
  for (int k = 0; k < 10; k++) assert_int_equal(count[k], 1000);
  long sum = 0;
  for (int i = 0; i < 784; i++) sum += d.images[i];
  assert_true(sum > 0); /* the first image is not blank */
  vs_fmnist_free(&d);
}

/* vs_fmnist_balanced: n / classes per class, the remainder to the first classes, a class's
 * shortfall to the next classes with images to spare; the first images of each class. */
static void test_balanced_choice(void **state) {
  (void)state;
  const uint8_t lab[10] = {0, 0, 0, 0, 1, 2, 2, 1, 1, 2};
  int32_t idx[10];
  assert_int_equal(vs_fmnist_balanced(lab, 10, 3, 6, idx), 0);
  const int32_t want6[6] = {0, 1, 4, 5, 6, 7};
  assert_memory_equal(idx, want6, sizeof want6);
  assert_int_equal(vs_fmnist_balanced(lab, 10, 3, 7, idx), 0); /* class 0 takes the extra */
  const int32_t want7[7] = {0, 1, 2, 4, 5, 6, 7};
  assert_memory_equal(idx, want7, sizeof want7);
  /* class 1 has one image: its shortfall goes to class 0, the next with images to spare */
  const uint8_t few[8] = {0, 0, 0, 0, 1, 2, 2, 2};
  assert_int_equal(vs_fmnist_balanced(few, 8, 3, 7, idx), 0);
  const int32_t wantf[7] = {0, 1, 2, 3, 4, 5, 6};
  assert_memory_equal(idx, wantf, sizeof wantf);
  /* labels outside 0..classes-1 are never taken; asking for more than there are fails */
  const uint8_t odd[4] = {5, 0, 1, 5};
  assert_int_equal(vs_fmnist_balanced(odd, 4, 2, 2, idx), 0);
  assert_int_equal(idx[0], 1);
  assert_int_equal(idx[1], 2);
  assert_int_equal(vs_fmnist_balanced(odd, 4, 2, 3, idx), VSPEC_EINVAL);
  assert_int_equal(vs_fmnist_balanced(odd, 4, 0, 1, idx), VSPEC_EINVAL);
  assert_int_equal(vs_fmnist_balanced(odd, 4, 2, -1, idx), VSPEC_EINVAL);
}

/* On the real training set (when installed): 10 per class at n = 100, where the first 100
 * images are not balanced; the same choice twice. */
static void test_balanced_real(void **state) {
  (void)state;
  char p[512];
  snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", VS_FMNIST_DIR);
  if (access(p, R_OK) != 0) skip();
  uint8_t *lab = NULL;
  int n = 0;
  char err[VSPEC_ERRLEN] = "";
  if (vs_idx_read_labels(p, 10000, &lab, &n, err, sizeof err)) fail_msg("%s", err);
  int32_t a[105], b[105];
  assert_int_equal(vs_fmnist_balanced(lab, n, 10, 100, a), 0);
  assert_int_equal(vs_fmnist_balanced(lab, n, 10, 100, b), 0);
  assert_memory_equal(a, b, sizeof(int32_t) * 100);
  int per[10] = {0}, first[10] = {0}, spread = 0;
  for (int i = 0; i < 100; i++) {
    per[lab[a[i]]]++;
    first[lab[i]]++;
    if (i) assert_true(a[i] > a[i - 1]);
  }
  for (int k = 0; k < 10; k++) {
    assert_int_equal(per[k], 10);
    spread |= first[k] != 10;
  }
  assert_true(spread); /* the prefix itself is not balanced: the choice matters */
  /* 105: classes 0..4 get 11 */
  assert_int_equal(vs_fmnist_balanced(lab, n, 10, 105, a), 0);
  memset(per, 0, sizeof per);
  for (int i = 0; i < 105; i++) per[lab[a[i]]]++;
  for (int k = 0; k < 10; k++) assert_int_equal(per[k], k < 5 ? 11 : 10);
  free(lab);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/vspec_fmnist_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_load),      cmocka_unit_test(test_generic_dims_and_plain_file),
      cmocka_unit_test(test_wrong_magic),     cmocka_unit_test(test_truncated_data),
      cmocka_unit_test(test_truncated_gzip),  cmocka_unit_test(test_trailing_and_bad_dims),
      cmocka_unit_test(test_split_errors),    cmocka_unit_test(test_input_layout),
      cmocka_unit_test(test_real_dataset),    cmocka_unit_test(test_balanced_choice),
      cmocka_unit_test(test_balanced_real),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
