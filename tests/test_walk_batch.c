/*
 * tests/test_walk_batch.c - the verification walk on the device (ABI 1.6) in cross-job
 * batches and on the unfused forward: llamagen's forward_multi walks each session that asks
 * (vspec_forward_out.walk) over its own slice of the batch's logits, with its own spec (rule,
 * sampling, rows, streams), and downloads every walk's result in one transfer and no logits
 * of a session that walked.
 *
 *  - forward_multi against the same batch without walks plus the CPU op over its logits
 *    (bitwise the same logits: the same sessions batched the same way): the same results for
 *    a mix of rules (exact with sampled drafts, LANTERN over a neighbour table, Cool-SD's
 *    omega), CFG rows and not, greedy and sampled, a walk after unverified tokens (the batch's
 *    last nodes), walkers and not in either order; the downloads and bytes exactly, unfused
 *    (the CPU's default) and on the fused ops (a GPU's);
 *  - whole models/fmnist jobs, several at once through a forward gate with VSPEC_WALK=device,
 *    against each alone with VSPEC_WALK=host: the same tokens and metrics (where batched
 *    forwards give the lone ones' bits, as the CPU's few-row kernels do), and every batch's
 *    downloads (a wrapper round the target's forward_multi counts them) exactly the features,
 *    the logits of the sessions that did not walk and the walk results;
 *  - whole jobs on a device without the fused ops (the unfused forward): the same tokens and
 *    metrics either way, and the rounds' logits less their results not downloaded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/forward_gate.h"
#include "core/host.h"
#include "core/tree.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"
#include "tests/support/ops_views.h"
#include "tests/support/method_of.h"

static vspec_host host, host_unfused;
static vs_registry *reg;

/* ---- forward_multi with walks against the CPU op over the same batch's logits ------------ */

enum { NS = 3, MAXN = 12, TABLE_K = 4 };

static int accepted, walks; /* draft nodes on the walks' paths (they accept, not only reject) */

typedef struct fixture {
  vspec_dev *dev, *batch_dev;
  vs_models *models;
  const vs_backend_model *t;
  vspec_session *a[NS], *b[NS]; /* walked, and the reference (logits, then the CPU op) */
  int rows[NS];
  int V, d, fused;
  int32_t *table; /* [V, TABLE_K] codebook neighbours for the LANTERN walk */
} fixture;

static void open_fixture(fixture *f, int fused) {
  char err[VSPEC_ERRLEN];
  memset(f, 0, sizeof *f);
  f->fused = fused;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &f->dev, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &f->batch_dev, err, sizeof err), 0);
  if (fused) setenv("VSPEC_MULTI", "fused", 1);
  int rc = vs_models_open(reg, &host, f->dev, "models/fmnist", VS_ROLE_TARGET, &f->models, err,
                          sizeof err);
  unsetenv("VSPEC_MULTI");
  if (rc) fail_msg("%s", err);
  f->t = &f->models->target;
  f->V = f->t->info.vocab;
  f->d = f->t->info.feature_dim;
  f->table = malloc((size_t)f->V * TABLE_K * sizeof(int32_t));
  for (int x = 0; x < f->V; x++)
    for (int j = 0; j < TABLE_K; j++) f->table[x * TABLE_K + j] = (x + 7 * j + 1) % f->V;
  static const int rows[NS] = {2, 1, 2};
  float *logits = malloc((size_t)2 * f->V * sizeof(float));
  for (int i = 0; i < NS; i++) {
    f->rows[i] = rows[i];
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = i + 2,
                                .rows = rows[i], .max_nodes = 16};
    for (int k = 0; k < 2; k++) {
      vspec_session **s = k ? &f->b[i] : &f->a[i];
      if (f->t->vt->session_open(f->t->model, f->dev, &cfg, s, err, sizeof err))
        fail_msg("%s", err);
      vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
      if (f->t->vt->prefill(*s, &o, err, sizeof err)) fail_msg("%s", err);
    }
  }
  free(logits);
}

