/*
 * core/drafter.c - one entry point for every kind of drafter (core/drafter_class.h lists
 * them); the engine never knows which kind it drives.
 */
#include "core/drafter.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/drafter_class.h"

struct vs_drafter {
  const vs_drafter_class *cls;
  void *self;
};

int vs_drafter_open(const vs_drafter_config *cfg, vs_drafter **out, char *err, size_t errlen) {
  const vs_drafter_class *cls;
  switch (cfg->kind) {
    case VSPEC_DRAFTER_MODEL:
    case VSPEC_DRAFTER_HEAD: cls = &vs__drafter_model; break;
    case VSPEC_DRAFTER_PLUGIN: cls = &vs__drafter_plugin; break;
    default:
      snprintf(err, errlen, "unknown drafter kind %u", cfg->kind);
      return VSPEC_EINVAL;
  }
  if (cls->propose == NULL && cfg->params && *cfg->params) {
    snprintf(err, errlen, "drafter '%s' takes no parameters (got '%s')", cls->name, cfg->params);
    return VSPEC_EINVAL;
  }
  vs_drafter *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  d->cls = cls;
  int rc = cls->open(cfg, &d->self, err, errlen);
  if (rc) {
    free(d);
    return rc;
  }
  *out = d;
  return VSPEC_OK;
}

void vs_drafter_close(vs_drafter *d) {
  if (!d) return;
  d->cls->close(d->self);
  free(d);
}

int vs_drafter_uses_features(const vs_drafter *d) { return d->cls->uses_features(d->self); }

int vs_drafter_start(vs_drafter *d, int32_t root_token, const float *root_feature, char *err,
                     size_t errlen) {
  return d->cls->start(d->self, root_token, root_feature, err, errlen);
}

int vs_drafter_begin(vs_drafter *d, vs_tree *tree, int32_t root_index, char *err,
                     size_t errlen) {
  if (!d->cls->begin) {
    snprintf(err, errlen, "drafter '%s' proposes its drafts itself", d->cls->name);
    return VSPEC_EINVAL;
  }
  return d->cls->begin(d->self, tree, root_index, err, errlen);
}

int vs_drafter_expand(vs_drafter *d, vs_tree *tree, const int32_t *nodes, int n,
                      int32_t root_index, char *err, size_t errlen) {
  if (!d->cls->expand) {
    snprintf(err, errlen, "drafter '%s' proposes its drafts itself", d->cls->name);
    return VSPEC_EINVAL;
  }
  return d->cls->expand(d->self, tree, nodes, n, root_index, err, errlen);
}

int vs_drafter_proposes(const vs_drafter *d) { return d->cls->propose != NULL; }

int vs_drafter_propose(vs_drafter *d, vs_tree *tree, int depth, int32_t root_index, char *err,
                       size_t errlen) {
  return d->cls->propose(d->self, tree, depth, root_index, err, errlen);
}

int vs_drafter_end(vs_drafter *d, const vs_round_outcome *o, char *err, size_t errlen) {
  return d->cls->end(d->self, o, err, errlen);
}

int vs_drafter_skip(vs_drafter *d, const float *root_feature, int32_t next_root, char *err,
                    size_t errlen) {
  return d->cls->skip(d->self, root_feature, next_root, err, errlen);
}

int64_t vs_drafter_forwards(const vs_drafter *d) {
  int64_t f = 0, n = 0;
  d->cls->counts(d->self, &f, &n);
  return f;
}

int64_t vs_drafter_nodes(const vs_drafter *d) {
  int64_t f = 0, n = 0;
  d->cls->counts(d->self, &f, &n);
  return n;
}

void vs_drafter_set_gate(vs_drafter *d, struct vs_forward_gate *gate) {
  if (d->cls->set_gate) d->cls->set_gate(d->self, gate);
}

const float *vs_drafter_node_feature(const vs_drafter *d, int32_t node) {
  return d->cls->node_feature ? d->cls->node_feature(d->self, node) : NULL;
}
