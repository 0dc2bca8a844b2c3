/*
 * kernels/cpu/cpu_dev.c - CPU device context: memory, copies, scratch arena.
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
#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_threads.h"
#include "kernels/cpu/cpu_weights.h"

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
static void *aligned_fill_alloc(size_t bytes, int fill) {
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

/* Every allocation is recorded (cpu_weights.h): that is how a linear layer knows its weight
 * is a whole allocation, and how the weight's bf16 copy goes when the weight does. */
static void *tracked_alloc(size_t bytes, int fill) {
  void *p = aligned_fill_alloc(bytes, fill);
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

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* threads = 0: one compute thread per online core (what "all cores" means to the CLIs). */
static int online_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > 256 ? 256 : (int)n);
}

/* The best instruction set of this CPU, capped by VSPEC_CPU_ISA=scalar|avx2|avx512: a way
 * to measure or reproduce the AVX2 and portable paths on an AVX-512 machine without a
 * rebuild. An unknown or unsupported value is ignored. */
static int default_isa(void) {
  int isa = vs_isa_best();
  const char *env = getenv("VSPEC_CPU_ISA");
  if (env && *env) {
    for (int i = VS_ISA_SCALAR; i <= VS_ISA_AVX512; i++)
      if (strcmp(env, vs_isa_name(i)) == 0 && i < isa) isa = i;
  }
  return isa;
}

static int cpu_count(char *err, size_t errlen) { return 1; }

static int cpu_open(const vs_device_options *opt, vspec_dev **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (!opt || !out || opt->threads < 0) {
    set_err(err, errlen, "cpu device: bad argument");
    return VSPEC_EINVAL;
  }
  if (opt->index != 0) {
    snprintf(err, errlen, "cpu device %d does not exist: the CPU is device 0", opt->index);
    return VSPEC_ERANGE;
  }
  int amx = default_isa() == VS_ISA_AVX512 && vs_amx_available();
  if (opt->precision == VS_PRECISION_BF16 && !amx && default_isa() < VS_ISA_AVX2) {
    set_err(err, errlen, "cpu device: precision bf16 needs AVX2 (or AMX tiles), which this "
            "CPU lacks (or VSPEC_CPU_ISA turned off): use fp32");
    return VSPEC_ENOTSUP;
  }
  vspec_dev *dev = calloc(1, sizeof *dev);
  if (!dev) {
    set_err(err, errlen, "cpu device: out of memory");
    return VSPEC_ENOMEM;
  }
  dev->head.cls = vs_cpu_device_class();
  dev->head.ops = vs__counted_ops(dev->head.cls);
  dev->threads = opt->threads ? opt->threads : online_cores();
  dev->isa = default_isa();
  dev->skinny_max_m = vs_skinny_max_m(dev->isa, vs_blis_tuned());
  dev->precision = opt->precision == VS_PRECISION_BF16 ? VS_PRECISION_BF16 : VS_PRECISION_FP32;
  dev->amx = amx;
  dev->amx_int8 = amx && vs_amx8_available();
  if (vs_cpu_reserve_scratch(dev, VS_CPU_SCRATCH_DEFAULT) != VSPEC_OK) {
    free(dev);
    set_err(err, errlen, "cpu device: cannot allocate the scratch arena");
    return VSPEC_ENOMEM;
  }
  if (dev->threads > 1 && !(dev->pool = vs_pool_create(dev->threads))) {
    free(dev->scratch);
    free(dev);
    set_err(err, errlen, "cpu device: cannot start the compute threads");
    return VSPEC_ENOMEM;
  }
  *out = dev;
  return VSPEC_OK;
}

static void cpu_close(vspec_dev *dev) {
  if (!dev) return;
  if (dev->rec) { /* a recording left open: end it, dropping what it recorded */
    vspec_graph *g;
    if (vs_cpu_graph_end(dev, &g) == VSPEC_OK) vs_cpu_graph_free(dev, g);
  }
  vs_pool_destroy(dev->pool);
  free(dev->scratch);
  free(dev->fused);
  free(dev);
}

static int cpu_info(vspec_dev *dev, vs_device_info *out) {
  out->kind = VSPEC_DEVICE_CPU;
  out->index = 0;
  snprintf(out->name, sizeof out->name, "cpu (%s%s, %d thread%s)", vs_isa_name(dev->isa),
           dev->precision != VS_PRECISION_BF16 ? "" : dev->amx ? "+amx" : "+bf16",
           dev->threads,
           dev->threads == 1 ? "" : "s");
  out->precision = dev->precision;
  return VSPEC_OK;
}

/* CPU ops that fail abort (vs_scratch) or return their error; nothing is left pending. */
static int cpu_check(vspec_dev *dev, char *err, size_t errlen) { return VSPEC_OK; }

static const vs_device_class cpu_class = {
    .struct_size = sizeof(vs_device_class),
    .version = VS_DEVICE_CLASS_VERSION,
    .name = "cpu",
    .kind = VSPEC_DEVICE_CPU,
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .info = cpu_info,
    .check = cpu_check,
    .sync = NULL,        /* CPU ops are done when they return */
    .alloc_error = NULL, /* the C library's malloc says nothing more */
};

const vs_device_class *vs_cpu_device_class(void) {
  /* .ops is filled here rather than in the initialiser: vs_cpu_ops() is not a constant
   * expression. The table is the same object every time, so the race is benign. */
  static vs_device_class cls;
  if (!cls.ops) {
    cls = cpu_class;
    cls.ops = vs_cpu_ops();
  }
  return &cls;
}

int vs_dev_create(const vspec_ops *ops, int threads, vspec_dev **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (!ops || !out || threads < 0) {
    set_err(err, errlen, "vs_dev_create: bad argument");
    return VSPEC_EINVAL;
  }
  if (ops != vs_cpu_ops()) {
    set_err(err, errlen, "vs_dev_create: only the CPU device is created this way; open other "
            "devices with vs_device_open");
    return VSPEC_ENOTSUP;
  }
  vs_device_options opt = {.threads = threads};
  return cpu_open(&opt, out, err, errlen);
}
