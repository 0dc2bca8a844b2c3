/*
 * plugins/accept/cand.h - a rule's input as the shared rule maths reads it
 * (kernels/common/vs_walk_rules.h: the formulas of the built-in rules, once, for these plugins
 * and for the ops' verify_walk on every device; header-only, each rule is its own plugin).
 */
#ifndef VSPEC_ACCEPT_CAND_H
#define VSPEC_ACCEPT_CAND_H

#include "common/vs_walk_rules.h" /* -Ikernels: plugins see include/ and kernels/common/ */
#include "vspec/plugin.h"

static inline vs_walk_cand vs_accept_cand(const vspec_accept_input *in) {
  vs_walk_cand c = {in->q, in->p, in->p_x, in->token, in->vocab, in->neighbour_table,
                    in->table_k};
  if (!in->neighbour_table || !in->neighbours || in->n_neighbours <= 0) c.table = NULL;
  return c;
}

#endif /* VSPEC_ACCEPT_CAND_H */
