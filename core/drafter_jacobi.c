/*
 * core/drafter_jacobi.c - Speculative Jacobi Decoding: drafts without a draft model.
 *
 * SJD (Teng et al., arXiv 2410.01699, §3.2, Algorithm 1) refines a window of L tokens by
 * Jacobi iteration. Each round the target scores root + window in one forward; its outputs
 * at window positions are the next round's drafts, and the distributions they were drawn
 * from are what the acceptance test divides by. In this engine that is a drafter:
 *   - propose: the window's tokens become a chain below the root; each chain node carries the
 *     distribution its token was drawn from (the walk's q), so the `exact` rule's test
 *     min(1, p/q) and residual norm(max(0, p - q)) are SJD's probabilistic verification, and
 *     the output follows the target exactly (speculative sampling, Leviathan et al., arXiv
 *     2211.17192, Appendix A.1; the proof only needs each draft to be a sample of the q it is
 *     judged against, independent of the test's uniform);
 *   - end: past the accepted path, the target's distribution at each scored node (conditioned
 *     on the stale drafts before it) is the new q of the position it predicts, and a new
 *     draft is drawn from it (the Jacobi update); positions never scored are initialised when
 *     the window first reaches them.
 * Every rule that judges a chain works on it (exact, lantern, coolsd, ...), with CFG: q is the
 * CFG-mixed, filtered distribution the walk compares with.
 *
 * Parameters (written among the scheduler's, core/method.c moves them here):
 *   coupling=none    how a position's successive drafts are drawn:
 *                      none     independently (SJD)
 *                      gumbel   Gumbel-max with one noise vector per position for the whole
 *                               job, so a position whose distribution barely moved draws the
 *                               same token again (MC-SJD / SCD, arXiv 2510.24211, §3)
 *                      maximal  the maximal coupling of the old and new distributions: keep
 *                               the old draft with probability min(1, q_new/q_old), else
 *                               draw from norm(max(0, q_new - q_old))
 *                    Each is an exact sample of the new q given everything the test at that
 *                    position sees (a position's earlier noise only shaped drafts at that
 *                    position and outputs after it), so all three stay lossless.
 *   init=uniform     the first draft of a position the window reaches:
 *                      uniform  a token drawn uniformly, judged against the uniform
 *                               distribution it was drawn from (accepted with probability
 *                               min(1, V p(x)))
 *                      random   SJD's 'random': the same draw, judged as a deterministic draft
 *                               (q one-hot at x, accepted with probability p(x)); the reference
 *                               mode (get_multi_token_for_preparation in
 *                               scheduler/jacobi_iteration_lumina_mgpt.py of
 *                               tyshiwo1/Accelerating-T2I-AR-with-SJD)
 *                      repeat   SJD's 'repeat_horizon' as it acts on a window: the newest token
 *                               before the position (a draft or the root) again, one-hot
 *                    One-hot drafts are exact too: a token fixed before the test is a sample of
 *                    the one-hot distribution at it.
 *   continue=KxD     SJD-PAC's proactive drafting (arXiv 2603.18599; KangJialiang/SJD-PAC,
 *                    scheduler/sjd_pac_iteration_lumina_mgpt.py, generate_tree_mask_and_retrieve):
 *                    the window's first D-1 positions become a K-ary tree whose every level
 *                    offers the same K candidates of its position (the window's draft first,
 *                    then K-1 more drawn without replacement from its q), and the rest of the
 *                    window continues as a chain below the first candidates, all verified in
 *                    one forward; no extra forward drafts them. Upstream's defaults: 3x3. Off
 *                    by default. Its adaptive continuation (a draft past the rejection is kept
 *                    while it still passes) is coupling=maximal here.
 * The window is the chain depth (shape=chain,depth=D): SJD's L = 16 tokens per forward are the
 * root and D = 15 drafts (test_llamagen.py, max_num_new_tokens). The target keeps the root and
 * the accepted drafts in its cache and drops the rest (KV compaction), as upstream does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/drafter_class.h"
#include "core/params.h"
#include "kernels/common/vs_philox.h"

enum { VS_JC_NONE = 0, VS_JC_GUMBEL = 1, VS_JC_MAXIMAL = 2 };
enum { VS_JI_UNIFORM = 0, VS_JI_RANDOM = 1, VS_JI_REPEAT = 2 };

/* Window positions live in a ring indexed by image position modulo its size. */
#define VS_J_RING (VS_MAX_DEPTH + 2)
/* Widest level of SJD-PAC's tree: 8 candidates, 3 levels below the root's (continue=8x4). */
#define VS_SD_MAX_TREE_LEVEL 512