static void close_fixture(fixture *f) {
  for (int i = 0; i < NS; i++) {
    f->t->vt->session_close(f->a[i]);
    f->t->vt->session_close(f->b[i]);
  }
  vs_models_close(f->models);
  vs_dev_destroy(f->dev);
  vs_dev_destroy(f->batch_dev);
  free(f->table);
}

/* One session's forward in a batch: `pre` unverified tokens (a chain) and then a tree of n
 * nodes, which it walks when `walk` is set, by rule kind `kind`. */
typedef struct member {
  int session, pre, n, walk, kind, features;
  uint64_t seed;
  /* built by make_member */
  int32_t tokens[MAXN], parents[MAXN]; /* the batch's */
  int32_t wparents[MAXN], wtokens[MAXN], dist[MAXN];
  uint8_t guided[MAXN];
  float *dists;
  vspec_walk_spec spec;
  vspec_forward_batch batch;
} member;

/* The tree's first children, nodes 0, 1, 3, 7, ..., drafted greedily from the target itself
 * (forwards of the chain so far on the reference session, which the round's forward, not
 * appending, then replaces), so that the walks accept some: random tokens never are. */
static void draft_chain(const fixture *f, member *m, float cfg) {
  int R = f->rows[m->session], V = f->V, chain[MAXN], k = 0;
  for (int c = 0; c < m->n; c = 2 * c + 1) chain[k++] = c;
  float *l = malloc((size_t)MAXN * R * V * sizeof(float));
  char err[VSPEC_ERRLEN];
  for (int j = 0; j + 1 < k; j++) {
    int32_t tok[MAXN], par[MAXN];
    int N = m->pre + j + 1;
    for (int i = 0; i < N; i++) {
      tok[i] = i < m->pre ? m->tokens[i] : m->tokens[m->pre + chain[i - m->pre]];
      par[i] = i - 1;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = N, .tokens = tok,
                             .parents = par};
    vspec_forward_out o = {.struct_size = sizeof o, .logits = l};
    if (f->t->vt->forward(f->b[m->session], &b, &o, err, sizeof err)) fail_msg("%s", err);
    const float *c = l + (size_t)(N - 1) * R * V, *u = c + V; /* conditional, unconditional */
    int guided = R > 1 && m->guided[chain[j]], best = 0;
    for (int x = 1; x < V; x++)
      if ((guided ? u[x] + cfg * (c[x] - u[x]) : c[x]) >
          (guided ? u[best] + cfg * (c[best] - u[best]) : c[best]))
        best = x;
    m->tokens[m->pre + chain[j + 1]] = best;
  }
  free(l);
}

/* A tree of n nodes after `pre` unverified ones: node i > 0 hangs under (i - 1) / 2 (two
 * children a node), the first children drafted by the target (draft_chain), the others
 * from the seed; the spec by kind, its sampling by session (CFG rows, temperature, top-k/p). */
