/*
 * What `vspec generate` shows of a job (clients/progress_line.c, clients/gen_view.c), fed
 * events directly and read back from memory streams:
 *  - the ETA counts generation only: it restarts after a phase (size=auto tuning took 30 s
 *    here) and after a fleet Restarted (the abandoned run began 46 minutes earlier);
 *  - AR jobs show "accept -", not "accept 0%"; VVS jobs show the unverified share beside the
 *    acceptance rate, and the final line says what the % counts;
 *  - Phase events on the live line ("size=auto: tuning sd:exact 40% (3 s left)") and as plain
 *    lines (one per tenth); Notice printed once even when Result.notes repeats it;
 *  - the seed the job runs with, in the text and the JSON;
 *  - --json: phase and notice events, the result's "notes", one error object at the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clients/gen_view.h"

typedef struct view {
  vs_gen_view v;
  char *out, *text;
  size_t nout, ntext;
  FILE *fout, *ftext;
} view;

static void view_open(view *w, int json, int mode) {
  memset(w, 0, sizeof *w);
  w->fout = open_memstream(&w->out, &w->nout);
  w->ftext = open_memstream(&w->text, &w->ntext);
  assert_non_null(w->fout);
  assert_non_null(w->ftext);
  vs_gen_view_init(&w->v, w->fout, w->ftext, json, 0, mode, 0.0);
}

/* Flushes; w->out and w->text hold everything written so far. */
static void view_read(view *w) {
  fflush(w->fout);
  fflush(w->ftext);
}

static void view_close(view *w) {
  vs_gen_view_free(&w->v);
  fclose(w->fout);
  fclose(w->ftext);
  free(w->out);
  free(w->text);
}

static void accepted(view *w, const char *method, uint64_t seed, double now) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted a = VSPEC__ACCEPTED__INIT;
  ev.has_job_id = 1;
  ev.job_id = 7;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &a;
  a.model = "m";
  a.method = (char *)method;
  a.node = "d1";
  a.has_tokens_total = 1;
  a.tokens_total = 100;
  a.has_seed = 1;
  a.seed = seed;
  vs_gen_show_accepted(&w->v, &ev, now);
}

/* A progress event: done tokens, the acceptance rate, and positions [from, done) with
 * status st (TokenStatus) as its delta. */
static void progress(view *w, unsigned done, double acc, unsigned from, uint32_t st,
                     double now) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Progress p = VSPEC__PROGRESS__INIT;
  static uint32_t pos[100], stv[100];
  static int32_t tok[100];
  ev.has_job_id = 1;
  ev.job_id = 7;
  ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
  ev.progress = &p;
  p.has_round = 1;
  p.round = done;
  p.tokens_done = done;
  p.tokens_total = 100;
  p.tpf = p.mal = 2.0;
  p.has_accept_rate = 1;
  p.accept_rate = acc;
  for (unsigned i = from; i < done; i++) {
    pos[i - from] = i;
    stv[i - from] = st;
    tok[i - from] = 1;
  }
  p.n_positions = p.n_status = p.n_tokens = done - from;
  p.positions = pos;
  p.status = stv;
  p.tokens = tok;
  vs_gen_show_progress(&w->v, &ev, now);
}

static void phase(view *w, const char *name, const char *msg, double done, double eta,
                  double now) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Phase ph = VSPEC__PHASE__INIT;
  ev.body_case = VSPEC__EVENT__BODY_PHASE;
  ev.phase = &ph;
  ph.name = (char *)name;
  ph.message = (char *)msg;
  ph.has_done = done >= 0;
  ph.done = done;
  ph.has_eta_s = eta >= 0;
  ph.eta_s = eta;
  vs_gen_show_phase(&w->v, &ev, now);
}

static void notice(view *w, const char *msg) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Notice n = VSPEC__NOTICE__INIT;
  ev.body_case = VSPEC__EVENT__BODY_NOTICE;
  ev.notice = &n;
  n.kind = "autotune";
  n.message = (char *)msg;
  vs_gen_show_notice(&w->v, &ev);
}

static void result(view *w, Vspec__Stats *st, char **notes, size_t n_notes) {
  Vspec__Result r = VSPEC__RESULT__INIT;
  r.stats = st;
  r.has_seed = 1;
  r.seed = 977;
  r.notes = notes;
  r.n_notes = n_notes;
  r.describe = "model=m seed=977";
  vs_gen_written out = {.out = "x.png", .width = 32, .height = 32, .upscale = 1};
  vs_gen_show_result(&w->v, &r, &out);
}

