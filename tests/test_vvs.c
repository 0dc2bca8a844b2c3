/*
 * VVS (partial verification skipping, the `vvs` scheduler):
 *  - a skipped round makes no target call (the target's committed length does not move);
 *  - two skipped rounds are never consecutive;
 *  - every unverified token is fed in front of the next verified tree, and afterwards the
 *    target's KV cache equals the one a fully verified run holds for the same tokens
 *    (checked by comparing next-token logits with a session that replays the tokens);
 *  - the truncation follows gamma = min(L_s, floor(mean candidate path length));
 *  - the token map marks exactly the unverified tokens; the same seed gives the same image.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/params.h"
#include "core/round_loop.h"
#include "core/tree.h"
#include "kernels/vs_kernels.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

static vspec_host host;
static vspec_dev *dev;

typedef struct watch {
  int rounds, skips, verified, consecutive_skips, last_skipped;
  int32_t last_committed;
  int pending_unverified;    /* unverified tokens not yet through the target */
  int prepend_mismatch, committed_moved_on_skip, commit_mismatch;
  int gamma_checked, gamma_mismatch;
  int kv_checked;
  double kv_max_diff;
  int first_skip_done;       /* fewest tokens out (root included) when a round skipped */
  vs_models *models;         /* for the replay check (NULL: skip it) */
} watch;

/* Next-token logits after `tokens` replayed in a fresh session. */
static void replay_logits(vs_models *models, const int32_t *tokens, int n, float *logits) {
  const vs_backend_model *t = &models->target;
  char err[VSPEC_ERRLEN];
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 2,
                              .rows = models->defaults.cfg_scale > 1 ? 2 : 1, .max_nodes = 64};
  vspec_session *s;
  assert_int_equal(t->vt->session_open(t->model, dev, &cfg, &s, err, sizeof err), 0);
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
  assert_int_equal(t->vt->prefill(s, &o, err, sizeof err), 0);
  int32_t parents[64], path[64];
  for (int i = 0; i < n; i++) parents[i] = i - 1, path[i] = i;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tokens,
                           .parents = parents};
  float *all = malloc((size_t)n * cfg.rows * t->info.vocab * sizeof(float));
  vspec_forward_out oa = {.struct_size = sizeof oa, .logits = all};
  assert_int_equal(t->vt->forward(s, &b, &oa, err, sizeof err), 0);
  memcpy(logits, all + (size_t)(n - 1) * cfg.rows * t->info.vocab,
         (size_t)cfg.rows * t->info.vocab * sizeof(float));
  free(all);
  (void)path;
  t->vt->session_close(s);
}

static void on_round(void *user, const vs_round_info *in) {
  watch *w = user;
  w->rounds++;
  int32_t committed = in->target->vt->committed(in->session);
  if (in->skipped) {
    w->skips++;
    int done = in->n_tokens - in->accepted_len;
    if (!w->first_skip_done || done < w->first_skip_done) w->first_skip_done = done;
    if (w->last_skipped) w->consecutive_skips++;
    if (committed != w->last_committed) w->committed_moved_on_skip++;
    /* gamma with select=confidence: the most likely leaf, truncated to the mean length */
    const vs_tree *t = in->tree;
    int best = -1, n_leaves = 0;
    double mean = 0.0;
    for (int i = 1; i < t->n; i++)
      if (t->nodes[i].first_child < 0) {
        n_leaves++;
        mean += t->nodes[i].depth;
        if (best < 0 || t->nodes[i].logp > t->nodes[best].logp) best = i;
      }
    mean /= n_leaves;
    int want = (int)floor(mean) < t->nodes[best].depth ? (int)floor(mean) : t->nodes[best].depth;
    w->gamma_checked++;
    if (in->accepted_len != want && !(in->n_tokens == 16 && in->accepted_len < want))
      w->gamma_mismatch++;
    /* the root and all accepted tokens but the last wait for the target */
    w->pending_unverified += in->accepted_len;
  } else if (in->round > 0) {
    w->verified++;
    if (in->prepended != w->pending_unverified) w->prepend_mismatch++;
    /* committed grows by the prepended tokens, the root and the accepted drafts */
    if (committed != w->last_committed + in->prepended + 1 + in->accepted_len)
      w->commit_mismatch++;
    if (w->models && in->prepended > 0 && in->n_tokens < 16) {
      /* KV check: the next root through this session vs a full replay */
      const vs_backend_model *t = in->target;
      int rows = w->models->defaults.cfg_scale > 1 ? 2 : 1, V = t->info.vocab;
      float got[2 * 64], want_l[2 * 64];
      int32_t root = in->tokens[in->n_tokens - 1], minus1 = -1;
      vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &root,
                               .parents = &minus1};
      vspec_forward_out o = {.struct_size = sizeof o, .logits = got};
      char err[VSPEC_ERRLEN];
      assert_int_equal(t->vt->forward(in->session, &b, &o, err, sizeof err), 0);
      replay_logits(w->models, in->tokens, in->n_tokens, want_l);
      for (int i = 0; i < rows * V; i++)
        w->kv_max_diff = fmax(w->kv_max_diff, fabs((double)got[i] - want_l[i]));
      w->kv_checked++;
    }
    w->pending_unverified = 0;
  }
  w->last_skipped = in->skipped;
  w->last_committed = committed;
}

