/*
 * core/status.h - status codes as text, and the one way to fail with a message.
 *
 * Every layer above kernels/ (core, proto, clients, daemon, bench) reports an error the same
 * way: a negative VSPEC_* status (include/vspec/types.h) and a message in the caller's
 * (err, errlen) buffer. vs_fail does both in one statement, so no file needs its own copy.
 */
#ifndef VS_STATUS_H
#define VS_STATUS_H

#include <stddef.h>

#include "vspec/types.h"

/* A short message for a status code, libuv's uv_strerror style: "not found", "I/O error",
 * ...; "success" for VSPEC_OK, "unknown status N" for a code not in vspec_status (that text
 * lives in a buffer per thread: valid until the thread's next call with an unknown code). */
const char *vspec_strerror(int status);

/* Writes the formatted message into err (when err is not NULL and errlen > 0, truncating as
 * snprintf does) and returns `status`, so that a failure is one line:
 *   return vs_fail(err, errlen, VSPEC_EFORMAT, "%s: header is %s", path, what); */
int vs_fail(char *err, size_t errlen, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* VS_STATUS_H */
