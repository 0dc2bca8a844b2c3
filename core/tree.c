#include "core/tree.h"

#include <stdlib.h>
#include <string.h>

int vs_tree_init(vs_tree *t, int cap, int cap_dists, int vocab) {
  memset(t, 0, sizeof *t);
  t->nodes = calloc((size_t)cap, sizeof *t->nodes);
  t->dists = malloc((size_t)cap_dists * vocab * sizeof(float));
  if (!t->nodes || !t->dists) {
    vs_tree_free(t);
    return -1;
  }
  t->cap = cap;
  t->cap_dists = cap_dists;
  t->vocab = vocab;
  return 0;
}

void vs_tree_free(vs_tree *t) {
  free(t->nodes);
  free(t->dists);
  memset(t, 0, sizeof *t);
}

static void tr_node_init(vs_tree_node *n, int32_t token, int32_t parent, int32_t depth) {
  *n = (vs_tree_node){.token = token, .parent = parent, .depth = depth, .first_child = -1,
                      .last_child = -1, .next_sibling = -1, .p_cond = 1.0f, .dist = -1,
                      .draft_slot = -1};
}

void vs_tree_reset(vs_tree *t, int32_t root_token) {
  t->n = 1;
  t->n_dists = 0;
  tr_node_init(&t->nodes[0], root_token, -1, 0);
}

int32_t vs_tree_add(vs_tree *t, int32_t parent, int32_t token, float p_cond, float logp) {
  if (t->n >= t->cap) return -1;
  int32_t i = t->n++;
  vs_tree_node *p = &t->nodes[parent], *n = &t->nodes[i];
  tr_node_init(n, token, parent, p->depth + 1);
  n->p_cond = p_cond;
  n->logp = logp;
  n->rank = p->n_children++;
  if (p->last_child < 0)
    p->first_child = i;
  else
    t->nodes[p->last_child].next_sibling = i;
  p->last_child = i;
  return i;
}

float *vs_tree_new_dist(vs_tree *t, int32_t node) {
  if (t->nodes[node].dist < 0) {
    if (t->n_dists >= t->cap_dists) return NULL;
    t->nodes[node].dist = t->n_dists++;
  }
  return t->dists + (size_t)t->nodes[node].dist * t->vocab;
}

void vs_tree_parents(const vs_tree *t, int32_t *parents) {
  for (int32_t i = 0; i < t->n; i++) parents[i] = t->nodes[i].parent;
}

int32_t vs_tree_max_depth(const vs_tree *t) {
  int32_t d = 0;
  for (int32_t i = 0; i < t->n; i++)
    if (t->nodes[i].depth > d) d = t->nodes[i].depth;
  return d;
}
