/*
 * kernels/common/vs_tree_visible.h - which cache slots a tree forward's query sees
 * (vspec_kv_tree_view, include/vspec/ops.h), as code both the CPU and the CUDA kernels compile:
 * the rule is written once, and a CPU test of it covers the GPU's copy.
 */
#ifndef VS_TREE_VISIBLE_H
#define VS_TREE_VISIBLE_H

#include <stdint.h>

#include "kernels/common/vs_math.h"
#include "vspec/ops.h"

/* Slots the queries of a forward read: committed + base + n. */
VS_HD static inline int vs_tree_kv_len(const vspec_kv_tree_view *t) {
  return t->lens[0] + t->lens[1] + t->n;
}

/* Writes row[s] = 1 where query i sees slot s, 0 elsewhere, for s < vs_tree_kv_len(t). The
 * ancestor walk costs the node's depth; parents must precede children (the forward's batch
 * check guarantees it). */
VS_HD static inline void vs_tree_mask_row(const vspec_kv_tree_view *t, int i, uint8_t *row) {
  int L = t->lens[0], base = t->lens[1], kv = vs_tree_kv_len(t), self = L + base + i;
  for (int s = 0; s < L; s++) row[s] = 1;
  for (int s = L; s < kv; s++) row[s] = 0;
  for (int a = base + i; a >= 0; a = t->parents[a]) row[L + a] = 1;
  for (int s = 0; s < t->n_prefix && s < kv; s++)
    if (!t->prefix[s] && s != self) row[s] = 0;
}

#endif /* VS_TREE_VISIBLE_H */
