/*
 * clients/json_out.h - writing JSON by hand for the CLI's --json output (no library: the
 * objects are flat and their fields fixed).
 */
#ifndef VS_JSON_OUT_H
#define VS_JSON_OUT_H

#include <stdio.h>

/* s as a JSON string, quotes included (NULL prints ""). */
void vs__json_str(FILE *f, const char *s);

#endif /* VS_JSON_OUT_H */