static void make_member(const fixture *f, member *m) {
  vspec_rng r;
  vs_rng_init(&r, m->seed, 9);
  int N = m->pre + m->n, V = f->V, rows = f->rows[m->session];
  float cfg = rows > 1 ? 2.5f : 1.0f;
  for (int i = 0; i < N; i++) {
    m->tokens[i] = (int32_t)(vs_rng_uniform(&r) * V);
    m->parents[i] = i - 1; /* the chain of unverified tokens, then the tree's root */
  }
  for (int i = 1; i < m->n; i++) {
    m->wparents[i] = (i - 1) / 2;
    m->parents[m->pre + i] = m->pre + (i - 1) / 2;
  }
  m->wparents[0] = -1;
  for (int i = 0; i < m->n; i++) m->guided[i] = (uint8_t)(i % 5 != 4); /* a CFG interval */
  draft_chain(f, m, cfg);
  for (int i = 0; i < m->n; i++) {
    m->wtokens[i] = m->tokens[m->pre + i];
    m->dist[i] = i;
  }
  m->spec = (vspec_walk_spec){
      .sample = {.n = m->n, .rows = rows, .vocab = V, .cfg_scale = cfg,
                 .temperature = 1.0f, .top_p = 1.0f, .guided = m->guided},
      .parents = m->wparents, .tokens = m->wtokens, .rule = {.kind = m->kind}};
  vs_rng_init(&m->spec.accept, m->seed, 3);
  vs_rng_init(&m->spec.target, m->seed, 1);
  m->dists = NULL;
  if (m->kind == VSPEC_WALK_EXACT) { /* sampled drafts: a distribution per node */
    m->dists = malloc((size_t)m->n * V * sizeof(float));
    for (int i = 0; i < m->n; i++) {
      float *p = m->dists + (size_t)i * V;
      for (int x = 0; x < V; x++) p[x] = (float)vs_rng_uniform(&r);
      /* the drafted children hold much of the mass, so that some are accepted */
      for (int c = 2 * i + 1; c <= 2 * i + 2 && c < m->n; c++) p[m->wtokens[c]] += (float)V / 4;
      double sum = 0;
      for (int x = 0; x < V; x++) sum += p[x];
      for (int x = 0; x < V; x++) p[x] = (float)(p[x] / sum);
    }
    m->spec.dists = m->dists;
    m->spec.dist = m->dist;
  } else if (m->kind == VSPEC_WALK_PROXIMITY) { /* LANTERN, one-hot drafts, top-k */
    m->spec.rule.k = 3;
    m->spec.rule.budget_abs = 0.3;
    m->spec.neighbours = f->table;
    m->spec.table_k = TABLE_K;
    m->spec.sample.temperature = 0.8f;
    m->spec.sample.top_k = 50;
  } else { /* Cool-SD's omega per depth, optimal resampling, top-p; greedy when seed is odd */
    for (int d = 0; d <= VSPEC_WALK_MAX_DEPTH; d++) m->spec.rule.omega[d] = 2.0 - 0.1 * d;
    m->spec.rule.optimal = 1;
    m->spec.sample.top_p = 0.9f;
    if (m->seed & 1) m->spec.sample.temperature = 0.0f;
  }
  m->batch = (vspec_forward_batch){.struct_size = sizeof m->batch, .n_nodes = N,
                                   .tokens = m->tokens, .parents = m->parents};
}

static const float SENTINEL = -12345.0f;

/* One batch of `count` members, walked on f->a and plain on f->b (the same composition);
 * asserts the results, the logits of those that did not walk, and the batch's transfers.
 * Commits each walker's path (after its unverified tokens) and node 0 of the others. */
