/*
 * size=auto (core/autotune.h): the default, what a method leaves to tune, the choice between
 * a speculative combination and AR, the stored choice and its reuse, a corrupt or foreign
 * cache file, and vspecd / the CLI running a job with it (the tuning as a Phase, the choice
 * as a Notice and in the Result's notes).
 *
 * The model is the harness's "self" (the micro LlamaGen model drafting for itself): a chain
 * tuning on it takes about half a second. Which combination wins there depends on the
 * machine's timings, so the tests that need a speculative choice use a relaxed rule (which
 * never falls back to AR), and the AR fallback is checked on a stored choice. The fixture's
 * cache directory ($VSPEC_CACHE_DIR, set by vs_fixture_make) holds the choices, so nothing
 * touches the user's cache.
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
#include "tests/support/method_of.h"

/* A relaxed rule: a speculative choice whatever the timings. */
#define CHAIN "sd:coolsd:delta=2@standard:shape=chain,drafter=model,size=auto"
#define CHAIN_BASE "sd:coolsd:delta=2@standard:shape=chain,drafter=model"
/* An exact rule: AR may replace it. */
#define EXACT "sd:exact@standard:shape=chain,size=auto"
#define EXACT_BASE "sd:exact@standard:shape=chain"

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
  vs_autotune_opts o = {.flags = flags};
  if (vs_autotune_resolve(w->models, w->dev, &m, &o, res, err, sizeof err))
    fail_msg("%s: %s", text, err);
}

static size_t read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t len = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[len] = 0;
  return len;
}

/* The path of the choice file of method `base` in the fixture's cache (exactly one). */
static void cache_file(const world *w, const char *base, char *path, size_t cap) {
  char dir[300], want[1200], text[8192];
  snprintf(dir, sizeof dir, "%s/cache", w->fx.dir);
  snprintf(want, sizeof want, "\nmethod %s\n", base);
  DIR *d = opendir(dir);
  assert_non_null(d);
  int found = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, "autotune-", 9) || !strncmp(e->d_name, "autotune-curve-", 15)) continue;
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    read_file(p, text, sizeof text);
    if (!strstr(text, want)) continue;
    snprintf(path, cap, "%s", p);
    found++;
  }
  closedir(d);
  assert_int_equal(found, 1);
}

/* Rewrites the choice line of the file at `path`. */
static void set_choice(const char *path, const char *choice) {
  char text[8192], out[8192];
  read_file(path, text, sizeof text);
  char *line = strstr(text, "\nchoice ");
  assert_non_null(line);
  snprintf(out, sizeof out, "%.*s\nchoice %s%s", (int)(line - text), text, choice,
           strchr(line + 1, '\n'));
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(out, f);
  fclose(f);
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
      /* a drafter plugin keeps its own window unless size=auto is named */
      {"sd:exact@standard:drafter=jacobi,coupling=gumbel",
       "sd:exact@standard:drafter=jacobi,coupling=gumbel", 0},
      {"sd:continuous@standard:shape=chain", "sd:continuous@standard:shape=chain", 1},
      {"ar", "ar", 0},
  };
  char err[VSPEC_ERRLEN];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vs_method m;
    parse(cases[i].in, &m);
    int changed = vs_autotune_default(&m, cases[i].continuous);
    assert_string_equal(m.text, cases[i].out);
    assert_int_equal(changed, strcmp(cases[i].out, cases[i].in) != 0);
    assert_int_equal(vs_autotune_wanted(&m), strstr(m.text, "size=auto") != NULL);
    /* the default sets the field and spells it: the same method as parsing that spelling */
    vs_method again;
    parse(m.text, &again);
    assert_int_equal(again.size, m.size);
    assert_string_equal(again.sched_params, m.sched_params);
  }
  vs_method m;
  parse("sd:exact@standard:shape=chain,size=auto,drafter=model", &m);
  assert_int_equal(vs_autotune_wanted(&m), 1);
  /* size=auto is a field: the scheduler's parameters are what its plugin must accept */
  assert_string_equal(m.sched_params, "shape=chain,drafter=model");
  assert_string_equal(m.text, "sd:exact@standard:shape=chain,size=auto,drafter=model");
  assert_int_equal(vs_method_parse("sd:exact@standard:size=4", &m, err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "size=4: only size=auto"));
}

