/*
 * tests/support/graph_replay.h - graph replay against eager execution (ABI 1.5), shared by
 * tests/test_graph_replay.c (the CPU, whose graphs record and replay the ops) and
 * tests/gpu/test_cuda_graphs.c (CUDA graphs); header only, cmocka asserts.
 *
 * One LlamaGen model is loaded twice on one device: graphs=on (tree forwards padded to their
 * node-count bucket, one recorded graph per bucket and head kind, replayed every step) and
 * graphs=pad (the same padded forwards run eagerly: the same ops with the same arguments
 * when nothing per-step is baked into a graph). Every output must be bit-identical: logits
 * and features of forwards across KV lengths, every bucket up to 16, chains, random trees,
 * batches appended to pending nodes, two sessions interleaved on one device, 1 and 2 CFG
 * rows, draws on the device. A backend that passes a per-step value by value (a node count,
 * a length) replays the value of the step it recorded and fails here.
 */
#ifndef VS_TEST_GRAPH_REPLAY_H
#define VS_TEST_GRAPH_REPLAY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/models.h"
#include "core/registry.h"
#include "core/sampling.h"
#include "kernels/vs_kernels.h"

typedef struct gr_pair {
  vs_backend_model m[2];  /* graphs=on, graphs=pad */
  vspec_session *s[2][2]; /* [model][session]: two sessions of each, interleaved */
  int V, d, rows;
  vspec_dev *dev;
} gr_pair;

static uint32_t gr_lcg(uint32_t *x) { return (*x = *x * 1664525u + 1013904223u) >> 8; }

static void gr_load(gr_pair *p, vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                    const char *path) {
  static const char *const params[2] = {"max_nodes=64,graphs=on", "max_nodes=64,graphs=pad"};
  char err[VSPEC_ERRLEN];
  memset(p, 0, sizeof *p);
  p->dev = dev;
  for (int i = 0; i < 2; i++)
    if (vs_backend_model_load(reg, host, dev, "llamagen", path, params[i], &p->m[i], err,
                              sizeof err))
      fail_msg("%s: %s", path, err);
  p->V = p->m[0].info.vocab;
  p->d = p->m[0].info.feature_dim;
}

static void gr_open(gr_pair *p, const vspec_session_config *cfg) {
  char err[VSPEC_ERRLEN];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      if (p->m[i].vt->session_open(p->m[i].model, p->dev, cfg, &p->s[i][j], err, sizeof err))
        fail_msg("session_open: %s", err);
  p->rows = cfg->rows;
}

static void gr_close(gr_pair *p) {
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      if (p->s[i][j]) p->m[i].vt->session_close(p->s[i][j]), p->s[i][j] = NULL;
}

static void gr_unload(gr_pair *p) {
  gr_close(p);
  vs_backend_model_unload(&p->m[0]);
  vs_backend_model_unload(&p->m[1]);
}

static void gr_same(const char *what, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a))
      fail_msg("%s: element %zu of %zu: graph %.9g, eager %.9g", what, i, n, a[i], b[i]);
}

/* Prefill (b NULL) or forward on session j of both models; logits and features compared. */
static void gr_both(gr_pair *p, int j, const vspec_forward_batch *b, const char *what) {
  int n = b ? b->n_nodes : 1;
  size_t nl = (size_t)n * p->rows * p->V, nf = (size_t)n * p->rows * p->d;
  float *l[2], *f[2];
  char err[VSPEC_ERRLEN], name[128];
  for (int i = 0; i < 2; i++) {
    l[i] = malloc(nl * sizeof(float));
    f[i] = malloc(nf * sizeof(float));
    assert_non_null(l[i]);
    assert_non_null(f[i]);
    vspec_forward_out o = {.struct_size = sizeof o, .logits = l[i], .features = f[i]};
    int rc = b ? p->m[i].vt->forward(p->s[i][j], b, &o, err, sizeof err)
               : p->m[i].vt->prefill(p->s[i][j], &o, err, sizeof err);
    if (rc) fail_msg("%s: %s", what, err);
  }
  snprintf(name, sizeof name, "session %d, %s, logits", j, what);
  gr_same(name, l[0], l[1], nl);
  snprintf(name, sizeof name, "session %d, %s, features", j, what);
  gr_same(name, f[0], f[1], nf);
  for (int i = 0; i < 2; i++) free(l[i]), free(f[i]);
}

static void gr_commit(gr_pair *p, int j, const int32_t *path, int n) {
  char err[VSPEC_ERRLEN];
  for (int i = 0; i < 2; i++)
    if (p->m[i].vt->commit(p->s[i][j], path, n, err, sizeof err)) fail_msg("commit: %s", err);
}

/* The parents of a session's pending nodes, as the backend holds them. */
typedef struct gr_pending {
  int32_t par[128];
  int n;
} gr_pending;

/* A random tree of n nodes, fresh or appended below the pending ones, forwarded on session j
 * of both models. */
