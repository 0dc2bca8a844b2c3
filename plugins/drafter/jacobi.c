/*
 * plugins/drafter/jacobi.c - `jacobi`: Speculative Jacobi Decoding, drafts without a draft model.
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
 * Parameters (written among the scheduler's: sd:exact@standard:drafter=jacobi,coupling=gumbel;
 * the engine hands them to the drafter):
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
#include <string.h>

#include "vspec/plugin.h"

enum { JC_NONE = 0, JC_GUMBEL = 1, JC_MAXIMAL = 2 };
enum { JI_UNIFORM = 0, JI_RANDOM = 1, JI_REPEAT = 2 };

/* Window positions live in a ring indexed by image position modulo its size, max_depth + 1
 * (the drafts, and the position past the window that the last one scores). */
#define J_MAX_RING 130
/* Widest level of SJD-PAC's tree: 8 candidates, 3 levels below the root's (continue=8x4). */
#define J_MAX_LEVEL 512

/* RNG streams of the job (vspec_drafter_job.seed): draws, then Gumbel noise per position. */
#define J_STREAM_DRAW VSPEC_STREAM_DRAFTER
#define J_STREAM_GUMBEL (VSPEC_STREAM_DRAFTER + 1)

#ifndef JACOBI_NAME
#define JACOBI_NAME "jacobi"
#endif

struct vspec_drafter {
  const vspec_host *host;
  int V, ring, greedy;
  int coupling, init, branch, branch_depth;
  uint64_t seed;
  vspec_rng rng;        /* redraws, first draws, extra candidates, the maximal coupling */
  int32_t root_index;   /* the last emitted token's image index */
  int32_t root_token;
  int n_valid;          /* drafts held for root_index + 1 .. root_index + n_valid */
  int32_t tok[J_MAX_RING];
  float *q;             /* [ring, V]: the distribution each held draft was drawn from */
  float *q_new, *res;   /* [V] */
};

static float *jd_q(vspec_drafter *j, int32_t pos) { return j->q + (size_t)(pos % j->ring) * j->V; }

/* Index of the first maximum. */
static int32_t jd_argmax(const float *p, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (p[i] > p[best]) best = i;
  return best;
}

/* Inverse-CDF draw from unnormalised weights; -1 when they have no mass. */
static int32_t jd_sample(const float *p, int n, double u) {
  double total = 0.0;
  for (int i = 0; i < n; i++) total += p[i];
  if (!(total > 0.0)) return -1;
  double target = u * total, acc = 0.0;
  int32_t last = -1;
  for (int i = 0; i < n; i++) {
    if (!(p[i] > 0.0f)) continue;
    acc += p[i];
    last = i;
    if (target < acc) return i;
  }
  return last; /* round-off: the last token with mass */
}

static void jd_destroy(vspec_drafter *j) {
  if (!j) return;
  j->host->free(j->q);
  j->host->free(j->q_new);
  j->host->free(j->res);
  j->host->free(j);
}

static int jd_params(vspec_drafter *j, const vspec_params *p, char *err, size_t errlen) {
  static const char *const known[] = {"coupling", "init", "continue", NULL};
  static const char *const couplings[] = {"none", "gumbel", "maximal", NULL};
  static const char *const inits[] = {"uniform", "random", "repeat", NULL};
  const vspec_host *h = j->host;
  int rc;
  if ((rc = h->param_check_known(p, known, err, errlen)) ||
      (rc = h->param_choice(p, "coupling", couplings, JC_NONE, &j->coupling, err, errlen)) ||
      (rc = h->param_choice(p, "init", inits, JI_UNIFORM, &j->init, err, errlen)))
    return rc;
  const char *cont = h->param_string(p, "continue");
  if (cont && strcmp(cont, "off") != 0) {
    char tail;
    if (sscanf(cont, "%dx%d%c", &j->branch, &j->branch_depth, &tail) != 2 || j->branch < 2 ||
        j->branch > 8 || j->branch_depth < 2 || j->branch_depth > 4) {
      snprintf(err, errlen, "parameter 'continue' = '%s': give KxD with K in 2..8 candidates "
               "and D in 2..4 tree levels (SJD-PAC's 3x3), or off", cont);
      return VSPEC_EINVAL;
    }
  }
  return VSPEC_OK;
}

