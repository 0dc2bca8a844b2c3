/*
 * `vvs` scheduler: partial verification skipping (VVS, arXiv 2511.13587 §4; reference
 * code HyattDD/VVS models/skip_utils_llamagen.py).
 *
 * Some rounds accept a drafted path without calling the target. The engine feeds those
 * tokens to the target in front of the next verified tree (post-verification: their KV and
 * features are filled, they are not judged again), and the drafter continues from reused
 * features meanwhile.
 *
 * Parameters (plus the shape parameters of plugins/sched/shape.h; VVS drafts EAGLE-2
 * dynamic trees, the default shape):
 *   skip=dynamic      uniform: skip every `interval`-th round (after interval-1 verified
 *                     ones, §4.4); dynamic: skip when the candidate paths are similar:
 *                     mean over path pairs of sum_l w_l cos(E[a_l], E[b_l]) >= threshold,
 *                     w_l = alpha^l / sum_k alpha^k over the shared positions l, E the VQ
 *                     codebook, paths down-sampled with stride 2 (Algorithm 1, Eq. 2); a
 *                     tree with a single candidate path (after down-sampling) counts as
 *                     fully similar
 *   interval=3        uniform skipping period, 2..100
 *   threshold=0.7     dynamic skipping similarity threshold, [0, 1]
 *   alpha=0.9         position decay of the similarity weights, (0, 1]
 *   select=uniform    the path taken on a skipped round: uniform (a random candidate path,
 *                     the paper's choice) or confidence (the most likely path)
 *   truncate=on       on: accept gamma = min(L_s, floor(mean path length)) tokens (Eq. 1);
 *                     off: the whole path (the paper's ablation)
 *   features=stale    drafter inputs for unverified tokens: stale (the most recent cached
 *                     target features, as many as tokens, §4.3), draft (the drafter's own
 *                     predicted features), blend (their mean)
 *   staleness=0       stale features: use ones this many positions older (Table 5 ablation)
 *   warmup=5          never skip while at most this many tokens are done (reference code)
 * Two skipped rounds are never consecutive (§4.4).
 */
#include <math.h>
#include <stdio.h>

#include "shape.h"

enum { VV_UNIFORM = 0, VV_DYNAMIC = 1 };

struct vspec_sched {
  const vspec_host *host;
  vs_shape shape;
  int skip, interval, select, truncate, features, staleness, warmup;
  double threshold, alpha;
  int since_skip; /* verified rounds since the last skip */
};

static int vv_create(const vspec_host *host, const vspec_params *params, vspec_sched **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {VS_SHAPE_KEYS, "size", "skip", "interval", "threshold",
                                      "alpha", "select", "truncate", "features", "staleness",
                                      "warmup", NULL};
  static const char *const skips[] = {"uniform", "dynamic", NULL};
  static const char *const selects[] = {"uniform", "confidence", NULL};
  static const char *const onoff[] = {"off", "on", NULL};
  static const char *const feats[] = {"stale", "draft", "blend", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_sched *s = host->calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->host = host;
  long interval, staleness, warmup;
  if ((rc = vs_shape_parse(host, params, &s->shape, err, errlen)) ||
      (rc = host->param_choice(params, "skip", skips, VV_DYNAMIC, &s->skip, err, errlen)) ||
      (rc = host->param_int(params, "interval", 3, 2, 100, &interval, err, errlen)) ||
      (rc = host->param_double(params, "threshold", 0.7, 0.0, 1.0, &s->threshold, err, errlen)) ||
      (rc = host->param_double(params, "alpha", 0.9, 1e-6, 1.0, &s->alpha, err, errlen)) ||
      (rc = host->param_choice(params, "select", selects, 0, &s->select, err, errlen)) ||
      (rc = host->param_choice(params, "truncate", onoff, 1, &s->truncate, err, errlen)) ||
      (rc = host->param_choice(params, "features", feats, 0, &s->features, err, errlen)) ||
      (rc = host->param_int(params, "staleness", 0, 0, 64, &staleness, err, errlen)) ||
      (rc = host->param_int(params, "warmup", 5, 0, 1 << 20, &warmup, err, errlen))) {
    host->free(s);
    return rc;
  }
  s->interval = (int)interval;
  s->staleness = (int)staleness;
  s->warmup = (int)warmup;
  *out = s;
  return VSPEC_OK;
}

static void vv_destroy(vspec_sched *s) { s->host->free(s); }

static int vv_plan(vspec_sched *s, const vspec_round_state *state, vspec_round_plan *plan) {
  (void)state;
  vs_shape_plan(&s->shape, plan);
  return VSPEC_OK;
}

static double vv_cos(const float *a, const float *b, int dim) {
  double ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < dim; i++) {
    ab += (double)a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += (double)b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
}

/* Fills path[0..depth(leaf)-1] with the drafted tokens of the root-to-leaf path. */
static int vv_path(const vspec_tree_view *t, int leaf, int32_t *path) {
  int d = t->depth[leaf];
  for (int a = leaf; a > 0; a = t->parents[a]) path[t->depth[a] - 1] = t->tokens[a];
  return d;
}

/* Mean weighted cosine similarity of the candidate paths (Algorithm 1). */
static double vv_similarity(const vspec_sched *s, const vspec_tree_view *t, const int *leaves,
                            int n_leaves) {
  if (!t->codebook || t->token_dim <= 0) return 0.0;
  int sub[128], n = 0;
  for (int i = 0; i < n_leaves && n < 128; i += 2) sub[n++] = leaves[i]; /* stride 2 */
  if (n < 2) return 1.0; /* one candidate path: nothing differs */
  int32_t pa[64], pb[64];
  double total = 0.0;
  int pairs = 0;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      int la = vv_path(t, sub[i], pa), lb = vv_path(t, sub[j], pb);
      int L = la < lb ? la : lb;
      double wsum = 0.0, sim = 0.0, w = 1.0;
      for (int l = 0; l < L; l++, w *= s->alpha) {
        sim += w * vv_cos(t->codebook + (size_t)pa[l] * t->token_dim,
                          t->codebook + (size_t)pb[l] * t->token_dim, t->token_dim);
        wsum += w;
      }
      if (wsum > 0) {
        total += sim / wsum;
        pairs++;
      }
    }
  return pairs ? total / pairs : 1.0;
}

