/*
 * core/draft_tree.c - this round's token tree below the root (algorithms: EAGLE-1, arXiv
 * 2401.15077 §4; EAGLE-2, arXiv 2406.16858 §4).
 *
 *   chain    a separate draft model samples L tokens one after the other
 *   static   EAGLE-1: a fixed shape; each expanded node's children are sampled without
 *            replacement (temperature > 0) and carry conditional probabilities; they may be
 *            drawn on the device (core/draft_device.c), a level a forward
 *   dynamic  EAGLE-2: expand the top_k best nodes by cumulative log-probability for
 *            `depth` steps, keep the total_tokens best; drafts are deterministic, so the
 *            walk treats the draft distribution as one-hot (p := 1)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/round_loop.h"
#include "core/status.h"
#include "kernels/common/vs_philox.h"

int vs_draft_chain(vs_rounds *c, int depth, int32_t root_index, char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  t->deterministic = c->greedy;
  int32_t node = 0;
  for (int d = 1; d <= depth && c->round_dev; d++) {
    /* drawn on the device (core/draft_device.c): draft d - 1 of the chain's device tokens */
    int32_t child = vs_tree_add(t, node, -d, 1.0f, 0.0f);
    if (child < 0) return vs_fail(err, errlen, VSPEC_ERANGE, "a chain of %d drafts does not "
                                  "fit the tree", depth);
    int rc = d < depth ? vs_drafter_expand(c->drafter, t, &child, 1, root_index, err, errlen) : 0;
    if (rc) return rc;
    node = child;
  }
  for (int d = 1; d <= depth && !c->round_dev; d++) {
    const float *p = vs_tree_dist(t, node);
    int32_t x;
    float px = 1.0f;
    if (c->greedy) {
      x = vs_argmax_first(p, c->V);
    } else {
      x = vs_draw(p, c->V, vs_rng_uniform(&c->rng_draft));
      if (x < 0) break; /* an empty draft distribution: stop drafting */
      px = p[x];
    }
    /* the path's cumulative draft log-probability, as dynamic trees carry it (VVS's
     * confidence selection ranks paths by it) */
    float lp = t->nodes[node].logp + (p[x] > 0.0f ? logf(p[x]) : -INFINITY);
    int32_t child = vs_tree_add(t, node, x, px, lp);
    if (child < 0) break;
    if (d < depth) {
      int rc = vs_drafter_expand(c->drafter, t, &child, 1, root_index, err, errlen);
      if (rc) return rc;
    }
    node = child;
  }
  return VSPEC_OK;
}

/* Children of `node`, `count` of them, drawn without replacement from its draft
 * distribution (temperature > 0) or its top-`count` (greedy), in rank order. */
static void dt_sample_children(vs_rounds *c, int32_t node, int count) {
  vs_tree *t = &c->tree;
  const float *p = vs_tree_dist(t, node);
  memcpy(c->p_work, p, (size_t)c->V * sizeof(float));
  for (int j = 0; j < count; j++) {
    double mass = 0.0;
    for (int y = 0; y < c->V; y++) mass += c->p_work[y];
    if (mass <= 0.0) return;
    int32_t x;
    if (c->greedy) {
      x = vs_argmax_first(c->p_work, c->V);
      if (c->p_work[x] <= 0.0f) return;
    } else {
      x = vs_draw(c->p_work, c->V, vs_rng_uniform(&c->rng_draft));
      if (x < 0) return;
    }
    /* EAGLE-1's conditional probability under sampling without replacement,
     * p(x) / (1 - mass of earlier siblings) (eagle/model/cnets.py, Model.sample). */
    float pc = c->greedy ? 1.0f : (float)(c->p_work[x] / mass);
    /* cumulative draft log-probability of the path (the unconditional p(x), as dynamic
     * trees carry it; VVS's confidence selection ranks paths by it) */
    float lp = t->nodes[node].logp + (p[x] > 0.0f ? logf(p[x]) : -INFINITY);
    if (vs_tree_add(t, node, x, pc, lp) < 0) return;
    c->p_work[x] = 0.0f;
  }
}

/* A static tree drawn on the device (core/draft_device.c set its rows up): after forward k
 * the children of its rows are there, tree node j + 1 draft j (token -1 - j); forward k + 1
 * expands the next level's rows. */
static int dt_static_device(vs_rounds *c, int32_t root_index, char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  const vs_draw_children *dc = &c->draw_children;
  t->deterministic = c->greedy;
  for (int k = 0; k < c->n_draw_fwd; k++) {
    for (int r = c->draw_fwd[k]; r < c->draw_fwd[k + 1]; r++)
      for (int j = 0; j < dc->counts[r]; j++) {
        int32_t draft = dc->first[r] + j;
        if (vs_tree_add(t, c->draw_node[r], -1 - draft, 1.0f, 0.0f) != draft + 1)
          return vs_fail(err, errlen, VSPEC_ERANGE, "the static tree does not fit (%d nodes)",
                         draft + 2);
      }
    if (k + 1 == c->n_draw_fwd) break;
    int32_t expand[VS_SD_MAX_NODES];
    int ne = 0;
    for (int r = c->draw_fwd[k + 1]; r < c->draw_fwd[k + 2]; r++) expand[ne++] = c->draw_node[r];
    int rc = vs_drafter_expand(c->drafter, t, expand, ne, root_index, err, errlen);
    if (rc) return rc;
  }
  return VSPEC_OK;
}