static void gr_tree(gr_pair *p, int j, int n, int append, gr_pending *pd, uint32_t *x) {
  int32_t tok[64], par[64];
  int first = append ? pd->n : 0;
  for (int i = 0; i < n; i++) {
    tok[i] = (int32_t)(gr_lcg(x) % (uint32_t)p->V);
    par[i] = first + i == 0 ? -1 : (int32_t)(gr_lcg(x) % (uint32_t)(first + i + 1)) - 1;
    pd->par[first + i] = par[i];
  }
  pd->n = first + n;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tok, .parents = par,
                           .append = append};
  char what[64];
  snprintf(what, sizeof what, "%s of %d after %d pending", append ? "appended tree" : "tree", n,
           first);
  gr_both(p, j, &b, what);
}

/* Commits up to `most` nodes of the path from a root down to the last pending node. */
static void gr_commit_last(gr_pair *p, int j, gr_pending *pd, int most) {
  int32_t chain[128], path[128];
  int k = 0;
  for (int a = pd->n - 1; a >= 0; a = pd->par[a]) chain[k++] = a;
  for (int i = 0; i < k; i++) path[i] = chain[k - 1 - i];
  gr_commit(p, j, path, k < most ? k : most);
  pd->n = 0;
}

/* A session's life on sessions 0 and 1 in turn: prefill, forwards of every size 1..16 (each
 * bucket with several real node counts, at growing KV lengths), batches appended to the
 * pending tree, commits that move cache slots, one-token steps between. */
static void gr_script(gr_pair *p, uint32_t seed) {
  static const int sizes[] = {1, 3, 4, 2, 7, 5, 1, 9, 16, 12, 8, 6, 1, 13, 11, 10, 15, 14, 1};
  uint32_t x = seed;
  gr_pending pd[2] = {{.n = 0}, {.n = 0}};
  for (int j = 0; j < 2; j++) gr_both(p, j, NULL, "prefill");
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (int j = 0; j < 2; j++) {
      gr_tree(p, j, sizes[k], 0, &pd[j], &x);
      if (k % 3 == 1) gr_tree(p, j, 3, 1, &pd[j], &x); /* appended: base > 0 */
      gr_commit_last(p, j, &pd[j], 2);
    }
}

/* Draws on the device through graphs and eagerly: the same tokens, and an AR step through a
 * graph costs one upload, one launch, one download. */
static void gr_draws(gr_pair *p, uint32_t seed) {
  static const vs_sampling set = {.temperature = 1.0f, .top_k = 8, .top_p = 0.9f,
                                  .cfg_scale = 2.0f, .cfg_interval = 3};
  char err[VSPEC_ERRLEN];
  uint32_t x = seed;
  for (int j = 0; j < 2; j++) gr_both(p, j, NULL, "prefill");
  for (int step = 0; step < 8; step++) {
    int32_t tok = (int32_t)(gr_lcg(&x) % (uint32_t)p->V), par = -1, got[2] = {-7, -8}, path0 = 0;
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tok,
                             .parents = &par};
    double u = (double)gr_lcg(&x) / 16777216.0;
    uint8_t guided;
    vspec_sample_spec spec;
    vs_sample_spec_one(&set, p->rows, p->V, step + 1, &guided, &u, &spec);
    for (int i = 0; i < 2; i++) {
      vspec_forward_out o = {.struct_size = sizeof o, .sample = &spec, .tokens = &got[i]};
      vs_dev_counters c0, c1;
      vs_dev_counters_get(p->dev, &c0);
      assert_int_equal(p->m[i].vt->forward(p->s[i][0], &b, &o, err, sizeof err), 0);
      vs_dev_counters_get(p->dev, &c1);
      vs_dev_counters_sub(&c1, &c0);
      assert_int_equal(o.sampled, 1);
      assert_int_equal(c1.uploads, 1);
      assert_int_equal(c1.downloads, 1);
      if (i == 0 && step > 0) { /* recorded at step 0, replayed since */
        assert_int_equal(c1.launches, 1);
        assert_int_equal(c1.ops, 1);
        assert_int_equal(c1.recorded, 0);
      }
      assert_int_equal(p->m[i].vt->commit(p->s[i][0], &path0, 1, err, sizeof err), 0);
    }
    if (got[0] != got[1]) fail_msg("step %d: graph drew %d, eager %d", step, got[0], got[1]);
  }
}

/* The whole check on one model file: 1 and 2 CFG rows; graphs must have been launched. */
static void gr_check_model(vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                           const char *path, int class_label) {
  gr_pair p;
  gr_load(&p, reg, host, dev, path);
  vs_dev_counters c0, c1;
  vs_dev_counters_get(dev, &c0);
  for (int rows = 1; rows <= 2; rows++) {
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = class_label,
                                .rows = rows, .max_nodes = 32};
    gr_open(&p, &cfg);
    gr_script(&p, 7u + (uint32_t)rows);
    gr_close(&p);
    gr_open(&p, &cfg);
    gr_draws(&p, 3u + (uint32_t)rows);
    gr_close(&p);
  }
  vs_dev_counters_get(dev, &c1);
  vs_dev_counters_sub(&c1, &c0);
  printf("  %s: %llu graph launches, %llu ops recorded\n", path,
         (unsigned long long)c1.launches, (unsigned long long)c1.recorded);
  assert_true(c1.launches > 100); /* the graphs ran: not every forward fell back */
  gr_unload(&p);
}

#endif /* VS_TEST_GRAPH_REPLAY_H */
