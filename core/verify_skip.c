/*
 * core/verify_skip.c - partial verification skipping (VVS, arXiv 2511.13587 §4): the
 * scheduler may accept a drafted path without calling the target; the accepted tokens are
 * fed to the target in front of the next tree (post-verification) and the drafter goes on
 * from reused features.
 */
#include <stdio.h>
#include <string.h>

#include "core/round_loop.h"
#include "core/status.h"

int vs_skip_decide(vs_rounds *c, const vspec_round_state *st, int remaining,
                   vspec_skip_decision *dec, char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  for (int i = 0; i < t->n; i++) {
    c->view_tokens[i] = t->nodes[i].token;
    c->view_depth[i] = t->nodes[i].depth;
    c->view_score[i] = t->nodes[i].logp;
  }
  vs_tree_parents(t, c->parents);
  vspec_tree_view view = {.struct_size = sizeof view, .n_nodes = t->n, .tokens = c->view_tokens,
                          .parents = c->parents, .depth = c->view_depth, .score = c->view_score,
                          .codebook = c->t->info.codebook, .token_dim = c->t->info.token_dim};
  int rc = c->sched_vt->decide(c->sched, st, &view, &c->rng_sched, dec);
  if (rc) {
    return vs_fail(err, errlen, rc, "scheduler failed to decide whether to verify: %s (%d)",
                   vspec_strerror(rc), rc);
  }
  if (!dec->skip) return VSPEC_OK;
  if (dec->leaf < 1 || dec->leaf >= t->n || dec->length < 1 ||
      dec->length > t->nodes[dec->leaf].depth || dec->length > remaining ||
      dec->features > VSPEC_FEATURES_BLEND || dec->extra_staleness < 0) {
    snprintf(err, errlen, "scheduler chose an invalid unverified path (node %d, %d tokens)",
             dec->leaf, dec->length);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* The feature-cache slot whose features the j-th of gamma unverified inputs reuses: the
 * gamma most recent ones, `staleness` positions older (§4.3, retrieve_features in the
 * reference code's skip_utils_llamagen.py); when fewer exist than tokens, the cache in order
 * and then its most recent entry repeated, as the reference code does. */
int vs_skip_stale_slot(int n_fcache, int staleness, int gamma, int j) {
  int avail = n_fcache - staleness; /* the entries at least `staleness` positions old */
  if (avail < 1) avail = 1;
  if (avail > n_fcache) avail = n_fcache;
  int slot = gamma <= avail ? avail - gamma + j : (j < avail ? j : avail - 1);
  return slot < 0 ? 0 : slot;
}

/* Accepts the first `length` drafted tokens of the path to `leaf` without calling the
 * target (VVS §4.1-4.3): the root and all but the last of them wait for the next target
 * forward; the last becomes the new root; the drafter continues with reused features. */
int vs_skip_accept(vs_rounds *c, const vspec_skip_decision *dec, int32_t root_index,
                   int32_t *tokens, int *emitted, int *gamma_out, char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  int32_t pathn[VS_MAX_DEPTH + 2];
  int depth = t->nodes[dec->leaf].depth, gamma = dec->length;
  for (int32_t a = dec->leaf; a >= 0; a = t->nodes[a].parent) pathn[t->nodes[a].depth] = a;
  (void)depth;
  /* Tokens for the next target forward: the root and the accepted drafts before the last. */
  c->unv[c->n_unv++] = tokens[root_index];
  for (int j = 1; j < gamma; j++) c->unv[c->n_unv++] = t->nodes[pathn[j]].token;
  int32_t acc[VS_MAX_DEPTH + 1];
  for (int j = 1; j <= gamma; j++) {
    acc[j - 1] = t->nodes[pathn[j]].token;
    if (c->job->status) c->job->status[*emitted] = VS_TOKEN_UNVERIFIED;
    tokens[(*emitted)++] = acc[j - 1];
  }
  c->mt->tokens = *emitted;
  c->mt->skipped_rounds++;
  c->mt->unverified_tokens += gamma;
  *gamma_out = gamma;
  if (*emitted >= c->N) return VSPEC_OK;
  /* Features for the gamma inputs (accepted drafts 1..gamma-1 and the new root): the most
   * recent cached target features, as many as tokens (§4.3), or the drafter's own. */
  float *pf = NULL;
  if (vs_drafter_uses_features(c->drafter)) {
    size_t fs = (size_t)c->rows * c->fdim;
    pf = c->path_feats;
    for (int j = 0; j < gamma; j++) {
      int slot = vs_skip_stale_slot(c->n_fcache, dec->extra_staleness, gamma, j);
      const float *stale = c->fcache + (size_t)slot * fs;
      const float *own = vs_drafter_node_feature(c->drafter, c->feat_node[pathn[j]]);
      float *dst = pf + (size_t)j * fs;
      for (size_t k = 0; k < fs; k++)
        dst[k] = dec->features == VSPEC_FEATURES_STALE ? stale[k]
                 : dec->features == VSPEC_FEATURES_DRAFT ? own[k]
                                                          : 0.5f * (stale[k] + own[k]);
    }
  }
  vs_round_outcome o = {.tree = t, .path = pathn, .accepted = acc, .n = gamma - 1,
                        .features = pf, .next_root = acc[gamma - 1],
                        .root_index = root_index, .logits = NULL};
  return vs_drafter_end(c->drafter, &o, err, errlen);
}
