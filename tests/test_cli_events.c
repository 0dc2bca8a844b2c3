/*
 * `vspec generate` against a fake server (a ZeroMQ ROUTER in this process) that sends what a
 * daemon sends for a job with long phases: Accepted (with the seed it drew), Phase events
 * (size=auto tuning), a Notice, a Progress, then the Result with its notes and a PNG.
 * Checks the CLI's side of the protocol, end to end through the real binary:
 *  - the Submit carries no seed unless --seed is given (the daemon draws one, as for HTTP);
 *  - --json prints phase and notice events, the seed, and the result's notes, last;
 *  - plain text shows the phase lines, the notice once and the seed;
 *  - phases and notices take no credit back (only the progress event does).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cli_run.h"
#include "tests/support/fake_daemon.h"
#include "tests/support/daemon_harness.h"

#define WAIT_MS 20000

static void send_phase(vs_fake *f, double done) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Phase ph = VSPEC__PHASE__INIT;
  ev.body_case = VSPEC__EVENT__BODY_PHASE;
  ev.phase = &ph;
  ph.name = "tuning";
  ph.message = "size=auto: tuning sd:exact";
  ph.has_done = ph.has_eta_s = 1;
  ph.done = done;
  ph.eta_s = 4 * (1 - done);
  vs_fake_send(f, &ev, NULL, 0);
}

static void send_notice(vs_fake *f) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Notice n = VSPEC__NOTICE__INIT;
  ev.body_case = VSPEC__EVENT__BODY_NOTICE;
  ev.notice = &n;
  n.kind = "autotune";
  n.message = "size=auto: chose depth=3";
  vs_fake_send(f, &ev, NULL, 0);
}

/* Plays the job to vspec; returns whether the Submit had a seed. Takes the requests that
 * follow until the client has gone (nothing more comes). */
static int play(vs_fake *f) {
  int has_seed;
  uint64_t rid = vs_fake_submit(f, WAIT_MS, &has_seed);
  vs_fake_accepted(f, rid);
  for (int i = 0; i <= 4; i++) send_phase(f, i / 4.0);
  send_notice(f);
  vs_fake_progress(f);
  vs_wire_msg m;
  vs_wire_alloc a;
  Vspec__Request *rq = vs_fake_recv(f, WAIT_MS, &m, &a); /* the progress's credit */
  assert_non_null(rq);
  vs_wire_request_free(rq, &a);
  vs_wire_msg_close(&m);
  char *notes[] = {"size=auto: chose depth=3"};
  vs_fake_result(f, notes, 1);
  vs_fake_drain(f, 500);
  return has_seed;
}

static void test_json(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  char out[300], last[4096];
  snprintf(out, sizeof out, "%s/out.png", f.dir);
  const char *args[] = {"generate", "--server", f.ep, "--out", out, "--json", "--timeout", "10",
                        NULL};
  vs_cli_proc p;
  vs_cli_start(&p, args, f.dir, NULL);
  int has_seed = play(&f);
  static vs_cli_result r;
  vs_cli_finish(&p, &r, WAIT_MS);
  printf("%s%s", r.out, r.err);
  assert_int_equal(r.status, 0);
  assert_int_equal(has_seed, 0); /* no --seed: the daemon draws one */
  assert_int_equal(f.credits, 1);
  assert_non_null(strstr(r.out, "\"node\": \"fake\", \"seed\": 8808317955088799277}"));
  assert_non_null(strstr(r.out, "{\"event\": \"phase\", \"job\": 77, \"name\": \"tuning\", "
                                "\"message\": \"size=auto: tuning sd:exact\", \"done\": 0.5000"));
  assert_non_null(strstr(r.out, "{\"event\": \"notice\", \"job\": 77, \"kind\": \"autotune\", "
                                "\"message\": \"size=auto: chose depth=3\"}"));
  vs_cli_last_line(r.out, last, sizeof last);
  assert_non_null(strstr(last, "{\"event\": \"result\", \"job\": 77"));
  assert_non_null(strstr(last, "\"seed\": 8808317955088799277"));
  assert_non_null(strstr(last, "\"notes\": [\"size=auto: chose depth=3\"]"));
  vs_fake_close(&f);
}

static void test_text(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  char out[300];
  snprintf(out, sizeof out, "%s/out.png", f.dir);
  const char *args[] = {"generate", "--server", f.ep, "--out", out, "--timeout", "10", NULL};
  vs_cli_proc p;
  vs_cli_start(&p, args, f.dir, NULL);
  play(&f);
  static vs_cli_result r;
  vs_cli_finish(&p, &r, WAIT_MS);
  printf("%s", r.err);
  assert_int_equal(r.status, 0);
  assert_non_null(strstr(r.err, "method sd:exact, seed 8808317955088799277, 4 tokens"));
  assert_non_null(strstr(r.err, "job 77: size=auto: tuning sd:exact 50% (2 s left)\n"));
  const char *note = strstr(r.err, "note: size=auto: chose depth=3\n");
  assert_non_null(note);
  assert_null(strstr(note + 1, "note:")); /* once, though the result's notes repeat it */
  assert_non_null(strstr(r.err, "job 77, seed 8808317955088799277,"));
  vs_fake_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_json), cmocka_unit_test(test_text)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