static int jd_create(const vspec_host *host, const vspec_params *params,
                     const vspec_drafter_job *job, vspec_drafter **out, char *err,
                     size_t errlen) {
  vspec_drafter *j = host->calloc(1, sizeof *j);
  if (!j) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  j->host = host;
  int rc = jd_params(j, params, err, errlen);
  if (rc) {
    jd_destroy(j);
    return rc;
  }
  if (job->vocab < 1 || job->max_depth < 1 || job->max_depth + 1 > J_MAX_RING) {
    snprintf(err, errlen, "a job of vocabulary %d and draft depth %d is out of range",
             job->vocab, job->max_depth);
    jd_destroy(j);
    return VSPEC_EINVAL;
  }
  j->V = job->vocab;
  /* live positions: root + 1 .. root + max_depth + 1 (the last scored one) */
  j->ring = job->max_depth + 1;
  j->greedy = job->greedy;
  j->seed = job->seed;
  host->rng_init(&j->rng, j->seed, J_STREAM_DRAW);
  j->q = host->alloc((size_t)j->ring * j->V * sizeof(float));
  j->q_new = host->alloc((size_t)j->V * sizeof(float));
  j->res = host->alloc((size_t)j->V * sizeof(float));
  if (!j->q || !j->q_new || !j->res) {
    jd_destroy(j);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *out = j;
  return VSPEC_OK;
}

static int jd_start(vspec_drafter *j, int32_t root_token, char *err, size_t errlen) {
  (void)err, (void)errlen;
  j->root_index = 0;
  j->root_token = root_token;
  j->n_valid = 0;
  return VSPEC_OK;
}

/* Gumbel noise of (position, token), a pure function of the job's seed: the same vector every
 * time the position is drawn. */
static double jd_gumbel(const vspec_drafter *j, int32_t pos, int v) {
  double u = j->host->rng_uniform_at(j->seed, J_STREAM_GUMBEL + (uint64_t)pos, (uint64_t)v);
  if (!(u > 0.0)) u = 0x1p-53;
  return -log(-log(u));
}

/* A sample of q for position pos, by the job's coupling; -1 if q has no mass. */
static int32_t jd_draw(vspec_drafter *j, int32_t pos, const float *q) {
  if (j->greedy) return jd_argmax(q, j->V);
  if (j->coupling != JC_GUMBEL) return jd_sample(q, j->V, j->host->rng_uniform(&j->rng));
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int v = 0; v < j->V; v++) {
    if (!(q[v] > 0.0f)) continue;
    double score = log((double)q[v]) + jd_gumbel(j, pos, v);
    if (score > best_score) best_score = score, best = v;
  }
  return best;
}

/* The first draft of a position the window reaches (its ring slot is free). */
static void jd_init_position(vspec_drafter *j, int32_t pos) {
  float *q = jd_q(j, pos);
  int32_t *x = &j->tok[pos % j->ring];
  float u = 1.0f / (float)j->V;
  for (int v = 0; v < j->V; v++) q[v] = u;
  if (j->init == JI_REPEAT)
    *x = pos - 1 > j->root_index ? j->tok[(pos - 1) % j->ring] : j->root_token;
  else
    *x = jd_draw(j, pos, q);
  if (j->init != JI_UNIFORM && *x >= 0) { /* judged as a deterministic draft */
    memset(q, 0, (size_t)j->V * sizeof(float));
    q[*x] = 1.0f;
  }
}

/* Candidate k (k >= 1) of a position for SJD-PAC's tree: drawn from q without the earlier
 * candidates (the best ones when greedy); its conditional probability in *pc. -1: q has no
 * more mass. */
static int32_t jd_next_candidate(vspec_drafter *j, const float *q, const int32_t *cand, int k,
                                 float *pc) {
  memcpy(j->res, q, (size_t)j->V * sizeof(float));
  double left = 1.0;
  for (int i = 0; i < k; i++) {
    left -= j->res[cand[i]];
    j->res[cand[i]] = 0.0f;
  }
  int32_t x = j->greedy ? jd_argmax(j->res, j->V)
                        : jd_sample(j->res, j->V, j->host->rng_uniform(&j->rng));
  if (x < 0 || !(j->res[x] > 0.0f)) return -1;
  *pc = j->greedy ? 1.0f : (float)(j->res[x] / (left > 0.0 ? left : 1.0));
  return x;
}

/* Adds the candidates of position pos below every node of `level` (n of them), the window's
 * draft first; the new level replaces `level`. Returns its size (0 when the tree is full). */
static int jd_tree_level(vspec_drafter *j, const vspec_draft_builder *b, int32_t pos,
                         int32_t *level, int n) {
  const float *q = jd_q(j, pos);
  int32_t cand[8];
  float pc[8];
  int k = 0;
  cand[k] = j->tok[pos % j->ring];
  pc[k++] = j->greedy ? 1.0f : q[cand[0]];
  while (k < j->branch && (cand[k] = jd_next_candidate(j, q, cand, k, &pc[k])) >= 0) k++;
  int32_t next[J_MAX_LEVEL];
  int m = 0;
  for (int i = 0; i < n; i++) {
    float *dist = b->dist(b->ctx, level[i]);
    if (!dist) break;
    memcpy(dist, q, (size_t)j->V * sizeof(float));
    for (int c = 0; c < k && m < J_MAX_LEVEL; c++) {
      int32_t child = b->add(b->ctx, level[i], cand[c], pc[c]);
      if (child < 0) break;
      next[m++] = child;
    }
  }
  memcpy(level, next, (size_t)m * sizeof(int32_t));
  return m;
}