typedef struct vs_jdrafter {
  int V, rows, greedy;
  int coupling, init;
  int branch, branch_depth; /* continue=KxD: K candidates for the first D-1 positions; 0 = off */
  vs_sampling s;
  uint64_t seed;
  vspec_rng rng;        /* redraws, initial draws and the maximal coupling */
  int32_t root_index;   /* the last emitted token's image index */
  int32_t root_token;
  int n_valid;          /* drafts held for root_index + 1 .. root_index + n_valid */
  int32_t tok[VS_J_RING];
  float *q;             /* [VS_J_RING, V]: the distribution each held draft was drawn from */
  float *q_new, *res;   /* [V] */
  vs_sampler sampler;
  int64_t rounds, redrawn, kept; /* kept: redraws that gave the same token again */
} vs_jdrafter;

static float *vs__q(vs_jdrafter *j, int32_t pos) { return j->q + (size_t)(pos % VS_J_RING) * j->V; }

static void jd_close(void *self) {
  vs_jdrafter *j = self;
  if (!j) return;
  free(j->q);
  free(j->q_new);
  free(j->res);
  vs_sampler_free(&j->sampler);
  free(j);
}

static int vs__jparams(vs_jdrafter *j, const char *text, char *err, size_t errlen) {
  static const char *const known[] = {"coupling", "init", "continue", NULL};
  static const char *const couplings[] = {"none", "gumbel", "maximal", NULL};
  static const char *const inits[] = {"uniform", "random", "repeat", NULL};
  vspec_params *p = NULL;
  char inner[VSPEC_ERRLEN] = "";
  int rc = vs_params_parse(text ? text : "", &p, inner, sizeof inner);
  if (!rc) rc = vs_param_check_known(p, known, inner, sizeof inner);
  if (!rc) rc = vs_param_choice(p, "coupling", couplings, VS_JC_NONE, &j->coupling, inner,
                                sizeof inner);
  if (!rc) rc = vs_param_choice(p, "init", inits, VS_JI_UNIFORM, &j->init, inner, sizeof inner);
  const char *cont = p ? vs_param_string(p, "continue") : NULL;
  if (!rc && cont && strcmp(cont, "off") != 0) {
    char tail;
    if (sscanf(cont, "%dx%d%c", &j->branch, &j->branch_depth, &tail) != 2 || j->branch < 2 ||
        j->branch > 8 || j->branch_depth < 2 || j->branch_depth > 4) {
      snprintf(inner, sizeof inner, "parameter 'continue' = '%s': give KxD with K in 2..8 "
               "candidates and D in 2..4 tree levels (SJD-PAC's 3x3), or off", cont);
      rc = VSPEC_EINVAL;
    }
  }
  vs_params_free(p);
  if (rc) snprintf(err, errlen, "drafter jacobi: %s", inner);
  return rc;
}

static int jd_open(const vs_drafter_config *cfg, void **out, char *err, size_t errlen) {
  vs_jdrafter *j = calloc(1, sizeof *j);
  if (!j) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int rc = vs__jparams(j, cfg->params, err, errlen);
  if (rc) {
    jd_close(j);
    return rc;
  }
  j->V = cfg->vocab;
  j->rows = cfg->rows;
  j->s = cfg->job->sampling;
  j->greedy = !(j->s.temperature > 0.0f);
  j->seed = cfg->job->seed;
  vs_rng_init(&j->rng, j->seed, VS_STREAM_JACOBI);
  j->q = malloc((size_t)VS_J_RING * j->V * sizeof(float));
  j->q_new = malloc((size_t)j->V * sizeof(float));
  j->res = malloc((size_t)j->V * sizeof(float));
  if (!j->q || !j->q_new || !j->res || vs_sampler_init(&j->sampler, j->V)) {
    jd_close(j);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *out = j;
  return VSPEC_OK;
}

static int jd_uses_features(const void *self) {
  (void)self;
  return 0;
}

static void jd_counts(const void *self, int64_t *forwards, int64_t *nodes) {
  (void)self;
  *forwards = 0; /* Jacobi drafts cost no forward of their own */
  *nodes = 0;
}

static int jd_start(void *self, int32_t root_token, const float *root_feature, char *err,
                    size_t errlen) {
  (void)root_feature, (void)err, (void)errlen;
  vs_jdrafter *j = self;
  j->root_index = 0;
  j->root_token = root_token;
  j->n_valid = 0;
  return VSPEC_OK;
}

/* Gumbel noise of (position, token), a pure function of the job's seed: the same vector
 * every time the position is drawn (Philox block pos * ceil(V/4) + v/4, word v % 4). */
static double vs__gumbel(const vs_jdrafter *j, int32_t pos, int v) {
  uint64_t block = (uint64_t)pos * (uint64_t)((j->V + 3) / 4) + (uint64_t)(v / 4);
  uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), VS_STREAM_JACOBI_GUMBEL, 0};
  uint32_t key[2] = {(uint32_t)j->seed, (uint32_t)(j->seed >> 32)};
  uint32_t out[4];
  vs_philox4x32_10(ctr, key, out);
  double u = ((double)out[v % 4] + 0.5) / 4294967296.0; /* in (0, 1) */
  return -log(-log(u));
}

