/*
 * core/params.h - key=value parameter sets handed to plugins (vspec_params).
 *
 * Text form: "k=100,delta=0.2". Keys are [A-Za-z0-9_.-]+, values anything but ',' and
 * '='. A key given twice is an error (a typo would otherwise silently win or lose).
 */
#ifndef VS_PARAMS_H
#define VS_PARAMS_H

#include "vspec/types.h"

/* The bytes of a set's keys and values, each with its NUL: room for the longest text a set is
 * read from (a model role's parameters, core/manifest.h, 4095 characters). */
#define VS_PARAMS_BYTES 4096

/* One fixed block that owns no memory, so that a set is copied by assigning it: a vs_method
 * holds its plugins' sets by value and is copied as freely (core/method.h). Plugins see the
 * type only by pointer (include/vspec/types.h). A zeroed set is empty. */
struct vspec_params {
  unsigned n, used;
  char buf[VS_PARAMS_BYTES]; /* "key\0value\0" for each of the n pairs, in their order */
};

vspec_params *vs_params_new(void);
void vs_params_free(vspec_params *p);
/* Parses `text` (NULL or "" = empty set) into a new set. */
int vs_params_parse(const char *text, vspec_params **out, char *err, size_t errlen);
/* The same into `out`, which the caller holds: emptied first, and on a failure holding the
 * pairs before the one that failed. */
int vs_params_read(const char *text, vspec_params *out, char *err, size_t errlen);
int vs_params_set(vspec_params *p, const char *key, const char *value, char *err, size_t errlen);
size_t vs_params_count(const vspec_params *p);
const char *vs_params_key(const vspec_params *p, size_t i);
const char *vs_params_value(const vspec_params *p, size_t i);
/* Canonical text form "a=1,b=2" into buf; returns the length it needs. */
size_t vs_params_format(const vspec_params *p, char *buf, size_t buflen);

/* The getters of vspec_host (see include/vspec/plugin.h for their contracts). */
int vs_param_double(const vspec_params *p, const char *key, double def, double lo, double hi,
                    double *out, char *err, size_t errlen);
int vs_param_int(const vspec_params *p, const char *key, long def, long lo, long hi, long *out,
                 char *err, size_t errlen);
int vs_param_choice(const vspec_params *p, const char *key, const char *const *choices, int def,
                    int *out, char *err, size_t errlen);
const char *vs_param_string(const vspec_params *p, const char *key);
int vs_param_check_known(const vspec_params *p, const char *const *known, char *err,
                         size_t errlen);

#endif /* VS_PARAMS_H */
