#include "core/params.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VS_PARAM_KEY_MAX 64
#define VS_PARAM_VALUE_MAX 256

vspec_params *vs_params_new(void) { return calloc(1, sizeof(vspec_params)); }

void vs_params_free(vspec_params *p) { free(p); }

static int pm_key_ok(const char *k) {
  if (!*k) return 0;
  for (; *k; k++)
    if (!(isalnum((unsigned char)*k) || *k == '_' || *k == '.' || *k == '-')) return 0;
  return 1;
}

/* Pair i's key; its value follows the key's NUL. */
static const char *pm_key_at(const vspec_params *p, size_t i) {
  const char *k = p->buf;
  for (; i; i--) k += strlen(k) + 1, k += strlen(k) + 1;
  return k;
}

static const char *params_lookup(const vspec_params *p, const char *key) {
  if (!p) return NULL;
  const char *k = p->buf;
  for (size_t i = 0; i < p->n; i++, k += strlen(k) + 1, k += strlen(k) + 1)
    if (strcmp(k, key) == 0) return k + strlen(k) + 1;
  return NULL;
}

int vs_params_set(vspec_params *p, const char *key, const char *value, char *err, size_t errlen) {
  if (!pm_key_ok(key) || strlen(key) >= VS_PARAM_KEY_MAX) {
    snprintf(err, errlen, "parameter name '%.80s' is not valid (letters, digits, '_', '.', '-'; "
             "at most %d characters)", key, VS_PARAM_KEY_MAX - 1);
    return VSPEC_EINVAL;
  }
  if (strlen(value) >= VS_PARAM_VALUE_MAX) {
    snprintf(err, errlen, "parameter '%s': value longer than %d characters", key,
             VS_PARAM_VALUE_MAX - 1);
    return VSPEC_EINVAL;
  }
  if (params_lookup(p, key)) {
    snprintf(err, errlen, "parameter '%s' given twice", key);
    return VSPEC_EINVAL;
  }
  size_t kn = strlen(key) + 1, vn = strlen(value) + 1;
  if (kn + vn > sizeof p->buf - p->used) {
    snprintf(err, errlen, "parameter '%s': the parameters are too long (at most %zu characters)",
             key, sizeof p->buf - 1);
    return VSPEC_ERANGE;
  }
  memcpy(p->buf + p->used, key, kn);
  memcpy(p->buf + p->used + kn, value, vn);
  p->used += (unsigned)(kn + vn);
  p->n++;
  return VSPEC_OK;
}

static void params_trim(char *s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  size_t i = 0;
  while (s[i] && isspace((unsigned char)s[i])) i++;
  memmove(s, s + i, strlen(s + i) + 1);
}

int vs_params_parse(const char *text, vspec_params **out, char *err, size_t errlen) {
  vspec_params *p = vs_params_new();
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int rc = vs_params_read(text, p, err, errlen);
  if (rc) {
    vs_params_free(p);
    return rc;
  }
  *out = p;
  return VSPEC_OK;
}

int vs_params_read(const char *text, vspec_params *p, char *err, size_t errlen) {
  p->n = p->used = 0;
  const char *s = text ? text : "";
  while (*s) {
    const char *end = strchr(s, ',');
    size_t len = end ? (size_t)(end - s) : strlen(s);
    char item[VS_PARAM_KEY_MAX + VS_PARAM_VALUE_MAX + 2];
    if (len >= sizeof item) {
      snprintf(err, errlen, "parameter '%.40s...' is too long", s);
      return VSPEC_EINVAL;
    }
    memcpy(item, s, len);
    item[len] = 0;
    params_trim(item);
    if (*item) {
      char *eq = strchr(item, '=');
      if (!eq) {
        snprintf(err, errlen, "parameter '%s' has no value (expected key=value)", item);
        return VSPEC_EINVAL;
      }
      *eq = 0;
      char *key = item, *value = eq + 1;
      params_trim(key);
      params_trim(value);
      if (strchr(value, '=')) {
        snprintf(err, errlen, "parameter '%s': value '%s' contains '=' (separate parameters with ',')",
                 key, value);
        return VSPEC_EINVAL;
      }
      int rc = vs_params_set(p, key, value, err, errlen);
      if (rc) return rc;
    }
    s += len;
    if (*s == ',') s++;
  }
  return VSPEC_OK;
}

