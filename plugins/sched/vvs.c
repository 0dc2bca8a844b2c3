/*
 * `vvs` scheduler: partial verification skipping (VVS, arXiv 2511.13587 §4; reference
 * code HyattDD/VVS models/skip_utils_llamagen.py).
 *
 * Some rounds accept a drafted path without calling the target. The engine feeds those
 * tokens to the target in front of the next verified tree (post-verification: their KV and
 * features are filled, they are not judged again), and the drafter continues from reused
 * features meanwhile.
 *
 * The defaults follow the reference code (docs/SPECULATIVE.md lists where and why).
 *
 * Parameters (plus the shape parameters of plugins/sched/shape.h; VVS drafts EAGLE-2
 * dynamic trees, the default shape):
 *   skip=dynamic      uniform: skip every `interval`-th round (after interval-1 verified
 *                     ones, §4.4); dynamic: skip when the candidate paths are similar:
 *                     mean over path pairs of sum_l w_l cos(E[a_l], E[b_l]) >= threshold,
 *                     E the VQ codebook, the candidate paths (leaves in the reference
 *                     code's order: lexicographic by node index) down-sampled with stride
 *                     2 (Algorithm 1, Eq. 2); the weights per `norm`
 *   norm=longest      longest: w_l = alpha^l / sum_k alpha^k over the longest candidate
 *                     path, positions missing from either path count 0, and a single
 *                     candidate path scores 0 (never skips): the reference code
 *                     (compute_similarity_pytorch_jit); pair: w_l normalised per pair over
 *                     the positions both paths have, a single path scores 1 (the project's
 *                     earlier variant: shorter paths are not penalised)
 *   interval=3        uniform skipping period, 2..100
 *   phase=round       uniform skipping: round (the reference code's skip_verify: skip the
 *                     rounds whose index, counted from 0 at the first drafted round with
 *                     skipped rounds included, is 1 mod interval) or verified (skip once
 *                     interval-1 rounds have been verified since the last skip, so the
 *                     first skip comes right after the warmup): the same period, so the
 *                     two differ by a phase offset that lasts the whole image
 *                     (docs/SPECULATIVE.md, "Verification skipping")
 *   threshold=0.7     dynamic skipping similarity threshold, [0, 1]
 *   alpha=0.9         position decay of the similarity weights, (0, 1]
 *   select=uniform    the path taken on a skipped round: uniform (every candidate path,
 *                     i.e. leaf, with probability 1/#leaves: the paper's choice, the
 *                     reference code's random.randint over the candidates) or confidence
 *                     (the leaf with the highest cumulative draft log-probability, on
 *                     every tree shape; ties go to the lower node index)
 *   truncate=on       on: accept gamma = min(L_s, floor(mean path length)) tokens (Eq. 1);
 *                     off: the whole path (the paper's ablation)
 *   features=stale    drafter inputs for unverified tokens: stale (the most recent cached
 *                     target features, as many as tokens, §4.3), draft (the drafter's own
 *                     predicted features), blend (their mean)
 *   staleness=0       stale features: use ones this many positions older (Table 5 ablation)
 *   warmup=5          never skip while at most this many tokens follow the first image
 *                     token (the prefill's): the reference code's skip_verify returns False
 *                     while new_token <= 5, and new_token (ea_llamagen.py) starts at 0 after
 *                     the prefill's token, so the first skip comes once 7 tokens are out,
 *                     root included; the same count in every mode
 * Two skipped rounds are never consecutive (§4.4).
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>

#include "shape.h"

enum { VV_UNIFORM = 0, VV_DYNAMIC = 1 };
enum { VV_NORM_LONGEST = 0, VV_NORM_PAIR = 1 };
enum { VV_PHASE_ROUND = 0, VV_PHASE_VERIFIED = 1 };

struct vspec_sched {
  const vspec_host *host;
  vs_shape shape;
  int skip, interval, select, truncate, features, staleness, warmup, norm, phase;
  double threshold, alpha;
  int since_skip; /* verified rounds since the last skip */
};

