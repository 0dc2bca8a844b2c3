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
#include "core/tree.h"
#include "kernels/vs_kernels.h"
#include "tests/support/table_model.h"

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
      vs_job job = {.method = methods[k], .class_label = 2, .seed = (uint64_t)seed,
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
    }
    printf("  %s: %d skipped rounds, %d KV checks (max |diff| %.2g), %d gamma checks\n",
           methods[k], total.skips, total.kv_checked, total.kv_max_diff, total.gamma_checked);
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
      vs_job job = {.method = runs[r], .seed = (uint64_t)seed, .sampling = s};
      if (vs_generate(models, dev, &job, tokens, &mt, err, sizeof err))
        fail_msg("%s: %s", runs[r], err);
      skipped += (int)mt.skipped_rounds;
    }
  assert_true(skipped > 0);
  int refused = 0;
  for (int seed = 0; seed < 20; seed++) {
    vs_job job = {.method = stale, .seed = (uint64_t)seed, .sampling = s};
    refused += vs_generate(models, dev, &job, tokens, &mt, err, sizeof err) != 0;
  }
  assert_true(refused > 0);
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
                          {"features=fresh", "stale|draft|blend"}};
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
      cmocka_unit_test(test_vvs_parameters),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(dev);
  return rc;
}