/* The method a choice makes (vs__autotune_method), its spelling in `spec`; checked field by
 * field against parsing that spelling, which the daemon and the bench no longer do. */
static void spec_of(const vs_method *m, const vs_at_space *sp, const char *choice, char *spec,
                    size_t cap) {
  vs_method run, parsed;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs__autotune_method(m, sp, choice, &run, err, sizeof err), 0);
  parse(run.text, &parsed);
  assert_int_equal(run.kind, parsed.kind);
  assert_int_equal(run.size, parsed.size);
  assert_string_equal(run.rule, parsed.rule);
  assert_string_equal(run.rule_params, parsed.rule_params);
  assert_string_equal(run.sched, parsed.sched);
  assert_string_equal(run.sched_params, parsed.sched_params);
  assert_string_equal(run.drafter, parsed.drafter);
  assert_string_equal(run.drafter_params, parsed.drafter_params);
  /* the sets, made from the family without parsing, are those its spelling parses to */
  const vspec_params *made[] = {&run.rule_set, &run.sched_set, &run.drafter_set},
                     *read[] = {&parsed.rule_set, &parsed.sched_set, &parsed.drafter_set};
  for (int i = 0; i < 3; i++) {
    char a[600], b[600];
    vs_params_format(made[i], a, sizeof a);
    vs_params_format(read[i], b, sizeof b);
    assert_string_equal(a, b);
  }
  snprintf(spec, cap, "%s", run.text);
}

/* What a method leaves to tune on the self model (a draft model, no EAGLE head), how a
 * choice is spelled and checked, and when AR replaces the winner. */
