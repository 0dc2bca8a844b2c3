/*
 * kernels/cpu/cpu_dev.c - where the CPU device's memory comes from: malloc's thresholds,
 * weight blocks on huge pages, the blocks of the alloc ops and the two scratch arenas.
 *
 * A leaf of kernels/cpu/: every kernel takes its scratch here and the allocation table
 * (cpu_weights.c) its copies' blocks, so this file calls none of them.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kernels/cpu/cpu_dev.h"

/* Every job opens sessions whose KV caches and work buffers take megabytes, and frees them at
 * its end. With glibc's defaults those blocks are mmap'ed, or trimmed off the heap when freed,
 * so the next job page-faults every page again: on models/fmnist, 100 images of each of three
 * methods took 392 000 minor faults, and speculative decoding, whose jobs open two sessions and
 * run fewer steps, lost a tenth of its speed to them (`vspec-bench eval --no-quality`: Cool-SD
 * 1.37x over AR, 1.55-1.63x with the thresholds below; 26 000 faults; vspecd, whose first
 * job already raised glibc's own threshold, went from 99 to 62 faults per job). Blocks up to
 * 32 MiB now come from the heap, and up to 64 MiB of free heap is kept for the next job
 * (glibc's own dynamic threshold also rises to 32 MiB, but only after the first such block is
 * freed, and it keeps trimming). Larger blocks are still mmap'ed and given back when freed. Process-wide,
 * set once at the first allocation, and not when the user set glibc's own
 * MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_. */
#if defined(__GLIBC__)
static void malloc_keep_job_memory(void) {
  if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_")) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}
#else
static void malloc_keep_job_memory(void) {}
#endif

static pthread_once_t malloc_once = PTHREAD_ONCE_INIT;

/* Blocks of at least this many bytes from vs_cpu_weight_alloc start on a 2 MiB boundary and
 * ask for transparent huge pages (where the kernel's THP mode is "madvise", the common default,
 * nothing else gets them). Decoding streams every weight once per token: with 4 KiB pages one
 * thread's weight stream ran at 20-25 GB/s, with 2 MiB pages at 30-31 GB/s on the AMD EPYC
 * (Zen 4) development machine (docs/BENCHMARKS.md, issue 33 item 4; the hardware prefetcher
 * does not cross a 4 KiB page and each page costs a TLB miss). The alignment gap goes back to
 * malloc's free lists. */
#define VS_CPU_HUGE ((size_t)2 << 20)

void *vs_cpu_weight_alloc(size_t bytes) {
  pthread_once(&malloc_once, malloc_keep_job_memory);
  size_t rounded = vs_align_up(bytes ? bytes : 1);
  if (rounded < bytes) return NULL; /* overflow */
  int huge = rounded >= VS_CPU_HUGE;
  /* posix_memalign: aligned_alloc wants the size a multiple of the alignment */
  void *p = NULL;
  if (posix_memalign(&p, huge ? VS_CPU_HUGE : VS_CPU_ALIGN, rounded) != 0) p = NULL;
#ifdef MADV_HUGEPAGE
  /* before the first touch, which then faults in huge pages; a refusal (THP off, an old
   * kernel) only leaves small pages */
  if (p && huge) (void)madvise(p, rounded / VS_CPU_HUGE * VS_CPU_HUGE, MADV_HUGEPAGE);
#endif
  return p;
}

/* fill: the byte every new block starts with, or -1 to leave it as malloc gives it. Zero-filled
 * blocks (every tensor a model loads comes through vs_cpu_alloc) are weight blocks: the memset
 * touches every page anyway, so huge pages cost no resident memory that small ones would not;
 * an uninitialised block, which may be touched sparsely, keeps small pages. */
void *vs_cpu_block_alloc(size_t bytes, int fill) {
  if (fill == 0) {
    void *p = vs_cpu_weight_alloc(bytes);
    if (p) memset(p, 0, vs_align_up(bytes ? bytes : 1));
    return p;
  }
  pthread_once(&malloc_once, malloc_keep_job_memory);
  /* aligned_alloc wants a multiple of the alignment; a zero-byte request still gets a
   * distinct pointer so that callers can treat NULL as failure only. */
  size_t rounded = vs_align_up(bytes ? bytes : 1);
  if (rounded < bytes) return NULL; /* overflow */
  void *p = aligned_alloc(VS_CPU_ALIGN, rounded);
  if (p && fill > 0) memset(p, fill, rounded);
  return p;
}

int vs_cpu_reserve_scratch(vspec_dev *dev, size_t bytes) {
  if (vs_cpu_recording(dev)) vs_cpu_graph_refuse(dev, "reserve_scratch");
  if (!dev) return VSPEC_EINVAL;
  if (bytes <= dev->scratch_bytes) return VSPEC_OK;
  /* Scratch never carries data from one op to the next, so no copy: free first, which
   * also keeps the peak footprint at the new size. */
  size_t rounded = vs_align_up(bytes);
  if (rounded < bytes) return VSPEC_ENOMEM;
  void *p = aligned_alloc(VS_CPU_ALIGN, rounded);
  if (!p) return VSPEC_ENOMEM;
  free(dev->scratch);
  dev->scratch = p;
  dev->scratch_bytes = rounded;
  dev->scratch_gen++;
  return VSPEC_OK;
}

void *vs_scratch(vspec_dev *dev, size_t bytes) {
  if (bytes > dev->scratch_bytes && vs_cpu_reserve_scratch(dev, bytes) != VSPEC_OK) {
    fprintf(stderr, "vspec: cpu op needs %zu bytes of scratch and growing the arena failed\n",
            bytes);
    abort();
  }
  return dev->scratch;
}

size_t vs_scratch_size(const vspec_dev *dev) { return dev->scratch_bytes; }

void *vs_fused_scratch(vspec_dev *dev, size_t bytes) {
  if (dev->fused && bytes <= dev->fused_bytes) return dev->fused;
  /* Nothing to keep (see cpu_dev.h): free first, as reserve_scratch does. Aligned like
   * alloc's blocks, so that the inner kernels meet temporaries as they meet the buffers of
   * the unfused sequence. */
  free(dev->fused);
  dev->fused = NULL;
  dev->fused_bytes = 0;
  size_t rounded = vs_align_up(bytes ? bytes : 1);
  if (rounded >= bytes) dev->fused = aligned_alloc(VS_CPU_ALIGN, rounded);
  if (!dev->fused) {
    fprintf(stderr, "vspec: a fused cpu op needs %zu bytes of temporaries and growing them "
            "failed\n", bytes);
    abort();
  }
  dev->fused_bytes = rounded;
  return dev->fused;
}
