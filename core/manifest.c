#include "core/manifest.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/models.h"
#include "core/params.h"
#include "core/text.h"

/* A manifest is a few hundred bytes; anything near this is not one. */
#define VS_MANIFEST_MAX_BYTES (1 << 20)

/* An integer setting: JSON 3 or 3.0 within [lo, hi]. Converting a double outside int's range
 * is undefined behaviour, so the range is checked on the double. */
static int mf_int_key(json_t *v, const char *key, long lo, long hi, int *out, const char *path,
                       char *err, size_t errlen) {
  double x = json_number_value(v);
  if (!json_is_number(v) || x != floor(x) || x < (double)lo || x > (double)hi) {
    snprintf(err, errlen, "%s: defaults.%s must be an integer in [%ld, %ld]", path, key, lo, hi);
    return VSPEC_EFORMAT;
  }
  *out = (int)x;
  return VSPEC_OK;
}

static int mf_float_key(json_t *v, const char *key, float *out, const char *path, char *err,
                         size_t errlen) {
  double x = json_number_value(v);
  if (!json_is_number(v) || !isfinite(x) || fabs(x) > FLT_MAX) {
    snprintf(err, errlen, "%s: defaults.%s must be a number", path, key);
    return VSPEC_EFORMAT;
  }
  *out = (float)x;
  return VSPEC_OK;
}

/* The "defaults" object; unknown keys are errors so that a typo is not silently ignored.
 * Ranges that depend on the model (top_k against the vocabulary) are the engine's check. */
static int mf_read_defaults(json_t *d, vs_sampling *s, const char *path, char *err,
                             size_t errlen) {
  if (!json_is_object(d)) {
    snprintf(err, errlen, "%s: \"defaults\" must be an object", path);
    return VSPEC_EFORMAT;
  }
  const char *key;
  json_t *v;
  json_object_foreach(d, key, v) {
    int rc;
    if (strcmp(key, "cfg_schedule") == 0) {
      const char *sv = json_string_value(v);
      if (sv && strcmp(sv, "linear") == 0) s->cfg_schedule = VS_CFG_LINEAR;
      else if (sv && strcmp(sv, "constant") == 0) s->cfg_schedule = VS_CFG_CONSTANT;
      else {
        snprintf(err, errlen, "%s: defaults.cfg_schedule must be \"linear\" or \"constant\"",
                 path);
        return VSPEC_EFORMAT;
      }
      continue;
    }
    if (strcmp(key, "temperature") == 0) rc = mf_float_key(v, key, &s->temperature, path, err, errlen);
    else if (strcmp(key, "top_p") == 0) rc = mf_float_key(v, key, &s->top_p, path, err, errlen);
    else if (strcmp(key, "cfg_scale") == 0) rc = mf_float_key(v, key, &s->cfg_scale, path, err, errlen);
    else if (strcmp(key, "top_k") == 0) rc = mf_int_key(v, key, 0, 1 << 30, &s->top_k, path, err, errlen);
    else if (strcmp(key, "cfg_interval") == 0)
      rc = mf_int_key(v, key, -1, 1 << 30, &s->cfg_interval, path, err, errlen);
    else if (strcmp(key, "num_iter") == 0)
      rc = mf_int_key(v, key, 0, 1 << 30, &s->num_iter, path, err, errlen);
    else {
      snprintf(err, errlen, "%s: unknown key defaults.%.64s (known: temperature, top_k, top_p, "
               "cfg_scale, cfg_interval, num_iter, cfg_schedule)", path, key);
      return VSPEC_EFORMAT;
    }
    if (rc) return rc;
  }
  return VSPEC_OK;
}

/* One role key other than backend and the weights, as a backend parameter. Files (values
 * naming a .safetensors) get the directory in front. The backend reads the parameters back
 * from "k=v,k=v" text with surrounding blanks trimmed, so a value with ',' or '=' or with
 * blanks at either end would come back as something else: refused. */
static int mf_role_param(vspec_params *p, const char *role, const char *key, const char *s,
                          const char *dir, const char *path, char *err, size_t errlen) {
  char value[2048], inner[VSPEC_ERRLEN];
  int is_file = strstr(s, ".safetensors") != NULL;
  size_t n = (size_t)snprintf(value, sizeof value, "%s%s%s", is_file ? dir : "",
                              is_file ? "/" : "", s);
  if (n >= sizeof value) {
    snprintf(err, errlen, "%s: %s.%.64s: the path is too long", path, role, key);
    return VSPEC_EFORMAT;
  }
  if (strpbrk(value, ",=") ||
      (n && ((unsigned char)value[0] <= ' ' || (unsigned char)value[n - 1] <= ' '))) {
    snprintf(err, errlen, "%s: %s.%.64s = '%.80s': a parameter value cannot contain ',' or '=' "
             "or start or end with a blank", path, role, key, value);
    return VSPEC_EFORMAT;
  }
  int rc = vs_params_set(p, key, value, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "%s: %s: %s", path, role, inner);
  return rc == VSPEC_ENOMEM ? rc : rc ? VSPEC_EFORMAT : VSPEC_OK;
}