/* The ETA restarts when generation starts: 30 s of tuning, then 10 of 100 tokens in 1 s
 * leave 9 s, not the 279 s that counting from the submit would say. */
static void test_eta_after_phase(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_PLAIN);
  accepted(&w, "sd:exact", 5, 0.0);
  for (int t = 1; t <= 30; t++)
    phase(&w, "tuning", "size=auto: tuning sd:exact", t / 30.0, 30 - t, t);
  progress(&w, 10, 0.5, 0, VSPEC__TOKEN_STATUS__TOKEN_ACCEPTED, 31.0);
  view_read(&w);
  printf("%s", w.text);
  assert_non_null(strstr(w.text, "10/100 tokens"));
  assert_non_null(strstr(w.text, "ETA 9.0s"));
  view_close(&w);
}

/* Fleet mode: the job runs again from its first token on another daemon 46 minutes (of an
 * abandoned run) later; the ETA counts the new run only. */
static void test_eta_after_restart(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_PLAIN);
  accepted(&w, "sd:exact", 5, 0.0);
  progress(&w, 50, 0.5, 0, VSPEC__TOKEN_STATUS__TOKEN_ACCEPTED, 10.0);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Restarted rs = VSPEC__RESTARTED__INIT;
  ev.body_case = VSPEC__EVENT__BODY_RESTARTED;
  ev.restarted = &rs;
  rs.delivery = 2;
  rs.node = "d2";
  vs_gen_show_restarted(&w.v, &ev, 2760.0);
  accepted(&w, "sd:exact", 5, 2760.0);
  progress(&w, 10, 0.5, 0, VSPEC__TOKEN_STATUS__TOKEN_ACCEPTED, 2761.0);
  view_read(&w);
  printf("%s", w.text);
  assert_non_null(strstr(w.text, "restarted on d2"));
  const char *after = strstr(w.text, "10/100 tokens");
  assert_non_null(after);
  assert_non_null(strstr(after, "ETA 9.0s"));
  view_close(&w);
}

/* AR drafts nothing: "accept -" on the line and in the final line, never "accept 0%". */
static void test_ar_accept_dash(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_PLAIN);
  accepted(&w, "ar", 977, 0.0);
  progress(&w, 50, 0.0, 0, VSPEC__TOKEN_STATUS__TOKEN_TARGET, 1.0);
  Vspec__Stats st = VSPEC__STATS__INIT;
  st.tokens = 100;
  st.target_forwards = 100;
  st.tpf = st.mal = 1.0;
  result(&w, &st, NULL, 0);
  view_read(&w);
  printf("%s", w.text);
  assert_non_null(strstr(w.text, "50/100 tokens, TPF 2.00, MAL 2.00, accept -,"));
  assert_non_null(strstr(w.text, "MAL 1.00, accept -, "));
  assert_null(strstr(w.text, "accept 0%"));
  /* the seed the job ran with: in the accepted line and the final line */
  assert_non_null(strstr(w.text, "method ar, seed 977"));
  assert_non_null(strstr(w.text, "job 7, seed 977,"));
  view_close(&w);
}

/* VVS: 3 % of the verified draft tokens accepted, but 60 of 100 tokens taken unverified:
 * both figures are shown, and the final line says what each counts. */
static void test_vvs_unverified_share(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_LIVE);
  accepted(&w, "sd:lantern@vvs", 5, 0.0);
  progress(&w, 40, 0.03, 0, VSPEC__TOKEN_STATUS__TOKEN_TARGET, 1.0);
  progress(&w, 100, 0.03, 40, VSPEC__TOKEN_STATUS__TOKEN_UNVERIFIED, 2.0);
  Vspec__Stats st = VSPEC__STATS__INIT;
  st.tokens = 100;
  st.target_forwards = 34;
  st.draft_tokens = 200;
  st.accept_rate = 0.03;
  st.unverified_tokens = 60;
  st.mal = 2.91;
  result(&w, &st, NULL, 0);
  view_read(&w);
  printf("%s\n", w.text);
  assert_non_null(strstr(w.text, "100/100 tokens  TPF 2.00  MAL 2.00  accept 3%  unverified 60%"));
  assert_non_null(strstr(w.text, "accept 3% of 200 draft tokens, 60% of the tokens unverified"));
  view_close(&w);
}

