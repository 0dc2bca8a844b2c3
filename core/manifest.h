/*
 * core/manifest.h - a model directory's manifest, vspec-model.json, read into settings
 * without loading anything: the model's name, its sampling defaults and, for each role
 * (target, draft, eagle), the backend, the main weights and the backend parameters. The
 * format is in core/models.h; vs_models_open loads what the manifest says.
 *
 * The manifest is the text of a model directory people write by hand, so every value is
 * checked here with a message naming the key: integers must be integers in range, paths
 * must fit, and each role's other keys become backend parameters that must survive the
 * "key=value,..." text the backend parses (core/params.h) unchanged. Parsing is apart from
 * loading so that it runs on any text without weights (tests/fuzz/fuzz_manifest.c).
 */
#ifndef VS_MANIFEST_H
#define VS_MANIFEST_H

#include <stddef.h>

#include "core/models.h"

#define VS_MANIFEST_FILE "vspec-model.json"

typedef struct vs_manifest_role {
  int present;        /* the manifest has this role and it was asked for */
  char backend[64];   /* plugin name */
  char weights[2048]; /* DIR/FILE of "gpt" or "weights"; "-" when the role names neither */
  char params[4096];  /* the role's other keys as backend parameters; files as DIR/FILE */
} vs_manifest_role;

/* A class name's bytes, its NUL included. */
#define VS_CLASS_NAME_MAX 64

typedef struct vs_manifest {
  char name[64]; /* "" when the manifest names none */
  vs_sampling defaults;
  vs_manifest_role target, draft, eagle;
  /* "class_names": one per class label, in label order; NULL (0) when the manifest has none.
   * One allocation (vs_manifest_free, or taken over by vs_models). Each is 1-63 bytes of
   * UTF-8 without control characters, blanks at neither end, not a number (a --class
   * argument is either), unique regardless of letter case. That there is one per class is
   * checked at load, against the target's num_classes. */
  char **class_names;
  int n_class_names;
} vs_manifest;

/* Parses `len` bytes of manifest text (JSON; need not end in NUL) of model directory `dir`;
 * `path` names it in messages. `base` are the defaults the manifest's "defaults" overlay.
 * Only the roles in `roles` (VS_ROLE_*) are read; the target must be there if asked for.
 * Returns 0, or VSPEC_EFORMAT (VSPEC_ENOMEM) with a message naming the path and the key. */
int vs_manifest_parse(const char *text, size_t len, const char *dir, const char *path,
                      const vs_sampling *base, unsigned roles, vs_manifest *m, char *err,
                      size_t errlen);

/* Frees what a parse allocated (the class names); the manifest may be parsed into again.
 * A parse into a manifest that holds class names does not free them: free it first. */
void vs_manifest_free(vs_manifest *m);

/* The same for DIR/vspec-model.json. VSPEC_ENOENT when there is none (not an error for
 * vs_models_open: a directory with gpt.safetensors needs no manifest). */
int vs_manifest_read(const char *dir, const vs_sampling *base, unsigned roles, vs_manifest *m,
                     char *err, size_t errlen);

#endif /* VS_MANIFEST_H */
