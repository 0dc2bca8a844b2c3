#include "core/method.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "core/names.h"
#include "core/text.h"
#include "vspec/plugin.h"

/* Copies src[0..len) without surrounding blanks; fails (-1) rather than truncate. */
static int mth_trim_copy(char *dst, size_t n, const char *src, size_t len) {
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

/* A rule's or scheduler's NAME and PARAMS, trimmed and checked. */
static int method_part(const char *name_src, size_t name_len, const char *params_src,
                       size_t params_len, char *name, size_t nn, char *params, size_t pn,
                       const char *what, char *err, size_t errlen) {
  if (mth_trim_copy(name, nn, name_src, name_len) ||
      mth_trim_copy(params, pn, params_src, params_len)) {
    snprintf(err, errlen, "method: %s name or parameters too long (at most %zu characters)",
             what, pn - 1);
    return VSPEC_EINVAL;
  }
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

/* "NAME[:PARAMS]" */
static int mth_name_params(const char *s, size_t len, char *name, size_t nn, char *params,
                           size_t pn, const char *what, char *err, size_t errlen) {
  const char *colon = memchr(s, ':', len);
  size_t name_len = colon ? (size_t)(colon - s) : len;
  return method_part(s, name_len, colon ? colon + 1 : "", colon ? len - name_len - 1 : 0, name,
                     nn, params, pn, what, err, errlen);
}

/* Parameter keys that configure the drafter, not the scheduler: those of the shipped drafter
 * plugin (plugins/drafter/jacobi.c), and any key written drafter.KEY (for other drafter
 * plugins; handed over as KEY). Returns the length of the prefix to strip, or -1. */
static int method_drafter_key(const char *kv, size_t len) {
  static const char *const keys[] = {"coupling", "init", "continue", NULL};
  const char *eq = memchr(kv, '=', len);
  size_t klen = eq ? (size_t)(eq - kv) : len;
  if (klen > 8 && !memcmp(kv, "drafter.", 8)) return 8;
  for (int i = 0; keys[i]; i++)
    if (strlen(keys[i]) == klen && memcmp(keys[i], kv, klen) == 0) return 0;
  return -1;
}

/* Whether kv[0..len) is the scheduler parameter `size`: 1 for size=auto, 0 for another key,
 * an error for another size (the size itself is depth, total_tokens or tree). */
static int method_size_key(const char *kv, size_t len, char *err, size_t errlen) {
  const char *eq = memchr(kv, '=', len);
  char key[8], value[64];
  if (!eq || mth_trim_copy(key, sizeof key, kv, (size_t)(eq - kv)) || strcmp(key, "size"))
    return 0;
  if (!mth_trim_copy(value, sizeof value, eq + 1, len - (size_t)(eq - kv) - 1) &&
      !strcmp(value, "auto"))
    return 1;
  snprintf(err, errlen, "size=%.*s: only size=auto is understood (set the size itself with "
           "depth, total_tokens or tree)", (int)(len - (size_t)(eq - kv) - 1), eq + 1);
  return VSPEC_EINVAL;
}

/* Moves the drafter's keys out of the scheduler's parameter list, in their order, and size=auto
 * into m->size: the scheduler never sees either. */
static int method_split_drafter_params(vs_method *m, char *err, size_t errlen) {
  char sched[sizeof m->sched_params] = "";
  size_t ns = 0, nd = 0;
  const char *s = m->sched_params;
  while (*s) {
    const char *comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    int strip = method_drafter_key(s, len), drafter = strip >= 0;
    int size = drafter ? 0 : method_size_key(s, len, err, errlen);
    if (size < 0) return size;
    if (size) {
      m->size = VS_METHOD_SIZE_AUTO;
      s += len;
      if (*s == ',') s++;
      continue;
    }
    char *dst = drafter ? m->drafter_params : sched;
    size_t *n = drafter ? &nd : &ns, cap = drafter ? sizeof m->drafter_params : sizeof sched;
    if (*n + len + 2 > cap) {
      snprintf(err, errlen, "method: %s parameters too long (at most %zu characters)",
               drafter ? "drafter" : "scheduler", cap - 1);
      return VSPEC_EINVAL;
    }
    if (*n) dst[(*n)++] = ',';
    memcpy(dst + *n, s + (drafter ? strip : 0), len - (drafter ? strip : 0));
    *n += len - (drafter ? strip : 0);
    if (len > 8 && !memcmp(s, "drafter=", 8) &&
        mth_trim_copy(m->drafter, sizeof m->drafter, s + 8, len - 8)) {
      snprintf(err, errlen, "method: drafter name too long");
      return VSPEC_EINVAL;
    }
    dst[*n] = 0;
    s += len;
    if (*s == ',') s++;
  }
  memcpy(m->sched_params, sched, ns + 1);
  return VSPEC_OK;
}

/* The canonical text of the parts in `m`, then its drafter's keys and size taken out. */
static int method_finish(vs_method *m, char *err, size_t errlen) {
  if ((size_t)snprintf(m->text, sizeof m->text, "sd:%s%s%s@%s%s%s", m->rule,
                       *m->rule_params ? ":" : "", m->rule_params, m->sched,
                       *m->sched_params ? ":" : "", m->sched_params) >= sizeof m->text) {
    snprintf(err, errlen, "method is too long (at most %zu characters)", sizeof m->text - 1);
    return VSPEC_EINVAL;
  }
  return method_split_drafter_params(m, err, errlen);
}

/* The plugins' parameter sets from their text, each parsed here once; a message names the
 * plugin as opening it did when the engine parsed them. */
static int method_read_params(vs_method *m, char *err, size_t errlen) {
  const char *drafter = vs_method_drafter(m) == VSPEC_DRAFTER_PLUGIN ? m->drafter : "model";
  const struct {
    const char *what, *name, *text;
    vspec_params *set;
  } part[] = {{"acceptance rule", m->rule, m->rule_params, &m->rule_set},
              {"scheduler", m->sched, m->sched_params, &m->sched_set},
              {"drafter", drafter, m->drafter_params, &m->drafter_set}};
  for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
    char inner[VSPEC_ERRLEN];
    if (vs_params_read(part[i].text, part[i].set, inner, sizeof inner)) {
      snprintf(err, errlen, "%s '%s': %s", part[i].what, part[i].name, inner);
      return VSPEC_EFORMAT;
    }
  }
  return VSPEC_OK;
}

void vs_method_set_ar(vs_method *m) {
  memset(m, 0, sizeof *m);
  m->kind = VS_METHOD_AR;
  snprintf(m->text, sizeof m->text, "ar");
}

int vs_method_parse(const char *text, vs_method *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  char t[1100], q[80];
  /* Methods come from clients and config files and are echoed in messages, logs and events:
   * only the characters of the method syntax get in (core/names.h). */
  if (vs_name_check(&vs_name_method, "method", text, err, errlen)) return VSPEC_EINVAL;
  if (mth_trim_copy(t, sizeof t, text, strlen(text))) {
    snprintf(err, errlen, "method is too long (at most %zu characters)", sizeof t - 1);
    return VSPEC_EINVAL;
  }
  if (strcmp(t, "ar") == 0) {
    vs_method_set_ar(out);
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
  int rc = mth_name_params(body, rule_len, out->rule, sizeof out->rule, out->rule_params,
                           sizeof out->rule_params, "acceptance rule", err, errlen);
  if (rc) return rc;
  if (at) {
    rc = mth_name_params(at + 1, strlen(at + 1), out->sched, sizeof out->sched,
                         out->sched_params, sizeof out->sched_params, "scheduler", err, errlen);
    if (rc) return rc;
  } else {
    snprintf(out->sched, sizeof out->sched, "standard");
  }
  rc = method_finish(out, err, errlen);
  return rc ? rc : method_read_params(out, err, errlen);
}

int vs_method_make(const char *rule, const char *rule_params, const char *sched,
                   const char *sched_params, vs_method *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->kind = VS_METHOD_SD;
  rule_params = rule_params ? rule_params : "";
  sched = sched && *sched ? sched : "standard";
  sched_params = sched_params ? sched_params : "";
  int rc = method_part(rule ? rule : "", rule ? strlen(rule) : 0, rule_params,
                       strlen(rule_params), out->rule, sizeof out->rule, out->rule_params,
                       sizeof out->rule_params, "acceptance rule", err, errlen);
  if (!rc)
    rc = method_part(sched, strlen(sched), sched_params, strlen(sched_params), out->sched,
                     sizeof out->sched, out->sched_params, sizeof out->sched_params, "scheduler",
                     err, errlen);
  if (!rc) rc = method_finish(out, err, errlen);
  /* the whole, as vs_method_parse would check its text: the same characters and length */
  if (!rc && vs_name_check(&vs_name_method, "method", out->text, err, errlen)) rc = VSPEC_EINVAL;
  return rc ? rc : method_read_params(out, err, errlen);
}

unsigned vs_method_drafter(const vs_method *m) {
  static const char *const names[] = {"auto", "model", "head"};
  if (m->kind != VS_METHOD_SD || !*m->drafter) return VSPEC_DRAFTER_AUTO;
  for (unsigned k = 0; k < sizeof names / sizeof names[0]; k++)
    if (!strcmp(m->drafter, names[k])) return k;
  return VSPEC_DRAFTER_PLUGIN;
}

int vs_method_compose(const vs_method *m, const char *sched_params, char *out, size_t cap) {
  if (m->kind == VS_METHOD_AR) return snprintf(out, cap, "ar");
  /* the drafter's parameters as they are written: drafter.KEY unless a shipped key */
  char dp[2 * sizeof m->drafter_params];
  size_t n = 0;
  for (const char *s = m->drafter_params; *s && n < sizeof dp;) {
    size_t len = strcspn(s, ",");
    n += (size_t)snprintf(dp + n, sizeof dp - n, "%s%s%.*s", n ? "," : "",
                          method_drafter_key(s, len) == 0 ? "" : "drafter.", (int)len, s);
    s += len;
    if (*s == ',') s++;
  }
  dp[n < sizeof dp ? n : sizeof dp - 1] = 0;
  int any = *sched_params || *dp;
  return snprintf(out, cap, "sd:%s%s%s@%s%s%s%s%s", m->rule, *m->rule_params ? ":" : "",
                  m->rule_params, m->sched, any ? ":" : "", sched_params,
                  *sched_params && *dp ? "," : "", dp);
}

int vs_method_split(const char *text, vs_method *out, int max, char *err, size_t errlen) {
  int n = 0;
  const char *s = text;
  while (*s) {
    const char *semi = strchr(s, ';');
    size_t len = semi ? (size_t)(semi - s) : strlen(s);
    char one[1100];
    if (mth_trim_copy(one, sizeof one, s, len)) {
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