static void walk_round(fixture *f, member *ms, int count) {
  vspec_session *sa[NS], *sb[NS];
  const vspec_forward_batch *bs[NS];
  vspec_forward_out oa[NS], ob[NS], *pa[NS], *pb[NS];
  vspec_walk_result res[NS];
  char err[VSPEC_ERRLEN];
  uint64_t want_bytes = 0, feat_rows = 0, want_uploads = (uint64_t)f->fused;
  int walkers = 0, runs = 0, feats = 0;
  for (int j = 0; j < count; j++) {
    member *m = &ms[j];
    make_member(f, m);
    size_t rows = (size_t)m->batch.n_nodes * f->rows[m->session];
    oa[j] = (vspec_forward_out){.struct_size = sizeof oa[j],
                                .logits = malloc(rows * f->V * sizeof(float)),
                                .features = m->features ? malloc(rows * f->d * sizeof(float))
                                                        : NULL};
    for (size_t k = 0; k < rows * f->V; k++) oa[j].logits[k] = SENTINEL;
    ob[j] = (vspec_forward_out){.struct_size = sizeof ob[j],
                                .logits = malloc(rows * f->V * sizeof(float))};
    if (m->walk) {
      oa[j].walk = &m->spec;
      oa[j].walk_dists = m->dists ? m->n : 0;
      oa[j].walk_result = &res[j];
      walkers++;
    } else {
      want_bytes += rows * f->V * sizeof(float);
      runs += j == 0 || ms[j - 1].walk;
    }
    feats |= m->features;
    feat_rows += rows;
    sa[j] = f->a[m->session];
    sb[j] = f->b[m->session];
    bs[j] = &m->batch;
    pa[j] = &oa[j];
    pb[j] = &ob[j];
  }
  if (feats) want_bytes += feat_rows * f->d * sizeof(float);
  want_bytes += (uint64_t)walkers * sizeof(vspec_walk_result);
  want_uploads += walkers > 0;
  if (f->t->vt->forward_multi(f->batch_dev, sb, bs, pb, count, err, sizeof err))
    fail_msg("%s", err);
  vs_dev_counters c0, c;
  vs_dev_counters_get(f->batch_dev, &c0);
  if (f->t->vt->forward_multi(f->batch_dev, sa, bs, pa, count, err, sizeof err))
    fail_msg("%s", err);
  vs_dev_counters_get(f->batch_dev, &c);
  vs_dev_counters_sub(&c, &c0);
  /* one download of the features, one per run of sessions that did not walk, one of every
   * walk's result: nothing of the walkers' logits */
  assert_int_equal(c.downloads, (uint64_t)feats + (uint64_t)runs + (walkers > 0));
  assert_int_equal(c.download_bytes, want_bytes);
  assert_int_equal(c.uploads, want_uploads);
  for (int j = 0; j < count; j++) {
    member *m = &ms[j];
    int R = f->rows[m->session];
    size_t rows = (size_t)m->batch.n_nodes * R;
    assert_int_equal(oa[j].walked, m->walk);
    if (!m->walk) {
      assert_memory_equal(oa[j].logits, ob[j].logits, rows * f->V * sizeof(float));
      int32_t root = 0;
      if (f->t->vt->commit(sa[j], &root, 1, err, sizeof err) ||
          f->t->vt->commit(sb[j], &root, 1, err, sizeof err))
        fail_msg("%s", err);
    } else {
      for (size_t k = 0; k < rows * f->V; k++) /* left unwritten */
        if (oa[j].logits[k] != SENTINEL) fail_msg("member %d: logits written (%zu)", j, k);
      /* the reference: the CPU op over the same logits, the walk's last n nodes */
      vspec_walk_result want;
      vs_dev_ops(f->dev)->verify_walk(f->dev, ob[j].logits + (size_t)m->pre * R * f->V,
                                      &m->spec, &want);
      assert_int_equal(want.status, VSPEC_OK);
      assert_int_equal(res[j].status, VSPEC_OK);
      assert_int_equal(res[j].n_path, want.n_path);
      assert_int_equal(res[j].next, want.next);
      assert_int_equal(res[j].accept_draws, want.accept_draws);
      assert_int_equal(res[j].target_draws, want.target_draws);
      assert_int_equal(res[j].tried, want.tried);
      assert_int_equal(res[j].fallbacks, want.fallbacks);
      assert_memory_equal(res[j].path, want.path, (size_t)want.n_path * sizeof(int32_t));
      accepted += want.n_path - 1;
      walks++;
      int32_t path[MAXN + VSPEC_WALK_MAX_PATH];
      int n = 0;
      for (int i = 0; i < m->pre; i++) path[n++] = i;
      for (int i = 0; i < want.n_path; i++) path[n++] = m->pre + want.path[i];
      if (f->t->vt->commit(sa[j], path, n, err, sizeof err) ||
          f->t->vt->commit(sb[j], path, n, err, sizeof err))
        fail_msg("%s", err);
    }
    free(oa[j].logits);
    free(oa[j].features);
    free(ob[j].logits);
    free(m->dists);
  }
}