/* A sample of q for position pos, by the job's coupling; -1 if q has no mass. */
static int32_t vs__draw(vs_jdrafter *j, int32_t pos, const float *q) {
  if (j->greedy) return vs_argmax_first(q, j->V);
  if (j->coupling != VS_JC_GUMBEL) return vs_draw(q, j->V, vs_rng_uniform(&j->rng));
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int v = 0; v < j->V; v++) {
    if (!(q[v] > 0.0f)) continue;
    double score = log((double)q[v]) + vs__gumbel(j, pos, v);
    if (score > best_score) best_score = score, best = v;
  }
  return best;
}

/* The first draft of a position the window reaches (its ring slot is free). */
static void vs__init_position(vs_jdrafter *j, int32_t pos) {
  float *q = vs__q(j, pos);
  int32_t *x = &j->tok[pos % VS_J_RING];
  float u = 1.0f / (float)j->V;
  for (int v = 0; v < j->V; v++) q[v] = u;
  if (j->init == VS_JI_REPEAT)
    *x = pos - 1 > j->root_index ? j->tok[(pos - 1) % VS_J_RING] : j->root_token;
  else
    *x = vs__draw(j, pos, q);
  if (j->init != VS_JI_UNIFORM && *x >= 0) { /* judged as a deterministic draft */
    memset(q, 0, (size_t)j->V * sizeof(float));
    q[*x] = 1.0f;
  }
}

/* Candidate k (k >= 1) of a position for SJD-PAC's tree: drawn from q without the earlier
 * candidates (top ones when greedy); its conditional probability in *pc. -1: q has no more
 * mass. */
static int32_t vs__next_candidate(vs_jdrafter *j, const float *q, const int32_t *cand, int k,
                                  float *pc) {
  memcpy(j->res, q, (size_t)j->V * sizeof(float));
  double left = 1.0;
  for (int i = 0; i < k; i++) {
    left -= j->res[cand[i]];
    j->res[cand[i]] = 0.0f;
  }
  int32_t x = j->greedy ? vs_argmax_first(j->res, j->V) : vs_draw(j->res, j->V, vs_rng_uniform(&j->rng));
  if (x < 0 || !(j->res[x] > 0.0f)) return -1;
  *pc = j->greedy ? 1.0f : (float)(j->res[x] / (left > 0.0 ? left : 1.0));
  return x;
}

/* Adds the candidates of position pos below every node of `level` (n of them), the window's
 * draft first; the new level replaces `level`. Returns its size (0 when the tree is full). */
static int vs__tree_level(vs_jdrafter *j, vs_tree *tree, int32_t pos, int32_t *level, int n) {
  const float *q = vs__q(j, pos);
  int32_t cand[8];
  float pc[8];
  int k = 0;
  cand[k] = j->tok[pos % VS_J_RING];
  pc[k++] = j->greedy ? 1.0f : q[cand[0]];
  while (k < j->branch && (cand[k] = vs__next_candidate(j, q, cand, k, &pc[k])) >= 0) k++;
  int32_t next[VS_SD_MAX_TREE_LEVEL];
  int m = 0;
  for (int i = 0; i < n; i++) {
    float *dist = vs_tree_new_dist(tree, level[i]);
    if (!dist) break;
    memcpy(dist, q, (size_t)j->V * sizeof(float));
    for (int c = 0; c < k && m < VS_SD_MAX_TREE_LEVEL; c++) {
      float lp = tree->nodes[level[i]].logp + (q[cand[c]] > 0.0f ? logf(q[cand[c]]) : -INFINITY);
      int32_t child = vs_tree_add(tree, level[i], cand[c], pc[c], lp);
      if (child < 0) break;
      next[m++] = child;
    }
  }
  memcpy(level, next, (size_t)m * sizeof(int32_t));
  return m;
}

