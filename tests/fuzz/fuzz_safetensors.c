/*
 * Fuzz target: the safetensors reader (core/safetensors.c) on a file's bytes in memory: the
 * header length, the header JSON, dtypes, shapes, the overflow checks and the tiling of the
 * data buffer, then every tensor handed out as vs_st_find and vs_st_get_f32 hand it to a
 * backend.
 *
 * Checks beyond "no crash": what open accepted is what the header promised: each tensor's
 * bytes lie inside the buffer and match its shape and dtype, lookups by name find every
 * tensor, and the float view of each float tensor can be read in full (ASan checks the
 * reads).
 */
#include "tests/fuzz/fuzz.h"

#include "core/safetensors.h"
#include "kernels/vs_kernels.h"
#include "vspec/types.h"

static vspec_dev *dev;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  char err[VSPEC_ERRLEN];
  if (vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err)) {
    fprintf(stderr, "fuzz_safetensors: %s\n", err);
    exit(1);
  }
  return 0;
}

static size_t elem_size(uint32_t dtype) {
  switch (dtype) {
    case VSPEC_DTYPE_F64: case VSPEC_DTYPE_I64: return 8;
    case VSPEC_DTYPE_F32: case VSPEC_DTYPE_I32: return 4;
    case VSPEC_DTYPE_F16: case VSPEC_DTYPE_BF16: case VSPEC_DTYPE_I16: case VSPEC_DTYPE_U16:
      return 2;
    default: return 1;
  }
}

static void check_tensor(vspec_tensor_file *f, const uint8_t *data, size_t size, size_t i) {
  const char *name = vs_st_name(f, i);
  VS_FUZZ_REQUIRE(name, "tensor %zu has no name", i);
  vspec_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  VS_FUZZ_REQUIRE(vs_st_find(f, name, &t) == 0, "tensor '%s' not found by its name", name);
  VS_FUZZ_REQUIRE(t.nbytes == (size_t)t.numel * elem_size(t.dtype), "'%s': %zu bytes for %lld "
                  "elements", name, t.nbytes, (long long)t.numel);
  VS_FUZZ_REQUIRE(t.nbytes <= size, "'%s': %zu bytes in a %zu-byte file", name, t.nbytes, size);
  if (t.dtype != VSPEC_DTYPE_F32 && t.dtype != VSPEC_DTYPE_F16 && t.dtype != VSPEC_DTYPE_BF16)
    return;
  const float *x = NULL;
  char err[VSPEC_ERRLEN];
  VS_FUZZ_REQUIRE(vs_st_get_f32(f, dev, name, t.ndim, t.shape, &x, err, sizeof err) == 0,
                  "'%s': float view refused: %s", name, err);
  volatile float sum = 0;
  for (int64_t k = 0; k < t.numel; k++) sum += x[k];
  (void)sum;
  (void)data;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  vs_fuzz_rss_tick();
  vspec_tensor_file *f = NULL;
  char err[VSPEC_ERRLEN] = "";
  if (vs_st_open_memory(data, size, "fuzz.safetensors", &f, err, sizeof err)) {
    VS_FUZZ_REQUIRE(strstr(err, "fuzz.safetensors"), "the message does not name the file: "
                    "'%s'", err);
    return 0;
  }
  size_t n = vs_st_count(f);
  for (size_t i = 0; i < n; i++) check_tensor(f, data, size, i);
  VS_FUZZ_REQUIRE(vs_st_name(f, n) == NULL, "a name past the last tensor");
  VS_FUZZ_REQUIRE(vs_st_find(f, "\x01 no such tensor", NULL) == VSPEC_ENOENT, "phantom tensor");
  (void)vs_st_meta(f, "model_type");
  vs_st_close(f);
  return 0;
}
