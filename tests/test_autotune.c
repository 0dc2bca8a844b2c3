/*
 * size=auto (core/autotune.h): the default, the stored choice and its reuse, a corrupt or
 * foreign cache file, and vspecd / the CLI running a job with it.
 *
 * The model is the harness's "self" (the micro LlamaGen model drafting for itself): a chain
 * tuning on it takes about half a second. The fixture's cache directory ($VSPEC_CACHE_DIR,
 * set by vs_fixture_make) holds the choices, so nothing touches the user's cache.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/autotune.h"
#include "core/engine.h"
#include "core/host.h"
#include "kernels/vs_kernels.h"
#include "tests/support/daemon_harness.h"

#define CHAIN "sd:exact@standard:shape=chain,drafter=model,size=auto"

/* Each tuning takes about 0.5 s here and several under the sanitizers: there, one tuning
 * in-process and one in the daemon; the corrupt files and the refresh (three more tunings)
 * run in the plain build only, which covers the same code. */
#ifdef VSPEC_SANITIZED
#define SANITIZED 1
#define SKIP_UNDER_SANITIZERS()                               \
  do {                                                        \
    print_message("skipped under the sanitizers (above)\n"); \
    skip();                                                   \
  } while (0)
#else
#define SANITIZED 0
#define SKIP_UNDER_SANITIZERS() \
  do {                          \
  } while (0)
#endif

typedef struct world {
  vs_fixture fx;
  vspec_host host;
  vspec_dev *dev;
  vs_registry *reg;
  vs_models *models;
} world;

static int setup(void **state) {
  world *w = calloc(1, sizeof *w);
  char err[VSPEC_ERRLEN];
  vs_fixture_make(&w->fx);
  vs_host_init(&w->host, vs_cpu_ops());
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &w->dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(w->fx.plugins, &w->host, &w->reg, err, sizeof err), 0);
  if (vs_models_open(w->reg, &w->host, w->dev, w->fx.self_model, VS_ROLE_ALL, &w->models, err,
                     sizeof err))
    fail_msg("%s", err);
  *state = w;
  return 0;
}

static int teardown(void **state) {
  world *w = *state;
  vs_models_close(w->models);
  vs_registry_close(w->reg);
  vs_dev_destroy(w->dev);
  vs_fixture_remove(&w->fx);
  free(w);
  return 0;
}

static void parse(const char *text, vs_method *m) {
  char err[VSPEC_ERRLEN];
  if (vs_method_parse(text, m, err, sizeof err)) fail_msg("%s: %s", text, err);
}

static void resolve(world *w, const char *text, unsigned flags, vs_autotune_result *res) {
  vs_method m;
  char err[VSPEC_ERRLEN];
  parse(text, &m);
  if (vs_autotune_resolve(w->models, w->dev, &m, flags, res, err, sizeof err))
    fail_msg("%s: %s", text, err);
}

/* The path of the one cache file of size=auto in the fixture's cache. */
static void cache_file(const world *w, char *path, size_t cap) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/cache", w->fx.dir);
  DIR *d = opendir(dir);
  assert_non_null(d);
  int found = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, "autotune-", 9)) {
      snprintf(path, cap, "%s/%s", dir, e->d_name);
      found++;
    }
  closedir(d);
  assert_int_equal(found, 1);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Which methods get size=auto by default, and what a size other than auto says. */