static int jd_propose(void *self, vs_tree *tree, int depth, int32_t root_index, char *err,
                      size_t errlen) {
  vs_jdrafter *j = self;
  if (root_index != j->root_index) {
    snprintf(err, errlen, "drafter jacobi: round at image index %d, expected %d", root_index,
             j->root_index);
    return VSPEC_EINVAL;
  }
  tree->deterministic = j->greedy;
  for (int i = j->n_valid + 1; i <= depth; i++) {
    vs__init_position(j, root_index + i);
    j->n_valid = i;
  }
  /* SJD-PAC's tree over the first positions; its first candidates are the window's drafts,
   * so the chain below continues from the first node of the last level. */
  int tree_levels = j->branch ? j->branch_depth - 1 : 0;
  if (tree_levels > depth) tree_levels = depth;
  int32_t level[VS_SD_MAX_TREE_LEVEL] = {0};
  int n = 1, i = 1;
  for (; i <= tree_levels && n > 0; i++) n = vs__tree_level(j, tree, root_index + i, level, n);
  int32_t node = n > 0 ? level[0] : -1;
  for (; node >= 0 && i <= depth; i++) {
    int32_t pos = root_index + i;
    const float *q = vs__q(j, pos);
    int32_t x = j->tok[pos % VS_J_RING];
    float *dist = vs_tree_new_dist(tree, node);
    if (!dist || x < 0) break; /* no room, or an empty distribution: a shorter chain */
    memcpy(dist, q, (size_t)j->V * sizeof(float));
    float lp = tree->nodes[node].logp + (q[x] > 0.0f ? logf(q[x]) : -INFINITY);
    node = vs_tree_add(tree, node, x, j->greedy ? 1.0f : q[x], lp);
  }
  j->rounds++;
  return VSPEC_OK;
}

/* The maximal coupling: the old draft x ~ q_old stays with probability min(1, q_new(x) /
 * q_old(x)); otherwise a draw from norm(max(0, q_new - q_old)). The result is a sample of
 * q_new. */
static int32_t vs__redraw_maximal(vs_jdrafter *j, int32_t x, const float *q_old,
                                  const float *q_new) {
  double u = vs_rng_uniform(&j->rng);
  if (x >= 0 && q_old[x] > 0.0f && u * (double)q_old[x] < (double)q_new[x]) return x;
  double mass = 0.0;
  for (int v = 0; v < j->V; v++) {
    float r = q_new[v] - q_old[v];
    j->res[v] = r > 0.0f ? r : 0.0f;
    mass += j->res[v];
  }
  double w = vs_rng_uniform(&j->rng);
  return mass > 0.0 ? vs_draw(j->res, j->V, w) : vs_draw(q_new, j->V, w);
}

int vs__jacobi_fault = 0;

/* The Jacobi update of one position from the target's distribution at the node before it. */
static void vs__jacobi_update(vs_jdrafter *j, int32_t pos, const float *node_logits) {
  vs_node_distribution(&j->sampler, node_logits, j->rows, pos, &j->s, j->q_new);
  float *q = vs__q(j, pos);
  int32_t *x = &j->tok[pos % VS_J_RING];
  int32_t y = j->coupling == VS_JC_MAXIMAL && !j->greedy
                  ? vs__redraw_maximal(j, *x, q, j->q_new)
                  : vs__draw(j, pos, j->q_new);
  if (vs__jacobi_fault && *x >= 0) y = *x;
  j->redrawn++;
  j->kept += y == *x;
  *x = y;
  memcpy(q, j->q_new, (size_t)j->V * sizeof(float));
}

static int jd_end(void *self, const vs_round_outcome *o, char *err, size_t errlen) {
  vs_jdrafter *j = self;
  if (!o->logits) {
    snprintf(err, errlen, "drafter jacobi: a round ended without the target's scores");
    return VSPEC_EINVAL;
  }
  const vs_tree *t = o->tree;
  int32_t new_root = o->root_index + o->n + 1;
  /* Nodes past the accepted path scored the positions after them with stale drafts before
   * them: their distributions are the window's next drafts. The chain's last node scored the
   * position just past the window. */
  int32_t last = o->root_index;
  /* The window's own drafts are the first children all the way down (SJD-PAC's extra
   * candidates hang beside them). */
  for (int32_t node = 0; node >= 0; node = t->nodes[node].first_child) {
    int depth = t->nodes[node].depth;
    int32_t pos = o->root_index + depth + 1;
    if (depth <= o->n) continue;
    vs__jacobi_update(j, pos, o->logits + (size_t)node * j->rows * j->V);
    if (pos > last) last = pos;
  }
  j->root_index = new_root;
  j->root_token = o->next_root;
  j->n_valid = last > new_root ? last - new_root : 0;
  /* Ring slots past the window are free again; nothing reads them before vs__init_position. */
  (void)err, (void)errlen;
  return VSPEC_OK;
}

/* A round without drafting (an AR step): the target emitted the window's first position. */
static int jd_skip(void *self, const float *root_feature, int32_t next_root, char *err,
                   size_t errlen) {
  (void)root_feature, (void)err, (void)errlen;
  vs_jdrafter *j = self;
  j->root_index++;
  j->root_token = next_root;
  if (j->n_valid > 0) j->n_valid--;
  return VSPEC_OK;
}

const vs_drafter_class vs__drafter_jacobi = {
    .name = "jacobi",
    .open = jd_open,
    .close = jd_close,
    .uses_features = jd_uses_features,
    .start = jd_start,
    .propose = jd_propose,
    .end = jd_end,
    .skip = jd_skip,
    .counts = jd_counts,
};