static void test_space(void **state) {
  world *w = *state;
  vs_method m;
  vs_at_space sp;
  char err[VSPEC_ERRLEN], param[VS_AUTOTUNE_PARAM_LEN], spec[1100];
  parse("sd:exact@standard:size=auto", &m);
  assert_int_equal(vs__autotune_space(w->models, &m, &sp, err, sizeof err), 0);
  assert_int_equal(sp.exact, 1);
  assert_string_equal(sp.rest, "");
  assert_int_equal(sp.n_fam, 3); /* the draft model's chain, dynamic and static families */
  vs__autotune_param(&sp, 0, 2, param, sizeof param);
  assert_string_equal(param, "drafter=model,shape=chain,depth=3");
  assert_int_equal(vs__autotune_valid(&sp, param), 1);
  assert_int_equal(vs__autotune_valid(&sp, "drafter=model,shape=chain,depth=9"), 0);
  assert_int_equal(vs__autotune_valid(&sp, "drafter=head,shape=chain,depth=3"), 0);
  assert_int_equal(vs__autotune_valid(&sp, "drafter=model,shape=static,tree=chain2"), 0);
  assert_int_equal(vs__autotune_valid(&sp, "drafter=model,shape=static,tree=fmnist"), 1);
  assert_int_equal(vs__autotune_valid(&sp, "drafter=model,shape=static,tree=wide2"), 1);
  assert_int_equal(vs__autotune_valid(&sp, "ar"), 1);
  spec_of(&m, &sp, param, spec, sizeof spec);
  assert_string_equal(spec, "sd:exact@standard:drafter=model,shape=chain,depth=3");
  spec_of(&m, &sp, "ar", spec, sizeof spec);
  assert_string_equal(spec, "ar");

  /* named axes stay as written; a relaxed rule has no AR choice */
  parse("sd:coolsd:delta=2@standard:shape=chain,drafter=model,top_k=3,size=auto", &m);
  assert_int_equal(vs__autotune_space(w->models, &m, &sp, err, sizeof err), 0);
  assert_int_equal(sp.exact, 0);
  assert_int_equal(sp.n_fam, 1);
  assert_string_equal(sp.rest, "shape=chain,drafter=model,top_k=3");
  vs__autotune_param(&sp, 0, 0, param, sizeof param);
  assert_string_equal(param, "depth=1");
  assert_int_equal(vs__autotune_valid(&sp, "ar"), 0);
  spec_of(&m, &sp, param, spec, sizeof spec);
  assert_string_equal(spec, "sd:coolsd:delta=2@standard:shape=chain,drafter=model,top_k=3,depth=1");

  /* drafter=auto is left to the tuning; a named static shape keeps its chainN trees */
  parse("sd:exact@standard:shape=static,drafter=auto,size=auto", &m);
  assert_int_equal(vs__autotune_space(w->models, &m, &sp, err, sizeof err), 0);
  assert_int_equal(sp.n_fam, 1);
  assert_string_equal(sp.rest, "shape=static");
  vs__autotune_param(&sp, 0, 1, param, sizeof param);
  assert_string_equal(param, "drafter=model,tree=chain2");

  /* a drafter plugin named with size=auto: its window tuned as a chain's depth, its own
   * parameters kept */
  parse("sd:coolsd:delta=2@standard:drafter=jacobi,coupling=maximal,size=auto", &m);
  assert_int_equal(vs__autotune_space(w->models, &m, &sp, err, sizeof err), 0);
  assert_int_equal(sp.n_fam, 1);
  assert_string_equal(sp.rest, "drafter=jacobi");
  vs__autotune_param(&sp, 0, 2, param, sizeof param);
  assert_string_equal(param, "shape=chain,depth=3");
  spec_of(&m, &sp, param, spec, sizeof spec);
  assert_string_equal(spec,
                      "sd:coolsd:delta=2@standard:drafter=jacobi,shape=chain,depth=3,coupling=maximal");

  /* AR replaces the winner only for an exact rule, and only when the winner is not 10 %
   * faster */
  assert_int_equal(vs__autotune_prefer_ar(1, 100.0, 100.0), 1);
  assert_int_equal(vs__autotune_prefer_ar(1, 109.0, 100.0), 1);
  assert_int_equal(vs__autotune_prefer_ar(1, 111.0, 100.0), 0);
  assert_int_equal(vs__autotune_prefer_ar(1, 0.0, 100.0), 1);
  assert_int_equal(vs__autotune_prefer_ar(0, 50.0, 100.0), 0);
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
  assert_true(a.n_cand >= 2 && a.n_cand <= 8); /* depths screened until two were worse */
  assert_true(a.best >= 0 && a.best < a.n_cand);
  assert_int_equal(a.cand[a.best].images, 4); /* a finalist, scored on its own images */
  assert_string_equal(a.choice, a.cand[a.best].param);
  assert_false(vs_autotune_is_ar(&a));
  assert_non_null(strstr(a.method.text, a.choice));
  assert_null(strstr(a.method.text, "size="));
  assert_true(a.ar_ms > 0);

  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 1);
  assert_int_equal(b.timed, 0);
  assert_string_equal(b.method.text, a.method.text);
  assert_string_equal(b.choice, a.choice);
  assert_int_equal(b.tuned_at, a.tuned_at);
  assert_int_equal(b.best, a.best);
  /* AR's cost per token comes back too (4 decimals in the file) */
  assert_true(fabs(b.ar_ms - a.ar_ms) < 1e-4);
  char note[1024];
  vs_autotune_describe(&b, note, sizeof note);
  assert_non_null(strstr(note, "size=auto: chose depth="));
  assert_non_null(strstr(note, "(cached, tuned "));
  assert_non_null(strstr(note, "against AR's"));
  /* the comparison with AR: said exactly when the choice makes fewer tokens per second */
  vs_autotune_result slow = b;
  double rate = b.cand[b.best].rate;
  slow.ar_ms = 0.5 * 1e3 / rate; /* AR twice as fast as the choice */
  assert_true(vs_autotune_slower_than_ar(&slow));
  vs_autotune_describe(&slow, note, sizeof note);
  assert_non_null(strstr(note, "slower than AR"));
  slow.ar_ms = 2.0 * 1e3 / rate;
  assert_false(vs_autotune_slower_than_ar(&slow));
  vs_autotune_describe(&slow, note, sizeof note);
  assert_null(strstr(note, "slower than AR"));

  /* the same seed through both resolutions: the same grid */
  int n = w->models->target.info.grid_h * w->models->target.info.grid_w;
  int32_t *t1 = calloc((size_t)n, sizeof *t1), *t2 = calloc((size_t)n, sizeof *t2);
  char err[VSPEC_ERRLEN];
  vs_metrics mt;
  vs_job j1 = {.method = &a.method, .class_label = 2, .seed = 11, .sampling = w->models->defaults};
  vs_job j2 = {.method = &b.method, .class_label = 2, .seed = 11, .sampling = w->models->defaults};
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

