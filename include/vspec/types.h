/*
 * vspec/types.h - status codes and small value types shared by the host and plugins.
 *
 * Part of the public plugin ABI: a third-party plugin compiles against include/vspec/
 * alone. Everything here is plain C11 with fixed-width integers; no host internals.
 */
#ifndef VSPEC_TYPES_H
#define VSPEC_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: 0 is success, errors are negative (libuv style). The numeric values of
 * the errno-like codes match Linux errno so that logs are familiar; the vspec-specific
 * ones live below -1000. Never renumber: plugins compare against these values. */
typedef enum vspec_status {
  VSPEC_OK = 0,
  VSPEC_ENOENT = -2,     /* file, tensor, plugin or key not found */
  VSPEC_EIO = -5,        /* read/write/mmap failure */
  VSPEC_ENOMEM = -12,    /* allocation failed */
  VSPEC_EBUSY = -16,     /* queue full, resource in use */
  VSPEC_EINVAL = -22,    /* bad argument or parameter value */
  VSPEC_ERANGE = -34,    /* value outside the allowed range */
  VSPEC_ENOTSUP = -95,   /* operation not supported by this plugin/device */
  VSPEC_ECANCELED = -125,
  VSPEC_EABI = -1001,    /* plugin ABI mismatch */
  VSPEC_EFORMAT = -1002, /* malformed file or message */
  VSPEC_ESHAPE = -1003,  /* tensor has the wrong shape or dtype */
  VSPEC_EPLUGIN = -1004, /* plugin failed to load or misbehaved */
  VSPEC_EDEVICE = -1005  /* device (GPU) error */
} vspec_status;

/* Size of the caller-provided error buffers passed across the ABI. A callee writes a
 * NUL-terminated message of at most errlen bytes; it never allocates the message. */
#define VSPEC_ERRLEN 512

/* True when a struct that starts with uint32_t struct_size includes `field` (every table
 * and vtable of the ABI: check before touching a field added in a later minor version). */
#define VSPEC_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* Log levels for vspec_host.log. */
typedef enum vspec_log_level {
  VSPEC_LOG_ERROR = 0,
  VSPEC_LOG_WARN = 1,
  VSPEC_LOG_INFO = 2,
  VSPEC_LOG_DEBUG = 3
} vspec_log_level;

/* Counter-based RNG state (Philox4x32-10). A stream is identified by (seed, stream id);
 * draws are a pure function of (seed, stream, counter), so the same job seed gives the
 * same image whatever the thread count. Treat the fields as opaque; use the host's RNG
 * services (kernels/common/vs_philox.h implements them). */
typedef struct vspec_rng {
  uint32_t key[2];     /* from the seed */
  uint32_t ctr[4];     /* ctr[0..1] draw counter, ctr[2..3] stream id */
  uint32_t buf[4];     /* last block */
  uint32_t used;       /* words of buf already consumed (4 = empty) */
} vspec_rng;

/* Opaque key=value parameter set (a rule's "k=100,delta=0.2", a backend's options).
 * Read it with the parameter functions of vspec_host. */
typedef struct vspec_params vspec_params;

#ifdef __cplusplus
}
#endif
#endif /* VSPEC_TYPES_H */
