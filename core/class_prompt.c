/*
 * core/class_prompt.c - a text prompt turned into a class (core/class_prompt.h).
 */
#include "core/class_prompt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/suggest.h"
#include "vspec/types.h"

#define VS__MAX_HITS 64 /* occurrences looked at; a prompt naming more is ambiguous anyway */
#define VS__WORD_MAX 64 /* a word (or two) of the prompt, for suggestions */

/* One occurrence of a class's term in the prompt: bytes [start, end) of the prompt, len the
 * term's own length (a plural's suffix not counted: "boots" is no longer than "boot"). */
typedef struct vs__hit {
  int label;
  size_t start, end, len;
} vs__hit;

/* Letters and digits, and every byte of a multi-byte UTF-8 character: a name never starts or
 * ends inside a word, whatever its script. */
static int cp_wordch(int c) { return isalnum(c) || (c & 0x80); }

/* The text without its surrounding blanks: *n bytes from the pointer returned. */
static const char *cp_trim(const char *s, size_t n0, size_t *n) {
  while (n0 && isspace((unsigned char)*s)) s++, n0--;
  while (n0 && isspace((unsigned char)s[n0 - 1])) n0--;
  *n = n0;
  return s;
}

/* Calls f on each term of a name: the whole name, the name before a qualifier in
 * parentheses at its end ("crane" of "crane (bird)") and, when it has '/', each part of it. */
typedef void (*vs__term_fn)(const char *term, size_t n, int label, void *arg);
static void cp_terms(const char *name, int label, vs__term_fn f, void *arg) {
  size_t n;
  const char *t = cp_trim(name, strlen(name), &n);
  f(t, n, label, arg);
  const char *open = n && t[n - 1] == ')' ? strrchr(t, '(') : NULL;
  if (open && open > t) {
    size_t k;
    const char *head = cp_trim(t, (size_t)(open - t), &k);
    if (k) f(head, k, label, arg);
  }
  if (!strchr(name, '/')) return;
  for (const char *p = name; *p;) {
    size_t k = strcspn(p, "/");
    t = cp_trim(p, k, &n);
    if (n) f(t, n, label, arg);
    p += k + (p[k] == '/');
  }
}

/* ---- a prompt that is a name ------------------------------------------------------------- */

typedef struct vs__whole {
  const char *text;
  size_t n;
  int label, exact, count; /* count: labels matched; exact: one matched with its case */
} vs__whole;

static void cp_whole_term(const char *term, size_t n, int label, void *arg) {
  vs__whole *w = arg;
  if (n != w->n || strncasecmp(term, w->text, n)) return;
  int exact = !strncmp(term, w->text, n);
  if (w->label == label) {
    w->exact |= exact;
    return;
  }
  /* names that differ only in case: the one written as the prompt is */
  if (w->count && w->exact && !exact) return;
  if (w->count && exact && !w->exact) w->count = 0;
  w->count++;
  w->label = label;
  w->exact = exact;
}

/* ---- names inside a text ----------------------------------------------------------------- */

typedef struct vs__scan {
  const char *text;
  size_t n;
  vs__hit hits[VS__MAX_HITS];
  int n_hits;
} vs__scan;

static void cp_scan_term(const char *term, size_t tn, int label, void *arg) {
  vs__scan *s = arg;
  if (!tn || tn > s->n) return;
  for (size_t i = 0; i + tn <= s->n; i++) {
    if (strncasecmp(s->text + i, term, tn)) continue;
    if (i && cp_wordch((unsigned char)s->text[i - 1]) && cp_wordch((unsigned char)term[0]))
      continue;
    size_t e = i + tn;
    int ends = e >= s->n || !cp_wordch((unsigned char)s->text[e]) ||
               !cp_wordch((unsigned char)term[tn - 1]);
    if (!ends) { /* an English plural: "sneakers", "dresses"; never "coatings" */
      size_t p = e;
      if (tolower((unsigned char)s->text[p]) == 's') p++;
      else if (p + 1 < s->n && tolower((unsigned char)s->text[p]) == 'e' &&
               tolower((unsigned char)s->text[p + 1]) == 's')
        p += 2;
      ends = p > e && (p >= s->n || !cp_wordch((unsigned char)s->text[p]));
      e = p;
    }
    if (!ends) continue;
    if (s->n_hits < VS__MAX_HITS)
      s->hits[s->n_hits++] = (vs__hit){.label = label, .start = i, .end = e, .len = tn};
  }
}

