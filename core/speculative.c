/*
 * Speculative decoding: the round loop, tree drafting and the verification walk.
 *
 * One round (DESIGN.md "Data flow of one job"):
 *   scheduler.plan -> the drafter builds a token tree below the root (the last emitted
 *   token) -> one target forward over root + tree -> the walk accepts a path with the
 *   acceptance-rule plugin and samples one more token -> the path is committed (KV
 *   compaction) -> the accepted tokens and the new token are emitted.
 *
 * Tree shapes (algorithms.md §2):
 *   chain    a separate draft model samples L tokens one after the other
 *   static   EAGLE-1: a fixed shape; each expanded node's children are sampled without
 *            replacement (temperature > 0) and carry conditional probabilities
 *   dynamic  EAGLE-2: expand the top_k best nodes by cumulative log-probability for
 *            `depth` steps, keep the total_tokens best; drafts are deterministic, so the
 *            walk treats the draft distribution as one-hot (p := 1, §2.4)
 *
 * The walk (one implementation for every rule, §2.2): at each node the children are tried
 * in rank order; the rule's acceptance probability decides; after a rejection the rule
 * turns the target residual into the distribution the next sibling is judged against. When
 * a child is accepted the walk descends; when a node has no children the bonus token is
 * sampled from the target distribution there; when every child is rejected the next token
 * is sampled from the residual. If a residual has no mass left (float round-off, or a
 * relaxed rule that removed everything) the walk falls back to the target distribution at
 * that node without the rejected candidates, and to the unmodified target distribution if
 * that is empty too (docs/SPECULATIVE.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/drafter.h"
#include "core/method.h"
#include "core/params.h"
#include "core/speculative.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

/* Largest tree one target forward verifies, root included. */
#define VS_SD_MAX_NODES 128
/* Largest candidate pool of a dynamic tree (1 + top_k + depth * top_k^2). */
#define VS_SD_MAX_POOL 1024

typedef struct vs__sd {
  vs_models *models;
  const vs_backend_model *t;
  vspec_dev *dev;
  const vspec_ops *ops;
  const vs_job *job;
  const vs_sampling *s;
  int V, N, rows, greedy;
  /* plugins */
  vs_plugin *rule_plugin, *sched_plugin;
  const vspec_accept_vtable *rule_vt;
  const vspec_sched_vtable *sched_vt;
  vspec_rule *rule;
  vspec_sched *sched;
  /* target */
  vspec_session *sess;
  float *logits;   /* [cap, rows, V] */
  float *feats;    /* [cap, rows, d] (feature drafters) */
  float *path_feats; /* [VS_MAX_DEPTH + 2, rows, d]: features at the accepted path */
  int fdim;
  size_t logits_off; /* tree node 0's index in the last target batch (after prepended tokens) */
  /* verification skipping (VVS) */
  int32_t *unv;      /* tokens accepted unverified, to feed before the next tree */
  int n_unv;
  float *fcache;     /* [N + 1, rows, d]: slot j holds the target feature preceding token j */
  int n_fcache;      /* slots 0 .. n_fcache-1 are filled (verified positions) */
  int32_t *view_tokens, *view_depth; /* tree view scratch */
  float *view_score;
  vspec_rng rng_sched;
  /* drafting */
  vs_drafter *drafter;
  vs_tree tree, pool;
  int32_t *parents, *order;
  int32_t *feat_node; /* [cap] drafter node (pool index for dynamic trees) of each tree node */
  float *pool_cu;
  /* walk buffers [V] */
  float *q, *q_res, *q_tmp, *p_work, *mixed;
  vspec_rng rng_target, rng_draft, rng_accept;
  vs_metrics *mt;
} vs__sd;

static double vs__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- drafting ------------------------------------------------------------------------ */

static int32_t vs__argmax(const float *p, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (p[i] > p[best]) best = i;
  return best;
}