/* The role object {"backend": ..., "gpt" or "weights": ..., other keys: parameters}. */
static int mf_read_role(json_t *obj, const char *role, const char *dir, const char *path,
                         vs_manifest_role *r, char *err, size_t errlen) {
  if (!json_is_object(obj)) {
    snprintf(err, errlen, "%s: \"%s\" must be an object", path, role);
    return VSPEC_EFORMAT;
  }
  const char *backend = json_string_value(json_object_get(obj, "backend"));
  if (!backend || !*backend || strlen(backend) >= sizeof r->backend) {
    snprintf(err, errlen, "%s: \"%s\" has no \"backend\" (a plugin name)", path, role);
    return VSPEC_EFORMAT;
  }
  snprintf(r->backend, sizeof r->backend, "%s", backend);
  snprintf(r->weights, sizeof r->weights, "-");
  vspec_params *p = vs_params_new();
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int rc = VSPEC_OK, has_weights = 0;
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    if (strcmp(key, "backend") == 0) continue;
    const char *s = json_string_value(v);
    char text[64];
    if (!s) {
      if (!json_is_number(v)) {
        snprintf(err, errlen, "%s: %s.%.64s must be a string or a number", path, role, key);
        rc = VSPEC_EFORMAT;
        break;
      }
      snprintf(text, sizeof text, "%g", json_number_value(v));
      s = text;
    }
    if (strcmp(key, "gpt") == 0 || strcmp(key, "weights") == 0) {
      if (has_weights++) {
        snprintf(err, errlen, "%s: \"%s\" names its weights twice (gpt and weights)", path, role);
        rc = VSPEC_EFORMAT;
        break;
      }
      if ((size_t)snprintf(r->weights, sizeof r->weights, "%s/%s", dir, s) >= sizeof r->weights) {
        snprintf(err, errlen, "%s: %s.%s: the path is too long", path, role, key);
        rc = VSPEC_EFORMAT;
        break;
      }
      continue;
    }
    if ((rc = mf_role_param(p, role, key, s, dir, path, err, errlen))) break;
  }
  if (!rc && vs_params_format(p, r->params, sizeof r->params) >= sizeof r->params) {
    snprintf(err, errlen, "%s: \"%s\" parameters are too long", path, role);
    rc = VSPEC_EFORMAT;
  }
  vs_params_free(p);
  if (!rc) r->present = 1;
  return rc;
}

/* Class names can be typed for --class (vspec-bench) and are shown in status and on the
 * demo grid: short, printable, not a number, and one name for one class. */
static int mf_class_name_ok(json_t *v, int i, const char *path, char *err, size_t errlen) {
  const char *s = json_string_value(v);
  size_t n = s ? json_string_length(v) : 0;
  const char *why = NULL;
  if (!s) why = "is not a string";
  else if (n == 0 || n >= VS_CLASS_NAME_MAX) why = "must be 1-63 bytes long";
  else if (strlen(s) != n || vs_text_clean_prefix(s, n) != n)
    why = "is not UTF-8 text without control characters";
  else if (s[0] == ' ' || s[n - 1] == ' ') why = "starts or ends with a blank";
  else if (strspn(s, "0123456789") == n) why = "is a number (--class takes numbers as labels)";
  if (!why) return VSPEC_OK;
  snprintf(err, errlen, "%s: class_names[%d] %s", path, i, why);
  return VSPEC_EFORMAT;
}

static int mf_casecmp_ptr(const void *a, const void *b) {
  return strcasecmp(*(char *const *)a, *(char *const *)b);
}

/* Two names for one class (letter case ignored) in names[0..n), or 0; *dup gets one. */
static int mf_duplicate(char **names, int n, const char **dup) {
  char **sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) return VSPEC_ENOMEM;
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, mf_casecmp_ptr);
  int found = 0;
  for (int i = 1; i < n && !found; i++)
    if (!strcasecmp(sorted[i - 1], sorted[i])) {
      *dup = sorted[i];
      found = 1;
    }
  free(sorted);
  return found;
}

