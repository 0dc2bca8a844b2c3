/*
 * core/names.h - the bytes each kind of name may hold, all in one place.
 *
 * Names a client or an operator gives (models, methods, plugins, parameters) end up in
 * plugin file names, the canonical method text, log lines, error messages and the events
 * sent back, so each kind is a small set of printable ASCII characters with a length limit;
 * a tag is free text, but UTF-8 without control characters. Anything else is refused, naming
 * the field, the offending byte (escaped) and its offset, and what the field allows.
 * DESIGN.md ("Wire protocol rules") lists the same sets; change both together.
 */
#ifndef VS_NAMES_H
#define VS_NAMES_H

#include <stddef.h>

typedef struct vs_name_kind {
  const char *what;  /* "a model name", for messages */
  const char *punct; /* characters allowed besides letters and digits; NULL: free text */
  int upper;         /* A-Z allowed (a-z and 0-9 always are) */
  const char *shown; /* the set as messages show it: "[A-Za-z0-9._-]" */
  size_t min, max;   /* length in bytes */
} vs_name_kind;

/* Submit.model and the names of [models]; like the config's other names (node). */
extern const vs_name_kind vs_name_model;
/* Submit.accept and .sched, a method's rule and scheduler, a reload's NAME: plugin files
 * are <kind>_<name>.so, so nothing here can walk out of the plugin directory. */
extern const vs_name_kind vs_name_plugin;
/* Submit.method and [defaults] method: "sd:lantern:k=100,delta=0.2@standard:shape=static,
 * drafter=head", tree paths such as tree=0/1/0.0; blanks around the separators are trimmed. */
extern const vs_name_kind vs_name_method;
/* Submit.accept_params and .sched_params: a method's parameters without its separators. */
extern const vs_name_kind vs_name_params;
/* Submit.draft and .cfg_schedule: one of a few words, each field lists which. */
extern const vs_name_kind vs_name_word;
/* ReloadRequest.name: NAME, KIND/NAME or KIND_NAME (admin endpoint). */
extern const vs_name_kind vs_name_reload;
/* Submit.tag: free text for the log, UTF-8 without control characters. */
extern const vs_name_kind vs_name_tag;
/* Submit.prompt: a class in words (core/class_prompt.h), free text like a tag but longer. */
extern const vs_name_kind vs_name_prompt;

/* Checks s (a C string) against kind k. On failure returns VSPEC_EINVAL with a message
 * that starts with `field`: "model: 'mi\x1bcro' has \x1b at offset 2; a model name is 1-63
 * bytes of [A-Za-z0-9._-]". */
int vs_name_check(const vs_name_kind *k, const char *field, const char *s, char *err,
                  size_t errlen);

#endif /* VS_NAMES_H */
