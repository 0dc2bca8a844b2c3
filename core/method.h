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

#include "core/params.h"

enum { VS_METHOD_AR = 0, VS_METHOD_SD = 1 };
/* The draft size: named by the scheduler's parameters (or its default), or size=auto, which
 * core/autotune.h resolves into parameters before the method runs. */
enum { VS_METHOD_SIZE_FIXED = 0, VS_METHOD_SIZE_AUTO = 1 };

/* A method is a value: its parameter sets own no memory (core/params.h), so it is copied by
 * assigning it and needs no release. */
typedef struct vs_method {
  int kind;
  char rule[64], sched[64];
  int size; /* VS_METHOD_SIZE_* */
  /* The drafter the scheduler's parameters name (drafter=NAME; "" when none). Its own
   * parameters are written among the scheduler's (the shipped jacobi plugin's coupling=,
   * init=, continue=; any other drafter plugin's as drafter.KEY=V) and moved to drafter_set at
   * parsing: the scheduler never sees them, the drafter gets them as KEY=V. */
  char drafter[64];
  /* The parameters each plugin is created with, parsed once where the method is made: the
   * submission's check, the engine and size=auto read these, never the text. The scheduler's
   * lack size=auto, which is `size`. */
  vspec_params rule_set, sched_set, drafter_set;
  /* The same parameters as they were written, for printing only: the canonical spelling
   * (logs, results, PNG metadata) and the spellings vs_method_compose makes from them (the
   * size=auto cache's key). */
  char rule_params[512], sched_params[512], drafter_params[256];
  char text[1100];
} vs_method;

/* Parses a method as users write it; the only parse a method's text, and its parameters'
 * text, go through. Parameters that do not parse fail with VSPEC_EFORMAT and a message that
 * names their plugin as opening it would ("acceptance rule 'lantern': parameter ..."). */
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