/* Whether hit h lies inside a longer hit (of another term). */
static int cp_covered(const vs__scan *s, const vs__hit *h) {
  for (int i = 0; i < s->n_hits; i++) {
    const vs__hit *g = &s->hits[i];
    if (g->len > h->len && g->start <= h->start && h->end <= g->end) return 1;
  }
  return 0;
}

/* ---- messages ------------------------------------------------------------------------------ */

/* " (classes: 0 a, 1 b, ...)" or " (classes 0..N-1, unnamed)". A list longer than err
 * (ImageNet's 1000 names) ends ", and N more)" and leaves `reserve` bytes for what follows. */
static void cp_list(char *err, size_t errlen, const char *const *names, int n_names,
                     int num_classes, size_t reserve) {
  size_t used = strlen(err);
  if (!n_names) {
    snprintf(err + used, errlen - used, " (classes 0..%d; this model names none)",
             num_classes - 1);
    return;
  }
  const size_t more = sizeof ", and 99999999999 more)"; /* what ending a cut list takes */
  for (int i = 0; i < n_names && used + 1 < errlen; i++) {
    char item[128];
    int k = snprintf(item, sizeof item, "%s%d %s", i ? ", " : " (classes: ", i, names[i]);
    /* the last name needs room for ")" only; any other for a cut list's ending too */
    size_t need = (size_t)k + (i + 1 < n_names ? more : 2) + reserve;
    if (used + need > errlen) {
      if (i) snprintf(err + used, errlen - used, ", and %d more)", n_names - i);
      else snprintf(err + used, errlen - used, " (%d classes)", n_names);
      return;
    }
    used += (size_t)snprintf(err + used, errlen - used, "%s", item);
  }
  if (used + 1 < errlen) snprintf(err + used, errlen - used, ")");
}

/* The name nearest the prompt, or one word or two neighbouring words of it; -1 if none is
 * a likely slip. */
static int cp_nearest(const char *text, size_t n, const char *const *names, int n_names) {
  char w[VS__WORD_MAX];
  int k = n < sizeof w ? (snprintf(w, sizeof w, "%.*s", (int)n, text),
                          vs_suggest_nearest(w, names, n_names))
                       : -1;
  for (size_t i = 0; k < 0 && i < n; i++) {
    if (isspace((unsigned char)text[i]) || (i && !isspace((unsigned char)text[i - 1]))) continue;
    size_t one = 0, two;
    while (i + one < n && !isspace((unsigned char)text[i + one])) one++;
    two = one;
    while (i + two < n && isspace((unsigned char)text[i + two])) two++;
    while (i + two < n && !isspace((unsigned char)text[i + two])) two++;
    size_t lens[2] = {one, two};
    for (int t = 0; t < 2 && k < 0; t++) {
      if (lens[t] >= sizeof w) continue;
      snprintf(w, sizeof w, "%.*s", (int)lens[t], text + i);
      k = vs_suggest_nearest(w, names, n_names);
    }
  }
  return k;
}