int vs_draft_static(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                            int32_t root_index, char *err, size_t errlen) {
  if (c->round_dev) return dt_static_device(c, root_index, err, errlen);
  vs_tree *t = &c->tree;
  t->deterministic = c->greedy;
  int n = plan->n_static;
  /* tree index of each static node (-1: not materialised), depth, children count */
  int32_t map[VS_SD_MAX_NODES], sdepth[VS_SD_MAX_NODES], nkids_root = 0;
  int32_t nkids[VS_SD_MAX_NODES];
  if (n >= VS_SD_MAX_NODES) {
    snprintf(err, errlen, "static tree of %d nodes exceeds %d", n, VS_SD_MAX_NODES - 1);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < n; i++) {
    int p = plan->static_parents[i];
    if (p < -1 || p >= i) {
      snprintf(err, errlen, "static tree node %d has parent %d: parents must come first", i, p);
      return VSPEC_EINVAL;
    }
    sdepth[i] = p < 0 ? 1 : sdepth[p] + 1;
    nkids[i] = 0;
    map[i] = -1;
    if (sdepth[i] > depth_limit) continue;
    if (p < 0) nkids_root++;
    else nkids[p]++;
  }
  /* Level by level: sample the children of every expanded node at this level, then
   * expand (one drafter forward) the new nodes that have children of their own. */
  dt_sample_children(c, 0, nkids_root);
  for (int d = 1; d <= depth_limit; d++) {
    /* Assign tree nodes to the static nodes of depth d. */
    for (int i = 0; i < n; i++) {
      if (sdepth[i] != d) continue;
      int p = plan->static_parents[i];
      int32_t tp = p < 0 ? 0 : map[p];
      if (tp < 0) continue;
      /* the k-th static child of p is the tree child of rank k */
      int rank = 0;
      for (int j = 0; j < i; j++)
        if (plan->static_parents[j] == p && sdepth[j] <= depth_limit) rank++;
      int32_t ch = t->nodes[tp].first_child;
      while (ch >= 0 && rank--) ch = t->nodes[ch].next_sibling;
      map[i] = ch;
    }
    int32_t expand[VS_SD_MAX_NODES];
    int ne = 0;
    for (int i = 0; i < n; i++)
      if (sdepth[i] == d && map[i] >= 0 && nkids[i] > 0) expand[ne++] = map[i];
    if (ne == 0) break;
    int rc = vs_drafter_expand(c->drafter, t, expand, ne, root_index, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < n; i++)
      if (sdepth[i] == d && map[i] >= 0 && nkids[i] > 0) dt_sample_children(c, map[i], nkids[i]);
  }
  return VSPEC_OK;
}

/* Indices of the k largest entries of v[0..n) into out (descending, ties by index). */
static int dt_topk(const float *v, int n, int k, int32_t *out) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!(v[i] > -INFINITY)) continue;
    if (m < k) {
      out[m++] = i;
    } else if (v[i] > v[out[m - 1]]) {
      out[m - 1] = i;
    } else {
      continue;
    }
    /* insertion step: keep out[] sorted descending, stable for equal values */
    for (int j = m - 1; j > 0 && v[out[j]] > v[out[j - 1]]; j--) {
      int32_t tmp = out[j];
      out[j] = out[j - 1];
      out[j - 1] = tmp;
    }
  }
  return m;
}

static int dt_cmp_pool(const void *a, const void *b, void *ctx) {
  const float *cu = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (cu[x] > cu[y]) return -1;
  if (cu[x] < cu[y]) return 1;
  return (x > y) - (x < y);
}

