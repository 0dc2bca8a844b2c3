/*
 * core/safetensors.h - safetensors reader behind the tensors_* entries of vspec_host.
 *
 * The file is read whole into private, read-only anonymous memory at open, never mapped:
 * a model file truncated or rewritten in place while loaded (`cp new old`) cannot crash
 * the process with SIGBUS or change the weights under running jobs (docs/RELIABILITY.md).
 * A file that changes while it is being read is refused; opens of the same unchanged file
 * share one copy (a target and the EAGLE head that reads its embeddings). The header is
 * validated in full
 * at open (format: safetensors.c; checks: safetensors_header.c), so later lookups can trust every
 * offset. Tensor data are handed out as pointers into that memory; vs_st_get_f32 copies
 * only when it has to (F16/BF16, a misaligned F32 tensor, or a non-CPU device), and the
 * copies live until vs_st_close.
 *
 * Threading: open/find/meta/name/count are read-only after open and may be called from
 * several threads at once. vs_st_get_f32 fills a per-file cache and must not race with
 * itself on one file. Every device passed to vs_st_get_f32 must outlive the file, because
 * vs_st_close frees the device copies on it.
 */
#ifndef VS_SAFETENSORS_H
#define VS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "vspec/plugin.h"

/* Largest header the reference reader accepts (safetensors MAX_HEADER_SIZE). */
#define VS_ST_MAX_HEADER 100000000ull

/* Opens and validates `path`; also reads config.json beside it when there is one.
 * Returns 0, or a negative vspec_status with a message naming the file (and the tensor or
 * field at fault) in err. */
int vs_st_open(const char *path, vspec_tensor_file **out, char *err, size_t errlen);
/* The same checks on a file's bytes already in memory (`len` bytes at `buf`, copied; `name`
 * stands for the path in messages and vs_st_path). No config.json is read: a buffer has no
 * directory. For the fuzzer (tests/fuzz/fuzz_safetensors.c) and tools. */
int vs_st_open_memory(const void *buf, size_t len, const char *name, vspec_tensor_file **out,
                      char *err, size_t errlen);
/* NULL is a no-op. Frees every device copy made by vs_st_get_f32. */
void vs_st_close(vspec_tensor_file *f);

const char *vs_st_path(const vspec_tensor_file *f);
/* Number of tensors (the __metadata__ entry is not a tensor). */
size_t vs_st_count(const vspec_tensor_file *f);
/* Name of tensor i, tensors ordered by their data offsets; NULL when i is out of range. */
const char *vs_st_name(const vspec_tensor_file *f, size_t i);

/* Value of `key` from __metadata__, else from config.json beside the file (non-string
 * JSON values as compact JSON text: 10 -> "10", [1,2] -> "[1,2]"); NULL if absent. The
 * string lives as long as the file. */
const char *vs_st_meta(const vspec_tensor_file *f, const char *key);

/* Raw view of tensor `name` (any dtype). Returns 0 and fills *out (all of it, struct_size
 * included) or VSPEC_ENOENT. out may be NULL to test for presence. */
int vs_st_find(const vspec_tensor_file *f, const char *name, vspec_tensor *out);

/* Tensor `name` as float32 memory of `dev`, owned by the file. ndim/shape give the
 * expected shape; shape[i] < 0 matches any size. F32, F16 and BF16 are accepted. */
int vs_st_get_f32(vspec_tensor_file *f, vspec_dev *dev, const char *name, int ndim,
                  const int64_t *shape, const float **out, char *err, size_t errlen);

#endif /* VS_SAFETENSORS_H */