static void check_batch_walks(int fused) {
  fixture f;
  open_fixture(&f, fused);
  accepted = walks = 0;
  enum { E = VSPEC_WALK_EXACT, L = VSPEC_WALK_PROXIMITY, C = VSPEC_WALK_OMEGA };
  /* every session walks, each by another rule; one after 2 unverified tokens */
  member r1[NS] = {{.session = 0, .n = 7, .walk = 1, .kind = E, .seed = 11},
                   {.session = 1, .pre = 2, .n = 5, .walk = 1, .kind = L, .seed = 12},
                   {.session = 2, .n = 6, .walk = 1, .kind = C, .seed = 14}};
  walk_round(&f, r1, NS);
  /* one does not walk, between two that do, features asked: one logits download */
  member r2[NS] = {{.session = 2, .n = 4, .walk = 1, .kind = L, .seed = 21, .features = 1},
                   {.session = 0, .n = 3, .walk = 0, .kind = E, .seed = 22},
                   {.session = 1, .n = 8, .walk = 1, .kind = C, .seed = 23}};
  walk_round(&f, r2, NS);
  /* two runs of sessions that do not walk around one that does (greedy Cool-SD) */
  member r3[NS] = {{.session = 1, .n = 2, .walk = 0, .kind = E, .seed = 31},
                   {.session = 0, .pre = 1, .n = 6, .walk = 1, .kind = C, .seed = 33},
                   {.session = 2, .n = 5, .walk = 0, .kind = L, .seed = 32}};
  walk_round(&f, r3, NS);
  /* a batch of one (no host stage), and two that walk by the same rule */
  member r4[1] = {{.session = 2, .n = 9, .walk = 1, .kind = E, .seed = 41}};
  walk_round(&f, r4, 1);
  member r5[2] = {{.session = 0, .n = 5, .walk = 1, .kind = L, .seed = 51},
                  {.session = 1, .n = 6, .walk = 1, .kind = L, .seed = 52}};
  walk_round(&f, r5, 2);
  printf("  %d draft nodes accepted over %d walks\n", accepted, walks);
  assert_true(accepted > 0);
  close_fixture(&f);
}

static void test_batch_walks_unfused(void **state) {
  (void)state;
  check_batch_walks(0);
}

static void test_batch_walks_fused(void **state) {
  (void)state;
  check_batch_walks(1);
}

/* ---- whole jobs through a gate ----------------------------------------------------------- */

/* The target's forward_multi, wrapped: counts the sessions that asked for the walk and those
 * that walked, and holds each batch's downloads on its device to the features (all rows,
 * where any session asks), the logits of the sessions that did not walk and the results. */
static const vspec_backend_vtable *real_vt;
static vspec_backend_vtable wrap_vt;
static pthread_mutex_t wrap_mu = PTHREAD_MUTEX_INITIALIZER;
static int wrap_V, wrap_d, n_known, wrap_asked, wrap_walked, wrap_batches, wrap_bad;
static struct {
  vspec_session *s;
  int rows;
} known[8];

static int known_rows(vspec_session *s) {
  for (int i = 0; i < n_known; i++)
    if (known[i].s == s) return known[i].rows;
  return 0;
}

static int wrapped_multi(vspec_dev *dev, vspec_session *const *ss,
                         const vspec_forward_batch *const *bs, vspec_forward_out *const *outs,
                         int32_t count, char *err, size_t errlen) {
  vs_dev_counters c0, c;
  vs_dev_counters_get(dev, &c0);
  int rc = real_vt->forward_multi(dev, ss, bs, outs, count, err, errlen);
  vs_dev_counters_get(dev, &c);
  vs_dev_counters_sub(&c, &c0);
  if (rc) return rc;
  pthread_mutex_lock(&wrap_mu);
  uint64_t bytes = 0, rows_all = 0;
  int feats = 0, walked = 0;
  for (int i = 0; i < count; i++) {
    int R = known_rows(ss[i]);
    if (!R) wrap_bad++, fprintf(stderr, "a batched session of no known job\n");
    uint64_t rows = (uint64_t)bs[i]->n_nodes * R;
    rows_all += rows;
    feats |= outs[i]->features != NULL;
    wrap_asked += outs[i]->walk != NULL;
    walked += outs[i]->walked;
    if (!outs[i]->walked && outs[i]->logits) bytes += rows * wrap_V * sizeof(float);
  }
  wrap_walked += walked;
  wrap_batches += count > 1;
  bytes += (feats ? rows_all * wrap_d * sizeof(float) : 0) + walked * sizeof(vspec_walk_result);
  if (c.download_bytes != bytes) {
    wrap_bad++;
    fprintf(stderr, "a batch of %d (%d walked) downloaded %llu bytes, not %llu\n", count,
            walked, (unsigned long long)c.download_bytes, (unsigned long long)bytes);
  }
  pthread_mutex_unlock(&wrap_mu);
  return rc;
}