static void test_default_and_wanted(void **state) {
  (void)state;
  static const struct {
    const char *in, *out;
    int continuous;
  } cases[] = {
      {"sd:exact", "sd:exact@standard:size=auto", 0},
      {"sd:lantern:k=4,delta=0.1@standard:shape=chain,drafter=model",
       "sd:lantern:k=4,delta=0.1@standard:shape=chain,drafter=model,size=auto", 0},
      {"sd:exact@standard:shape=chain,depth=3", "sd:exact@standard:shape=chain,depth=3", 0},
      {"sd:exact@standard:tree=chain2,shape=static", "sd:exact@standard:tree=chain2,shape=static", 0},
      {"sd:exact@standard:total_tokens=8", "sd:exact@standard:total_tokens=8", 0},
      {"sd:exact@standard:size=auto", "sd:exact@standard:size=auto", 0},
      {"sd:exact@vvs:skip=uniform", "sd:exact@vvs:skip=uniform", 0},
      {"sd:continuous@standard:shape=chain", "sd:continuous@standard:shape=chain", 1},
      {"ar", "ar", 0},
  };
  char err[VSPEC_ERRLEN], base[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vs_method m;
    parse(cases[i].in, &m);
    int changed = vs_autotune_default(&m, cases[i].continuous);
    assert_string_equal(m.text, cases[i].out);
    assert_int_equal(changed, strcmp(cases[i].out, cases[i].in) != 0);
    assert_int_equal(vs_autotune_wanted(&m, NULL, 0, err, sizeof err),
                     strstr(m.text, "size=auto") != NULL);
  }
  vs_method m;
  parse("sd:exact@standard:shape=chain,size=auto,drafter=model", &m);
  assert_int_equal(vs_autotune_wanted(&m, base, sizeof base, err, sizeof err), 1);
  assert_string_equal(base, "shape=chain,drafter=model");
  parse("sd:exact@standard:size=4", &m);
  assert_int_equal(vs_autotune_wanted(&m, base, sizeof base, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "size=4: only size=auto"));
}

/* Tuned once, read back the second time without timing anything; the same seed then gives
 * the same tokens; REFRESH tunes again. */
static void test_cache_round_trip(void **state) {
  world *w = *state;
  vs_autotune_result a, b;
  resolve(w, CHAIN, 0, &a);
  assert_int_equal(a.from_cache, 0);
  assert_true(a.timed > 0);
  assert_int_equal(a.stored, 1);
  assert_int_equal(a.n_cand, 8);
  assert_true(a.best >= 0 && a.best < 8);
  assert_string_equal(a.choice, a.cand[a.best].param);
  assert_non_null(strstr(a.spec, a.choice));
  assert_null(strstr(a.spec, "size="));

  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 1);
  assert_int_equal(b.timed, 0);
  assert_string_equal(b.spec, a.spec);
  assert_string_equal(b.choice, a.choice);
  assert_int_equal(b.tuned_at, a.tuned_at);
  /* the AR step's cost comes back too (4 decimals in the file) */
  assert_true(a.ar_ms > 0);
  assert_true(fabs(b.ar_ms - a.ar_ms) < 1e-4);
  char note[1024];
  vs_autotune_describe(&b, note, sizeof note);
  assert_non_null(strstr(note, "size=auto: chose depth="));
  assert_non_null(strstr(note, "(cached, tuned "));
  /* the comparison with AR: said exactly when the choice makes fewer tokens per second */
  vs_autotune_result slow = b;
  const vs_autotune_cand *bc = &b.cand[b.best];
  double sd_ms_per_token = (bc->target_ms + bc->draft_ms) / bc->tokens_per_round;
  slow.ar_ms = 0.5 * sd_ms_per_token; /* AR twice as fast as the choice */
  assert_true(vs_autotune_slower_than_ar(&slow));
  vs_autotune_describe(&slow, note, sizeof note);
  assert_non_null(strstr(note, "slower than AR"));
  slow.ar_ms = 2.0 * sd_ms_per_token;
  assert_false(vs_autotune_slower_than_ar(&slow));
  vs_autotune_describe(&slow, note, sizeof note);
  assert_null(strstr(note, "slower than AR"));
  slow.ar_ms = 0; /* unknown (an older cache file): nothing said */
  assert_false(vs_autotune_slower_than_ar(&slow));

  /* the same seed through both resolutions: the same grid */
  int n = w->models->target.info.grid_h * w->models->target.info.grid_w;
  int32_t *t1 = calloc((size_t)n, sizeof *t1), *t2 = calloc((size_t)n, sizeof *t2);
  char err[VSPEC_ERRLEN];
  vs_metrics mt;
  vs_job j1 = {.method = a.spec, .class_label = 2, .seed = 11, .sampling = w->models->defaults};
  vs_job j2 = {.method = b.spec, .class_label = 2, .seed = 11, .sampling = w->models->defaults};
  assert_int_equal(vs_generate(w->models, w->dev, &j1, t1, &mt, err, sizeof err), 0);
  assert_int_equal(vs_generate(w->models, w->dev, &j2, t2, &mt, err, sizeof err), 0);
  assert_memory_equal(t1, t2, (size_t)n * sizeof *t1);
  free(t1);
  free(t2);

  /* a deliberate refresh (vspec-bench tune) times again and replaces the entry */
  if (SANITIZED) return;
  vs_autotune_result c;
  resolve(w, CHAIN, VS_AUTOTUNE_REFRESH, &c);
  assert_int_equal(c.from_cache, 0);
  assert_true(c.timed > 0);
  assert_true(c.tuned_at >= a.tuned_at);
}

