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

typedef struct vs_manifest {
  char name[64]; /* "" when the manifest names none */
  vs_sampling defaults;
  vs_manifest_role target, draft, eagle;
} vs_manifest;

/* Parses `len` bytes of manifest text (JSON; need not end in NUL) of model directory `dir`;
 * `path` names it in messages. `base` are the defaults the manifest's "defaults" overlay.
 * Only the roles in `roles` (VS_ROLE_*) are read; the target must be there if asked for.
 * Returns 0, or VSPEC_EFORMAT (VSPEC_ENOMEM) with a message naming the path and the key. */
int vs_manifest_parse(const char *text, size_t len, const char *dir, const char *path,
                      const vs_sampling *base, unsigned roles, vs_manifest *m, char *err,
                      size_t errlen);

/* The same for DIR/vspec-model.json. VSPEC_ENOENT when there is none (not an error for
 * vs_models_open: a directory with gpt.safetensors needs no manifest). */
int vs_manifest_read(const char *dir, const vs_sampling *base, unsigned roles, vs_manifest *m,
                     char *err, size_t errlen);

#endif /* VS_MANIFEST_H */