static int vs__draft_chain(vs__sd *c, int depth, int32_t root_index, char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  t->deterministic = c->greedy;
  int32_t node = 0;
  for (int d = 1; d <= depth; d++) {
    const float *p = vs_tree_dist(t, node);
    int32_t x;
    float px = 1.0f;
    if (c->greedy) {
      x = vs__argmax(p, c->V);
    } else {
      x = c->ops->sample(c->dev, p, c->V, vs_rng_uniform(&c->rng_draft));
      if (x < 0) break; /* an empty draft distribution: stop drafting */
      px = p[x];
    }
    int32_t child = vs_tree_add(t, node, x, px, 0.0f);
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
static void vs__sample_children(vs__sd *c, int32_t node, int count) {
  vs_tree *t = &c->tree;
  memcpy(c->p_work, vs_tree_dist(t, node), (size_t)c->V * sizeof(float));
  for (int j = 0; j < count; j++) {
    double mass = 0.0;
    for (int y = 0; y < c->V; y++) mass += c->p_work[y];
    if (mass <= 0.0) return;
    int32_t x;
    if (c->greedy) {
      x = vs__argmax(c->p_work, c->V);
      if (c->p_work[x] <= 0.0f) return;
    } else {
      x = c->ops->sample(c->dev, c->p_work, c->V, vs_rng_uniform(&c->rng_draft));
      if (x < 0) return;
    }
    /* EAGLE-1's conditional probability under sampling without replacement (§2.1). */
    float pc = c->greedy ? 1.0f : (float)(c->p_work[x] / mass);
    if (vs_tree_add(t, node, x, pc, 0.0f) < 0) return;
    c->p_work[x] = 0.0f;
  }
}

static int vs__draft_static(vs__sd *c, const vspec_round_plan *plan, int depth_limit,
                            int32_t root_index, char *err, size_t errlen) {
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
  vs__sample_children(c, 0, nkids_root);
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
      if (sdepth[i] == d && map[i] >= 0 && nkids[i] > 0) vs__sample_children(c, map[i], nkids[i]);
  }
  return VSPEC_OK;
}

/* Indices of the k largest entries of v[0..n) into out (descending, ties by index). */
static int vs__topk(const float *v, int n, int k, int32_t *out) {
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

static int vs__cmp_pool(const void *a, const void *b, void *ctx) {
  const float *cu = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (cu[x] > cu[y]) return -1;
  if (cu[x] < cu[y]) return 1;
  return (x > y) - (x < y);
}

static int vs__cmp_index(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* EAGLE-2 (§2.3): grow a candidate pool by cumulative log-probability, then keep the
 * total_tokens best as the tree. Drafts are deterministic (p := 1). */
static int vs__draft_dynamic(vs__sd *c, const vspec_round_plan *plan, int depth_limit,
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
  int m = vs__topk(lp, c->V, K, top);
  for (int j = 0; j < m && 1 <= depth_limit; j++) {
    int32_t ch = vs_tree_add(pool, 0, top[j], 1.0f, lp[top[j]]);
    if (ch >= 0) frontier[nf++] = ch;
  }
  for (int step = 1; step <= steps && nf > 0; step++) {
    if (pool->nodes[frontier[0]].depth >= depth_limit) break;
    if (pool->n + nf * K > pool->cap) break;
    int rc = vs_drafter_expand(c->drafter, pool, frontier, nf, root_index, err, errlen);
    if (rc) return rc;
    int first_new = pool->n;
    for (int f = 0; f < nf; f++) {
      const float *p = vs_tree_dist(pool, frontier[f]);
      for (int y = 0; y < c->V; y++) lp[y] = p[y] > 0.0f ? logf(p[y]) : -INFINITY;
      m = vs__topk(lp, c->V, K, top);
      float base = pool->nodes[frontier[f]].logp;
      for (int j = 0; j < m; j++) vs_tree_add(pool, frontier[f], top[j], 1.0f, base + lp[top[j]]);
    }
    /* the next frontier: the K best new nodes by cumulative log-probability */
    int n_new = pool->n - first_new;
    for (int i = 0; i < n_new; i++) c->pool_cu[i] = pool->nodes[first_new + i].logp;
    m = vs__topk(c->pool_cu, n_new, K, top);
    nf = 0;
    for (int j = 0; j < m; j++) frontier[nf++] = first_new + top[j];
  }
  /* Rerank: the `total` best pool nodes; sorting by (score desc, index asc) keeps every
   * selected node's parent selected, since scores never increase along a path and parents
   * are created first. */
  int n_cand = 0;
  for (int i = 1; i < pool->n; i++) c->order[n_cand++] = i;
  for (int i = 0; i < pool->n; i++) c->pool_cu[i] = pool->nodes[i].logp;
  qsort_r(c->order, (size_t)n_cand, sizeof(int32_t), vs__cmp_pool, c->pool_cu);
  int keep = n_cand < total ? n_cand : total;
  if (keep > t->cap - 1 - c->n_unv) keep = t->cap - 1 - c->n_unv; /* room for the unverified prefix */
  qsort(c->order, (size_t)keep, sizeof(int32_t), vs__cmp_index);
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
    if (remap[c->order[j]] >= 0) c->feat_node[remap[c->order[j]]] = c->order[j];
  }
  return VSPEC_OK;
}

/* ---- verification walk --------------------------------------------------------------- */

static void vs__normalise(float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  if (s > 0.0)
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] / s);
}

