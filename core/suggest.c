#include "core/suggest.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define VS__SUGGEST_LEN 63

int vs_edit_distance(const char *a, const char *b) {
  int n = (int)strnlen(a, VS__SUGGEST_LEN), m = (int)strnlen(b, VS__SUGGEST_LEN);
  /* Three rows of the dynamic programme: the one before last (for swaps), last, this. */
  int rows[3][VS__SUGGEST_LEN + 1];
  int *pp = rows[0], *prev = rows[1], *cur = rows[2];
  for (int j = 0; j <= m; j++) prev[j] = j;
  for (int i = 1; i <= n; i++) {
    cur[0] = i;
    int ca = tolower((unsigned char)a[i - 1]);
    for (int j = 1; j <= m; j++) {
      int cb = tolower((unsigned char)b[j - 1]);
      int d = prev[j - 1] + (ca != cb);
      if (prev[j] + 1 < d) d = prev[j] + 1;
      if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == cb && pp[j - 2] + 1 < d)
        d = pp[j - 2] + 1;
      cur[j] = d;
    }
    int *t = pp;
    pp = prev;
    prev = cur;
    cur = t;
  }
  return prev[m];
}

int vs_suggest_nearest(const char *typed, const char *const *names, int n) {
  int len = (int)strnlen(typed, VS__SUGGEST_LEN);
  int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
  if (limit >= len) limit = len - 1;
  int best = -1, best_d = limit + 1;
  for (int i = 0; i < n; i++) {
    int d = vs_edit_distance(typed, names[i]);
    if (d < best_d) {
      best = i;
      best_d = d;
    }
  }
  return best;
}

void vs_suggest_append(char *msg, size_t cap, const char *label, const char *typed,
                       const char *const *names, int n) {
  size_t used = strlen(msg);
  if (used + 1 >= cap) return;
  used += (size_t)snprintf(msg + used, cap - used, " (%s: %s", label, n ? "" : "none");
  for (int i = 0; i < n && used + 1 < cap; i++)
    used += (size_t)snprintf(msg + used, cap - used, "%s%s", i ? ", " : "", names[i]);
  if (used + 1 < cap) used += (size_t)snprintf(msg + used, cap - used, ")");
  int k = vs_suggest_nearest(typed, names, n);
  if (k >= 0 && used + 1 < cap) snprintf(msg + used, cap - used, "; did you mean '%s'?", names[k]);
}