/* "class_names": an array of names, checked, into one allocation (pointers, then text). */
static int mf_read_class_names(json_t *a, vs_manifest *m, const char *path, char *err,
                                size_t errlen) {
  int n = json_is_array(a) ? (int)json_array_size(a) : -1;
  if (n <= 0) {
    snprintf(err, errlen, "%s: \"class_names\" must be a non-empty array of strings, one per "
             "class label", path);
    return VSPEC_EFORMAT;
  }
  size_t bytes = (size_t)n * sizeof(char *);
  for (int i = 0; i < n; i++) {
    json_t *v = json_array_get(a, (size_t)i);
    int rc = mf_class_name_ok(v, i, path, err, errlen);
    if (rc) return rc;
    bytes += json_string_length(v) + 1;
  }
  char **names = malloc(bytes);
  if (!names) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  char *text = (char *)(names + n);
  for (int i = 0; i < n; i++) {
    json_t *v = json_array_get(a, (size_t)i);
    names[i] = text;
    memcpy(text, json_string_value(v), json_string_length(v) + 1);
    text += json_string_length(v) + 1;
  }
  const char *dup = NULL;
  int rc = mf_duplicate(names, n, &dup);
  if (rc == 1)
    snprintf(err, errlen, "%s: class_names has '%s' twice (letter case aside): a name must say "
             "which class it is", path, dup);
  else if (rc)
    snprintf(err, errlen, "out of memory");
  if (rc) {
    free(names);
    return rc == 1 ? VSPEC_EFORMAT : rc;
  }
  m->class_names = names;
  m->n_class_names = n;
  return VSPEC_OK;
}

void vs_manifest_free(vs_manifest *m) {
  free(m->class_names);
  m->class_names = NULL;
  m->n_class_names = 0;
}

int vs_manifest_parse(const char *text, size_t len, const char *dir, const char *path,
                      const vs_sampling *base, unsigned roles, vs_manifest *m, char *err,
                      size_t errlen) {
  memset(m, 0, sizeof *m);
  m->defaults = *base;
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root || !json_is_object(root)) {
    snprintf(err, errlen, "%s: %s (line %d)", path, root ? "not a JSON object" : je.text,
             root ? 1 : je.line);
    json_decref(root);
    return VSPEC_EFORMAT;
  }
  int rc = VSPEC_OK;
  json_t *name = json_object_get(root, "name");
  if (name && (!json_is_string(name) || json_string_length(name) >= sizeof m->name)) {
    snprintf(err, errlen, "%s: \"name\" must be a string of at most %zu characters", path,
             sizeof m->name - 1);
    rc = VSPEC_EFORMAT;
    goto out;
  }
  if (name) snprintf(m->name, sizeof m->name, "%s", json_string_value(name));
  json_t *d = json_object_get(root, "defaults");
  if (d && (rc = mf_read_defaults(d, &m->defaults, path, err, errlen))) goto out;
  json_t *cn = json_object_get(root, "class_names");
  if (cn && (rc = mf_read_class_names(cn, m, path, err, errlen))) goto out;
  static const struct {
    unsigned bit;
    const char *key;
    size_t off;
  } role_keys[] = {{VS_ROLE_TARGET, "target", offsetof(vs_manifest, target)},
                   {VS_ROLE_DRAFT, "draft", offsetof(vs_manifest, draft)},
                   {VS_ROLE_EAGLE, "eagle", offsetof(vs_manifest, eagle)}};
  for (size_t i = 0; i < sizeof role_keys / sizeof role_keys[0]; i++) {
    if (!(roles & role_keys[i].bit)) continue;
    json_t *obj = json_object_get(root, role_keys[i].key);
    vs_manifest_role *r = (vs_manifest_role *)((char *)m + role_keys[i].off);
    if (!obj && role_keys[i].bit == VS_ROLE_TARGET) {
      snprintf(err, errlen, "%s: no \"target\" model", path);
      rc = VSPEC_EFORMAT;
      goto out;
    }
    if (obj && (rc = mf_read_role(obj, role_keys[i].key, dir, path, r, err, errlen))) goto out;
  }
out:
  json_decref(root);
  if (rc) vs_manifest_free(m);
  return rc;
}

int vs_manifest_read(const char *dir, const vs_sampling *base, unsigned roles, vs_manifest *m,
                     char *err, size_t errlen) {
  memset(m, 0, sizeof *m); /* nothing to free, whatever fails */
  char path[2048];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, VS_MANIFEST_FILE) >= sizeof path) {
    snprintf(err, errlen, "model directory path is too long");
    return VSPEC_EINVAL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
    return e == ENOENT ? VSPEC_ENOENT : VSPEC_EIO;
  }
  char *text = malloc(VS_MANIFEST_MAX_BYTES + 1);
  size_t n = text ? fread(text, 1, VS_MANIFEST_MAX_BYTES + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  int rc;
  if (!text) {
    snprintf(err, errlen, "out of memory");
    rc = VSPEC_ENOMEM;
  } else if (bad) {
    snprintf(err, errlen, "%s: read failed", path);
    rc = VSPEC_EIO;
  } else if (n > VS_MANIFEST_MAX_BYTES) {
    snprintf(err, errlen, "%s: larger than %d bytes: not a manifest", path,
             VS_MANIFEST_MAX_BYTES);
    rc = VSPEC_EFORMAT;
  } else {
    rc = vs_manifest_parse(text, n, dir, path, base, roles, m, err, errlen);
  }
  free(text);
  return rc;
}