/* An exact rule whose stored choice is AR runs as AR and says why; AR is no choice for a
 * relaxed rule (its images differ), so such a file is ignored and the method tuned again. */
static void test_ar_fallback(void **state) {
  world *w = *state;
  vs_autotune_result a, b;
  char path[700], note[1024];
  resolve(w, EXACT, 0, &a);
  cache_file(w, EXACT_BASE, path, sizeof path);
  set_choice(path, "ar");
  resolve(w, EXACT, 0, &b);
  assert_int_equal(b.from_cache, 1);
  assert_true(vs_autotune_is_ar(&b));
  assert_string_equal(b.method.text, "ar");
  vs_autotune_describe(&b, note, sizeof note);
  assert_non_null(strstr(note, "size=auto: runs as AR"));
  assert_non_null(strstr(note, "AR samples the same distribution"));
  assert_false(vs_autotune_slower_than_ar(&b));
  /* and it runs: AR's tokens */
  int n = w->models->target.info.grid_h * w->models->target.info.grid_w;
  int32_t *t1 = calloc((size_t)n, sizeof *t1), *t2 = calloc((size_t)n, sizeof *t2);
  char err[VSPEC_ERRLEN];
  vs_metrics mt;
  vs_job j1 = {.method = &b.method, .class_label = 1, .seed = 3, .sampling = w->models->defaults};
  vs_job j2 = {.method = NULL, .class_label = 1, .seed = 3, .sampling = w->models->defaults};
  assert_int_equal(vs_generate(w->models, w->dev, &j1, t1, &mt, err, sizeof err), 0);
  assert_int_equal(mt.draft_tokens, 0);
  assert_int_equal(vs_generate(w->models, w->dev, &j2, t2, &mt, err, sizeof err), 0);
  assert_memory_equal(t1, t2, (size_t)n * sizeof *t1);
  free(t1);
  free(t2);

  if (SANITIZED) return;
  resolve(w, CHAIN, 0, &a); /* cached by the round trip, or tuned now */
  cache_file(w, CHAIN_BASE, path, sizeof path);
  set_choice(path, "ar");
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 0);
  assert_false(vs_autotune_is_ar(&b));
}