typedef struct job_run {
  vs_models *models;
  vs_forward_gate *gate;
  const char *method;
  vs_sampling sampling;
  uint64_t seed;
  int32_t tokens[1024];
  vs_metrics m;
  uint64_t download_bytes, logits_bytes, walks;
  int rc;
  char err[VSPEC_ERRLEN];
} job_run;

/* Learns each job's session (round 0, the prefill: before any batch holds it) and counts what
 * a verified round but an AR step downloads as logits when the host walks. */
static void on_round(void *user, const vs_round_info *in) {
  job_run *j = user;
  int R = j->sampling.cfg_scale > 1.0f ? 2 : 1;
  if (in->round == 0) {
    pthread_mutex_lock(&wrap_mu);
    if (!known_rows(in->session) && n_known < 8)
      known[n_known].s = in->session, known[n_known++].rows = R;
    pthread_mutex_unlock(&wrap_mu);
    return;
  }
  int nodes = in->prepended + (in->tree ? in->tree->n : 1);
  if (in->skipped || nodes == 1) return;
  j->logits_bytes += (uint64_t)nodes * R * wrap_V * sizeof(float);
  j->walks++;
}

static void *job_main(void *arg) {
  job_run *j = arg;
  vspec_dev *dev;
  if ((j->rc = vs_dev_create(vs_cpu_ops(), 1, &dev, j->err, sizeof j->err))) return NULL;
  vs_job job = {.method = vs_method_of(j->method), .class_label = (int)(j->seed % 10),
                .seed = j->seed, .sampling = j->sampling, .gate = j->gate,
                .on_round = on_round, .user = j};
  vs_dev_counters c0, c;
  vs_dev_counters_get(dev, &c0);
  j->rc = vs_generate(j->models, dev, &job, j->tokens, &j->m, j->err, sizeof j->err);
  vs_dev_counters_get(dev, &c);
  vs_dev_counters_sub(&c, &c0);
  j->download_bytes = c.download_bytes;
  vs_dev_destroy(dev);
  return NULL;
}

static void expect_same(const char *what, const job_run *a, const job_run *b) {
  if (a->rc || b->rc) fail_msg("%s: %s%s", what, a->err, b->err);
  if (memcmp(a->tokens, b->tokens, sizeof a->tokens))
    fail_msg("%s (%s): the tokens differ", what, a->method);
  assert_int_equal(a->m.rounds, b->m.rounds);
  assert_int_equal(a->m.accepted, b->m.accepted);
  assert_int_equal(a->m.drafted, b->m.drafted);
  assert_int_equal(a->m.siblings_tried, b->m.siblings_tried);
  assert_int_equal(a->m.residual_fallbacks, b->m.residual_fallbacks);
  assert_memory_equal(a->m.reached, b->m.reached, sizeof a->m.reached);
  assert_memory_equal(a->m.accepted_at, b->m.accepted_at, sizeof a->m.accepted_at);
}

/* A mix of rules, drafters, CFG rows and samplings, as a daemon's jobs would be. */
static const char *const job_methods[] = {
    "sd:exact@standard:shape=chain,depth=4,drafter=model",
    "sd:lantern:k=8,delta=0.3@standard:shape=static,tree=fmnist,drafter=head",
    "sd:coolsd:delta=1.6@standard:shape=dynamic,drafter=model,depth=3,top_k=3,total_tokens=8",
};
static const vs_sampling job_samplings[] = {
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
    {.temperature = 0.8f, .top_k = 100, .top_p = 0.9f, .cfg_scale = 3.0f, .cfg_interval = 20},
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1},
};
enum { NJ = 3 };

