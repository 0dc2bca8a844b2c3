/*
 * core/method.h - decoding method specifications, as users write them.
 *
 *   ar                                 vanilla autoregressive decoding
 *   sd:RULE[:PARAMS][@SCHED[:PARAMS]]  speculative decoding with acceptance rule RULE and
 *                                      scheduler SCHED (default `standard`)
 * e.g. "sd:lantern:k=100,delta=0.2@standard:shape=dynamic,depth=4". Several methods are
 * separated by ';' (vs_method_split).
 */
#ifndef VS_METHOD_H
#define VS_METHOD_H

#include <stddef.h>

enum { VS_METHOD_AR = 0, VS_METHOD_SD = 1 };

typedef struct vs_method {
  int kind;
  char rule[64], rule_params[512];
  char sched[64], sched_params[512];
  char text[1100]; /* canonical spelling */
} vs_method;

int vs_method_parse(const char *text, vs_method *out, char *err, size_t errlen);
/* Splits "m1;m2;..." into up to `max` methods; returns the count or a negative status. */
int vs_method_split(const char *text, vs_method *out, int max, char *err, size_t errlen);

#endif /* VS_METHOD_H */