/* A corrupt, truncated or foreign cache file is ignored: tuned again and rewritten. */
static void test_corrupt_cache(void **state) {
  SKIP_UNDER_SANITIZERS();
  world *w = *state;
  vs_autotune_result a, b;
  resolve(w, CHAIN, 0, &a);
  char path[700];
  cache_file(w, path, sizeof path);
  FILE *f = fopen(path, "r");
  char good[8192];
  size_t len = fread(good, 1, sizeof good - 1, f);
  fclose(f);
  good[len] = 0;
  assert_non_null(strstr(good, "vspec-autotune 1\nmethod sd:exact@standard:shape=chain,drafter=model\n"));

  char bad[8192];
  const char *choice = strstr(good, "choice ");
  assert_non_null(choice);
  /* a choice that is not one of the shape's candidates */
  snprintf(bad, sizeof bad, "%.*schoice depth=99\n", (int)(choice - good), good);
  const char *corrupt[] = {
      "\x01\x02garbage\n",                                 /* not the format */
      bad,                                                 /* a choice out of the candidates */
  };
  for (size_t i = 0; i < sizeof corrupt / sizeof corrupt[0]; i++) {
    write_file(path, corrupt[i]);
    resolve(w, CHAIN, 0, &b);
    assert_int_equal(b.from_cache, 0);
    assert_true(b.timed > 0);
    assert_int_equal(b.stored, 1);
  }
  /* the rewritten file is read back */
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 1);
  /* a whole file made for another machine (a copied cache) */
  char foreign[8192];
  const char *machine = strstr(good, "machine ");
  assert_non_null(machine);
  snprintf(foreign, sizeof foreign, "%.*smachine some other cpu\n%s", (int)(machine - good),
           good, strchr(machine, '\n') + 1);
  write_file(path, foreign);
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 0);
  write_file(path, good); /* the original: valid again */
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 1);
  assert_string_equal(b.spec, a.spec);
  /* a file from before the AR line: still valid, the AR cost unknown */
  char old[8192];
  const char *ar = strstr(good, "\nar ");
  assert_non_null(ar);
  snprintf(old, sizeof old, "%.*s%s", (int)(ar + 1 - good), good, strchr(ar + 1, '\n') + 1);
  write_file(path, old);
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 1);
  assert_string_equal(b.spec, a.spec);
  assert_true(b.ar_ms == 0);
}

/* vspecd: a job with the default size=auto succeeds through the CLI; the worker tunes at first
 * use, logs the choice, and the second job (same seed) reads it back and gives the same PNG. */