static int vv_decide(vspec_sched *s, const vspec_round_state *state, const vspec_tree_view *t,
                     vspec_rng *rng, vspec_skip_decision *out) {
  out->skip = 0;
  /* Candidate paths: one per leaf of the drafted tree. */
  int leaves[128], n_leaves = 0;
  for (int i = 1; i < t->n_nodes && n_leaves < 128; i++) {
    int has_child = 0;
    for (int j = i + 1; j < t->n_nodes && !has_child; j++) has_child = t->parents[j] == i;
    if (!has_child) leaves[n_leaves++] = i;
  }
  int skip = 0;
  if (!state->last_skipped && state->tokens_done > s->warmup && n_leaves > 0) {
    if (s->skip == VV_UNIFORM)
      skip = s->since_skip >= s->interval - 1;
    else
      skip = vv_similarity(s, t, leaves, n_leaves) >= s->threshold;
  }
  if (!skip) {
    s->since_skip++;
    return VSPEC_OK;
  }
  int leaf = leaves[0];
  if (s->select == 0) {
    int k = (int)(s->host->rng_uniform(rng) * n_leaves);
    leaf = leaves[k < n_leaves ? k : n_leaves - 1];
  } else {
    for (int i = 1; i < n_leaves; i++)
      if (t->score[leaves[i]] > t->score[leaf]) leaf = leaves[i];
  }
  /* Eq. 1: gamma = min(L_s, floor(mean candidate path length)). */
  int ls = t->depth[leaf];
  double mean = 0.0;
  for (int i = 0; i < n_leaves; i++) mean += t->depth[leaves[i]];
  mean /= n_leaves;
  int gamma = s->truncate ? (int)floor(mean) : ls;
  if (gamma > ls) gamma = ls;
  if (gamma > state->tokens_total - state->tokens_done) gamma = state->tokens_total - state->tokens_done;
  if (gamma < 1) {
    s->since_skip++;
    return VSPEC_OK; /* nothing to accept: verify after all */
  }
  s->since_skip = 0;
  out->skip = 1;
  out->leaf = leaf;
  out->length = gamma;
  out->features = (uint32_t)s->features;
  out->extra_staleness = s->staleness;
  return VSPEC_OK;
}

static const vspec_sched_vtable vv_vtable = {
    .struct_size = sizeof(vspec_sched_vtable),
    .create = vv_create,
    .destroy = vv_destroy,
    .plan = vv_plan,
    .decide = vv_decide,
};

static const vspec_plugin_desc vv_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_SCHED, "vvs", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "VVS: partial verification skipping (uniform or path-similarity schedule)",
    .vtable = &vv_vtable,
};

VSPEC_PLUGIN_DEFINE(vv_desc)