/* The live line shows a phase with its progress and time left; plain lines one per tenth. */
static void test_phase_lines(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_LIVE);
  accepted(&w, "sd:exact", 5, 0.0);
  phase(&w, "tuning", "size=auto: tuning sd:exact", 0.4, 3.0, 1.0);
  view_read(&w);
  assert_non_null(strstr(w.text, "\r\033[K[job 7] size=auto: tuning sd:exact 40% (3 s left)"));
  view_close(&w);
  view_open(&w, 0, VS_PL_PLAIN);
  accepted(&w, "sd:exact", 5, 0.0);
  for (int i = 0; i <= 40; i++) phase(&w, "tuning", "size=auto: tuning", i / 40.0, -1, i);
  view_read(&w);
  int lines = 0;
  for (const char *s = w.text; (s = strstr(s, "size=auto: tuning")); s++) lines++;
  printf("%s", w.text);
  assert_int_equal(lines, 11); /* 0 %, 10 %, ..., 100 % */
  view_close(&w);
}

/* A notice is printed once, though the result's notes repeat it; a note seen only in the
 * result is printed then. */
static void test_notice_once(void **state) {
  (void)state;
  view w;
  view_open(&w, 0, VS_PL_PLAIN);
  accepted(&w, "sd:exact", 5, 0.0);
  notice(&w, "size=auto: chose depth=3");
  notice(&w, "size=auto: chose depth=3");
  char *notes[] = {"size=auto: chose depth=3", "sd:exact runs as AR here"};
  Vspec__Stats st = VSPEC__STATS__INIT;
  result(&w, &st, notes, 2);
  view_read(&w);
  printf("%s", w.text);
  const char *first = strstr(w.text, "note: size=auto: chose depth=3");
  assert_non_null(first);
  assert_null(strstr(first + strlen("note: size=auto: chose depth=3"), "chose depth=3"));
  assert_non_null(strstr(w.text, "note: sd:exact runs as AR here"));
  view_close(&w);
}

/* --json: phase and notice events, the seed in accepted and result, the result's notes. */
static void test_json_events(void **state) {
  (void)state;
  view w;
  view_open(&w, 1, VS_PL_PLAIN);
  accepted(&w, "sd:exact", 977, 0.0);
  phase(&w, "tuning", "size=auto: tuning sd:exact", 0.5, 2.0, 1.0);
  phase(&w, "loading", "loading model m", -1, -1, 1.5);
  notice(&w, "size=auto: chose depth=3");
  char *notes[] = {"size=auto: chose depth=3", "late note"};
  Vspec__Stats st = VSPEC__STATS__INIT;
  result(&w, &st, notes, 2);
  view_read(&w);
  printf("%s", w.out);
  assert_non_null(strstr(w.out, "\"event\": \"accepted\", \"job\": 7"));
  assert_non_null(strstr(w.out, "\"node\": \"d1\", \"seed\": 977}"));
  assert_non_null(strstr(w.out, "{\"event\": \"phase\", \"job\": 7, \"name\": \"tuning\", "
                                "\"message\": \"size=auto: tuning sd:exact\", \"done\": 0.5000, "
                                "\"eta_s\": 2.0000}"));
  assert_non_null(strstr(w.out, "\"name\": \"loading\", \"message\": \"loading model m\", "
                                "\"done\": null, \"eta_s\": null}"));
  assert_non_null(strstr(w.out, "{\"event\": \"notice\", \"job\": 7, \"kind\": \"autotune\", "
                                "\"message\": \"size=auto: chose depth=3\"}"));
  assert_non_null(strstr(w.out, "\"seed\": 977, \"tokens\""));
  assert_non_null(strstr(w.out, "\"notes\": [\"size=auto: chose depth=3\", \"late note\"]"));
  assert_int_equal(w.ntext, 0); /* nothing for people on stderr with --json */
  view_close(&w);
}

/* One terminal object: a failure after the result adds none; a failure alone is one. */
static void test_json_single_end(void **state) {
  (void)state;
  view w;
  view_open(&w, 1, VS_PL_PLAIN);
  assert_int_equal(vs_gen_fail(&w.v, 3, VS_GEN_TIMEOUT, "no answer from %s", "x"), 3);
  assert_int_equal(vs_gen_fail(&w.v, 130, VS_GEN_INTERRUPTED, "again"), 130);
  view_read(&w);
  printf("%s", w.out);
  assert_string_equal(w.out, "{\"event\": \"error\", \"job\": 0, \"code\": \"timeout\", "
                             "\"message\": \"no answer from x\", \"exit\": 3}\n");
  view_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eta_after_phase),   cmocka_unit_test(test_eta_after_restart),
      cmocka_unit_test(test_ar_accept_dash),    cmocka_unit_test(test_vvs_unverified_share),
      cmocka_unit_test(test_phase_lines),       cmocka_unit_test(test_notice_once),
      cmocka_unit_test(test_json_events),       cmocka_unit_test(test_json_single_end)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