static void make_selfdraft_dir(char *dir) {
  snprintf(dir, 256, "/tmp/vspec-vvs-model-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char path[512], cwd[512];
  assert_non_null(getcwd(cwd, sizeof cwd));
  const char *files[] = {"gpt.safetensors", "vq.safetensors"};
  for (int i = 0; i < 2; i++) {
    char src[1100];
    snprintf(src, sizeof src, "%s/tests/golden/micro_c2i/%s", cwd, files[i]);
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    assert_int_equal(symlink(src, path), 0);
  }
  snprintf(path, sizeof path, "%s/vspec-model.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  /* The target drafts for itself: enough agreement for long accepted paths. */
  fputs("{\"name\": \"selfdraft\", \"target\": {\"backend\": \"llamagen\", \"gpt\": "
        "\"gpt.safetensors\", \"vq\": \"vq.safetensors\"}, \"draft\": {\"backend\": \"llamagen\", "
        "\"gpt\": \"gpt.safetensors\"}, \"defaults\": {\"cfg_scale\": 2.0}}\n", f);
  fclose(f);
}

static void test_vvs_on_llamagen(void **state) {
  (void)state;
  char dir[256], plugins[1024], err[VSPEC_ERRLEN];
  const char *bd = getenv("VSPEC_BUILD");
  snprintf(plugins, sizeof plugins, "%s/plugins", bd ? bd : "build");
  make_selfdraft_dir(dir);
  vs_registry *reg;
  vs_models *models;
  assert_int_equal(vs_registry_open(plugins, &host, &reg, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, dir, VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  const char *methods[] = {
      "sd:exact@vvs:skip=uniform,interval=2,select=confidence,warmup=0,drafter=model,"
      "shape=dynamic,top_k=3,depth=3,total_tokens=8",
      "sd:lantern:delta=0.2@vvs:skip=dynamic,threshold=0.0,select=confidence,warmup=0,"
      "drafter=model,shape=dynamic,top_k=2,depth=3,total_tokens=6",
      /* the default warmup: every round may skip once more than 5 tokens follow token 0 */
      "sd:exact@vvs:skip=dynamic,threshold=0.0,select=confidence,drafter=model,"
      "shape=dynamic,top_k=2,depth=3,total_tokens=6",
  };
  for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
    watch total;
    memset(&total, 0, sizeof total);
    for (int seed = 0; seed < 8; seed++) {
      watch w;
      memset(&w, 0, sizeof w);
      w.models = models;
      w.last_committed = 1; /* after the prefill: the class position */
      int32_t tokens[16], again[16];
      uint8_t status[16], status2[16];
      vs_job job = {.method = vs_method_of(methods[k]), .class_label = 2, .seed = (uint64_t)seed,
                    .sampling = models->defaults, .status = status, .on_round = on_round,
                    .user = &w};
      vs_metrics mt;
      if (vs_generate(models, dev, &job, tokens, &mt, err, sizeof err)) fail_msg("%s", err);
      /* a skipped round makes no target call */
      assert_int_equal(mt.target_forwards, mt.rounds);
      assert_int_equal(mt.rounds + mt.skipped_rounds, w.rounds);
      assert_int_equal(w.committed_moved_on_skip, 0);
      assert_int_equal(w.consecutive_skips, 0);
      assert_int_equal(w.prepend_mismatch, 0);
      assert_int_equal(w.commit_mismatch, 0);
      assert_int_equal(w.gamma_mismatch, 0);
      int unverified = 0;
      for (int i = 0; i < 16; i++) unverified += status[i] == VS_TOKEN_UNVERIFIED;
      assert_int_equal(unverified, mt.unverified_tokens);
      /* same seed, same image (the callback's extra forwards change nothing) */
      job.status = status2;
      job.on_round = NULL;
      assert_int_equal(vs_generate(models, dev, &job, again, &mt, err, sizeof err), 0);
      assert_memory_equal(tokens, again, sizeof tokens);
      assert_memory_equal(status, status2, sizeof status);
      total.skips += w.skips;
      total.kv_checked += w.kv_checked;
      total.gamma_checked += w.gamma_checked;
      total.kv_max_diff = fmax(total.kv_max_diff, w.kv_max_diff);
      if (w.first_skip_done && (!total.first_skip_done || w.first_skip_done < total.first_skip_done))
        total.first_skip_done = w.first_skip_done;
    }
    printf("  %s: %d skipped rounds (the first with %d tokens out), %d KV checks (max |diff| "
           "%.2g), %d gamma checks\n", methods[k], total.skips, total.first_skip_done,
           total.kv_checked, total.kv_max_diff, total.gamma_checked);
    /* the warmup counts as the reference code's new_token, which leaves out the prefill's
     * token 0 (HyattDD/VVS models/ea_llamagen.py; skip_verify: no skip while new_token <= 5):
     * warmup=0 skips from 2 tokens out, the default 5 from 7, and threshold 0 makes some
     * seed skip at the boundary itself */
    assert_int_equal(total.first_skip_done, strstr(methods[k], "warmup=0") ? 2 : 7);
    /* the checks really ran */
    assert_true(total.skips >= 8);
    assert_true(total.kv_checked >= 4);
    assert_true(total.kv_max_diff < 1e-4);
  }
  vs_models_close(models);
  vs_registry_close(reg);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* With a feature head the skipped tokens' drafter inputs come from the feature cache: the
 * table head fails the job if a feature is misaligned, so every mode must run cleanly; and
 * the output stays a valid sequence. */
static void test_vvs_feature_modes(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_table_world w;
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 5, 6, 41, 1.2, 0.5, &s);
  vs_models *models = w.models;
  /* stale features break the table head's alignment check by design (they are stale), so
   * only the head's own features (draft) can pass it; stale and blend must be refused by
   * the head, which shows the engine really feeds what the decision asks for */
  const char *ok = "sd:exact@vvs:skip=uniform,interval=2,warmup=0,features=draft,drafter=head,"
                   "shape=static,tree=0/1/0.0/0.0.0";
  /* dynamic trees are drafted into a candidate pool and rebuilt: the head's own features
   * must follow the rebuilt tree's nodes */
  const char *ok_dynamic = "sd:exact@vvs:skip=uniform,interval=2,warmup=0,features=draft,"
                           "drafter=head,shape=dynamic,depth=3,top_k=3";
  /* a tree as large as a forward allows still leaves room for the unverified prefix */
  const char *big = "sd:exact@vvs:skip=uniform,interval=2,warmup=0,drafter=model,"
                    "shape=dynamic,depth=4,top_k=5,total_tokens=127";
  const char *stale = "sd:exact@vvs:skip=uniform,interval=2,warmup=0,features=stale,drafter=head,"
                      "shape=static,tree=0/1/0.0/0.0.0";
  int32_t tokens[6];
  vs_metrics mt;
  int skipped = 0;
  const char *runs[] = {ok, ok_dynamic, big};
  for (int r = 0; r < 3; r++)
    for (int seed = 0; seed < 20; seed++) {
      vs_job job = {.method = vs_method_of(runs[r]), .seed = (uint64_t)seed, .sampling = s};
      if (vs_generate(models, dev, &job, tokens, &mt, err, sizeof err))
        fail_msg("%s: %s", runs[r], err);
      skipped += (int)mt.skipped_rounds;
    }
  assert_true(skipped > 0);
  int refused = 0;
  for (int seed = 0; seed < 20; seed++) {
    vs_job job = {.method = vs_method_of(stale), .seed = (uint64_t)seed, .sampling = s};
    refused += vs_generate(models, dev, &job, tokens, &mt, err, sizeof err) != 0;
  }
  assert_true(refused > 0);
  vs_table_world_close(&w);
}


/* Which features the engine hands the drafter for the tokens of a skipped round (VVS §4.3;
 * HyattDD/VVS models/skip_utils_llamagen.py, update_inference_inputs_skip and
 * retrieve_features). The table head with log=PATH records every input feature that is not
 * the exact one instead of failing; the target's feature cache slot j holds the value j
 * (the table's feature is the prefix length), so a logged value names the slot it came
 * from. A round that skips with the root at index r and gamma accepted tokens feeds the
 * head, at positions r+1 .. r+gamma (the accepted drafts after the first, then the new
 * root), the cache slots vs_skip_stale_slot(r+1, staleness, gamma, j): with a cache of
 * r+1 slots, the gamma most recent ones `staleness` older (the helper itself is checked
 * against the reference's retrieve_features by test_vvs_reference_similarity). They reach
 * the head with the next drafted round (the catch-up chain); a skip that ends the image
 * feeds nothing. Every other input must be exact (not logged). */
enum { SP_LEN = 8 };

typedef struct stale_watch {
  int staleness, mode;           /* mode: 0 stale, 1 draft, 2 blend */
  double want[SP_LEN + 1];       /* expected feature per position; < 0: none expected */
  int pending[SP_LEN + 1], n_pending;
  int required[SP_LEN + 1];      /* positions whose inputs a drafter forward has consumed */
  int skips;
} stale_watch;

static void on_round_stale(void *user, const vs_round_info *in) {
  stale_watch *w = user;
  if (in->round <= 0) return;
  /* a drafted round first feeds the catch-up chain: the skipped tokens still pending */
  if (in->tree && in->tree->n > 1) {
    for (int i = 0; i < w->n_pending; i++) w->required[w->pending[i]] = 1;
    w->n_pending = 0;
  }
  if (!in->skipped) return;
  w->skips++;
  int gamma = in->accepted_len, r = in->n_tokens - gamma - 1;
  if (in->n_tokens >= SP_LEN || w->mode == 1) return; /* nothing fed, or the exact ones */
  for (int j = 0; j < gamma; j++) {
    int pos = r + 1 + j, slot = vs_skip_stale_slot(r + 1, w->staleness, gamma, j);
    w->want[pos] = w->mode == 0 ? slot : 0.5 * (slot + pos);
    w->pending[w->n_pending++] = pos;
  }
}

static void write_logged_head(const vs_table_world *w, const char *log) {
  char path[512];
  snprintf(path, sizeof path, "%s/vspec-model.json", w->model_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f,
          "{\"name\": \"table-log\", \"target\": {\"backend\": \"table\", \"gpt\": "
          "\"target.safetensors\"}, \"draft\": {\"backend\": \"table\", \"gpt\": "
          "\"draft.safetensors\"}, \"eagle\": {\"backend\": \"table\", \"gpt\": "
          "\"draft.safetensors\", \"mode\": \"head\", \"log\": \"%s\"}, \"defaults\": "
          "{\"temperature\": %g, \"top_p\": %g, \"cfg_scale\": %g, \"cfg_interval\": %d}}\n",
          log, w->s.temperature, w->s.top_p, w->s.cfg_scale, w->s.cfg_interval);
  fclose(f);
}

static void test_vvs_stale_positions(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN], log[300];
  vs_table_world w;
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 3, SP_LEN, 17, 1.2, 0.5, &s);
  snprintf(log, sizeof log, "%s/head.log", w.model_dir);
  write_logged_head(&w, log);
  vs_models *models;
  if (vs_models_open(w.reg, &w.host, w.dev, w.model_dir, VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  const struct {
    const char *features;
    int staleness, mode;
  } runs[] = {{"stale", 0, 0}, {"stale", 2, 0}, {"blend", 1, 2}, {"draft", 0, 1}};
  for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
    char method[300];
    snprintf(method, sizeof method,
             "sd:exact@vvs:skip=uniform,interval=2,warmup=0,features=%s,staleness=%d,"
             "drafter=head,shape=static,tree=0/1/0.0/0.0.0", runs[k].features,
             runs[k].staleness);
    int skips = 0, fed = 0, logged = 0;
    for (int seed = 0; seed < 30; seed++) {
      stale_watch sw = {.staleness = runs[k].staleness, .mode = runs[k].mode};
      for (int i = 0; i <= SP_LEN; i++) sw.want[i] = -1.0;
      remove(log);
      int32_t tokens[SP_LEN];
      vs_metrics mt;
      vs_job job = {.method = vs_method_of(method), .seed = (uint64_t)seed, .sampling = s,
                    .on_round = on_round_stale, .user = &sw};
      if (vs_generate(models, w.dev, &job, tokens, &mt, err, sizeof err))
        fail_msg("%s (seed %d): %s", method, seed, err);
      skips += sw.skips;
      int seen[SP_LEN + 1][2] = {{0}};
      FILE *f = fopen(log, "r");
      int pos, row;
      double got;
      while (f && fscanf(f, "%d %d %lf", &pos, &row, &got) == 3) {
        if (pos < 1 || pos > SP_LEN || row < 0 || row > 1 || sw.want[pos] < 0.0)
          fail_msg("%s (seed %d): position %d was fed feature %g, the exact one is %d", method,
                   seed, pos, got, pos);
        if (fabs(got - sw.want[pos]) > 1e-5)
          fail_msg("%s (seed %d): position %d (row %d) was fed feature %g, expected %g (slot "
                   "of the feature cache)", method, seed, pos, row, got, sw.want[pos]);
        seen[pos][row]++;
        logged++;
      }
      if (f) fclose(f);
      for (int p = 1; p <= SP_LEN; p++) {
        if (!sw.required[p] || sw.want[p] < 0.0) continue;
        for (int r = 0; r < 2; r++)
          if (seen[p][r] != 1)
            fail_msg("%s (seed %d): position %d (row %d) was fed its reused feature %d times",
                     method, seed, p, r, seen[p][r]);
        fed++;
      }
    }
    printf("  features=%s,staleness=%d: %d skipped rounds, %d reused inputs checked, %d "
           "inexact features fed\n", runs[k].features, runs[k].staleness, skips, fed, logged);
    assert_true(skips >= 20);
    /* the check has something to see; features=draft feeds the head's own, exact ones */
    if (runs[k].mode != 1) assert_true(fed >= 20 && logged >= 2 * fed);
    else assert_int_equal(logged, 0);
  }
  vs_models_close(models);
  vs_table_world_close(&w);
}

/* ---- the scheduler's decision on hand-made trees -------------------------------------- */

typedef struct vv_fixture {
  vs_registry *reg;
  vs_plugin *plugin;
  const vspec_sched_vtable *vt;
} vv_fixture;

static void vv_open(vv_fixture *fx) {
  char plugins[1024], err[VSPEC_ERRLEN];
  const char *bd = getenv("VSPEC_BUILD");
  snprintf(plugins, sizeof plugins, "%s/plugins", bd ? bd : "build");
  assert_int_equal(vs_registry_open(plugins, &host, &fx->reg, err, sizeof err), 0);
  assert_int_equal(
      vs_registry_acquire(fx->reg, VSPEC_PLUGIN_SCHED, "vvs", &fx->plugin, err, sizeof err), 0);
  fx->vt = vs_plugin_vtable(fx->plugin);
}

static void vv_close(vv_fixture *fx) {
  vs_plugin_release(fx->plugin);
  vs_registry_close(fx->reg);
}

static vspec_sched *vv_make(const vv_fixture *fx, const char *spec) {
  char err[VSPEC_ERRLEN];
  vspec_params *params;
  assert_int_equal(vs_params_parse(spec, &params, err, sizeof err), 0);
  vspec_sched *s = NULL;
  if (fx->vt->create(&host, params, &s, err, sizeof err)) fail_msg("%s: %s", spec, err);
  vs_params_free(params);
  return s;
}

/* A tree view over parents/tokens/scores (depths derived). */
typedef struct vv_tree {
  int32_t n, parents[64], tokens[64], depth[64];
  float score[64];
  vspec_tree_view view;
} vv_tree;

static void vv_tree_init(vv_tree *t, int n, const int32_t *parents, const int32_t *tokens,
                         const float *score, const float *codebook, int dim) {
  memset(t, 0, sizeof *t);
  t->n = n;
  t->parents[0] = -1;
  for (int i = 0; i < n; i++) {
    if (i > 0) t->parents[i] = parents[i];
    t->depth[i] = i ? t->depth[t->parents[i]] + 1 : 0;
    t->tokens[i] = tokens ? tokens[i] : i;
    t->score[i] = score ? score[i] : 0.0f;
  }
  t->view = (vspec_tree_view){.struct_size = sizeof t->view, .n_nodes = n, .tokens = t->tokens,
                              .parents = t->parents, .depth = t->depth, .score = t->score,
                              .codebook = codebook, .token_dim = dim};
}

static vspec_skip_decision vv_decide(const vv_fixture *fx, vspec_sched *s, const vv_tree *t,
                                     vspec_rng *rng) {
  vspec_round_state st = {.struct_size = sizeof st, .round = 3, .tokens_done = 10,
                          .tokens_total = 256, .max_nodes = 64, .verified_rounds = 3};
  vspec_skip_decision d = {.struct_size = sizeof d};
  assert_int_equal(fx->vt->decide(s, &st, &t->view, rng, &d), 0);
  return d;
}

/* Does a fresh dynamic scheduler with this threshold skip this tree? */
static int vv_skips(const vv_fixture *fx, const char *norm, double alpha, double threshold,
                    const vv_tree *t) {
  char spec[200];
  snprintf(spec, sizeof spec, "skip=dynamic,warmup=0,norm=%s,alpha=%.9g,threshold=%.9g", norm,
           alpha, threshold);
  vspec_sched *s = vv_make(fx, spec);
  vspec_rng rng;
  host.rng_init(&rng, 1, 0);
  int skip = vv_decide(fx, s, t, &rng).skip;
  fx->vt->destroy(s);
  return skip;
}

/* The path similarity against tools/ref/vvs_ref.py's transcription of the reference code
 * (tests/golden/vvs/cases.txt): each value is bracketed by thresholds 1e-5 either side,
 * for the reference normalisation (longest path, zero padding, one path = 0) and the
 * per-pair one; and the stale-feature slots against the reference's retrieve_features. */
static void test_vvs_reference_similarity(void **state) {
  (void)state;
  vv_fixture fx;
  vv_open(&fx);
  FILE *f = fopen("tests/golden/vvs/cases.txt", "r");
  assert_non_null(f);
  int V, D;
  assert_int_equal(fscanf(f, " codebook %d %d", &V, &D), 2);
  assert_true(V > 0 && V <= 64 && D > 0 && D <= 16);
  float codebook[64 * 16];
  for (int i = 0; i < V * D; i++) assert_int_equal(fscanf(f, "%f", &codebook[i]), 1);
  char kind[16];
  int sims = 0, singles = 0, slots = 0, unequal = 0;
  while (fscanf(f, " %15s", kind) == 1) {
    if (!strcmp(kind, "sim")) {
      int n;
      double alpha, want[2];
      int32_t parents[64] = {-1}, tokens[64];
      assert_int_equal(fscanf(f, "%d %lf", &n, &alpha), 2);
      assert_true(n >= 2 && n <= 64);
      for (int i = 1; i < n; i++) assert_int_equal(fscanf(f, "%d", &parents[i]), 1);
      for (int i = 0; i < n; i++) assert_int_equal(fscanf(f, "%d", &tokens[i]), 1);
      assert_int_equal(fscanf(f, "%lf %lf", &want[0], &want[1]), 2);
      vv_tree t;
      vv_tree_init(&t, n, parents, tokens, NULL, codebook, D);
      const char *norms[] = {"longest", "pair"};
      for (int m = 0; m < 2; m++) {
        double lo = want[m] - 1e-5, hi = want[m] + 1e-5;
        if (lo >= 0.0 && !vv_skips(&fx, norms[m], alpha, lo, &t))
          fail_msg("case %d norm=%s: similarity below %.6f (reference %.6f)", sims, norms[m],
                   lo, want[m]);
        if (hi <= 1.0 && vv_skips(&fx, norms[m], alpha, hi, &t))
          fail_msg("case %d norm=%s: similarity above %.6f (reference %.6f)", sims, norms[m],
                   hi, want[m]);
      }
      singles += want[0] == 0.0 && want[1] == 1.0;
      unequal += fabs(want[0] - want[1]) > 1e-3;
      sims++;
    } else if (!strcmp(kind, "slots")) {
      int n, stale, gamma, want;
      assert_int_equal(fscanf(f, "%d %d %d", &n, &stale, &gamma), 3);
      for (int j = 0; j < gamma; j++) {
        assert_int_equal(fscanf(f, "%d", &want), 1);
        int got = vs_skip_stale_slot(n, stale, gamma, j);
        if (got != want)
          fail_msg("%d cached, staleness %d, %d tokens: input %d reuses slot %d, reference %d",
                   n, stale, gamma, j, got, want);
      }
      slots++;
    } else {
      fail_msg("unknown record '%s'", kind);
    }
  }
  fclose(f);
  /* the fixture really holds the interesting cases */
  assert_true(sims >= 10 && singles >= 2 && unequal >= 3 && slots >= 5);
  vv_close(&fx);
}

/* select=uniform draws every leaf with probability 1/#leaves (the paper; the reference
 * code's random.randint over the candidates); select=confidence takes the leaf of highest
 * path score; gamma = min(L_s, floor(mean leaf depth)) (Eq. 1). */
static void test_vvs_selection(void **state) {
  (void)state;
  vv_fixture fx;
  vv_open(&fx);
  /* leaves 3 (depth 3), 4 (depth 1), 6 (depth 3), 7 (depth 2): mean depth 2.25 */
  const int32_t parents[] = {-1, 0, 1, 2, 0, 0, 5, 1};
  const float score[] = {0.0f, -0.5f, -1.0f, -2.5f, -0.9f, -0.2f, -0.4f, -1.5f};
  vv_tree t;
  vv_tree_init(&t, 8, parents, NULL, score, NULL, 0);
  const int leaves[] = {3, 4, 6, 7};
  /* uniform: a frequency check over the leaves (4000 draws: sd of a share ~ 0.007) */
  vspec_sched *s = vv_make(&fx, "skip=dynamic,threshold=0,warmup=0,select=uniform,truncate=off");
  vspec_rng rng;
  host.rng_init(&rng, 7, 3);
  int count[8] = {0}, draws = 4000;
  for (int k = 0; k < draws; k++) {
    vspec_skip_decision d = vv_decide(&fx, s, &t, &rng);
    assert_int_equal(d.skip, 1);
    assert_true(d.leaf >= 1 && d.leaf < 8);
    count[d.leaf]++;
    assert_int_equal(d.length, t.depth[d.leaf]); /* truncate=off: the whole path */
    fx.vt->destroy(s); /* two skips are never consecutive: a fresh scheduler each draw */
    s = vv_make(&fx, "skip=dynamic,threshold=0,warmup=0,select=uniform,truncate=off");
  }
  fx.vt->destroy(s);
  for (int i = 0; i < 4; i++) {
    double share = (double)count[leaves[i]] / draws;
    if (fabs(share - 0.25) > 0.03) fail_msg("leaf %d drawn with share %.3f", leaves[i], share);
  }
  /* confidence: leaf 6 (score -0.4) although it is neither the first leaf by index nor in
   * the reference order, and the shallow leaf 4 scores lower */
  s = vv_make(&fx, "skip=dynamic,threshold=0,warmup=0,select=confidence");
  vspec_skip_decision d = vv_decide(&fx, s, &t, &rng);
  assert_int_equal(d.skip, 1);
  assert_int_equal(d.leaf, 6);
  assert_int_equal(d.length, 2); /* floor(2.25) = 2 < 3 */
  fx.vt->destroy(s);
  /* a different scoring moves the choice: leaf 3 */
  t.score[3] = -0.1f;
  s = vv_make(&fx, "skip=dynamic,threshold=0,warmup=0,select=confidence");
  d = vv_decide(&fx, s, &t, &rng);
  assert_int_equal(d.leaf, 3);
  assert_int_equal(d.length, 2);
  fx.vt->destroy(s);
  /* skip=uniform: phase=round skips rounds 2, 5, 8 (index 1 mod 3 counted from 0 at the
   * engine's round 1), phase=verified after every 2 verified rounds, so from round 3 on */
  const char *phases[][2] = {{"skip=uniform,interval=3,warmup=0,phase=round", "010010010"},
                             {"skip=uniform,interval=3,warmup=0,phase=verified", "001001001"}};
  for (int k = 0; k < 2; k++) {
    s = vv_make(&fx, phases[k][0]);
    char got[10] = {0};
    int last = 0;
    for (int r = 1; r <= 9; r++) {
      vspec_round_state st = {.struct_size = sizeof st, .round = r, .tokens_done = 10 + r,
                              .tokens_total = 256, .max_nodes = 64, .last_skipped = last};
      vspec_skip_decision dd = {.struct_size = sizeof dd};
      assert_int_equal(fx.vt->decide(s, &st, &t.view, &rng, &dd), 0);
      got[r - 1] = (char)('0' + dd.skip);
      last = dd.skip;
    }
    if (strcmp(got, phases[k][1])) fail_msg("%s: skipped %s", phases[k][0], got);
    fx.vt->destroy(s);
  }
  /* gamma floor: leaves of depth 1, 2, 2 (mean 1.67): 1 token of the depth-2 best leaf */
  const int32_t p2[] = {-1, 0, 0, 2, 0, 4};
  const float sc2[] = {0.0f, -3.0f, -0.1f, -0.2f, -0.5f, -0.6f};
  vv_tree_init(&t, 6, p2, NULL, sc2, NULL, 0);
  s = vv_make(&fx, "skip=dynamic,threshold=0,warmup=0,select=confidence");
  d = vv_decide(&fx, s, &t, &rng);
  assert_int_equal(d.skip, 1);
  assert_int_equal(d.leaf, 3);
  assert_int_equal(d.length, 1);
  fx.vt->destroy(s);
  vv_close(&fx);
}

/* The warmup as the reference code counts it (HyattDD/VVS models/skip_utils_llamagen.py,
 * skip_verify: no skip while new_token <= 5; models/ea_llamagen.py: new_token starts at 0
 * after the prefill's token and grows by every token emitted after it). The engine's
 * tokens_done counts token 0 too, so the defaults may first skip with 7 tokens out, not 6,
 * under both skip rules; a dynamic tree whose candidate paths are identical (similarity 1). */
static void test_vvs_warmup(void **state) {
  (void)state;
  vv_fixture fx;
  vv_open(&fx);
  const float codebook[4] = {1.0f, 1.0f, 1.0f, 1.0f}; /* one dimension: every cosine is 1 */
  const int32_t parents[] = {-1, 0, 0, 0};
  vv_tree t;
  vv_tree_init(&t, 4, parents, NULL, NULL, codebook, 1);
  vspec_rng rng;
  host.rng_init(&rng, 5, 0);
  /* skip=dynamic (the default); phase=round skips rounds 2, 5, 8 ... (test_vvs_selection) */
  const char *specs[] = {"", "skip=uniform", "skip=uniform,phase=verified"};
  for (int k = 0; k < 3; k++)
    for (int done = 5; done <= 8; done++) {
      vspec_sched *s = vv_make(&fx, specs[k]);
      vspec_round_state st = {.struct_size = sizeof st, .round = 5, .tokens_done = done,
                              .tokens_total = 256, .max_nodes = 64, .verified_rounds = 4};
      vspec_skip_decision d = {.struct_size = sizeof d};
      /* phase=verified: two verified rounds since the last skip first (rounds 3, 4) */
      for (int r = 3; k == 2 && r < 5; r++) {
        vspec_round_state early = st;
        early.round = r;
        early.tokens_done = 1;
        assert_int_equal(fx.vt->decide(s, &early, &t.view, &rng, &d), 0);
        assert_int_equal(d.skip, 0);
      }
      assert_int_equal(fx.vt->decide(s, &st, &t.view, &rng, &d), 0);
      if (d.skip != (done - 1 > 5))
        fail_msg("vvs:%s with %d tokens out (new_token %d): skip %d", specs[k], done, done - 1,
                 d.skip);
      fx.vt->destroy(s);
    }
  vv_close(&fx);
}

/* Static and chain drafts carry their cumulative draft log-probabilities (confidence
 * selection ranks paths by them on every tree shape): every node's score is its parent's
 * plus log p_draft(token), and the leaves do not all tie. */
static void on_round_scores(void *user, const vs_round_info *in) {
  int *bad = user;
  const vs_tree *t = in->tree;
  if (in->round < 0 || !t || t->n < 2) return;
  int distinct = 0;
  for (int i = 1; i < t->n; i++) {
    const vs_tree_node *n = &t->nodes[i], *p = &t->nodes[n->parent];
    if (!(n->logp < p->logp + 1e-6f)) bad[0]++;
    if (n->logp != t->nodes[1].logp) distinct = 1;
  }
  bad[1] += t->n > 2 && !distinct;
  bad[2]++;
}

static void test_vvs_static_scores(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_table_world w;
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 5, 6, 41, 1.2, 0.5, &s);
  const char *methods[] = {"sd:exact@vvs:skip=uniform,interval=2,warmup=0,select=confidence,"
                           "features=draft,drafter=head,shape=static,tree=0/1/0.0/0.0.0",
                           "sd:exact@vvs:skip=uniform,interval=2,warmup=0,select=confidence,"
                           "drafter=model,shape=chain,depth=3"};
  int32_t tokens[6];
  vs_metrics mt;
  for (int m = 0; m < 2; m++) {
    int bad[3] = {0, 0, 0};
    for (int seed = 0; seed < 5; seed++) {
      vs_job job = {.method = vs_method_of(methods[m]), .seed = (uint64_t)seed, .sampling = s,
                    .on_round = on_round_scores, .user = bad};
      if (vs_generate(w.models, dev, &job, tokens, &mt, err, sizeof err))
        fail_msg("%s: %s", methods[m], err);
    }
    if (bad[0] || bad[1] || bad[2] == 0)
      fail_msg("%s: %d nodes without a decreasing path score, %d trees whose nodes all tie "
               "(%d rounds seen)", methods[m], bad[0], bad[1], bad[2]);
  }
  vs_table_world_close(&w);
}

static void test_vvs_parameters(void **state) {
  (void)state;
  char plugins[1024], err[VSPEC_ERRLEN];
  const char *bd = getenv("VSPEC_BUILD");
  snprintf(plugins, sizeof plugins, "%s/plugins", bd ? bd : "build");
  vs_registry *reg;
  assert_int_equal(vs_registry_open(plugins, &host, &reg, err, sizeof err), 0);
  vs_plugin *p;
  assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_SCHED, "vvs", &p, err, sizeof err), 0);
  const vspec_sched_vtable *vt = vs_plugin_vtable(p);
  const char *bad[][2] = {{"interval=1", "'interval'"}, {"threshold=1.5", "'threshold'"},
                          {"select=best", "uniform|confidence"}, {"skip=sometimes", "'skip'"},
                          {"features=fresh", "stale|draft|blend"}, {"norm=mean", "longest|pair"},
                          {"phase=odd", "round|verified"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vspec_params *params;
    assert_int_equal(vs_params_parse(bad[i][0], &params, err, sizeof err), 0);
    vspec_sched *s = NULL;
    assert_true(vt->create(&host, params, &s, err, sizeof err) != 0);
    if (!strstr(err, bad[i][1])) fail_msg("'%s' gave '%s'", bad[i][0], err);
    vs_params_free(params);
  }
  vs_plugin_release(p);
  vs_registry_close(reg);
}

int main(void) {
  char err[VSPEC_ERRLEN];
  vs_host_init(&host, vs_cpu_ops());
  if (vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vvs_on_llamagen),
      cmocka_unit_test(test_vvs_feature_modes),
      cmocka_unit_test(test_vvs_stale_positions),
      cmocka_unit_test(test_vvs_parameters),
      cmocka_unit_test(test_vvs_reference_similarity),
      cmocka_unit_test(test_vvs_selection),
      cmocka_unit_test(test_vvs_warmup),
      cmocka_unit_test(test_vvs_static_scores),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(dev);
  return rc;
}