/* Whether a batch of the model's forwards gives each session the bits of its lone forward, at
 * the jobs' sizes (3 sessions, 2 rows, 18 nodes: more than the jobs' trees): on the CPU each
 * row's linear products do not depend on the row count up to the few-row kernel's limit
 * (kernels/cpu/cpu_reduce4.h, VS_SKINNY_MAX_M: 256 rows on AVX-512); past it, or with other
 * kernels, batched jobs differ from lone ones by float rounding and may draw differently. */
static int batch_bits_exact(const vs_backend_model *bm, vspec_dev *dev, vspec_dev *batch_dev) {
  enum { S = 3, N = 18 };
  char err[VSPEC_ERRLEN];
  int V = bm->info.vocab, same = 1;
  vspec_session *s[2][S];
  float *l = malloc((size_t)2 * S * 2 * N * V * sizeof(float));
  int32_t tok[N], par[N];
  for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 5) % V), par[i] = i - 1;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = N, .tokens = tok, .parents = par};
  const vspec_forward_batch *bs[S] = {&b, &b, &b};
  vspec_forward_out o[2][S], *os[S];
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < S; i++) {
      vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = i, .rows = 2,
                                  .max_nodes = N};
      if (bm->vt->session_open(bm->model, dev, &cfg, &s[k][i], err, sizeof err))
        fail_msg("%s", err);
      o[k][i] = (vspec_forward_out){.struct_size = sizeof o[k][i],
                                    .logits = l + (size_t)(k * S + i) * 2 * N * V};
      if (bm->vt->prefill(s[k][i], &o[k][i], err, sizeof err)) fail_msg("%s", err);
      if (k == 0 && bm->vt->forward(s[k][i], &b, &o[k][i], err, sizeof err))
        fail_msg("%s", err);
      os[i] = &o[k][i];
    }
  if (bm->vt->forward_multi(batch_dev, s[1], bs, os, S, err, sizeof err)) fail_msg("%s", err);
  for (int i = 0; i < S; i++) {
    same &= memcmp(o[0][i].logits, o[1][i].logits, (size_t)2 * N * V * sizeof(float)) == 0;
    bm->vt->session_close(s[0][i]);
    bm->vt->session_close(s[1][i]);
  }
  free(l);
  return same;
}

/* Jobs several at once through a gate that batches them, walking on the device, give each
 * the tokens and metrics it gets alone walking on the host (where batched forwards give the
 * lone forwards' bits: batch_bits_exact; else at most 2 % of the tokens differ, as
 * tests/test_forward_gate.c allows), and the batches walked every session that asked,
 * downloading nothing else of theirs. */