static int jd_propose(vspec_drafter *j, int32_t root_index, int32_t depth,
                      const vspec_draft_builder *b, char *err, size_t errlen) {
  if (root_index != j->root_index || depth < 0 || depth > j->ring - 1) {
    snprintf(err, errlen, "round at image index %d, depth %d: expected index %d, depth <= %d",
             root_index, depth, j->root_index, j->ring - 1);
    return VSPEC_EINVAL;
  }
  for (int i = j->n_valid + 1; i <= depth; i++) {
    jd_init_position(j, root_index + i);
    j->n_valid = i;
  }
  /* SJD-PAC's tree over the first positions; its first candidates are the window's drafts,
   * so the chain below continues from the first node of the last level. */
  int levels = j->branch ? j->branch_depth - 1 : 0;
  if (levels > depth) levels = depth;
  int32_t level[J_MAX_LEVEL] = {0};
  int n = 1, i = 1;
  for (; i <= levels && n > 0; i++) n = jd_tree_level(j, b, root_index + i, level, n);
  int32_t node = n > 0 ? level[0] : -1;
  for (; node >= 0 && i <= depth; i++) {
    int32_t pos = root_index + i;
    int32_t x = j->tok[pos % j->ring];
    float *dist = b->dist(b->ctx, node);
    if (!dist || x < 0) break; /* no room, or an empty distribution: a shorter chain */
    memcpy(dist, jd_q(j, pos), (size_t)j->V * sizeof(float));
    node = b->add(b->ctx, node, x, j->greedy ? 1.0f : jd_q(j, pos)[x]);
  }
  return VSPEC_OK;
}

/* The maximal coupling: the old draft x ~ q_old stays with probability min(1, q_new(x) /
 * q_old(x)); otherwise a draw from norm(max(0, q_new - q_old)). The result is a sample of
 * q_new. */
static int32_t jd_redraw_maximal(vspec_drafter *j, int32_t x, const float *q_old,
                                 const float *q_new) {
  double u = j->host->rng_uniform(&j->rng);
  if (x >= 0 && q_old[x] > 0.0f && u * (double)q_old[x] < (double)q_new[x]) return x;
  for (int v = 0; v < j->V; v++) {
    float r = q_new[v] - q_old[v];
    j->res[v] = r > 0.0f ? r : 0.0f;
  }
  double w = j->host->rng_uniform(&j->rng);
  int32_t y = jd_sample(j->res, j->V, w);
  return y >= 0 ? y : jd_sample(q_new, j->V, w);
}

/* The Jacobi update of position pos: q_new is the target's distribution at the node before
 * it, conditioned on the stale drafts before that. `held`: the position had a draft (the
 * maximal coupling couples with it; a position past the old window has none). */
static void jd_update(vspec_drafter *j, int32_t pos, int held) {
  float *q = jd_q(j, pos);
  int32_t *x = &j->tok[pos % j->ring];
  int32_t y = j->coupling == JC_MAXIMAL && !j->greedy && held
                  ? jd_redraw_maximal(j, *x, q, j->q_new)
                  : jd_draw(j, pos, j->q_new);
#ifdef JACOBI_PLANTED_FAULT
  /* tests only: the old draft judged against a distribution it was not drawn from */
  if (held && *x >= 0) y = *x;
#endif
  *x = y;
  memcpy(q, j->q_new, (size_t)j->V * sizeof(float));
}

static int jd_end(vspec_drafter *j, const vspec_round_result *r, char *err, size_t errlen) {
  int32_t new_root = r->root_index + r->n_accepted + 1;
  int32_t last = r->root_index;
  /* The window's own drafts are the first children all the way down (SJD-PAC's extra
   * candidates hang beside them); past the accepted path each scored the position after it. */
  for (int32_t node = 0; node >= 0;) {
    int32_t pos = r->root_index + r->depth[node] + 1;
    if (r->depth[node] > r->n_accepted) {
      int rc = r->target_dist(r->ctx, node, j->q_new);
      if (rc) {
        snprintf(err, errlen, "the target's distribution at node %d: status %d", node, rc);
        return rc;
      }
      jd_update(j, pos, pos <= j->root_index + j->n_valid);
      last = pos;
    }
    int32_t child = -1;
    for (int32_t i = node + 1; i < r->n_nodes && child < 0; i++)
      if (r->parents[i] == node) child = i;
    node = child;
  }
  j->root_index = new_root;
  j->root_token = r->next_root;
  j->n_valid = last > new_root ? last - new_root : 0;
  return VSPEC_OK;
}

/* A round without drafting (an AR step): the target emitted the window's first position. */
static int jd_skip(vspec_drafter *j, int32_t next_root, char *err, size_t errlen) {
  (void)err, (void)errlen;
  j->root_index++;
  j->root_token = next_root;
  if (j->n_valid > 0) j->n_valid--;
  return VSPEC_OK;
}

static const vspec_drafter_vtable jd_vtable = {
    .struct_size = sizeof(vspec_drafter_vtable),
    .create = jd_create,
    .destroy = jd_destroy,
    .start = jd_start,
    .propose = jd_propose,
    .end = jd_end,
    .skip = jd_skip,
};

static const vspec_plugin_desc jd_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_DRAFTER, JACOBI_NAME, "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "Speculative Jacobi Decoding: the window's drafts are the target's earlier "
                   "outputs (SJD, MC-SJD couplings, SJD-PAC's tree); no draft model",
    .vtable = &jd_vtable,
};

VSPEC_PLUGIN_DEFINE(jd_desc)