/* A corrupt, truncated or foreign cache file is ignored: tuned again and rewritten. */
static void test_corrupt_cache(void **state) {
  SKIP_UNDER_SANITIZERS();
  world *w = *state;
  vs_autotune_result a, b;
  resolve(w, CHAIN, 0, &a);
  char path[700];
  cache_file(w, CHAIN_BASE, path, sizeof path);
  char good[8192];
  read_file(path, good, sizeof good);
  char head[256];
  snprintf(head, sizeof head, "vspec-autotune %d\nmethod %s\n", VS_AUTOTUNE_VERSION, CHAIN_BASE);
  assert_non_null(strstr(good, head));

  char bad[8192];
  const char *choice = strstr(good, "choice ");
  assert_non_null(choice);
  /* a choice that is not one of the method's candidates */
  snprintf(bad, sizeof bad, "%.*schoice depth=99%s", (int)(choice - good), good,
           strchr(choice, '\n'));
  const char *corrupt[] = {
      "\x01\x02garbage\n", /* not the format */
      bad,                 /* a choice out of the candidates */
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
  assert_string_equal(b.method.text, a.method.text);
  /* a file without AR's cost (the comparison every choice rests on) is not whole */
  char old[8192];
  const char *ar = strstr(good, "\nar ");
  assert_non_null(ar);
  snprintf(old, sizeof old, "%.*s%s", (int)(ar + 1 - good), good, strchr(ar + 1, '\n') + 1);
  write_file(path, old);
  resolve(w, CHAIN, 0, &b);
  assert_int_equal(b.from_cache, 0);
}

/* One job through a raw client: the tuning shows as Phase events ending at done = 1 (when
 * this job tunes; expect_tuning 1: it must, 0: it must not, -1: either), the choice as one
 * Notice before the Result, which repeats it. Returns the result's describe text. */
static void daemon_events(const char *ep, const char *method, int expect_tuning, char *notice,
                          size_t cap, char *describe, size_t dcap) {
  vs_conn c;
  vs_client_open(&c, ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.method = (char *)method;
  s.has_seed = 1;
  s.seed = 9;
  s.has_credit = 1;
  s.credit = 64;
  uint64_t rid = vs_client_submit(&c, &s), job = 0;
  int phases = 0, notices = 0, ended = 0;
  double last_done = -1;
  while (!ended) {
    vs_conn_event e;
    vs_client_next(&c, 60000, &e);
    Vspec__Event *ev = e.ev;
    if (!job && ev->has_request_id && ev->request_id == rid) job = ev->job_id;
    if (ev->body_case == VSPEC__EVENT__BODY_PHASE) {
      assert_string_equal(ev->phase->name, "tuning");
      assert_true(ev->phase->has_done && ev->phase->done >= last_done);
      assert_int_equal(notices, 0); /* the choice comes after the tuning */
      last_done = ev->phase->done;
      phases++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_NOTICE) {
      snprintf(notice, cap, "%s", ev->notice->message);
      /* the kind says which: a fallback to AR, or size=auto's choice */
      assert_string_equal(ev->notice->kind,
                          strstr(notice, "runs as AR") ? "fallback" : "autotune");
      notices++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
      assert_int_equal(notices, 1);
      assert_int_equal(ev->result->n_notes, 1);
      assert_string_equal(ev->result->notes[0], notice);
      snprintf(describe, dcap, "%s", ev->result->describe);
      ended = 1;
    } else if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      fail_msg("%s: %s", method, ev->error->message);
    }
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
  if (expect_tuning > 0) {
    assert_true(phases >= 2);
    assert_true(last_done == 1.0);
  } else if (expect_tuning == 0) {
    assert_int_equal(phases, 0);
  }
}

/* The first LANTERN job on a model makes its codebook neighbour table before its first round:
 * its client sees that as a "loading" phase ending at done = 1 (the newest state wins: the
 * start may be folded into it), before any progress; the next job has nothing to wait for.
 * Returns the phase events seen. */
static int loading_phases(const char *ep) {
  vs_conn c;
  vs_client_open(&c, ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.method = "sd:lantern:delta=0.2@standard:shape=chain,depth=2";
  s.has_credit = 1;
  s.credit = 64;
  uint64_t rid = vs_client_submit(&c, &s);
  int phases = 0, progress = 0, ended = 0;
  double last = -1;
  while (!ended) {
    vs_conn_event e;
    vs_client_next(&c, 60000, &e);
    Vspec__Event *ev = e.ev;
    if (ev->body_case == VSPEC__EVENT__BODY_PHASE) {
      assert_string_equal(ev->phase->name, "loading");
      assert_int_equal(progress, 0);
      last = ev->phase->done;
      phases++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_PROGRESS && ev->progress->round >= 0) {
      progress++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      fail_msg("%s", ev->error->message);
    }
    ended = ev->body_case == VSPEC__EVENT__BODY_RESULT ||
            (ev->has_request_id && ev->request_id == rid && ev->body_case == VSPEC__EVENT__BODY_ERROR);
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
  if (phases) assert_true(last == 1.0);
  return phases;
}

/* vspecd: a job with the default size=auto succeeds through the CLI; the worker tunes at first
 * use, tells the client, logs the choice, and the second job (same seed) reads it back and
 * gives the same PNG. A stored AR choice runs the job as AR. */
static void test_daemon_job(void **state) {
  world *w = *state;
  vs_daemon dm;
  const char *extra[] = {"--set", "defaults.auto_size=true", NULL};
  vs_daemon_start(&dm, &w->fx, "autosize", extra);
  char notice[1024], describe[1024];
  daemon_events(dm.job_ep, "sd:coolsd:delta=3@standard:shape=chain", 1, notice, sizeof notice,
                describe, sizeof describe);
  assert_non_null(strstr(notice, "size=auto: chose "));
  assert_non_null(strstr(notice, "tuned now in "));
  daemon_events(dm.job_ep, "sd:coolsd:delta=3@standard:shape=chain", 0, notice, sizeof notice,
                describe, sizeof describe);
  assert_non_null(strstr(notice, "(cached, tuned "));
  assert_non_null(strstr(describe, "method=sd:coolsd:delta=3@standard:shape=chain,"));

  char out[2][300], buf[8192];
  uint8_t png[2][8192];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    snprintf(out[i], sizeof out[i], "%s/auto%d.png", w->fx.dir, i);
    const char *args[] = {"generate", "--server", dm.job_ep, "--model", "self", "--class", "1",
                          "--method", "sd:coolsd:delta=2@standard:shape=chain", "--seed", "5",
                          "--out", out[i], "--json", NULL};
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
  /* a bad size value is refused at submission */
  const char *bad[] = {"generate", "--server", dm.job_ep, "--model", "self", "--method",
                       "sd:exact@standard:shape=chain,size=big", "--out", out[0], NULL};
  assert_int_not_equal(vs_run_tool("vspec", bad, buf, sizeof buf), 0);

  /* the exact rule: tuned by a first job (or by test_ar_fallback in this process: the daemon
   * runs one thread per job, so its machine is the same), its stored choice made AR, then
   * run as AR */
  daemon_events(dm.job_ep, "sd:exact@standard:shape=chain", -1, notice, sizeof notice, describe,
                sizeof describe);
  char path[700];
  cache_file(w, EXACT_BASE, path, sizeof path);
  set_choice(path, "ar");
  daemon_events(dm.job_ep, "sd:exact@standard:shape=chain", 0, notice, sizeof notice, describe,
                sizeof describe);
  assert_non_null(strstr(notice, "size=auto: runs as AR"));
  assert_non_null(strstr(describe, "method=ar "));
  assert_true(loading_phases(dm.job_ep) >= 1);
  assert_int_equal(loading_phases(dm.job_ep), 0);
  assert_int_equal(vs_daemon_stop(&dm, 15, 20000), 0);
  /* the log says what was chosen, tuned the first time and cached the second */
  FILE *f = fopen(dm.log, "r");
  assert_non_null(f);
  static char log[1 << 20];
  size_t ln = fread(log, 1, sizeof log - 1, f);
  fclose(f);
  log[ln] = 0;
  const char *first = strstr(log, "size=auto: chose drafter=model,depth=");
  assert_non_null(first);
  assert_non_null(strstr(first, "tuned now in "));
  assert_non_null(strstr(first + 1, "(cached, tuned "));
}

/* vspec-bench tune stores a choice that vspec-bench generate then uses, image after image. */
static void test_bench_tune(void **state) {
  SKIP_UNDER_SANITIZERS();
  world *w = *state;
  char out[8192], model[300];
  snprintf(model, sizeof model, "%s", w->fx.self_model);
  const char *method = "sd:coolsd:delta=4@standard:shape=chain";
  const char *tune[] = {"tune", "--model", model, "--method", method, "--threads", "1",
                        "--images", "2", "--plugins", w->fx.plugins, NULL};
  assert_int_equal(vs_run_tool("vspec-bench", tune, out, sizeof out), 0);
  assert_non_null(strstr(out, "\n* drafter=model,depth="));
  const char *runs = strstr(out, "runs as: sd:coolsd:delta=4@standard:shape=chain,drafter=model,depth=");
  assert_non_null(runs);
  char want[200];
  snprintf(want, sizeof want, "method=%.*s", (int)strcspn(runs + 9, "\n"), runs + 9);
  uint8_t png[2][8192];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    char path[300];
    snprintf(path, sizeof path, "%s/bench%d.png", w->fx.dir, i);
    const char *gen[] = {"generate", "--model", model, "--method", method, "--seed", "4",
                         "--threads", "1", "--plugins", w->fx.plugins, "--out", path, NULL};
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
      cmocka_unit_test(test_space),
      cmocka_unit_test(test_cache_round_trip),
      cmocka_unit_test(test_ar_fallback),
      cmocka_unit_test(test_corrupt_cache),
      cmocka_unit_test(test_daemon_job),
      cmocka_unit_test(test_bench_tune),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