size_t vs_params_count(const vspec_params *p) { return p ? p->n : 0; }
const char *vs_params_key(const vspec_params *p, size_t i) {
  return i < p->n ? pm_key_at(p, i) : NULL;
}
const char *vs_params_value(const vspec_params *p, size_t i) {
  if (i >= p->n) return NULL;
  const char *k = pm_key_at(p, i);
  return k + strlen(k) + 1;
}

size_t vs_params_format(const vspec_params *p, char *buf, size_t buflen) {
  size_t need = 0;
  if (buflen) buf[0] = 0;
  for (size_t i = 0; p && i < p->n; i++) {
    int w = snprintf(buf ? buf + (need < buflen ? need : buflen) : NULL,
                     need < buflen ? buflen - need : 0, "%s%s=%s", i ? "," : "",
                     vs_params_key(p, i), vs_params_value(p, i));
    need += (size_t)w;
  }
  return need;
}

const char *vs_param_string(const vspec_params *p, const char *key) {
  return params_lookup(p, key);
}

int vs_param_double(const vspec_params *p, const char *key, double def, double lo, double hi,
                    double *out, char *err, size_t errlen) {
  const char *v = params_lookup(p, key);
  if (!v) {
    *out = def;
    return VSPEC_OK;
  }
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || errno == ERANGE || !isfinite(x)) {
    snprintf(err, errlen, "parameter '%s': '%s' is not a number (allowed range [%g, %g])", key, v,
             lo, hi);
    return VSPEC_EINVAL;
  }
  if (x < lo || x > hi) {
    snprintf(err, errlen, "parameter '%s' = %g is out of range: allowed [%g, %g]", key, x, lo, hi);
    return VSPEC_ERANGE;
  }
  *out = x;
  return VSPEC_OK;
}

int vs_param_int(const vspec_params *p, const char *key, long def, long lo, long hi, long *out,
                 char *err, size_t errlen) {
  const char *v = params_lookup(p, key);
  if (!v) {
    *out = def;
    return VSPEC_OK;
  }
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end || errno == ERANGE) {
    snprintf(err, errlen, "parameter '%s': '%s' is not an integer (allowed range [%ld, %ld])", key,
             v, lo, hi);
    return VSPEC_EINVAL;
  }
  if (x < lo || x > hi) {
    snprintf(err, errlen, "parameter '%s' = %ld is out of range: allowed [%ld, %ld]", key, x, lo,
             hi);
    return VSPEC_ERANGE;
  }
  *out = x;
  return VSPEC_OK;
}

int vs_param_choice(const vspec_params *p, const char *key, const char *const *choices, int def,
                    int *out, char *err, size_t errlen) {
  const char *v = params_lookup(p, key);
  if (!v) {
    *out = def;
    return VSPEC_OK;
  }
  for (int i = 0; choices[i]; i++)
    if (strcmp(choices[i], v) == 0) {
      *out = i;
      return VSPEC_OK;
    }
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; choices[i] && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", choices[i]);
  snprintf(err, errlen, "parameter '%s' = '%s' is not allowed: choose one of %s", key, v, list);
  return VSPEC_EINVAL;
}

int vs_param_check_known(const vspec_params *p, const char *const *known, char *err,
                         size_t errlen) {
  for (size_t i = 0; p && i < p->n; i++) {
    int found = 0;
    for (int j = 0; known[j]; j++)
      if (strcmp(known[j], vs_params_key(p, i)) == 0) found = 1;
    if (!found) {
      char list[256] = "";
      size_t used = 0;
      for (int j = 0; known[j] && used < sizeof list; j++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "", known[j]);
      snprintf(err, errlen, "unknown parameter '%s' (known: %s)", vs_params_key(p, i),
               *list ? list : "none");
      return VSPEC_EINVAL;
    }
  }
  return VSPEC_OK;
}
