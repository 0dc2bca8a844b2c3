/*
 * plugins/backend/llamagen/lg_meta.c - hyper-parameters read from a checkpoint's metadata
 * (lg_internal.h). A leaf: the loaders of llamagen.c and gpt.c use it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lg_internal.h"

int lg_meta_int(vspec_model *m, vspec_tensor_file *f, const char *key, long def, long *out,
                char *err, size_t errlen) {
  const char *v = m->host->tensors_meta(f, key);
  if (!v || !*v || strcmp(v, "none") == 0 || strcmp(v, "None") == 0 || strcmp(v, "null") == 0) {
    *out = def;
    return VSPEC_OK;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end || errno) {
    snprintf(err, errlen, "metadata '%s' = '%s' is not an integer", key, v);
    return VSPEC_EFORMAT;
  }
  *out = x;
  return VSPEC_OK;
}

int lg_meta_double(vspec_model *m, vspec_tensor_file *f, const char *key, double def, double *out,
                   char *err, size_t errlen) {
  const char *v = m->host->tensors_meta(f, key);
  if (!v || !*v || strcmp(v, "none") == 0 || strcmp(v, "None") == 0) {
    *out = def;
    return VSPEC_OK;
  }
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || errno) {
    snprintf(err, errlen, "metadata '%s' = '%s' is not a number", key, v);
    return VSPEC_EFORMAT;
  }
  *out = x;
  return VSPEC_OK;
}
