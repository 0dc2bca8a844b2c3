/*
 * core/status.c - vspec_strerror and vs_fail (core/status.h).
 */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *vspec_strerror(int status) {
  switch ((vspec_status)status) {
    case VSPEC_OK: return "success";
    case VSPEC_ENOENT: return "not found";
    case VSPEC_EIO: return "I/O error";
    case VSPEC_ENOMEM: return "out of memory";
    case VSPEC_EBUSY: return "busy";
    case VSPEC_EINVAL: return "invalid argument";
    case VSPEC_ERANGE: return "value out of range";
    case VSPEC_ENOTSUP: return "not supported";
    case VSPEC_ECANCELED: return "cancelled";
    case VSPEC_EABI: return "plugin ABI mismatch";
    case VSPEC_EFORMAT: return "malformed file or message";
    case VSPEC_ESHAPE: return "wrong shape or dtype";
    case VSPEC_EPLUGIN: return "plugin failed";
    case VSPEC_EDEVICE: return "device error";
  }
  /* Not a switch default: -Wswitch then names a code added to vspec_status but not here. */
  static _Thread_local char unknown[32];
  snprintf(unknown, sizeof unknown, "unknown status %d", status);
  return unknown;
}

int vs_fail(char *err, size_t errlen, int status, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return status;
}
