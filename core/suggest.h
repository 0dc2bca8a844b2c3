/*
 * core/suggest.h - "did you mean ...?": the known name nearest a mistyped one.
 *
 * A name a user typed (a rule, a scheduler, a backend) that matches nothing is answered with
 * the names there are and, when one is close enough to be a slip of the keyboard, that one.
 * Close means an edit distance (insertions, deletions, substitutions and swaps of two
 * neighbouring characters, letter case ignored) of at most 1 for names of up to 4
 * characters, 2 up to 8 and 3 beyond, and less than the typed name's length: `lantrn` gets
 * `lantern`, `xyz` gets nothing.
 */
#ifndef VS_SUGGEST_H
#define VS_SUGGEST_H

#include <stddef.h>

/* Optimal string alignment distance between a and b, case-insensitive; names longer than 63
 * bytes are compared on their first 63. */
int vs_edit_distance(const char *a, const char *b);

/* Index of the name of names[0..n) nearest `typed` when it is close enough (above), the
 * first of equals; -1 when none is. */
int vs_suggest_nearest(const char *typed, const char *const *names, int n);

/* Appends to msg (a NUL-terminated string of capacity cap) "(LABEL: a, b, c)" or
 * "(LABEL: none)" and, when one of names[0..n) is close to `typed`, "; did you mean 'x'?".
 * Cut to fit. */
void vs_suggest_append(char *msg, size_t cap, const char *label, const char *typed,
                       const char *const *names, int n);

#endif /* VS_SUGGEST_H */
