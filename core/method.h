/*
 * core/method.h - decoding method specifications, as users write them.
 *
 *   ar                                 vanilla autoregressive decoding
 *   sd:RULE[:PARAMS][@SCHED[:PARAMS]]  speculative decoding with acceptance rule RULE and
 *                                      scheduler SCHED (default `standard`)
 * e.g. "sd:lantern:k=100,delta=0.2@standard:shape=dynamic,depth=4", or without a draft model
 * "sd:exact@standard:drafter=jacobi,coupling=gumbel". Several methods are
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
  /* The drafter the scheduler's parameters name (drafter=NAME; "" when none), and its own
   * parameters, written among the scheduler's (the shipped jacobi plugin's coupling=, init=,
   * continue=; any other drafter plugin's as drafter.KEY=V) and moved here at parsing: the
   * scheduler never sees them, the drafter gets them as KEY=V. */
  char drafter[64];
  char drafter_params[256];
  char text[1100]; /* canonical spelling */
} vs_method;

int vs_method_parse(const char *text, vs_method *out, char *err, size_t errlen);
/* The kind of drafter the method names (vspec_drafter_kind: auto, model, head, or any other
 * name: a drafter plugin; VSPEC_DRAFTER_AUTO when it names none or is not sd). */
unsigned vs_method_drafter(const vs_method *m);
/* The spelling of `m` with `sched_params` in place of its scheduler parameters (the drafter's
 * are appended to them again); returns what snprintf does. */
int vs_method_compose(const vs_method *m, const char *sched_params, char *out, size_t cap);
/* Splits "m1;m2;..." into up to `max` methods; returns the count or a negative status. */
int vs_method_split(const char *text, vs_method *out, int max, char *err, size_t errlen);

#endif /* VS_METHOD_H */
