/*
 * core/tree.h - the draft token tree of one round.
 *
 * Node 0 is the root: the last emitted token, not yet in the target's cache. Children of a
 * node are kept in proposal order (rank 0 first), which is the order the verification walk
 * tries them in. A node the drafter expanded owns the processed draft distribution its
 * children were drawn from.
 */
#ifndef VS_TREE_H
#define VS_TREE_H

#include <stddef.h>
#include <stdint.h>

typedef struct vs_tree_node {
  int32_t token;
  int32_t parent;       /* -1 for the root */
  int32_t depth;        /* root 0 */
  int32_t rank;         /* position among its siblings */
  int32_t first_child, last_child, next_sibling, n_children;
  float p_cond;         /* probability the node was proposed with: p(x) for a sampled chain,
                           p(x) / (1 - mass of earlier siblings) for a tree sampled without
                           replacement, 1 for deterministic top-k drafts */
  float logp;           /* cumulative draft log-probability of the path (0 at the root) */
  int32_t dist;         /* index of this node's expansion distribution, -1 if not expanded */
  int32_t draft_slot;   /* pending-node index in the drafter's session, -1 if not forwarded */
} vs_tree_node;

typedef struct vs_tree {
  int32_t n, cap, vocab;
  int32_t cap_dists;    /* expansion distributions the tree can hold */
  vs_tree_node *nodes;
  float *dists;         /* [cap, vocab] processed draft distributions of expanded nodes */
  int32_t n_dists;
  int deterministic;    /* drafts are top-k choices: the walk treats p as one-hot (p := 1) */
} vs_tree;

/* cap nodes, of which at most cap_dists can be expanded (hold a draft distribution). */
int vs_tree_init(vs_tree *t, int cap, int cap_dists, int vocab);
void vs_tree_free(vs_tree *t);
void vs_tree_reset(vs_tree *t, int32_t root_token);
/* Appends a child of `parent` after its existing children; returns its index or -1 when the
 * tree is full. */
int32_t vs_tree_add(vs_tree *t, int32_t parent, int32_t token, float p_cond, float logp);
/* Gives node i an expansion distribution slot and returns it ([vocab] floats), or NULL
 * when all cap_dists slots are taken. */
float *vs_tree_new_dist(vs_tree *t, int32_t node);
static inline const float *vs_tree_dist(const vs_tree *t, int32_t node) {
  return t->nodes[node].dist >= 0 ? t->dists + (size_t)t->nodes[node].dist * t->vocab : 0;
}
/* parents[] of every node (root -1), the form backends take. */
void vs_tree_parents(const vs_tree *t, int32_t *parents);
int32_t vs_tree_max_depth(const vs_tree *t);

#endif /* VS_TREE_H */
