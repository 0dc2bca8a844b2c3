/*
 * core/drafter_class.h - what a kind of drafter implements (internal to core/drafter*.c).
 *
 * core/drafter.c dispatches through this table; each kind lives in its own file:
 *   drafter_model.c   a draft model or an EAGLE head (the engine's tree builders drive it
 *                     through begin / expand, one forward per tree level)
 *   drafter_plugin.c  a drafter plugin (include/vspec/plugin.h: Speculative Jacobi Decoding
 *                     is plugins/drafter/jacobi.c): it proposes the whole tree itself
 * A kind implements either begin + expand or propose.
 */
#ifndef VS_DRAFTER_CLASS_H
#define VS_DRAFTER_CLASS_H

#include "core/drafter.h"

typedef struct vs_drafter_class {
  const char *name;
  int (*open)(const vs_drafter_config *cfg, void **self, char *err, size_t errlen);
  void (*close)(void *self);
  int (*uses_features)(const void *self);
  int (*start)(void *self, int32_t root_token, const float *root_feature, char *err,
               size_t errlen);
  /* model-driven kinds */
  int (*begin)(void *self, vs_tree *tree, int32_t root_index, char *err, size_t errlen);
  int (*expand)(void *self, vs_tree *tree, const int32_t *nodes, int n, int32_t root_index,
                char *err, size_t errlen);
  /* self-driven kinds */
  int (*propose)(void *self, vs_tree *tree, int depth, int32_t root_index, char *err,
                 size_t errlen);
  int (*end)(void *self, const vs_round_outcome *o, char *err, size_t errlen);
  int (*skip)(void *self, const float *root_feature, int32_t next_root, char *err,
              size_t errlen);
  void (*set_gate)(void *self, struct vs_forward_gate *gate); /* NULL: no forwards */
  const float *(*node_feature)(const void *self, int32_t node); /* NULL: no features */
  void (*counts)(const void *self, int64_t *forwards, int64_t *nodes);
} vs_drafter_class;

extern const vs_drafter_class vs__drafter_model;
extern const vs_drafter_class vs__drafter_plugin;

#endif /* VS_DRAFTER_CLASS_H */