static double vs__mass(const float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  return s;
}

/* Walks the verified tree; fills path (tree nodes, root first) and the next token. */
static int vs__walk(vs__sd *c, int32_t root_index, int32_t *path, int *n_path, int32_t *next,
                    char *err, size_t errlen) {
  vs_tree *t = &c->tree;
  int V = c->V, max_depth = vs_tree_max_depth(t);
  int32_t node = 0;
  *n_path = 0;
  path[(*n_path)++] = 0;
  for (;;) {
    const vs_tree_node *tn = &t->nodes[node];
    /* Target distribution after `node`: it predicts image token root_index + depth + 1. */
    vs_node_distribution(c->ops, c->dev, c->logits + (c->logits_off + (size_t)node) * c->rows * V,
                         c->rows, V, root_index + tn->depth + 1, c->s, c->mixed, c->q);
    if (tn->first_child < 0) {
      /* Bonus token (or the plain AR step of a round without drafts). */
      *next = c->greedy ? vs__argmax(c->q, V)
                        : c->ops->sample(c->dev, c->q, V, vs_rng_uniform(&c->rng_target));
      break;
    }
    int depth = tn->depth + 1;
    if (depth <= VS_MAX_DEPTH) c->mt->reached[depth]++;
    c->mt->drafted++;
    memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
    if (c->greedy && c->rule_vt->greedy_accept) {
      /* greedy relaxed rules judge against the target's softmax, not its one-hot argmax */
      vs_sampling s1 = *c->s;
      s1.temperature = 1.0f;
      vs_node_distribution(c->ops, c->dev, c->logits + (c->logits_off + (size_t)node) * c->rows * V,
                           c->rows, V, root_index + tn->depth + 1, &s1, c->mixed, c->q_res);
    }
    const float *pdist = vs_tree_dist(t, node);
    int sampled = !t->deterministic && pdist;
    if (sampled) memcpy(c->p_work, pdist, (size_t)V * sizeof(float));
    int32_t accepted = -1;
    for (int32_t ch = tn->first_child; ch >= 0; ch = t->nodes[ch].next_sibling) {
      int32_t x = t->nodes[ch].token;
      float px = sampled ? c->p_work[x] : 1.0f;
      if (!(px > 0.0f)) continue; /* EAGLE skips siblings with no draft mass (§10 item 7) */
      vspec_accept_input in = {.struct_size = sizeof in, .vocab = V, .token = x, .depth = depth,
                               .max_depth = max_depth, .sibling = t->nodes[ch].rank,
                               .p_x = px, .p = sampled ? c->p_work : NULL, .q = c->q_res};
      if (c->models->neighbours) {
        in.neighbour_table = c->models->neighbours;
        in.table_k = c->models->neighbours_k;
        in.neighbours = c->models->neighbours + (size_t)x * in.table_k;
        in.n_neighbours = in.table_k;
      }
      c->mt->siblings_tried++;
      int ok;
      if (c->greedy) {
        ok = c->rule_vt->greedy_accept ? c->rule_vt->greedy_accept(c->rule, &in)
                                       : x == vs__argmax(c->q, V);
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
        snprintf(err, errlen, "acceptance rule failed to compute a residual (%d)", rc);
        return rc;
      }
      if (vs__mass(c->q_tmp, V) > 0.0) {
        memcpy(c->q_res, c->q_tmp, (size_t)V * sizeof(float));
        vs__normalise(c->q_res, V);
      } else {
        /* Fallback: the target distribution without the candidates rejected so far. */
        c->mt->residual_fallbacks++;
        memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
        for (int32_t r = tn->first_child; r >= 0; r = t->nodes[r].next_sibling) {
          c->q_res[t->nodes[r].token] = 0.0f;
          if (r == ch) break;
        }
        if (vs__mass(c->q_res, V) > 0.0) vs__normalise(c->q_res, V);
        else memcpy(c->q_res, c->q, (size_t)V * sizeof(float));
      }
      if (sampled) {
        /* The next sibling was drawn from p without the tokens tried so far. */
        c->p_work[x] = 0.0f;
        vs__normalise(c->p_work, V);
      }
    }
    if (accepted >= 0) {
      if (depth <= VS_MAX_DEPTH) c->mt->accepted_at[depth]++;
      c->mt->accepted++;
      path[(*n_path)++] = accepted;
      node = accepted;
      continue;
    }
    *next = c->greedy ? vs__argmax(c->q, V)
                      : c->ops->sample(c->dev, c->q_res, V, vs_rng_uniform(&c->rng_target));
    break;
  }
  if (*next < 0) {
    snprintf(err, errlen, "the target distribution is empty (all probabilities zero)");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* ---- verification skipping (VVS) ---------------------------------------------------- */

static void vs__report(vs__sd *c, int64_t round, int skipped, const int32_t *tokens, int n,
                       int prepended, int accepted_len, const vs_tree *tree) {
  if (!c->job->on_round) return;
  vs_round_info info = {.round = round, .skipped = skipped, .n_tokens = n, .tokens = tokens,
                        .status = c->job->status, .prepended = prepended,
                        .accepted_len = accepted_len, .tree = tree, .target = c->t,
                        .session = c->sess, .metrics = c->mt, .rule_plugin = c->rule_plugin,
                        .sched_plugin = c->sched_plugin};
  c->job->on_round(c->job->user, &info);
}

/* Asks the scheduler whether to verify this round's tree and checks its answer. */
static int vs__decide(vs__sd *c, const vspec_round_state *st, int remaining,
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
    snprintf(err, errlen, "scheduler failed to decide whether to verify (%d)", rc);
    return rc;
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

/* Accepts the first `length` drafted tokens of the path to `leaf` without calling the
 * target (VVS §4.1-4.3): the root and all but the last of them wait for the next target
 * forward; the last becomes the new root; the drafter continues with reused features. */
static int vs__skip(vs__sd *c, const vspec_skip_decision *dec, int32_t root_index,
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
      /* When fewer cached features exist than tokens, the most recent one is repeated
       * (as the reference code does). */
      int slot = c->n_fcache - dec->extra_staleness - gamma + j;
      int first = c->n_fcache - dec->extra_staleness - gamma;
      if (first < 0) slot = j < c->n_fcache ? j : c->n_fcache - 1;
      if (slot < 0) slot = 0;
      if (slot > c->n_fcache - 1) slot = c->n_fcache - 1;
      const float *stale = c->fcache + (size_t)slot * fs;
      const float *own = vs_drafter_node_feature(c->drafter, c->feat_node[pathn[j]]);
      float *dst = pf + (size_t)j * fs;
      for (size_t k = 0; k < fs; k++)
        dst[k] = dec->features == VSPEC_FEATURES_STALE ? stale[k]
                 : dec->features == VSPEC_FEATURES_DRAFT ? own[k]
                                                          : 0.5f * (stale[k] + own[k]);
    }
  }
  return vs_drafter_end(c->drafter, acc, gamma - 1, pf, acc[gamma - 1], err, errlen);
}

/* ---- the round loop ------------------------------------------------------------------ */

static int vs__plugin_create(vs__sd *c, const vs_method *m, char *err, size_t errlen) {
  const vspec_host *host = c->models->host;
  char inner[VSPEC_ERRLEN] = "";
  vspec_params *p = NULL;
  int rc = vs_registry_acquire(c->models->reg, VSPEC_PLUGIN_ACCEPT, m->rule, &c->rule_plugin,
                               err, errlen);
  if (rc) return rc;
  c->rule_vt = vs_plugin_vtable(c->rule_plugin);
  if ((rc = vs_params_parse(m->rule_params, &p, err, errlen))) return rc;
  rc = c->rule_vt->create(host, p, &c->rule, inner, sizeof inner);
  vs_params_free(p);
  if (rc) {
    snprintf(err, errlen, "acceptance rule '%s': %s", m->rule, inner);
    return rc;
  }
  rc = vs_registry_acquire(c->models->reg, VSPEC_PLUGIN_SCHED, m->sched, &c->sched_plugin, err,
                           errlen);
  if (rc) return rc;
  c->sched_vt = vs_plugin_vtable(c->sched_plugin);
  if ((rc = vs_params_parse(m->sched_params, &p, err, errlen))) return rc;
  rc = c->sched_vt->create(host, p, &c->sched, inner, sizeof inner);
  vs_params_free(p);
  if (rc) snprintf(err, errlen, "scheduler '%s': %s", m->sched, inner);
  return rc;
}

static void vs__sd_free(vs__sd *c) {
  if (c->rule) c->rule_vt->destroy(c->rule);
  if (c->sched) c->sched_vt->destroy(c->sched);
  vs_plugin_release(c->rule_plugin);
  vs_plugin_release(c->sched_plugin);
  vs_drafter_close(c->drafter);
  if (c->sess) c->t->vt->session_close(c->sess);
  vs_tree_free(&c->tree);
  vs_tree_free(&c->pool);
  free(c->logits);
  free(c->feats);
  free(c->path_feats);
  free(c->unv);
  free(c->fcache);
  free(c->view_tokens);
  free(c->view_depth);
  free(c->view_score);
  free(c->parents);
  free(c->order);
  free(c->feat_node);
  free(c->pool_cu);
  free(c->q);
  free(c->q_res);
  free(c->q_tmp);
  free(c->p_work);
  free(c->mixed);
}

/* Nodes the drafter forwards in one round besides the root. */
static int vs__plan_expansions(const vspec_round_plan *p) {
  switch (p->shape) {
    case VSPEC_DRAFT_CHAIN: return p->depth;
    case VSPEC_DRAFT_STATIC: return p->n_static;
    case VSPEC_DRAFT_DYNAMIC: return p->depth * p->top_k;
    default: return 0;
  }
}

static int vs__plan_nodes(const vspec_round_plan *p) {
  switch (p->shape) {
    case VSPEC_DRAFT_NONE: return 1;
    case VSPEC_DRAFT_CHAIN: return 1 + p->depth;
    case VSPEC_DRAFT_STATIC: return 1 + p->n_static;
    case VSPEC_DRAFT_DYNAMIC: return 1 + p->total_tokens;
    default: return -1;
  }
}

int vs_generate_sd(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
                   int32_t *tokens, vs_metrics *mt, char *err, size_t errlen) {
  vs__sd c;
  memset(&c, 0, sizeof c);
  c.models = models;
  c.t = &models->target;
  c.dev = dev;
  c.ops = vs_dev_ops(dev);
  c.job = job;
  c.s = &job->sampling;
  c.mt = mt;
  c.V = c.t->info.vocab;
  c.N = c.t->info.grid_h * c.t->info.grid_w;
  c.rows = c.s->cfg_scale > 1.0f ? 2 : 1;
  c.greedy = c.s->temperature <= 0.0f;
  c.fdim = c.t->info.feature_dim;
  int rc = vs__plugin_create(&c, m, err, errlen);
  if (rc) goto done;

  /* The first plan fixes the drafter for the whole job. */
  vspec_round_state st = {.struct_size = sizeof st, .tokens_total = c.N,
                          .max_nodes = VS_SD_MAX_NODES};
  vspec_round_plan plan = {.struct_size = sizeof plan};
  if ((rc = c.sched_vt->plan(c.sched, &st, &plan))) {
    snprintf(err, errlen, "scheduler '%s' failed to plan the first round", m->sched);
    goto done;
  }
  const vs_backend_model *dm = NULL;
  uint32_t dk = plan.drafter;
  if (dk == VSPEC_DRAFTER_AUTO) dk = models->eagle.model ? VSPEC_DRAFTER_HEAD : VSPEC_DRAFTER_MODEL;
  dm = dk == VSPEC_DRAFTER_HEAD ? &models->eagle : &models->draft;
  if (!dm->model) {
    snprintf(err, errlen, "method '%s' needs a %s, but model '%s' has none (vspec-model.json "
             "\"%s\")", m->text, dk == VSPEC_DRAFTER_HEAD ? "draft head" : "draft model",
             models->name, dk == VSPEC_DRAFTER_HEAD ? "eagle" : "draft");
    rc = VSPEC_EINVAL;
    goto done;
  }
  if (dm->info.vocab != c.V || dm->info.grid_h != c.t->info.grid_h ||
      dm->info.grid_w != c.t->info.grid_w) {
    snprintf(err, errlen, "the drafter (vocabulary %d, grid %dx%d) does not match the target "
             "(vocabulary %d, grid %dx%d)", dm->info.vocab, dm->info.grid_h, dm->info.grid_w, c.V,
             c.t->info.grid_h, c.t->info.grid_w);
    rc = VSPEC_ESHAPE;
    goto done;
  }

  int cap = VS_SD_MAX_NODES < c.t->info.max_nodes ? VS_SD_MAX_NODES : c.t->info.max_nodes;
  vspec_session_config sc = {.struct_size = sizeof sc, .class_label = job->class_label,
                             .caption = job->caption, .caption_mask = job->caption_mask,
                             .rows = c.rows, .max_nodes = cap};
  char inner[VSPEC_ERRLEN] = "";
  if ((rc = c.t->vt->session_open(c.t->model, dev, &sc, &c.sess, inner, sizeof inner))) {
    snprintf(err, errlen, "%s", inner);
    goto done;
  }
  size_t V = (size_t)c.V;
  c.logits = malloc((size_t)cap * c.rows * V * sizeof(float));
  c.feats = malloc((size_t)cap * c.rows * c.fdim * sizeof(float));
  c.path_feats = malloc((size_t)(VS_MAX_DEPTH + 2) * c.rows * c.fdim * sizeof(float));
  c.unv = malloc((size_t)c.N * sizeof(int32_t));
  c.fcache = malloc((size_t)(c.N + 1) * c.rows * c.fdim * sizeof(float));
  c.view_tokens = malloc((size_t)cap * sizeof(int32_t));
  c.view_depth = malloc((size_t)cap * sizeof(int32_t));
  c.view_score = malloc((size_t)cap * sizeof(float));
  c.parents = malloc(VS_SD_MAX_POOL * sizeof(int32_t));
  c.order = malloc(VS_SD_MAX_POOL * sizeof(int32_t));
  c.feat_node = malloc((size_t)cap * sizeof(int32_t));
  c.pool_cu = malloc((VS_SD_MAX_POOL > V ? VS_SD_MAX_POOL : V) * sizeof(float));
  c.q = malloc(V * sizeof(float));
  c.q_res = malloc(V * sizeof(float));
  c.q_tmp = malloc(V * sizeof(float));
  c.p_work = malloc(V * sizeof(float));
  c.mixed = malloc(V * sizeof(float));
  if (!c.logits || !c.feats || !c.path_feats || !c.unv || !c.fcache || !c.view_tokens ||
      !c.view_depth || !c.view_score || !c.parents || !c.order || !c.feat_node || !c.pool_cu || !c.q || !c.q_res ||
      !c.q_tmp || !c.p_work || !c.mixed || vs_tree_init(&c.tree, cap, cap, c.V) ||
      /* the dynamic tree's candidate pool: only frontier nodes are expanded */
      (plan.shape == VSPEC_DRAFT_DYNAMIC &&
       vs_tree_init(&c.pool, VS_SD_MAX_POOL, 1 + plan.depth * plan.top_k, c.V))) {
    snprintf(err, errlen, "out of memory");
    rc = VSPEC_ENOMEM;
    goto done;
  }
  vs_rng_init(&c.rng_target, job->seed, VS_STREAM_TARGET_SAMPLE);
  vs_rng_init(&c.rng_draft, job->seed, VS_STREAM_DRAFT_SAMPLE);
  vs_rng_init(&c.rng_accept, job->seed, VS_STREAM_ACCEPT);
  vs_rng_init(&c.rng_sched, job->seed, VS_STREAM_SCHED);

  /* Round 0: the target's prefill gives image token 0 (an AR step). */
  double t0 = vs__now();
  vspec_forward_out out = {.struct_size = sizeof out, .logits = c.logits, .features = c.feats};
  if ((rc = c.t->vt->prefill(c.sess, &out, inner, sizeof inner))) {
    snprintf(err, errlen, "target prefill: %s", inner);
    goto done;
  }
  mt->verify_s += vs__now() - t0;
  mt->target_forwards++;
  mt->rounds++;
  mt->tree_nodes++;
  vs_node_distribution(c.ops, dev, c.logits, c.rows, c.V, 0, c.s, c.mixed, c.q);
  tokens[0] = c.greedy ? vs__argmax(c.q, c.V)
                       : c.ops->sample(dev, c.q, c.V, vs_rng_uniform(&c.rng_target));
  int emitted = 1;
  mt->tokens = 1;
  if (job->status) job->status[0] = VS_TOKEN_TARGET;
  size_t fs = (size_t)c.rows * c.fdim;
  memcpy(c.fcache, c.feats, fs * sizeof(float));
  c.n_fcache = 1;
  int64_t round = 0;
  vs__report(&c, round++, 0, tokens, emitted, 0, 0, NULL);

  /* Drafter capacity: the catch-up chain (accepted tokens), the root and the nodes one
   * round expands, which the plan bounds. */
  int expand_max = vs__plan_expansions(&plan);
  int dcap = VS_MAX_DEPTH + 2 + expand_max;
  vs_drafter_config dc = {.model = dm, .dev = dev, .job = job, .rows = c.rows, .max_nodes = dcap,
                          .max_tree_nodes = VS_SD_MAX_POOL, .n_image = c.N,
                          .target_feature_dim = c.fdim};
  if ((rc = vs_drafter_open(&dc, &c.drafter, err, errlen))) goto done;
  if ((rc = vs_drafter_start(c.drafter, tokens[0], c.feats, err, errlen))) goto done;

  int32_t path[VS_MAX_DEPTH + 2];
  int last_skipped = 0;
  while (emitted < c.N) {
    if (job->cancel && atomic_load(job->cancel)) {
      snprintf(err, errlen, "job cancelled");
      rc = VSPEC_ECANCELED;
      goto done;
    }
    int32_t root_index = emitted - 1;
    int remaining = c.N - emitted;
    /* Accepted drafts plus the token sampled after them must fit the image. */
    int depth_limit = remaining - 1 < VS_MAX_DEPTH ? remaining - 1 : VS_MAX_DEPTH;
    st.round = (int32_t)round;
    st.tokens_done = emitted;
    st.unverified = c.n_unv;
    st.last_skipped = last_skipped;
    st.verified_rounds = (int32_t)mt->rounds;
    if ((rc = c.sched_vt->plan(c.sched, &st, &plan))) {
      snprintf(err, errlen, "scheduler '%s' failed to plan round %d", m->sched, st.round);
      goto done;
    }
    if (plan.shape > VSPEC_DRAFT_DYNAMIC || plan.depth < 0 || plan.depth > VS_MAX_DEPTH ||
        (plan.shape == VSPEC_DRAFT_DYNAMIC &&
         (plan.top_k < 1 || plan.top_k > 64 || plan.total_tokens < 1)) ||
        (plan.shape == VSPEC_DRAFT_STATIC && plan.n_static > 0 && !plan.static_parents)) {
      snprintf(err, errlen, "scheduler '%s' returned an invalid plan", m->sched);
      rc = VSPEC_EINVAL;
      goto done;
    }
    int need = vs__plan_nodes(&plan);
    if (vs__plan_expansions(&plan) > expand_max || (plan.shape == VSPEC_DRAFT_DYNAMIC &&
        1 + plan.top_k + plan.depth * plan.top_k * plan.top_k > VS_SD_MAX_POOL)) {
      snprintf(err, errlen, "scheduler '%s' planned more drafting than the job allows (the first "
               "round's plan sizes the drafter; dynamic pools hold %d nodes)", m->sched,
               VS_SD_MAX_POOL);
      rc = VSPEC_ERANGE;
      goto done;
    }
    if (plan.shape == VSPEC_DRAFT_DYNAMIC && need + c.n_unv > cap && c.n_unv < cap - 1)
      need = cap - c.n_unv; /* the dynamic tree is trimmed to fit */
    if (plan.shape == VSPEC_DRAFT_DYNAMIC && !c.pool.nodes &&
        vs_tree_init(&c.pool, VS_SD_MAX_POOL, 1 + expand_max, c.V)) {
      snprintf(err, errlen, "out of memory");
      rc = VSPEC_ENOMEM;
      goto done;
    }
    if (need < 1 || need + c.n_unv > cap) {
      snprintf(err, errlen, "scheduler '%s' planned a tree of %d nodes (+%d unverified): allowed "
               "1..%d", m->sched, need, c.n_unv, cap);
      rc = VSPEC_ERANGE;
      goto done;
    }
    vs_tree_reset(&c.tree, tokens[root_index]);
    for (int i = 0; i < cap; i++) c.feat_node[i] = i;
    double td = vs__now();
    int drafted = depth_limit > 0 && plan.shape != VSPEC_DRAFT_NONE;
    if (drafted) {
      if ((rc = vs_drafter_begin(c.drafter, &c.tree, root_index, err, errlen))) goto done;
      switch (plan.shape) {
        case VSPEC_DRAFT_CHAIN:
          rc = vs__draft_chain(&c, plan.depth < depth_limit ? plan.depth : depth_limit, root_index,
                               err, errlen);
          break;
        case VSPEC_DRAFT_STATIC:
          rc = vs__draft_static(&c, &plan, depth_limit, root_index, err, errlen);
          break;
        case VSPEC_DRAFT_DYNAMIC:
          rc = vs__draft_dynamic(&c, &plan, depth_limit, root_index, err, errlen);
          break;
        default:
          snprintf(err, errlen, "scheduler planned unknown draft shape %u", plan.shape);
          rc = VSPEC_EINVAL;
      }
      if (rc) goto done;
    }
    mt->draft_s += vs__now() - td;

    /* Verify, or accept a path without the target (VVS). */
    vspec_skip_decision dec = {.struct_size = sizeof dec};
    if (drafted && c.tree.n > 1 && c.sched_vt->decide &&
        (rc = vs__decide(&c, &st, remaining, &dec, err, errlen)))
      goto done;
    if (dec.skip) {
      int gamma;
      if ((rc = vs__skip(&c, &dec, root_index, tokens, &emitted, &gamma, err, errlen))) goto done;
      last_skipped = 1;
      vs__report(&c, round++, 1, tokens, emitted, 0, gamma, &c.tree);
      continue;
    }

    /* One target forward: the unverified tokens of skipped rounds first (post-verification:
     * their KV entries and features are filled, they are not judged again), then the tree. */
    double tv = vs__now();
    int u = c.n_unv, nb = u + c.tree.n;
    int32_t *bt = c.order, *bp = c.parents;
    for (int i = 0; i < u; i++) {
      bt[i] = c.unv[i];
      bp[i] = i - 1;
    }
    vs_tree_parents(&c.tree, bp + u);
    for (int i = 0; i < c.tree.n; i++) {
      bt[u + i] = c.tree.nodes[i].token;
      bp[u + i] = i == 0 ? u - 1 : bp[u + i] + u;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = nb, .tokens = bt, .parents = bp};
    out.features = vs_drafter_uses_features(c.drafter) ? c.feats : NULL;
    if ((rc = c.t->vt->forward(c.sess, &b, &out, inner, sizeof inner))) {
      snprintf(err, errlen, "target forward: %s", inner);
      goto done;
    }
    mt->verify_s += vs__now() - tv;
    mt->target_forwards++;
    mt->rounds++;
    mt->tree_nodes += c.tree.n;
    c.logits_off = (size_t)u;

    int n_path;
    int32_t next;
    double tw = vs__now();
    if ((rc = vs__walk(&c, root_index, path, &n_path, &next, err, errlen))) goto done;
    mt->accept_s += vs__now() - tw;
    int32_t commit[VS_SD_MAX_NODES];
    for (int i = 0; i < u; i++) commit[i] = i;
    for (int j = 0; j < n_path; j++) commit[u + j] = u + path[j];
    if ((rc = c.t->vt->commit(c.sess, commit, u + n_path, inner, sizeof inner))) {
      snprintf(err, errlen, "target commit: %s", inner);
      goto done;
    }
    c.n_unv = 0;
    last_skipped = 0;
    if (vs_drafter_uses_features(c.drafter)) {
      /* Cache every verified feature: prepended token j sits at index root_index - u + j,
       * path node j at root_index + j; slot = index + 1. */
      for (int i = 0; i < u + n_path; i++)
        memcpy(c.fcache + (size_t)(root_index - u + i + 1) * fs, c.feats + (size_t)commit[i] * fs,
               fs * sizeof(float));
      c.n_fcache = root_index + n_path + 1;
    }
    int32_t acc_tokens[VS_MAX_DEPTH + 1];
    for (int j = 1; j < n_path; j++) {
      acc_tokens[j - 1] = c.tree.nodes[path[j]].token;
      if (job->status) job->status[emitted] = VS_TOKEN_ACCEPTED;
      tokens[emitted++] = acc_tokens[j - 1];
    }
    if (job->status) job->status[emitted] = VS_TOKEN_TARGET;
    tokens[emitted++] = next;
    mt->tokens = emitted;
    vs__report(&c, round++, 0, tokens, emitted, u, n_path - 1, &c.tree);
    if (emitted >= c.N) break;
    /* The drafter needs the target features at the root and every accepted node. */
    float *pf = NULL;
    if (vs_drafter_uses_features(c.drafter)) {
      pf = c.path_feats;
      for (int j = 0; j < n_path; j++)
        memcpy(pf + j * fs, c.feats + ((size_t)u + path[j]) * fs, fs * sizeof(float));
    }
    rc = drafted ? vs_drafter_end(c.drafter, acc_tokens, n_path - 1, pf, next, err, errlen)
                 : vs_drafter_skip(c.drafter, pf, next, err, errlen);
    if (rc) goto done;
  }
  mt->tokens = emitted;
  mt->draft_forwards = vs_drafter_forwards(c.drafter);
done:
  vs__sd_free(&c);
  return rc;
}