static void test_daemon_job(void **state) {
  world *w = *state;
  vs_daemon dm;
  const char *extra[] = {"--set", "defaults.auto_size=true", NULL};
  vs_daemon_start(&dm, &w->fx, "autosize", extra);
  char out[2][300], buf[8192];
  uint8_t png[2][8192];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    snprintf(out[i], sizeof out[i], "%s/auto%d.png", w->fx.dir, i);
    const char *args[] = {"generate", "--server", dm.job_ep, "--model", "self", "--class", "1",
                          "--method", "sd:exact@standard:shape=chain", "--seed", "5", "--out",
                          out[i], "--json", NULL};
    if (vs_run_tool("vspec", args, buf, sizeof buf) != 0) {
      vs_daemon_dump_log(&dm);
      fail_msg("vspec generate failed: %s", buf);
    }
    assert_non_null(strstr(buf, "\"event\": \"result\""));
    FILE *f = fopen(out[i], "rb");
    assert_non_null(f);
    n[i] = fread(png[i], 1, sizeof png[i], f);
    fclose(f);
  }
  assert_int_equal(n[0], n[1]);
  assert_memory_equal(png[0], png[1], n[0]);
  /* an explicit size=auto on a model with continuous tokens is refused at submission: the
   * fixture has none, so check a bad size value instead */
  const char *bad[] = {"generate", "--server", dm.job_ep, "--model", "self", "--method",
                       "sd:exact@standard:shape=chain,size=big", "--out", out[0], NULL};
  assert_int_not_equal(vs_run_tool("vspec", bad, buf, sizeof buf), 0);
  assert_int_equal(vs_daemon_stop(&dm, 15, 20000), 0);
  /* the log says what was chosen, tuned the first time and cached the second */
  FILE *f = fopen(dm.log, "r");
  assert_non_null(f);
  static char log[1 << 20];
  size_t ln = fread(log, 1, sizeof log - 1, f);
  fclose(f);
  log[ln] = 0;
  const char *first = strstr(log, "size=auto: chose depth=");
  assert_non_null(first);
  assert_non_null(strstr(first, "tuned now on "));
  assert_non_null(strstr(first + 1, "(cached, tuned "));
}

/* vspec-bench tune stores a choice that vspec-bench generate then uses, image after image. */
static void test_bench_tune(void **state) {
  SKIP_UNDER_SANITIZERS();
  world *w = *state;
  char out[8192], model[300];
  snprintf(model, sizeof model, "%s", w->fx.self_model);
  const char *tune[] = {"tune", "--model", model, "--method", "sd:exact@standard:shape=chain",
                        "--threads", "1", "--plugins", w->fx.plugins, NULL};
  assert_int_equal(vs_run_tool("vspec-bench", tune, out, sizeof out), 0);
  assert_non_null(strstr(out, "\n* depth="));
  const char *runs = strstr(out, "runs as: sd:exact@standard:shape=chain,depth=");
  assert_non_null(runs);
  char want[200];
  snprintf(want, sizeof want, "method=%.*s", (int)strcspn(runs + 9, "\n"), runs + 9);
  uint8_t png[2][8192];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    char path[300];
    snprintf(path, sizeof path, "%s/bench%d.png", w->fx.dir, i);
    const char *gen[] = {"generate", "--model", model, "--method", "sd:exact@standard:shape=chain",
                         "--seed", "4", "--threads", "1", "--plugins", w->fx.plugins, "--out",
                         path, NULL};
    assert_int_equal(vs_run_tool("vspec-bench", gen, NULL, 0), 0);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    n[i] = fread(png[i], 1, sizeof png[i], f);
    fclose(f);
    /* the PNG's text chunk names the method as it ran: the tuned depth */
    if (!memmem(png[i], n[i], want, strlen(want))) fail_msg("'%s' not in the PNG's text", want);
  }
  assert_int_equal(n[0], n[1]);
  assert_memory_equal(png[0], png[1], n[0]);
}

int main(void) {
  /* One fixture for all: test_corrupt_cache starts from the choice the round trip stored
   * (it tunes once more when run alone). */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_and_wanted),
      cmocka_unit_test(test_cache_round_trip),
      cmocka_unit_test(test_corrupt_cache),
      cmocka_unit_test(test_daemon_job),
      cmocka_unit_test(test_bench_tune),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
