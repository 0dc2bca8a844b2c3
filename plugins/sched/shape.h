/*
 * plugins/sched/shape.h - draft-shape parameters shared by the scheduler plugins
 * (header-only: each scheduler is its own plugin and links nothing but the host table).
 *
 * Parameters
 *   shape=dynamic     chain | static (EAGLE-1) | dynamic (EAGLE-2)
 *   depth=4           chain length, or dynamic-tree expansion steps (LANTERN: 4)
 *   top_k=10          dynamic tree branching (LANTERN: 10)
 *   total_tokens=58   dynamic tree size without the root (LANTERN's total_token = 59
 *                     counts the root: EaModel.from_pretrained in ea_model_llamagen.py)
 *   tree=NAME|PATHS   static tree: a name (see below) or rank paths such as
 *                     "0/1/0.0/0.1/0.0.0", children of a node listed without gaps
 *   drafter=auto      auto | model | head | NAME: the separate draft model, the EAGLE head,
 *                     or a drafter plugin such as jacobi (Speculative Jacobi Decoding, no
 *                     model: plugins/drafter/jacobi.c); a plugin builds its own tree at most
 *                     depth deep (shape=chain; depth VS_SHAPE_JACOBI_DEPTH by default) and
 *                     takes its own parameters, which the engine hands it (core/method.h)
 *
 * Static trees by name:
 *   mc_sim_7b_63   EAGLE-1's default, 25 nodes, depth 5 (EAGLE's eagle/model/choices.py)
 *   fmnist         our default for 8x8 token images, 15 nodes, depth 4: four candidates for
 *                  the first token, where a drafter is least sure, and a narrowing spine
 *                  below, because acceptance on the small Fashion-MNIST models falls off
 *                  after depth 3 and every extra node costs target compute on a CPU
 *   chainN         a single path of N nodes
 */
#ifndef VSPEC_SCHED_SHAPE_H
#define VSPEC_SCHED_SHAPE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/plugin.h"

#define ST_MAX_STATIC 127
/* A drafter plugin's default depth: SJD's window on LlamaGen, 16 tokens per forward, the root
 * and 15 drafts (plugins/drafter/jacobi.c gives the source) */
#define VS_SHAPE_JACOBI_DEPTH 15

enum { ST_CHAIN = 0, ST_STATIC = 1, ST_DYNAMIC = 2 };

typedef struct vs_shape {
  int shape, depth, top_k, total_tokens, drafter;
  int n_static;
  int32_t static_parents[ST_MAX_STATIC];
} vs_shape;

static const char *const st_named[][2] __attribute__((unused)) = {
    {"mc_sim_7b_63",
     "0/1/2/3/0.0/0.1/0.2/1.0/1.1/2.0/2.1/3.0/0.0.0/0.0.1/0.0.2/0.1.0/0.1.1/0.2.0/0.2.1/1.0.0/"
     "0.0.0.0/0.0.0.1/0.0.0.2/0.0.0.0.0/0.0.0.0.1"},
    {"fmnist", "0/1/2/3/0.0/0.1/0.2/1.0/1.1/2.0/0.0.0/0.0.1/0.1.0/1.0.0/0.0.0.0"},
    /* wide and shallow: where a drafter forward costs what its kernels' launches do (a GPU)
     * whatever its nodes, a level of siblings costs one forward */
    {"wide1", "0/1/2/3"},
    {"wide2", "0/1/2/3/0.0/0.1/1.0/2.0"},
};

/* Parses rank paths "0/1/0.0" into parent indices; paths may come in any order but every
 * prefix and every lower-ranked sibling must be present. */