static void test_gate_jobs_walk(void **state) {
  (void)state;
#ifdef VSPEC_SANITIZED
  /* 14 s there: whole jobs repeat what test_batch_walks_* check per batch (the backend's
   * memory) and tests/test_walk_jobs.c and test_forward_gate.c per job (the engine's, the
   * gate's); make test's ASan pass stays short */
  print_message("skipped under the sanitizers (the batches' walks run above)\n");
  skip();
#endif
  char err[VSPEC_ERRLEN];
  vspec_dev *dev, *gate_dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &gate_dev, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  wrap_V = models->target.info.vocab;
  wrap_d = models->target.info.feature_dim;
  real_vt = models->target.vt;
  wrap_vt = *real_vt;
  wrap_vt.forward_multi = wrapped_multi;
  int exact = batch_bits_exact(&models->target, dev, gate_dev) &&
              batch_bits_exact(&models->draft, dev, gate_dev);
  if (!exact) printf("  batched forwards are not the lone ones' bits here: tokens within 2 %%\n");
  models->target.vt = &wrap_vt;
  for (int round = 0; round < 2; round++) {
    job_run *alone = calloc(NJ, sizeof *alone), *batched = calloc(NJ, sizeof *batched);
    vs_forward_gate *g;
    assert_int_equal(vs_forward_gate_create(NJ, 0.5, &gate_dev, 1, &g, err, sizeof err), 0);
    n_known = wrap_asked = wrap_walked = wrap_batches = wrap_bad = 0;
    setenv("VSPEC_WALK", "host", 1);
    for (int i = 0; i < NJ; i++) {
      alone[i] = (job_run){.models = models, .method = job_methods[i],
                           .sampling = job_samplings[(i + round) % NJ],
                           .seed = 5 + 3 * (uint64_t)round + (uint64_t)i};
      batched[i] = alone[i];
      batched[i].gate = g;
      job_main(&alone[i]);
    }
    setenv("VSPEC_WALK", "device", 1);
    pthread_t th[NJ];
    for (int i = 0; i < NJ; i++) pthread_create(&th[i], NULL, job_main, &batched[i]);
    for (int i = 0; i < NJ; i++) pthread_join(th[i], NULL);
    unsetenv("VSPEC_WALK");
    vs_forward_gate_stats st;
    vs_forward_gate_get_stats(g, &st);
    for (int i = 0; i < NJ; i++) {
      if (exact) {
        expect_same("batched, walked on the device", &batched[i], &alone[i]);
        continue;
      }
      if (batched[i].rc || alone[i].rc) fail_msg("%s%s", batched[i].err, alone[i].err);
      int diff = 0, n = models->target.info.grid_h * models->target.info.grid_w;
      for (int k = 0; k < n; k++) diff += batched[i].tokens[k] != alone[i].tokens[k];
      if (diff * 50 > n) fail_msg("%s: %d of %d tokens differ", job_methods[i], diff, n);
    }
    printf("  %d batches of several, %d walks asked for in them, %d walked\n", wrap_batches,
           wrap_asked, wrap_walked);
    assert_true(st.multi > 0);
    assert_true(wrap_asked > 0);
    assert_int_equal(wrap_walked, wrap_asked);
    assert_int_equal(wrap_bad, 0);
    vs_forward_gate_destroy(&g);
    free(alone);
    free(batched);
  }
  models->target.vt = real_vt;
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_dev_destroy(gate_dev);
}

/* ---- the unfused forward ----------------------------------------------------------------- */

/* Whole jobs whose target forwards take the unfused path walk there too: the same tokens and
 * metrics as the host walk, and every such round's logits less its result not downloaded. */
static void test_unfused_jobs_walk(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_dev *dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  if (vs_models_open(reg, &host_unfused, dev, "models/fmnist", VS_ROLE_ALL, &models, err,
                     sizeof err))
    fail_msg("%s", err);
  wrap_V = models->target.info.vocab;
#ifdef VSPEC_SANITIZED
  const int n = 1;
#else
  const int n = NJ;
#endif
  for (int i = 0; i < n; i++) {
    job_run *h = calloc(1, sizeof *h), *d = calloc(1, sizeof *d);
    *h = (job_run){.models = models, .method = job_methods[i], .sampling = job_samplings[i],
                   .seed = 21 + (uint64_t)i};
    *d = *h;
    setenv("VSPEC_WALK", "host", 1);
    job_main(h);
    setenv("VSPEC_WALK", "device", 1);
    job_main(d);
    unsetenv("VSPEC_WALK");
    expect_same("unfused, walked on the device", d, h);
    assert_true(d->walks > 0);
    assert_int_equal(h->logits_bytes, d->logits_bytes);
    assert_int_equal(h->download_bytes - d->download_bytes,
                     d->logits_bytes - d->walks * sizeof(vspec_walk_result));
    free(h);
    free(d);
  }
  vs_models_close(models);
  vs_dev_destroy(dev);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024], cache[] = "/tmp/vspec-walk-batch-XXXXXX";
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  if (!mkdtemp(cache)) return 1;
  setenv("VSPEC_CACHE_DIR", cache, 1); /* the neighbour table is built, not read from $HOME */
  vs_host_init(&host, vs_cpu_ops());
  host_unfused = host;
  host_unfused.dev_ops = vt_ops_unfused;
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_walks_unfused),
      cmocka_unit_test(test_batch_walks_fused),
      cmocka_unit_test(test_gate_jobs_walk),
      cmocka_unit_test(test_unfused_jobs_walk),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  if (system(cmd)) rc |= 0;
  return rc;
}
