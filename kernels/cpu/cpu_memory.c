/*
 * kernels/cpu/cpu_memory.c - the memory ops of the CPU device: alloc, free, transfers and
 * copies (a transfer is a memcpy here, counted as a GPU's bus transfer would be).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_weights.h"

/* Every allocation is recorded (cpu_weights.h): that is how a linear layer knows its weight
 * is a whole allocation, and how the weight's bf16 copy goes when the weight does. */
static void *tracked_alloc(size_t bytes, int fill) {
  void *p = vs_cpu_block_alloc(bytes, fill);
  if (p && vs_cpu_weights_track(p, bytes) != VSPEC_OK) {
    free(p);
    return NULL;
  }
  return p;
}

/* Memory management is no stream op (not recorded): it runs, and fails a recording open on
 * dev, as allocating inside a CUDA graph capture would. */
void *vs_cpu_alloc(vspec_dev *dev, size_t bytes) {
  if (vs_cpu_recording(dev)) vs_cpu_graph_refuse(dev, "alloc");
  return tracked_alloc(bytes, 0);
}

/* The sanitizer build (make test runs every test in it) fills these blocks with 0xff bytes,
 * a NaN in every float: a read of a place nothing wrote first then spreads NaN into the
 * outputs the golden and statistical tests compare, instead of passing on zeros. */
void *vs_cpu_alloc_uninit(vspec_dev *dev, size_t bytes) {
  if (vs_cpu_recording(dev)) vs_cpu_graph_refuse(dev, "alloc_uninit");
#ifdef VSPEC_SANITIZED
  return tracked_alloc(bytes, 0xff);
#else
  return tracked_alloc(bytes, -1);
#endif
}

void vs_cpu_free(vspec_dev *dev, void *ptr) {
  if (vs_cpu_recording(dev)) vs_cpu_graph_refuse(dev, "free");
  if (!ptr) return;
  vs_cpu_weights_untrack(ptr);
  free(ptr);
}

int vs_cpu_upload(vspec_dev *dev, void *dst, const void *src_host, size_t bytes) {
  VS_CPU_UNRECORDED_RC(dev, "upload", VSPEC_ENOTSUP);
  if (bytes == 0) return VSPEC_OK;
  if (!dst || !src_host) return VSPEC_EINVAL;
  vs_dev_count_transfer(dev, 0, bytes); /* a memcpy here; a bus transfer on a GPU */
  memcpy(dst, src_host, bytes);
  return VSPEC_OK;
}

int vs_cpu_download(vspec_dev *dev, void *dst_host, const void *src, size_t bytes) {
  VS_CPU_UNRECORDED_RC(dev, "download", VSPEC_ENOTSUP);
  if (bytes == 0) return VSPEC_OK;
  if (!dst_host || !src) return VSPEC_EINVAL;
  vs_dev_count_transfer(dev, 1, bytes);
  memcpy(dst_host, src, bytes);
  return VSPEC_OK;
}

int vs_cpu_copy(vspec_dev *dev, void *dst, const void *src, size_t bytes) {
  VS_CPU_UNRECORDED_RC(dev, "copy", VSPEC_ENOTSUP);
  if (bytes == 0) return VSPEC_OK;
  if (!dst || !src) return VSPEC_EINVAL;
  memmove(dst, src, bytes);
  return VSPEC_OK;
}

int vs_cpu_copy3d(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                  size_t src_a, size_t src_b, size_t width, int na, int nb) {
  VS_CPU_UNRECORDED_RC(dev, "copy3d", VSPEC_ENOTSUP);
  if (width == 0 || na <= 0 || nb <= 0) return VSPEC_OK;
  if (!dst || !src) return VSPEC_EINVAL;
  for (int a = 0; a < na; a++)
    for (int b = 0; b < nb; b++)
      memcpy((char *)dst + a * dst_a + b * dst_b, (const char *)src + a * src_a + b * src_b,
             width);
  return VSPEC_OK;
}
