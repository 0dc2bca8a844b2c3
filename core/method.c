#include "core/method.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "core/names.h"
#include "core/text.h"
#include "vspec/types.h"

/* Copies src[0..len) without surrounding blanks; fails (-1) rather than truncate. */
static int vs__trim_copy(char *dst, size_t n, const char *src, size_t len) {
  while (len && isspace((unsigned char)*src)) src++, len--;
  while (len && isspace((unsigned char)src[len - 1])) len--;
  if (len >= n) {
    dst[0] = 0;
    return -1;
  }
  memcpy(dst, src, len);
  dst[len] = 0;
  return 0;
}

/* "NAME[:PARAMS]" */
static int vs__name_params(const char *s, size_t len, char *name, size_t nn, char *params,
                           size_t pn, const char *what, char *err, size_t errlen) {
  const char *colon = memchr(s, ':', len);
  size_t name_len = colon ? (size_t)(colon - s) : len;
  if (vs__trim_copy(name, nn, s, name_len) ||
      (colon && vs__trim_copy(params, pn, colon + 1, len - name_len - 1))) {
    snprintf(err, errlen, "method: %s name or parameters too long (at most %zu characters)",
             what, pn - 1);
    return VSPEC_EINVAL;
  }
  if (!colon) params[0] = 0;
  if (!*name) {
    snprintf(err, errlen, "method: missing %s name", what);
    return VSPEC_EINVAL;
  }
  char inner[VSPEC_ERRLEN];
  if (vs_name_check(&vs_name_plugin, what, name, inner, sizeof inner)) {
    snprintf(err, errlen, "method: %s", inner);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

int vs_method_parse(const char *text, vs_method *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  char t[1100], q[80];
  /* Methods come from clients and config files and are echoed in messages, logs and events:
   * only the characters of the method syntax get in (core/names.h). */
  if (vs_name_check(&vs_name_method, "method", text, err, errlen)) return VSPEC_EINVAL;
  if (vs__trim_copy(t, sizeof t, text, strlen(text))) {
    snprintf(err, errlen, "method is too long (at most %zu characters)", sizeof t - 1);
    return VSPEC_EINVAL;
  }
  if (strcmp(t, "ar") == 0) {
    out->kind = VS_METHOD_AR;
    snprintf(out->text, sizeof out->text, "ar");
    return VSPEC_OK;
  }
  if (strncmp(t, "sd:", 3) != 0) {
    snprintf(err, errlen, "method %s is not known: use 'ar' or 'sd:RULE[:PARAMS][@SCHED[:PARAMS]]'",
             vs_text_quote(q, sizeof q, t, strlen(t)));
    return VSPEC_EINVAL;
  }
  out->kind = VS_METHOD_SD;
  const char *body = t + 3, *at = strchr(body, '@');
  size_t rule_len = at ? (size_t)(at - body) : strlen(body);
  int rc = vs__name_params(body, rule_len, out->rule, sizeof out->rule, out->rule_params,
                           sizeof out->rule_params, "acceptance rule", err, errlen);
  if (rc) return rc;
  if (at) {
    rc = vs__name_params(at + 1, strlen(at + 1), out->sched, sizeof out->sched,
                         out->sched_params, sizeof out->sched_params, "scheduler", err, errlen);
    if (rc) return rc;
  } else {
    snprintf(out->sched, sizeof out->sched, "standard");
  }
  snprintf(out->text, sizeof out->text, "sd:%s%s%s@%s%s%s", out->rule, *out->rule_params ? ":" : "",
           out->rule_params, out->sched, *out->sched_params ? ":" : "", out->sched_params);
  return VSPEC_OK;
}

int vs_method_split(const char *text, vs_method *out, int max, char *err, size_t errlen) {
  int n = 0;
  const char *s = text;
  while (*s) {
    const char *semi = strchr(s, ';');
    size_t len = semi ? (size_t)(semi - s) : strlen(s);
    char one[1100];
    if (vs__trim_copy(one, sizeof one, s, len)) {
      snprintf(err, errlen, "method %d is too long (at most %zu characters)", n + 1,
               sizeof one - 1);
      return VSPEC_EINVAL;
    }
    if (*one) {
      if (n == max) {
        snprintf(err, errlen, "too many methods (at most %d)", max);
        return VSPEC_ERANGE;
      }
      int rc = vs_method_parse(one, &out[n], err, errlen);
      if (rc) return rc;
      n++;
    }
    s += len;
    if (*s == ';') s++;
  }
  if (n == 0) {
    snprintf(err, errlen, "no method given");
    return VSPEC_EINVAL;
  }
  return n;
}