static int dt_cmp_index(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Drops the frontier nodes none of whose descendants can be kept, and returns how many are
 * left (in order). The rerank keeps the `keep` best pool nodes by (score desc, index asc).
 * A descendant of node f scores at most f's score and is created after every node now in the
 * pool, so every pool node scoring at least f's (f included) ranks before it: once there are
 * `keep` of them, expanding f cannot change the kept tree. The authors' pool
 * (Model.topK_genrate) expands all top_k frontier nodes at every step, depth x top_k drafter
 * nodes a round whatever total_tokens is; this keeps their tree exactly (the same nodes in
 * the same order: what is dropped would only have added nodes that rank after the kept
 * ones) with as few as total_tokens drafter nodes per step, which is what makes small
 * dynamic trees affordable where a drafter forward is not free (a CPU). */
static int dt_prune_frontier(const vs_tree *pool, int32_t *frontier, int nf, int keep) {
  int kept = 0;
  for (int f = 0; f < nf; f++) {
    float s = pool->nodes[frontier[f]].logp;
    int ahead = 0;
    for (int i = 1; i < pool->n && ahead < keep; i++) ahead += pool->nodes[i].logp >= s;
    if (ahead < keep) frontier[kept++] = frontier[f];
  }
  return kept;
}

/* EAGLE-2 (as Model.topK_genrate in LANTERN's cnets_llamagen.py): grow a candidate pool by
 * cumulative log-probability, then keep the total_tokens best as the tree. Drafts are
 * deterministic (p := 1). */
int vs_draft_dynamic(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                             int32_t root_index, char *err, size_t errlen) {
  vs_tree *pool = &c->pool, *t = &c->tree;
  int K = plan->top_k, steps = plan->depth, total = plan->total_tokens;
  vs_tree_reset(pool, t->nodes[0].token);
  pool->nodes[0].draft_slot = t->nodes[0].draft_slot;
  memcpy(vs_tree_new_dist(pool, 0), vs_tree_dist(t, 0), (size_t)c->V * sizeof(float));
  float *lp = c->q_tmp;
  int32_t top[64], frontier[64];
  int nf = 0;
  /* children of a pool node: its top K tokens by log p */
  const float *p0 = vs_tree_dist(pool, 0);
  for (int y = 0; y < c->V; y++) lp[y] = p0[y] > 0.0f ? logf(p0[y]) : -INFINITY;
  int m = dt_topk(lp, c->V, K, top);
  for (int j = 0; j < m && 1 <= depth_limit; j++) {
    int32_t ch = vs_tree_add(pool, 0, top[j], 1.0f, lp[top[j]]);
    if (ch >= 0) frontier[nf++] = ch;
  }
  /* The tree keeps at most `keep_max` pool nodes (room left for the unverified prefix). */
  int keep_max = total < t->cap - 1 - c->n_unv ? total : t->cap - 1 - c->n_unv;
  for (int step = 1; step <= steps && nf > 0; step++) {
    if (pool->nodes[frontier[0]].depth >= depth_limit) break;
    nf = dt_prune_frontier(pool, frontier, nf, keep_max);
    if (nf == 0) break;
    if (pool->n + nf * K > pool->cap) break;
    int rc = vs_drafter_expand(c->drafter, pool, frontier, nf, root_index, err, errlen);
    if (rc) return rc;
    int first_new = pool->n;
    for (int f = 0; f < nf; f++) {
      const float *p = vs_tree_dist(pool, frontier[f]);
      for (int y = 0; y < c->V; y++) lp[y] = p[y] > 0.0f ? logf(p[y]) : -INFINITY;
      m = dt_topk(lp, c->V, K, top);
      float base = pool->nodes[frontier[f]].logp;
      for (int j = 0; j < m; j++) vs_tree_add(pool, frontier[f], top[j], 1.0f, base + lp[top[j]]);
    }
    /* the next frontier: the K best new nodes by cumulative log-probability */
    int n_new = pool->n - first_new;
    for (int i = 0; i < n_new; i++) c->pool_cu[i] = pool->nodes[first_new + i].logp;
    m = dt_topk(c->pool_cu, n_new, K, top);
    nf = 0;
    for (int j = 0; j < m; j++) frontier[nf++] = first_new + top[j];
  }
  /* Rerank: the `total` best pool nodes; sorting by (score desc, index asc) keeps every
   * selected node's parent selected, since scores never increase along a path and parents
   * are created first. */
  int n_cand = 0;
  for (int i = 1; i < pool->n; i++) c->order[n_cand++] = i;
  for (int i = 0; i < pool->n; i++) c->pool_cu[i] = pool->nodes[i].logp;
  qsort_r(c->order, (size_t)n_cand, sizeof(int32_t), dt_cmp_pool, c->pool_cu);
  int keep = n_cand < keep_max ? n_cand : keep_max;
  qsort(c->order, (size_t)keep, sizeof(int32_t), dt_cmp_index);
  /* Rebuild as the verified tree: creation order puts parents first and siblings in
   * descending draft probability. */
  int32_t *remap = c->parents; /* pool index -> tree index, scratch */
  for (int i = 0; i < pool->n; i++) remap[i] = -1;
  remap[0] = 0;
  t->deterministic = 1;
  for (int j = 0; j < keep; j++) {
    const vs_tree_node *pn = &pool->nodes[c->order[j]];
    int32_t tp = remap[pn->parent];
    if (tp < 0) continue; /* cannot happen (ancestor-closed), kept for safety */
    remap[c->order[j]] = vs_tree_add(t, tp, pn->token, 1.0f, pn->logp);
    if (remap[c->order[j]] < 0) continue;
    c->feat_node[remap[c->order[j]]] = c->order[j];
    /* the drafter's pending entry for the node, if it was fed (vs_drafter_end keeps it) */
    t->nodes[remap[c->order[j]]].draft_slot = pn->draft_slot;
  }
  return VSPEC_OK;
}
