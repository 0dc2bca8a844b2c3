/*
 * core/verify_walk.c - the verification walk: one implementation for every acceptance rule
 * (SpecInfer's multi-candidate verification, arXiv 2305.09781 §4; EAGLE-1's tree walk,
 * arXiv 2401.15077 §4.2).
 *
 * At each node the children are tried in rank order; the rule's acceptance probability
 * decides; after a rejection the rule turns the target residual into the distribution the
 * next sibling is judged against. When a child is accepted the walk descends; when a node
 * has no children the bonus token is sampled from the target distribution there (for
 * vanilla AR, the one-node tree, that is the AR step); when every child is rejected the
 * next token is sampled from the residual. If a residual has no mass left (float
 * round-off, or a relaxed rule that removed everything) the walk falls back to the target
 * distribution at that node without the rejected candidates, and to the unmodified target
 * distribution if that is empty too (docs/SPECULATIVE.md).
 */
#include <stdio.h>
#include <string.h>

#include "core/round_loop.h"
#include "core/status.h"
#include "kernels/common/vs_philox.h"

static void vw_normalise(float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  if (s > 0.0)
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] / s);
}

static double vw_mass(const float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  return s;
}

int vs_verify_walk(vs_rounds *c, int32_t root_index, int32_t *path, int *n_path, int32_t *next,
                   char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  int V = c->V, max_depth = vs_tree_max_depth(t);
  int32_t node = 0;
  *n_path = 0;
  path[(*n_path)++] = 0;
  for (;;) {
    const vs_tree_node *tn = &t->nodes[node];
    /* Target distribution after `node`: it predicts image token root_index + depth + 1. */
    const float *node_logits = c->logits + (c->logits_off + (size_t)node) * c->rows * V;
    vs_node_distribution(&c->sampler, node_logits, c->rows, root_index + tn->depth + 1, c->s,
                         c->q);
    if (tn->first_child < 0) {
      /* Bonus token (or the plain AR step of a round without drafts). */
      *next = c->greedy ? vs_argmax_first(c->q, V)
                        : vs_draw(c->q, V, vs_rng_uniform(&c->rng_target));
      break;
    }
    int depth = tn->depth + 1;
    if (depth <= VS_MAX_DEPTH) c->mt->reached[depth]++;
    c->mt->drafted++;
    memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
    if (c->greedy && c->rule_vt->greedy_accept) {
      /* greedy relaxed rules judge against the target's softmax, not its one-hot argmax,
       * and unfiltered (top_k / top_p off), as the authors' greedy path does
       * (torch.softmax of the raw logits in EaModel.evaluate_posterior[_v1]) */
      vs_sampling s1 = *c->s;
      s1.temperature = 1.0f;
      s1.top_k = 0;
      s1.top_p = 1.0f;
      vs_node_distribution(&c->sampler, node_logits, c->rows, root_index + tn->depth + 1, &s1,
                           c->q_res);
    }
    const float *pdist = vs_tree_dist(t, node);
    int sampled = !t->deterministic && pdist;
    if (sampled) memcpy(c->p_work, pdist, (size_t)V * sizeof(float));
    int32_t accepted = -1;
    for (int32_t ch = tn->first_child; ch >= 0; ch = t->nodes[ch].next_sibling) {
      int32_t x = t->nodes[ch].token;
      float px = sampled ? c->p_work[x] : 1.0f;
      if (!(px > 0.0f)) continue; /* no draft mass: skipped, as EAGLE's evaluate_posterior does */
      vspec_accept_input in = {.struct_size = sizeof in, .vocab = V, .token = x, .depth = depth,
                               .max_depth = max_depth, .sibling = t->nodes[ch].rank,
                               .p_x = px, .p = sampled ? c->p_work : NULL, .q = c->q_res};
      if (c->neighbours) {
        in.neighbour_table = c->neighbours;
        in.table_k = c->neighbours_k;
        in.neighbours = c->neighbours + (size_t)x * in.table_k;
        in.n_neighbours = in.table_k;
      }
      c->mt->siblings_tried++;
      int ok;
      if (c->greedy) {
        ok = c->rule_vt->greedy_accept ? c->rule_vt->greedy_accept(c->rule, &in)
                                       : x == vs_argmax_first(c->q, V);
      } else {
        double a = c->rule_vt->accept_prob(c->rule, &in);
        ok = vs_rng_uniform(&c->rng_accept) < a;
      }
      if (ok) {
        accepted = ch;
        break;
      }
      if (c->greedy) continue;
      int rc = c->rule_vt->residual(c->rule, &in, c->q_tmp);
      if (rc) {
        return vs_fail(err, errlen, rc, "acceptance rule failed to compute a residual: %s (%d)",
                       vspec_strerror(rc), rc);
      }
      if (vw_mass(c->q_tmp, V) > 0.0) {
        memcpy(c->q_res, c->q_tmp, (size_t)V * sizeof(float));
        vw_normalise(c->q_res, V);
      } else {
        /* Fallback: the target distribution without the candidates rejected so far. */
        c->mt->residual_fallbacks++;
        memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
        for (int32_t r = tn->first_child; r >= 0; r = t->nodes[r].next_sibling) {
          c->q_res[t->nodes[r].token] = 0.0f;
          if (r == ch) break;
        }
        if (vw_mass(c->q_res, V) > 0.0) vw_normalise(c->q_res, V);
        else memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
      }
      if (sampled) {
        /* The next sibling was drawn from p without the tokens tried so far. */
        c->p_work[x] = 0.0f;
        vw_normalise(c->p_work, V);
      }
    }
    if (accepted >= 0) {
      if (depth <= VS_MAX_DEPTH) c->mt->accepted_at[depth]++;
      c->mt->accepted++;
      path[(*n_path)++] = accepted;
      node = accepted;
      continue;
    }
    *next = c->greedy ? vs_argmax_first(c->q, V)
                      : vs_draw(c->q_res, V, vs_rng_uniform(&c->rng_target));
    break;
  }
  if (*next < 0) {
    snprintf(err, errlen, "the target distribution is empty (all probabilities zero)");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}