static int vv_create(const vspec_host *host, const vspec_params *params, vspec_sched **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {VS_SHAPE_KEYS, "size", "skip", "interval", "threshold",
                                      "alpha", "select", "truncate", "features", "staleness",
                                      "warmup", "norm", "phase", NULL};
  static const char *const skips[] = {"uniform", "dynamic", NULL};
  static const char *const selects[] = {"uniform", "confidence", NULL};
  static const char *const onoff[] = {"off", "on", NULL};
  static const char *const feats[] = {"stale", "draft", "blend", NULL};
  static const char *const norms[] = {"longest", "pair", NULL};
  static const char *const phases[] = {"round", "verified", NULL};
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
      (rc = host->param_choice(params, "phase", phases, VV_PHASE_ROUND, &s->phase, err,
                               errlen)) ||
      (rc = host->param_choice(params, "norm", norms, VV_NORM_LONGEST, &s->norm, err, errlen)) ||
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

enum { VS_VV_MAX_DEPTH = 64 };

/* Fills path[0..depth(leaf)-1] with the drafted tokens of the root-to-leaf path. */
static int vv_path(const vspec_tree_view *t, int leaf, int32_t *path) {
  int d = t->depth[leaf];
  for (int a = leaf; a > 0; a = t->parents[a]) path[t->depth[a] - 1] = t->tokens[a];
  return d;
}

/* Weighted cosine similarity of two paths, sum_l w_l cos(E[a_l], E[b_l]) over the shared
 * positions l, w_l = alpha^l / wnorm. */
static double vv_pair(const vspec_tree_view *t, const int32_t *pa, const int32_t *pb, int L,
                      double alpha, double wnorm) {
  double sim = 0.0, w = 1.0;
  for (int l = 0; l < L; l++, w *= alpha)
    sim += w * vv_cos(t->codebook + (size_t)pa[l] * t->token_dim,
                      t->codebook + (size_t)pb[l] * t->token_dim, t->token_dim);
  return sim / wnorm;
}

static double vv_wsum(double alpha, int L) {
  double sum = 0.0, w = 1.0;
  for (int l = 0; l < L; l++, w *= alpha) sum += w;
  return sum;
}

/* Mean weighted cosine similarity of the candidate paths (Algorithm 1). */
static double vv_similarity(const vspec_sched *s, const vspec_tree_view *t, const int *leaves,
                            int n_leaves) {
  if (!t->codebook || t->token_dim <= 0) return 0.0;
  int sub[64], n = 0, longest = 0;
  for (int i = 0; i < n_leaves && n < 64; i += 2) sub[n++] = leaves[i]; /* stride 2 */
  /* one candidate path: the reference code scores it 0 (nothing to compare, so no
   * evidence that the target would agree); the per-pair variant calls it fully similar */
  if (n < 2) return s->norm == VV_NORM_PAIR ? 1.0 : 0.0;
  static_assert(VS_VV_MAX_DEPTH >= 1, "path buffer");
  int32_t paths[64][VS_VV_MAX_DEPTH];
  int len[64];
  for (int i = 0; i < n; i++) {
    len[i] = vv_path(t, sub[i], paths[i]);
    if (len[i] > longest) longest = len[i];
  }
  /* longest: one normalisation over the longest path, missing positions count 0 */
  double wlong = vv_wsum(s->alpha, longest), total = 0.0;
  int pairs = 0;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      int L = len[i] < len[j] ? len[i] : len[j];
      double wn = s->norm == VV_NORM_PAIR ? vv_wsum(s->alpha, L) : wlong;
      if (wn <= 0) continue;
      total += vv_pair(t, paths[i], paths[j], L, s->alpha, wn);
      pairs++;
    }
  return pairs ? total / pairs : 0.0;
}

/* Is leaf a's path of node indices lexicographically before leaf b's? (The reference
 * code's candidate order, EAGLE-2's custom_sort of retrieve_indices; no leaf's path is a
 * prefix of another's.) */
static int vv_before(const vspec_tree_view *t, int a, int b) {
  int32_t pa[VS_VV_MAX_DEPTH], pb[VS_VV_MAX_DEPTH];
  int la = 0, lb = 0;
  for (int x = a; x > 0 && la < VS_VV_MAX_DEPTH; x = t->parents[x]) pa[la++] = x;
  for (int x = b; x > 0 && lb < VS_VV_MAX_DEPTH; x = t->parents[x]) pb[lb++] = x;
  for (int i = la - 1, j = lb - 1; i >= 0 && j >= 0; i--, j--)
    if (pa[i] != pb[j]) return pa[i] < pb[j];
  return la > lb;
}

/* The candidate paths: one per leaf, in the reference code's order. */
static int vv_leaves(const vspec_tree_view *t, int *leaves, int cap) {
  int n = 0;
  for (int i = 1; i < t->n_nodes && n < cap; i++) {
    int has_child = 0;
    for (int j = i + 1; j < t->n_nodes && !has_child; j++) has_child = t->parents[j] == i;
    if (has_child || t->depth[i] > VS_VV_MAX_DEPTH) continue;
    int k = n++;
    for (; k > 0 && vv_before(t, i, leaves[k - 1]); k--) leaves[k] = leaves[k - 1];
    leaves[k] = i;
  }
  return n;
}

static int vv_decide(vspec_sched *s, const vspec_round_state *state, const vspec_tree_view *t,
                     vspec_rng *rng, vspec_skip_decision *out) {
  out->skip = 0;
  int leaves[128], n_leaves = vv_leaves(t, leaves, 128);
  int skip = 0;
  /* tokens_done counts the prefill's token 0, upstream's new_token does not */
  if (!state->last_skipped && state->tokens_done - 1 > s->warmup && n_leaves > 0) {
    if (s->skip == VV_UNIFORM && s->phase == VV_PHASE_ROUND)
      skip = state->round >= 1 && (state->round - 1) % s->interval == 1; /* engine: from 1 */
    else if (s->skip == VV_UNIFORM)
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
      if (t->score[leaves[i]] > t->score[leaf] ||
          (t->score[leaves[i]] == t->score[leaf] && leaves[i] < leaf))
        leaf = leaves[i];
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