static int cp_refuse(const char *text, size_t n, const char *model, const char *const *names,
                     int n_names, int num_classes, const vs__scan *s, char *err,
                     size_t errlen) {
  const char *ell = n > 80 ? "..." : "";
  int shown = n > 80 ? 80 : (int)n;
  if (s && s->n_hits) {
    size_t used = (size_t)snprintf(err, errlen, "prompt: '%.*s%s' names more than one class of "
                                   "model '%s' (", shown, text, ell, model);
    /* the classes in the order the prompt names them */
    int seen[VS__MAX_HITS], k = 0;
    for (;;) {
      const vs__hit *first = NULL;
      for (int i = 0; i < s->n_hits; i++) {
        const vs__hit *h = &s->hits[i];
        int dup = cp_covered(s, h);
        for (int j = 0; j < k && !dup; j++) dup = seen[j] == h->label;
        if (!dup && (!first || h->start < first->start)) first = h;
      }
      if (!first || used + 1 >= errlen) break;
      seen[k++] = first->label;
      used += (size_t)snprintf(err + used, errlen - used, "%s%s", k > 1 ? ", " : "",
                               names[first->label]);
    }
    if (used + 1 < errlen) snprintf(err + used, errlen - used, "): name one");
  } else {
    snprintf(err, errlen, "prompt: '%.*s%s' names no class of model '%s'", shown, text, ell,
             model);
  }
  int near = s && s->n_hits ? -1 : cp_nearest(text, n, names, n_names);
  cp_list(err, errlen, names, n_names, num_classes,
           near >= 0 ? strlen("; did you mean ''?") + strlen(names[near]) : 0);
  size_t used = strlen(err);
  if (near >= 0 && used + 1 < errlen)
    snprintf(err + used, errlen - used, "; did you mean '%s'?", names[near]);
  return VSPEC_EINVAL;
}

/* ---- the match ----------------------------------------------------------------------------- */

int vs_class_prompt_match(const char *prompt, const char *model, const char *const *names,
                          int n_names, int num_classes, vs_class_pick *pick, char *err,
                          size_t errlen) {
  size_t n;
  const char *text = cp_trim(prompt, strlen(prompt), &n);
  if (n_names != num_classes) n_names = 0; /* names that do not cover the classes: unusable */
  if (num_classes <= 0) {
    snprintf(err, errlen, "prompt: model '%s' is not class-conditional", model);
    return VSPEC_EINVAL;
  }
  if (!n) {
    snprintf(err, errlen, "prompt: empty: name a class of model '%s'", model);
    cp_list(err, errlen, names, n_names, num_classes, 0);
    return VSPEC_EINVAL;
  }
  size_t digits = 0;
  while (digits < n && isdigit((unsigned char)text[digits])) digits++;
  if (digits == n) {
    long v = n > 9 ? -1 : strtol(text, NULL, 10);
    if (v < 0 || v >= num_classes) {
      snprintf(err, errlen, "prompt: class %.*s is out of range: model '%s' has classes 0..%d",
               n > 20 ? 20 : (int)n, text, model, num_classes - 1);
      cp_list(err, errlen, names, n_names, num_classes, 0);
      return VSPEC_EINVAL;
    }
    *pick = (vs_class_pick){.label = (int)v, .how = VS_CLASS_BY_NUMBER};
    return VSPEC_OK;
  }
  vs__whole w = {.text = text, .n = n, .label = -1};
  for (int i = 0; i < n_names; i++) cp_terms(names[i], i, cp_whole_term, &w);
  if (w.count == 1) {
    *pick = (vs_class_pick){.label = w.label, .how = VS_CLASS_BY_NAME};
    return VSPEC_OK;
  }
  vs__scan s = {.text = text, .n = n};
  for (int i = 0; i < n_names; i++) cp_terms(names[i], i, cp_scan_term, &s);
  int label = -1, ambiguous = 0;
  for (int i = 0; i < s.n_hits; i++) {
    if (cp_covered(&s, &s.hits[i])) continue;
    if (label >= 0 && label != s.hits[i].label) ambiguous = 1;
    label = s.hits[i].label;
  }
  if (label >= 0 && !ambiguous) {
    *pick = (vs_class_pick){.label = label, .how = VS_CLASS_IN_TEXT};
    return VSPEC_OK;
  }
  return cp_refuse(text, n, model, names, n_names, num_classes, ambiguous ? &s : NULL, err,
                   errlen);
}
