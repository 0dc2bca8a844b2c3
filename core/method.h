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
/* The draft size: named by the scheduler's parameters (or its default), or size=auto, which
 * core/autotune.h resolves into parameters before the method runs. */
enum { VS_METHOD_SIZE_FIXED = 0, VS_METHOD_SIZE_AUTO = 1 };

typedef struct vs_method {
  int kind;
  char rule[64], rule_params[512];
  char sched[64], sched_params[512]; /* without size=auto, which is `size` */
  int size;                          /* VS_METHOD_SIZE_* */
  /* The drafter the scheduler's parameters name (drafter=NAME; "" when none), and its own
   * parameters, written among the scheduler's (the shipped jacobi plugin's coupling=, init=,
   * continue=; any other drafter plugin's as drafter.KEY=V) and moved here at parsing: the
   * scheduler never sees them, the drafter gets them as KEY=V. */
  char drafter[64];
  char drafter_params[256];
  char text[1100]; /* canonical spelling, for logs, results and PNG metadata only */
} vs_method;

/* Parses a method as users write it; the only parse a method's text goes through. */
int vs_method_parse(const char *text, vs_method *out, char *err, size_t errlen);
/* The method sd:RULE[:RULE_PARAMS]@SCHED[:SCHED_PARAMS] from its parts (Submit's accept /
 * sched form), checked as vs_method_parse checks its text; sched NULL or "": standard. */
int vs_method_make(const char *rule, const char *rule_params, const char *sched,
                   const char *sched_params, vs_method *out, char *err, size_t errlen);
/* Plain autoregressive decoding, as vs_method_parse("ar") makes it. */
void vs_method_set_ar(vs_method *m);
/* The kind of drafter the method names (vspec_drafter_kind: auto, model, head, or any other
 * name: a drafter plugin; VSPEC_DRAFTER_AUTO when it names none or is not sd). */
unsigned vs_method_drafter(const vs_method *m);
/* The spelling of `m` with `sched_params` in place of its scheduler parameters (the drafter's
 * are appended to them again; its size is not written); returns what snprintf does. */
int vs_method_compose(const vs_method *m, const char *sched_params, char *out, size_t cap);
/* Splits "m1;m2;..." into up to `max` methods; returns the count or a negative status. */
int vs_method_split(const char *text, vs_method *out, int max, char *err, size_t errlen);

#endif /* VS_METHOD_H */