static inline int st_parse_tree(vs_shape *s, const char *spec, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof st_named / sizeof st_named[0]; i++)
    if (strcmp(spec, st_named[i][0]) == 0) spec = st_named[i][1];
  if (strncmp(spec, "chain", 5) == 0) {
    int n = atoi(spec + 5);
    if (n < 1 || n > 32) {
      snprintf(err, errlen, "parameter 'tree' = '%s': chainN needs N in 1..32", spec);
      return VSPEC_ERANGE;
    }
    for (int i = 0; i < n; i++) s->static_parents[i] = i - 1;
    s->n_static = n;
    return VSPEC_OK;
  }
  /* Paths as rank lists. */
  int ranks[ST_MAX_STATIC][8], len[ST_MAX_STATIC], n = 0;
  const char *p = spec;
  while (*p) {
    if (n == ST_MAX_STATIC) {
      snprintf(err, errlen, "parameter 'tree': more than %d nodes", ST_MAX_STATIC);
      return VSPEC_ERANGE;
    }
    len[n] = 0;
    for (;;) {
      char *end;
      long r = strtol(p, &end, 10);
      if (end == p || r < 0 || r > 63 || len[n] == 8) {
        snprintf(err, errlen, "parameter 'tree' = '%s' is not a list of rank paths such as "
                 "0/1/0.0 (ranks 0..63, depth <= 8) or a known name (mc_sim_7b_63, fmnist, "
                 "chainN)", spec);
        return VSPEC_EINVAL;
      }
      ranks[n][len[n]++] = (int)r;
      p = end;
      if (*p == '.') {
        p++;
        continue;
      }
      break;
    }
    n++;
    if (*p == '/') p++;
    else if (*p) {
      snprintf(err, errlen, "parameter 'tree' = '%s': unexpected '%c'", spec, *p);
      return VSPEC_EINVAL;
    }
  }
  /* Order by (depth, lexicographic) so parents come first and siblings by rank. */
  int order[ST_MAX_STATIC];
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0; j--) {
      int a = order[j - 1], b = order[j], swap = len[a] > len[b];
      if (len[a] == len[b])
        for (int k = 0; k < len[a]; k++)
          if (ranks[a][k] != ranks[b][k]) {
            swap = ranks[a][k] > ranks[b][k];
            break;
          }
      if (!swap) break;
      order[j - 1] = b;
      order[j] = a;
    }
  for (int i = 0; i < n; i++) {
    int a = order[i];
    s->static_parents[i] = -2;
    /* the parent is the path without its last rank */
    if (len[a] == 1) s->static_parents[i] = -1;
    for (int j = 0; j < i && s->static_parents[i] == -2; j++) {
      int b = order[j];
      if (len[b] == len[a] - 1 && memcmp(ranks[b], ranks[a], (size_t)len[b] * sizeof(int)) == 0)
        s->static_parents[i] = j;
    }
    if (s->static_parents[i] == -2) {
      snprintf(err, errlen, "parameter 'tree': a path's parent path is missing");
      return VSPEC_EINVAL;
    }
    /* sibling ranks must be 0, 1, 2, ... : a gap would make the walk's conditional draft
     * probabilities wrong */
    int siblings = 0;
    for (int j = 0; j < i; j++) siblings += s->static_parents[j] == s->static_parents[i];
    if (ranks[a][len[a] - 1] != siblings) {
      snprintf(err, errlen, "parameter 'tree': sibling ranks must have no gaps (0, 1, 2, ...)");
      return VSPEC_EINVAL;
    }
    for (int j = 0; j < i; j++)
      if (len[order[j]] == len[a] && memcmp(ranks[order[j]], ranks[a], (size_t)len[a] * sizeof(int)) == 0) {
        snprintf(err, errlen, "parameter 'tree': a path is listed twice");
        return VSPEC_EINVAL;
      }
  }
  s->n_static = n;
  return n > 0 ? VSPEC_OK : VSPEC_EINVAL;
}


/* The shape keys, for param_check_known lists. */
#define VS_SHAPE_KEYS "shape", "depth", "top_k", "total_tokens", "tree", "drafter"

/* Reads the shape parameters (see the top of this file). */
static inline int vs_shape_parse(const vspec_host *host, const vspec_params *params, vs_shape *s,
                                 char *err, size_t errlen) {
  static const char *const shapes[] = {"chain", "static", "dynamic", NULL};
  static const char *const drafters[] = {"auto", "model", "head", NULL};
  memset(s, 0, sizeof *s);
  long depth, top_k, total;
  int rc;
  /* Any other name is a drafter plugin, which the engine resolves (and refuses if unknown). */
  const char *dn = host->param_string(params, "drafter");
  int plugin = dn && strcmp(dn, "auto") && strcmp(dn, "model") && strcmp(dn, "head");
  if (plugin) s->drafter = VSPEC_DRAFTER_PLUGIN;
  else if ((rc = host->param_choice(params, "drafter", drafters, 0, &s->drafter, err, errlen)))
    return rc;
  /* A drafter plugin builds its own tree; the scheduler plans a chain whose depth is its
   * window (SJD's for jacobi). */
  if ((rc = host->param_choice(params, "shape", shapes, plugin ? ST_CHAIN : ST_DYNAMIC, &s->shape,
                               err, errlen)) ||
      (rc = host->param_int(params, "depth", plugin ? VS_SHAPE_JACOBI_DEPTH : 4, 1, 32, &depth,
                            err, errlen)) ||
      (rc = host->param_int(params, "top_k", 10, 1, 32, &top_k, err, errlen)) ||
      (rc = host->param_int(params, "total_tokens", 58, 1, 127, &total, err, errlen)))
    return rc;
  if (plugin && s->shape != ST_CHAIN) {
    snprintf(err, errlen, "drafter=%s is a drafter plugin: it builds its own tree, at most "
             "depth deep (shape=chain, depth=D)", dn);
    return VSPEC_EINVAL;
  }
  s->depth = (int)depth;
  s->top_k = (int)top_k;
  s->total_tokens = (int)total;
  const char *tree = host->param_string(params, "tree");
  if (s->shape == ST_STATIC && (rc = st_parse_tree(s, tree ? tree : "fmnist", err, errlen)))
    return rc;
  if (s->shape != ST_STATIC && tree) {
    snprintf(err, errlen, "parameter 'tree' applies to shape=static only");
    return VSPEC_EINVAL;
  }
  if (host->param_string(params, "size")) {
    snprintf(err, errlen, "parameter 'size' (size=auto) is resolved before a job reaches the "
             "scheduler (vspec-bench, vspecd: core/autotune.h); a job handed to the engine "
             "directly gives depth, total_tokens or tree");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

static inline void vs_shape_plan(const vs_shape *s, vspec_round_plan *plan) {
  static const uint32_t shape[] = {VSPEC_DRAFT_CHAIN, VSPEC_DRAFT_STATIC, VSPEC_DRAFT_DYNAMIC};
  plan->shape = shape[s->shape];
  plan->depth = s->depth;
  plan->top_k = s->top_k;
  plan->total_tokens = s->total_tokens;
  plan->n_static = s->n_static;
  plan->static_parents = s->static_parents;
  plan->drafter = (uint32_t)s->drafter;
}

#endif /* VSPEC_SCHED_SHAPE_H */
