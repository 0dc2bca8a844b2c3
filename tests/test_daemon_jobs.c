/*
 * vspecd end to end, one daemon on its own ipc endpoints: submit, stream and receive the
 * result with a raw client and with the CLI (the image equals the in-process engine's),
 * previews in order with growing coverage, credit, cancel (own job, queued job, operator),
 * deadlines, a full queue, a client that vanishes mid-job.
 *
 * Long jobs come from the test scheduler sched_slow (tests/plugins/slowsched.c), which
 * sleeps in every round, on the "self" model (the micro model drafting for itself).
 *
 * "mar" is the micro continuous-token model (tests/golden/micro_mar): ar and continuous SD
 * give the in-process engine's pixels, its token map streams per position (not a prefix),
 * previews decode the partial latents, and a discrete rule is refused naming the problem.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <png.h>

#include "core/engine.h"
#include "core/host.h"
#include "kernels/vs_kernels.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/method_of.h"

static vs_fixture fx;
static vs_daemon dm;
static char mar_model[PATH_MAX];

static int group_setup(void **state) {
  (void)state;
  vs_fixture_make(&fx);
  if (!realpath("tests/golden/micro_mar", mar_model)) fail_msg("no tests/golden/micro_mar");
  char mar[PATH_MAX + 8];
  snprintf(mar, sizeof mar, "mar=%s", mar_model);
  const char *extra[] = {"--workers", "1", "--set", "queue.size=2", "--set", "queue.per_client=8",
                         "--set", "limits.heartbeat_ivl_ms=200", "--model", mar, NULL};
  vs_daemon_start(&dm, &fx, "jobs", extra);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  int rc = vs_daemon_stop(&dm, SIGTERM, 30000);
  if (rc != 0) vs_daemon_dump_log(&dm);
  vs_fixture_remove(&fx);
  /* A daemon that leaked (LeakSanitizer) or crashed exits non-zero. */
  assert_int_equal(rc, 0);
  return 0;
}

/* Waits until the daemon at `admin` has no job running or waiting. */
static void wait_idle_at(const char *admin) {
  double end = vs_harness_now() + 20;
  for (;;) {
    vs_conn_event e;
    vs_client_status(admin, &e);
    int idle = e.ev->status->running == 0 && e.ev->status->queued == 0;
    vs_conn_event_free(&e);
    if (idle) return;
    if (vs_harness_now() > end) fail_msg("daemon not idle after 20 s");
    vs_harness_sleep_ms(20);
  }
}

static void wait_idle(void) { wait_idle_at(dm.admin_ep); }

static void stop_ok(vs_daemon *d) {
  int rc = vs_daemon_stop(d, SIGTERM, 30000);
  if (rc != 0) {
    vs_daemon_dump_log(d);
    fail_msg("vspecd '%s' exited with %d", d->name, rc);
  }
}

static void in_process_tokens(const char *model_dir, const char *method, int class_label,
                              uint64_t seed, int32_t *tokens) {
  char plugins[600], err[VSPEC_ERRLEN];
  snprintf(plugins, sizeof plugins, "%s/plugins", vs_harness_build());
  vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  vspec_dev *dev;
  vs_registry *reg;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(plugins, &host, &reg, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, model_dir, VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  vs_job job = {.method = vs_method_of(method), .class_label = class_label, .seed = seed,
                .sampling = models->defaults};
  vs_metrics mt;
  if (vs_generate(models, dev, &job, tokens, &mt, err, sizeof err)) fail_msg("%s", err);
  vs_models_close(models);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
}

static int is_png(const void *p, size_t n) {
  return n > 24 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8);
}

static uint32_t png_width(const uint8_t *p) {
  return (uint32_t)p[16] << 24 | (uint32_t)p[17] << 16 | (uint32_t)p[18] << 8 | p[19];
}

/* Submits, follows the stream, checks the map the deltas build against the result. */
static void run_and_compare(const char *model, const char *method, const char *dir,
                            uint64_t seed) {
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = (char *)model;
  s.method = (char *)method;
  s.has_class_label = 1;
  s.class_label = 3;
  s.has_seed = 1;
  s.seed = seed;
  s.has_credit = 1;
  s.credit = 64; /* enough for every round: nothing coalesces away */
  s.has_progress_interval_ms = 1;
  s.progress_interval_ms = 0;
  uint64_t rid = vs_client_submit(&c, &s), job = 0;
  int32_t map[16];
  uint8_t status[16];
  memset(map, -1, sizeof map);
  memset(status, 0, sizeof status);
  int accepted = 0, progress = 0;
  uint32_t last_done = 0;
  for (;;) {
    vs_conn_event e;
    vs_client_next(&c, 20000, &e);
    Vspec__Event *ev = e.ev;
    if (!job && ev->has_request_id && ev->request_id == rid) job = ev->job_id;
    if (!ev->has_job_id || ev->job_id != job) {
      if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("refused: %s", ev->error->message);
      vs_conn_event_free(&e);
      continue;
    }
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
      assert_int_equal(ev->seq, 0);
      assert_string_equal(ev->accepted->node, "jobs");
      assert_int_equal(ev->accepted->tokens_total, 16);
      accepted = 1;
    } else if (ev->body_case == VSPEC__EVENT__BODY_PROGRESS) {
      const Vspec__Progress *p = ev->progress;
      assert_true(accepted);
      if (p->round >= 0) {
        assert_true(p->tokens_done >= last_done);
        last_done = p->tokens_done;
        assert_int_equal(p->n_positions, p->n_tokens);
        assert_int_equal(p->n_positions, p->n_status);
        for (size_t i = 0; i < p->n_positions; i++) {
          assert_true(p->positions[i] < 16);
          map[p->positions[i]] = p->tokens[i];
          status[p->positions[i]] = (uint8_t)p->status[i];
        }
        progress++;
      }
    } else if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
      const Vspec__Result *r = ev->result;
      size_t len, tl, sl;
      const uint8_t *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
      const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tl);
      const uint8_t *st = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_STATUS_U8, &sl);
      assert_non_null(png);
      assert_true(is_png(png, len));
      assert_int_equal(png_width(png), 8);
      assert_int_equal(r->width, 8);
      assert_int_equal(tl, 64);
      assert_int_equal(sl, 16);
      int32_t want[16];
      char path[300];
      snprintf(path, sizeof path, "%s", dir);
      in_process_tokens(path, method, 3, seed, want);
      for (int i = 0; i < 16; i++) {
        int32_t got = (int32_t)((uint32_t)tok[4 * i] | (uint32_t)tok[4 * i + 1] << 8 |
                                (uint32_t)tok[4 * i + 2] << 16 | (uint32_t)tok[4 * i + 3] << 24);
        assert_int_equal(got, want[i]);
        /* the streamed deltas rebuilt the same map */
        assert_int_equal(map[i], want[i]);
        assert_int_equal(status[i], st[i]);
        assert_true(st[i] != 0);
      }
      assert_true(progress >= 1);
      assert_int_equal(r->stats->tokens, 16);
      printf("  %s on %s: %d progress events, TPF %.2f, MAL %.2f\n", method, model, progress,
             r->stats->tpf, r->stats->mal);
      vs_conn_event_free(&e);
      break;
    } else {
      fail_msg("unexpected event %d (%s)", ev->body_case,
               ev->body_case == VSPEC__EVENT__BODY_ERROR ? ev->error->message : "");
    }
    vs_conn_event_free(&e);
  }
  /* exactly one terminal event: nothing more for this job */
  vs_conn_event e;
  char err[256];
  int rc = vs_conn_recv(&c, 300, &e, err, sizeof err);
  if (rc == 1) {
    assert_true(!e.ev->has_job_id || e.ev->job_id != job ||
                e.ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT);
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
}

static void test_raw_client_result_matches_engine(void **state) {
  (void)state;
  run_and_compare("micro", "ar", fx.micro_model, 7);
  run_and_compare("self", "sd:exact@standard:shape=chain,depth=3,drafter=model", fx.self_model,
                  11);
}

/* A submit without a seed gets a fresh one, reported in Accepted and Result (and below 2^53,
 * so JSON keeps it exact): the same seed makes the same image again. Unset class = class 0. */
static void test_unset_seed(void **state) {
  (void)state;
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  uint64_t seeds[2];
  for (int k = 0; k < 2; k++) {
    Vspec__Submit s = VSPEC__SUBMIT__INIT;
    s.model = "micro";
    s.method = "ar";
    uint64_t rid = vs_client_submit(&c, &s), job = 0, accepted_seed = 0;
    int accepted = 0;
    for (;;) {
      vs_conn_event e;
      vs_client_next(&c, 20000, &e);
      Vspec__Event *ev = e.ev;
      if (!job && ev->has_request_id && ev->request_id == rid) job = ev->job_id;
      if (ev->has_job_id && ev->job_id == job && ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
        assert_true(ev->accepted->has_seed);
        accepted_seed = ev->accepted->seed;
        assert_true(accepted_seed < (1ull << 53));
        accepted = 1;
      } else if (ev->has_job_id && ev->job_id == job &&
                 ev->body_case == VSPEC__EVENT__BODY_RESULT) {
        assert_true(accepted);
        assert_true(ev->result->has_seed);
        assert_int_equal(ev->result->seed, accepted_seed);
        size_t tl;
        const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tl);
        assert_non_null(tok);
        assert_int_equal(tl, 64);
        int32_t want[16];
        in_process_tokens(fx.micro_model, "ar", 0, accepted_seed, want);
        for (int i = 0; i < 16; i++) {
          int32_t got = (int32_t)((uint32_t)tok[4 * i] | (uint32_t)tok[4 * i + 1] << 8 |
                                  (uint32_t)tok[4 * i + 2] << 16 | (uint32_t)tok[4 * i + 3] << 24);
          assert_int_equal(got, want[i]);
        }
        vs_conn_event_free(&e);
        break;
      } else if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
        fail_msg("refused: %s", ev->error->message);
      }
      vs_conn_event_free(&e);
    }
    seeds[k] = accepted_seed;
  }
  assert_true(seeds[0] != seeds[1]);
  vs_conn_close(&c);
  /* the daemon reports its node_id (the high bits of its job ids) */
  vs_conn_event e;
  vs_client_status(dm.admin_ep, &e);
  assert_true(e.ev->status->has_node_id);
  vs_conn_event_free(&e);
}

static void test_cli_generate(void **state) {
  (void)state;
  char out1[300], out2[300], prev[300], buf[8192];
  snprintf(out1, sizeof out1, "%s/a.png", fx.dir);
  snprintf(out2, sizeof out2, "%s/b.png", fx.dir);
  snprintf(prev, sizeof prev, "%s/previews", fx.dir);
  const char *a1[] = {"generate", "--server", dm.job_ep, "--model", "micro", "--class", "3",
                      "--seed", "7", "--out", out1, "--json", NULL};
  assert_int_equal(vs_run_tool("vspec", a1, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "\"event\": \"result\""));
  /* the JSON result carries the grid; seed 7 is the raw-client test's job */
  int32_t want[16];
  in_process_tokens(fx.micro_model, "ar", 3, 7, want);
  char grid[256];
  int o = snprintf(grid, sizeof grid, "\"grid\": [");
  for (int i = 0; i < 16; i++) o += snprintf(grid + o, sizeof grid - o, "%s%d", i ? ", " : "", want[i]);
  assert_non_null(strstr(buf, grid));
  const char *a2[] = {"generate", "--server", dm.job_ep, "--model", "micro", "--class", "3",
                      "--seed", "7", "--out", out2, "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", a2, NULL, 0), 0);
  /* same seed, same bytes */
  FILE *f1 = fopen(out1, "rb"), *f2 = fopen(out2, "rb");
  assert_non_null(f1);
  assert_non_null(f2);
  uint8_t b1[4096], b2[4096];
  size_t n1 = fread(b1, 1, sizeof b1, f1), n2 = fread(b2, 1, sizeof b2, f2);
  fclose(f1);
  fclose(f2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  assert_true(is_png(b1, n1));
  /* speculative decoding through the CLI's parts: --accept --param --sched --draft, previews */
  const char *a3[] = {"generate", "--server", dm.job_ep, "--model", "self", "--class", "1",
                      "--accept", "testrule", "--param", "scale=5", "--sched", "slow",
                      "--sched-param", "ms=2", "--draft", "model", "--seed", "1", "--out", out2,
                      "--previews", prev, "--preview-every", "2", "--json", NULL};
  assert_int_equal(vs_run_tool("vspec", a3, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "sd:testrule:scale=5@slow:ms=2,drafter=model"));
  assert_non_null(strstr(buf, "\"event\": \"preview\""));
  struct stat sb;
  char p0[400];
  snprintf(p0, sizeof p0, "%s/preview-000.png", prev);
  assert_int_equal(stat(p0, &sb), 0);

  /* usability: --help everywhere, exit codes scripts can use */
  const char *cmds[][3] = {{"--help"}, {"generate", "--help"}, {"status", "--help"},
                           {"plugins", "--help"}, {"cancel", "--help"}, {"ping", "--help"},
                           {"keygen", "--help"}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    assert_int_equal(vs_run_tool("vspec", cmds[i], buf, sizeof buf), 0);
    assert_non_null(strstr(buf, "usage: vspec"));
  }
  const char *bad[] = {"generate", "--class", "x", NULL};
  assert_int_equal(vs_run_tool("vspec", bad, NULL, 0), 2);
  /* vspecd --check reads each model's manifest: a directory that is not there fails it */
  char micro_arg[1200];
  snprintf(micro_arg, sizeof micro_arg, "micro=%s", fx.micro_model);
  const char *chk_ok[] = {"--model", micro_arg, "--set", "models.fmnist=", "--default-model",
                          "micro", "--check", NULL};
  assert_int_equal(vs_run_tool("vspecd", chk_ok, NULL, 0), 0);
  const char *chk_bad[] = {"--model", micro_arg, "--model", "gone=/nonexistent/model",
                           "--set", "models.fmnist=", "--default-model", "micro", "--check",
                           NULL};
  assert_int_equal(vs_run_tool("vspecd", chk_bad, NULL, 0), 2);
  const char *ver[] = {"--version", NULL};
  assert_int_equal(vs_run_tool("vspec", ver, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "plugin ABI 1."));
  /* keygen keeps an existing key pair unless --force */
  char key_prefix[300], key_file[320], before[200] = "", after[200] = "";
  snprintf(key_prefix, sizeof key_prefix, "%s/k", fx.dir);
  snprintf(key_file, sizeof key_file, "%s.key", key_prefix);
  const char *kg[] = {"keygen", key_prefix, NULL}, *kgf[] = {"keygen", "--force", key_prefix, NULL};
  assert_int_equal(vs_run_tool("vspec", kg, before, sizeof before), 0);
  assert_int_equal(vs_run_tool("vspec", kg, NULL, 0), 1);
  FILE *kf = fopen(key_file, "r");
  assert_non_null(kf);
  char line[200] = "", first[200] = "";
  while (fgets(line, sizeof line, kf))
    if (!strncmp(line, "public = ", 9)) snprintf(first, sizeof first, "%s", line + 9);
  fclose(kf);
  assert_memory_equal(first, before, 40); /* the refused run left the file alone */
  assert_int_equal(vs_run_tool("vspec", kgf, after, sizeof after), 0);
  assert_memory_not_equal(before, after, 40);
  const char *unknown_model[] = {"generate", "--server", dm.job_ep, "--model", "nope", "--out",
                                 out2, "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", unknown_model, NULL, 0), 4);
  const char *bad_class[] = {"generate", "--server", dm.job_ep, "--model", "micro", "--class",
                             "10", "--out", out2, "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", bad_class, NULL, 0), 4);
  char nowhere[300];
  snprintf(nowhere, sizeof nowhere, "ipc://%s/nobody.sock", fx.dir);
  const char *unreachable[] = {"generate", "--server", nowhere, "--timeout", "0.5", "--out",
                               out2, "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", unreachable, NULL, 0), 3);
  const char *st[] = {"status", "--admin", dm.admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", st, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "jobs: 0 waiting"));
  assert_non_null(strstr(buf, "testrule"));
  const char *pl[] = {"plugins", "list", "--admin", dm.admin_ep, "--json", NULL};
  assert_int_equal(vs_run_tool("vspec", pl, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "\"name\": \"slow\""));
}

/* Submits a slow speculative job on "self" (ms per round, chain of `depth`). */
static uint64_t submit_slow(vs_conn *c, int ms, int depth, int preview, int credit,
                            uint32_t deadline_ms) {
  char sp[64];
  snprintf(sp, sizeof sp, "ms=%d,depth=%d", ms, depth);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.accept = "exact";
  s.sched = "slow";
  s.sched_params = sp;
  s.has_seed = 1;
  s.seed = 5;
  if (preview) {
    s.has_preview = 1;
    s.preview = preview;
    s.has_preview_every_tokens = 1;
    s.preview_every_tokens = 1;
  }
  if (credit) {
    s.has_credit = 1;
    s.credit = (uint32_t)credit;
  }
  s.has_progress_interval_ms = 1; /* every round */
  s.progress_interval_ms = 0;
  if (deadline_ms) {
    s.has_deadline_ms = 1;
    s.deadline_ms = deadline_ms;
  }
  return vs_client_submit(c, &s);
}

/* The job id of request rid (reads up to its Accepted event). */
static uint64_t accepted_job(vs_conn *c, uint64_t rid) {
  for (;;) {
    vs_conn_event e;
    vs_client_next(c, 20000, &e);
    if (e.ev->has_request_id && e.ev->request_id == rid) {
      if (e.ev->body_case != VSPEC__EVENT__BODY_ACCEPTED)
        fail_msg("not accepted: %s", e.ev->body_case == VSPEC__EVENT__BODY_ERROR
                                         ? e.ev->error->message : "?");
      uint64_t id = e.ev->job_id;
      vs_conn_event_free(&e);
      return id;
    }
    vs_conn_event_free(&e);
  }
}

static void test_previews_in_order(void **state) {
  (void)state;
  int kinds[] = {VSPEC__PREVIEW_KIND__PREVIEW_LUT, VSPEC__PREVIEW_KIND__PREVIEW_DECODE};
  for (int k = 0; k < 2; k++) {
    vs_conn c;
    vs_client_open(&c, dm.job_ep);
    uint64_t rid = submit_slow(&c, 10, 1, kinds[k], 64, 0), job = 0;
    int previews = 0;
    uint32_t last = 0;
    uint64_t last_seq = 0;
    for (;;) {
      vs_conn_event e;
      vs_client_next(&c, 20000, &e);
      Vspec__Event *ev = e.ev;
      if (!job && ev->has_request_id && ev->request_id == rid) job = ev->job_id;
      if (!ev->has_job_id || ev->job_id != job) {
        vs_conn_event_free(&e);
        continue;
      }
      assert_true(ev->seq == 0 || ev->seq > last_seq);
      last_seq = ev->seq;
      if (ev->body_case == VSPEC__EVENT__BODY_PREVIEW) {
        const Vspec__Preview *p = ev->preview;
        size_t len;
        const uint8_t *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
        assert_non_null(png);
        assert_true(is_png(png, len));
        assert_int_equal(png_width(png), 8);
        assert_int_equal(p->kind, kinds[k]);
        /* coverage grows, and a preview is never of the finished image */
        assert_true(p->tokens_done > last);
        assert_true(p->tokens_done < p->tokens_total);
        last = p->tokens_done;
        previews++;
      }
      int end = ev->body_case == VSPEC__EVENT__BODY_RESULT;
      if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("%s", ev->error->message);
      vs_conn_event_free(&e);
      if (end) break;
    }
    printf("  preview kind %d: %d previews\n", kinds[k], previews);
    assert_true(previews >= 4);
    vs_conn_close(&c);
  }
}

static void test_credit_bounds_events(void **state) {
  (void)state;
  /* Credit 2 and none returned: at most 2 progress/preview events, then the result. */
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  uint64_t rid = submit_slow(&c, 5, 1, VSPEC__PREVIEW_KIND__PREVIEW_LUT, 2, 0), job = 0;
  vs_conn_event e;
  int before = vs_client_until_end(&c, rid, &job, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_RESULT);
  vs_conn_event_free(&e);
  assert_true(before <= 3); /* accepted + 2 */
  /* Returning credit as events are handled gets the stream going again. */
  rid = submit_slow(&c, 5, 1, 0, 1, 0);
  job = 0;
  int progress = 0;
  for (;;) {
    vs_client_next(&c, 20000, &e);
    if (!job && e.ev->has_request_id && e.ev->request_id == rid) job = e.ev->job_id;
    int end = e.ev->body_case == VSPEC__EVENT__BODY_RESULT;
    if (e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS) {
      progress++;
      vs_client_credit(&c, job, 1);
    }
    vs_conn_event_free(&e);
    if (end) break;
  }
  assert_true(progress >= 4);
  vs_conn_close(&c);
}

static void test_cancel(void **state) {
  (void)state;
  wait_idle();
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  /* a running job, cancelled by its client after its first progress event */
  uint64_t rid = submit_slow(&c, 80, 1, 0, 64, 0);
  uint64_t job = accepted_job(&c, rid);
  /* a second one waits in the queue (one worker), cancelled there */
  uint64_t rid2 = submit_slow(&c, 80, 1, 0, 64, 0);
  uint64_t job2 = accepted_job(&c, rid2);
  vs_conn_event e;
  for (;;) {
    vs_client_next(&c, 20000, &e);
    int p = e.ev->has_job_id && e.ev->job_id == job &&
            e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
    vs_conn_event_free(&e);
    if (p) break;
  }
  double t0 = vs_harness_now();
  vs_client_cancel(&c, job2);
  vs_client_cancel(&c, job);
  int ended = 0, ended2 = 0;
  while (!ended || !ended2) {
    vs_client_next(&c, 20000, &e);
    Vspec__Event *ev = e.ev;
    if (ev->body_case == VSPEC__EVENT__BODY_ERROR && ev->has_job_id) {
      assert_int_equal(ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
      assert_non_null(strstr(ev->error->message, "cancelled by its client"));
      if (ev->job_id == job) ended++;
      if (ev->job_id == job2) ended2++;
    }
    assert_true(ev->body_case != VSPEC__EVENT__BODY_RESULT);
    vs_conn_event_free(&e);
  }
  /* stopped at a round boundary, long before its 16 rounds of 80 ms */
  assert_true(vs_harness_now() - t0 < 0.8);
  /* cancelling again: no such job any more */
  vs_client_cancel(&c, job);
  vs_client_next(&c, 5000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_NOT_FOUND);
  vs_conn_event_free(&e);

  /* an operator cancels through the admin endpoint with the CLI */
  rid = submit_slow(&c, 40, 1, 0, 64, 0);
  job = accepted_job(&c, rid);
  char id[32];
  snprintf(id, sizeof id, "%llu", (unsigned long long)job);
  const char *args[] = {"cancel", id, "--admin", dm.admin_ep, NULL};
  char out[512];
  assert_int_equal(vs_run_tool("vspec", args, out, sizeof out), 0);
  assert_non_null(strstr(out, "being cancelled"));
  for (;;) {
    vs_client_next(&c, 20000, &e);
    int end = e.ev->has_job_id && e.ev->job_id == job &&
              e.ev->body_case == VSPEC__EVENT__BODY_ERROR;
    if (end) {
      assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
      assert_non_null(strstr(e.ev->error->message, "operator"));
    }
    vs_conn_event_free(&e);
    if (end) break;
  }
  const char *none[] = {"cancel", "999999", "--admin", dm.admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", none, NULL, 0), 4);
  /* a client cannot cancel someone else's job on the job endpoint */
  rid = submit_slow(&c, 20, 1, 0, 64, 0);
  job = accepted_job(&c, rid);
  vs_conn other;
  vs_client_open(&other, dm.job_ep);
  vs_client_cancel(&other, job);
  vs_client_next(&other, 5000, &e);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_NOT_FOUND);
  vs_conn_event_free(&e);
  vs_conn_close(&other);
  uint64_t j2 = job;
  vs_client_until_end(&c, 0, &j2, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_RESULT);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* A status or plugins request on `c`: the reply event (caller frees). */
static void ask(vs_conn *c, Vspec__Request__BodyCase body, vs_conn_event *e) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
  Vspec__PluginsRequest pr = VSPEC__PLUGINS_REQUEST__INIT;
  r.body_case = body;
  if (body == VSPEC__REQUEST__BODY_STATUS) r.status = &sr;
  else r.plugins = &pr;
  char err[256];
  if (vs_conn_call(c, &r, 10000, e, err, sizeof err) != 1) fail_msg("no answer: %s", err);
}

static int any_model_dir(const Vspec__StatusReply *st) {
  for (size_t i = 0; i < st->n_models; i++)
    if (st->models[i]->dir) return 1;
  return 0;
}

/* Issue 32, finding 6: the job endpoint's status told any client the other clients' running
 * job ids, the model directories and (plugins) the plugin directory. Now a client sees its own
 * jobs and the counts; the admin endpoint sees everything. The CLI says which it got. */
static void test_status_by_endpoint(void **state) {
  (void)state;
  wait_idle();
  vs_conn a, b, adm;
  vs_client_open(&a, dm.job_ep);
  vs_client_open(&b, dm.job_ep);
  vs_client_open(&adm, dm.admin_ep);
  uint64_t job = accepted_job(&a, submit_slow(&a, 40, 1, 0, 64, 0));
  vs_conn_event e;
  for (;;) { /* running once it reports its first round */
    vs_client_next(&a, 20000, &e);
    int p = e.ev->has_job_id && e.ev->job_id == job &&
            e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
    vs_conn_event_free(&e);
    if (p) break;
  }
  /* another client: the counts, no job id, no path */
  ask(&b, VSPEC__REQUEST__BODY_STATUS, &e);
  const Vspec__StatusReply *st = e.ev->status;
  assert_true(st->own_jobs_only);
  assert_int_equal(st->running, 1);
  assert_int_equal(st->n_workers, 0);
  assert_true(st->n_models > 0);
  assert_false(any_model_dir(st));
  vs_conn_event_free(&e);
  ask(&b, VSPEC__REQUEST__BODY_PLUGINS, &e);
  assert_true(e.ev->plugins->n_plugins > 0);
  assert_null(e.ev->plugins->plugin_dir);
  vs_conn_event_free(&e);
  /* the job's own client: its job */
  ask(&a, VSPEC__REQUEST__BODY_STATUS, &e);
  st = e.ev->status;
  assert_int_equal(st->n_workers, 1);
  assert_int_equal(st->workers[0]->job_id, job);
  assert_false(any_model_dir(st));
  vs_conn_event_free(&e);
  /* the admin endpoint: everything */
  ask(&adm, VSPEC__REQUEST__BODY_STATUS, &e);
  st = e.ev->status;
  assert_false(st->own_jobs_only);
  assert_int_equal(st->n_workers, 1);
  assert_int_equal(st->workers[0]->job_id, job);
  assert_true(any_model_dir(st));
  vs_conn_event_free(&e);
  ask(&adm, VSPEC__REQUEST__BODY_PLUGINS, &e);
  assert_string_equal(e.ev->plugins->plugin_dir, fx.plugins);
  vs_conn_event_free(&e);
  /* the CLI on each */
  char out[16384], id[32];
  snprintf(id, sizeof id, "job %llu", (unsigned long long)job);
  const char *on_job[] = {"status", "--server", dm.job_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", on_job, out, sizeof out), 0);
  const char *mine = strstr(out, "your jobs:");
  printf("  vspec status --server: %.*s\n", mine ? (int)strcspn(mine, "\n") : 0, mine ? mine : "");
  assert_non_null(strstr(out, "your jobs: none running (the job endpoint shows a client its own "
                              "jobs and no paths; every job and the directories need the admin "
                              "endpoint, --admin)"));
  assert_null(strstr(out, id));
  assert_null(strstr(out, fx.dir));
  const char *on_admin[] = {"status", "--admin", dm.admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", on_admin, out, sizeof out), 0);
  assert_non_null(strstr(out, "workers:"));
  assert_non_null(strstr(out, id));
  assert_non_null(strstr(out, fx.self_model));
  const char *plugins[] = {"plugins", "list", "--server", dm.job_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", plugins, out, sizeof out), 0);
  assert_non_null(strstr(out, "the directory is shown on the admin endpoint only"));
  assert_null(strstr(out, fx.dir));
  vs_client_cancel(&a, job);
  for (int end = 0; !end;) {
    vs_client_next(&a, 20000, &e);
    end = e.ev->has_job_id && e.ev->job_id == job &&
          (e.ev->body_case == VSPEC__EVENT__BODY_ERROR || e.ev->body_case == VSPEC__EVENT__BODY_RESULT);
    vs_conn_event_free(&e);
  }
  vs_conn_close(&adm);
  vs_conn_close(&b);
  vs_conn_close(&a);
}

static void test_deadline(void **state) {
  (void)state;
  wait_idle();
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  uint64_t rid = submit_slow(&c, 40, 1, 0, 64, 150), job = 0;
  vs_conn_event e;
  vs_client_until_end(&c, rid, &job, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_DEADLINE);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

static void test_queue_full(void **state) {
  (void)state;
  wait_idle();
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  /* one running, two waiting (queue.size = 2), the fourth is refused. The first must be
   * running before the others come: a worker takes the next job only after it has cleaned
   * up the last one, which under ASan can take longer than two submits. */
  uint64_t jobs[3];
  vs_conn_event e;
  jobs[0] = accepted_job(&c, submit_slow(&c, 40, 1, 0, 64, 0));
  for (;;) {
    vs_client_next(&c, 20000, &e);
    int p = e.ev->has_job_id && e.ev->job_id == jobs[0] &&
            e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
    vs_conn_event_free(&e);
    if (p) break;
  }
  for (int i = 1; i < 3; i++) jobs[i] = accepted_job(&c, submit_slow(&c, 40, 1, 0, 64, 0));
  uint64_t rid = submit_slow(&c, 40, 1, 0, 64, 0);
  for (;;) {
    vs_client_next(&c, 20000, &e);
    if (e.ev->has_request_id && e.ev->request_id == rid) break;
    vs_conn_event_free(&e);
  }
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_BUSY);
  assert_true(e.ev->error->has_retry_after_ms && e.ev->error->retry_after_ms > 0);
  assert_non_null(strstr(e.ev->error->message, "queue is full"));
  vs_conn_event_free(&e);
  /* the CLI maps it to exit status 5 */
  char out[300];
  snprintf(out, sizeof out, "%s/busy.png", fx.dir);
  const char *args[] = {"generate", "--server", dm.job_ep, "--model", "micro", "--out", out,
                        "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", args, NULL, 0), 5);
  for (int i = 0; i < 3; i++) vs_client_cancel(&c, jobs[i]);
  int ended = 0;
  while (ended < 3) {
    vs_client_next(&c, 20000, &e);
    if (e.ev->body_case == VSPEC__EVENT__BODY_ERROR && e.ev->has_job_id) ended++;
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
  vs_client_status(dm.admin_ep, &e);
  assert_true(e.ev->status->totals->rejected_busy >= 2);
  vs_conn_event_free(&e);
}

static void test_client_gone_mid_job(void **state) {
  (void)state;
  wait_idle();
  vs_conn_event e;
  vs_client_status(dm.admin_ep, &e);
  uint64_t lost0 = e.ev->status->totals->clients_lost;
  uint64_t cancelled0 = e.ev->status->totals->cancelled;
  vs_conn_event_free(&e);
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  /* 16 rounds of 100 ms: 1.6 s if nobody stops it; a second job waits behind it */
  uint64_t job = accepted_job(&c, submit_slow(&c, 100, 1, VSPEC__PREVIEW_KIND__PREVIEW_LUT, 4, 0));
  accepted_job(&c, submit_slow(&c, 100, 1, 0, 4, 0));
  for (;;) {
    vs_client_next(&c, 20000, &e);
    int p = e.ev->has_job_id && e.ev->job_id == job &&
            e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
    vs_conn_event_free(&e);
    if (p) break;
  }
  double t0 = vs_harness_now();
  int linger = 0;
  zmq_setsockopt(c.sock, ZMQ_LINGER, &linger, sizeof linger);
  vs_conn_close(&c); /* the client vanishes without a word */
  for (;;) {
    vs_client_status(dm.admin_ep, &e);
    const Vspec__StatusReply *s = e.ev->status;
    int done = s->running == 0 && s->queued == 0 && s->clients == 0;
    uint64_t lost = s->totals->clients_lost, cancelled = s->totals->cancelled;
    vs_conn_event_free(&e);
    if (done) {
      assert_int_equal(lost, lost0 + 1);
      assert_true(cancelled >= cancelled0 + 2);
      break;
    }
    if (vs_harness_now() - t0 > 10) fail_msg("the lost client's jobs are still there");
    vs_harness_sleep_ms(20);
  }
  /* well before the running job's natural end plus the queued one's */
  printf("  jobs of the lost client gone after %.3f s\n", vs_harness_now() - t0);
  assert_true(vs_harness_now() - t0 < 1.5);
}

/* Defect 6 (docs/RELIABILITY.md), end to end: one worker, a peer with a backlog, then a
 * newcomer. Its job must start before the backlog has drained: when its result arrives, most
 * of the peer's jobs are still waiting. (Before, it ran after all of them: only running jobs
 * counted, and with one worker none of the peer's is running when the next job is picked.) */
static void test_newcomer_not_behind_backlog(void **state) {
  (void)state;
  vs_daemon d;
  const char *extra[] = {"--workers", "1", "--set", "queue.size=32", "--set",
                         "queue.per_client=32", NULL};
  vs_daemon_start(&d, &fx, "fair", extra);
  enum { BACKLOG = 8 };
  vs_conn a, b;
  vs_client_open(&a, d.job_ep);
  for (int i = 0; i < BACKLOG; i++) accepted_job(&a, submit_slow(&a, 20, 1, 0, 1, 0));
  vs_client_open(&b, d.job_ep);
  uint64_t rid = submit_slow(&b, 20, 1, 0, 1, 0), job = 0;
  vs_conn_event e;
  vs_client_until_end(&b, rid, &job, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_RESULT);
  vs_conn_event_free(&e);
  vs_client_status(d.admin_ep, &e);
  uint32_t waiting = e.ev->status->queued;
  vs_conn_event_free(&e);
  printf("  the newcomer's job finished with %u of the peer's %d jobs still waiting\n", waiting,
         BACKLOG);
  /* ahead of it: the peer's job that was running, at most one more */
  assert_true(waiting >= BACKLOG - 3);
  int linger = 0;
  zmq_setsockopt(a.sock, ZMQ_LINGER, &linger, sizeof linger);
  vs_conn_close(&a); /* its jobs are dropped */
  vs_conn_close(&b);
  stop_ok(&d);
}

/* A plain ZeroMQ proxy (ROUTER front, DEALER to the daemon) in a thread: the way any device
 * stacks in front of vspecd, its clients' ids reaching the daemon as a routing frame after
 * the proxy's own (docs/DESIGN.md, "Wire protocol rules"). */
typedef struct proxy {
  void *ctx, *front, *back, *ctl;
  pthread_t thread;
} proxy;

static void *proxy_main(void *arg) {
  proxy *p = arg;
  zmq_proxy_steerable(p->front, p->back, NULL, p->ctl); /* until TERMINATE */
  return NULL;
}

static void proxy_start(proxy *p, const char *front, const char *daemon_ep) {
  int zero = 0;
  p->ctx = zmq_ctx_new();
  p->front = zmq_socket(p->ctx, ZMQ_ROUTER);
  p->back = zmq_socket(p->ctx, ZMQ_DEALER);
  p->ctl = zmq_socket(p->ctx, ZMQ_PAIR);
  void *socks[] = {p->front, p->back, p->ctl};
  for (int i = 0; i < 3; i++) zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
  assert_int_equal(zmq_bind(p->front, front), 0);
  assert_int_equal(zmq_connect(p->back, daemon_ep), 0);
  assert_int_equal(zmq_bind(p->ctl, "inproc://proxy-ctl"), 0);
  assert_int_equal(pthread_create(&p->thread, NULL, proxy_main, p), 0);
}

static void proxy_stop(proxy *p) {
  void *cmd = zmq_socket(p->ctx, ZMQ_PAIR);
  assert_int_equal(zmq_connect(cmd, "inproc://proxy-ctl"), 0);
  assert_int_equal(zmq_send(cmd, "TERMINATE", 9, 0), 9);
  pthread_join(p->thread, NULL);
  zmq_close(cmd);
  zmq_close(p->front);
  zmq_close(p->back);
  zmq_close(p->ctl);
  zmq_ctx_term(p->ctx);
}

/* Behind a proxy a daemon sees one connection for all the proxy's clients (defect 6: a
 * client is a connection), yet each client's events still go back to it alone, and each
 * client whose job waits still hears the daemon's heartbeats along its own envelope (vspec
 * gives up after --timeout of silence). */
static void test_proxied_clients_apart(void **state) {
  (void)state;
  vs_daemon d;
  const char *extra[] = {"--workers", "1", "--set", "limits.heartbeat_ivl_ms=50", NULL};
  vs_daemon_start(&d, &fx, "apart", extra);
  char front[300];
  snprintf(front, sizeof front, "ipc://%s/apart-front.sock", fx.dir);
  proxy px;
  proxy_start(&px, front, d.job_ep);
  vs_conn a, b;
  vs_client_open(&a, front);
  vs_client_open(&b, front);
  uint64_t ja = accepted_job(&a, submit_slow(&a, 40, 1, 0, 1, 0)); /* runs some 0.4 s */
  uint64_t jb = accepted_job(&b, submit_slow(&b, 40, 1, 0, 1, 0)); /* waits behind it */
  int heartbeats = 0;
  double end = vs_harness_now() + 2;
  while (heartbeats < 2) {
    if (vs_harness_now() > end) fail_msg("no heartbeats for a client waiting behind a proxy");
    vs_conn_event e;
    char err[256];
    int rc = vs_conn_recv(&b, 100, &e, err, sizeof err);
    if (rc < 0) fail_msg("%s", err);
    if (rc == 0) continue;
    if (e.ev->has_job_id && e.ev->job_id == ja) fail_msg("client b got an event of a's job");
    heartbeats += e.ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT;
    vs_conn_event_free(&e);
  }
  vs_conn_event e;
  vs_client_status(d.admin_ep, &e);
  assert_int_equal(e.ev->status->clients, 1); /* the proxy */
  vs_conn_event_free(&e);
  vs_client_cancel(&a, ja);
  vs_client_cancel(&b, jb);
  uint64_t j = ja;
  vs_client_until_end(&a, 0, &j, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  vs_conn_event_free(&e);
  j = jb;
  vs_client_until_end(&b, 0, &j, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  vs_conn_event_free(&e);
  vs_conn_close(&a);
  vs_conn_close(&b);
  proxy_stop(&px);
  stop_ok(&d);
}

/* Defect 8 (docs/RELIABILITY.md): a job that had finished on its worker, but whose news the
 * loop had not yet taken from the mailbox, was unlinked uncounted when its client was found
 * gone just then. To hold that window open, a reload of sched_slowload (300 ms to load, on
 * the loop thread, under the registry's lock) on the admin endpoint keeps the loop busy
 * while the client's short job, past its start (it holds its plugins), finishes; the
 * client's last message, a submit sent while the reload runs and read right after it, finds
 * the client gone (its Accepted is unroutable). Every job must be counted exactly once. */
static void test_totals_count_every_job(void **state) {
  (void)state;
  vs_fixture_install(&fx, "slowload.so", "sched_slowload.so");
  vs_daemon d;
  const char *extra[] = {"--workers", "1", NULL};
  vs_daemon_start(&d, &fx, "totals", extra);
  vs_conn adm;
  vs_client_open(&adm, d.admin_ep);
  enum { ROUNDS = 3 };
  for (int round = 0; round < ROUNDS; round++) {
    vs_conn a;
    vs_client_open(&a, d.job_ep);
    /* some 10 rounds of 8 ms; running once it reports its first round */
    uint64_t job = accepted_job(&a, submit_slow(&a, 8, 1, 0, 1, 0));
    for (;;) {
      vs_conn_event e;
      vs_client_next(&a, 20000, &e);
      int p = e.ev->has_job_id && e.ev->job_id == job &&
              e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
      vs_conn_event_free(&e);
      if (p) break;
    }
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__ReloadRequest rl = VSPEC__RELOAD_REQUEST__INIT;
    rl.name = "sched/slowload";
    r.body_case = VSPEC__REQUEST__BODY_RELOAD;
    r.reload = &rl;
    char err[256];
    if (vs_conn_send(&adm, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
    vs_harness_sleep_ms(30); /* into the reload */
    submit_slow(&a, 8, 1, 0, 1, 0);
    vs_conn_close(&a); /* the submit goes out (linger), then the client is gone */
    vs_conn_event e;
    vs_client_next(&adm, 20000, &e);
    if (e.ev->body_case != VSPEC__EVENT__BODY_RELOAD)
      fail_msg("reload: %s", e.ev->body_case == VSPEC__EVENT__BODY_ERROR ? e.ev->error->message
                                                                        : "unexpected answer");
    vs_conn_event_free(&e);
  }
  vs_conn_close(&adm);
  wait_idle_at(d.admin_ep);
  /* The last job is counted when the loop hears from its worker, just after it is idle; and
   * the last round's submit may still wait behind the reload's answer (the loop answers the
   * admin socket first), so the status is asked again until both are in. */
  double end = vs_harness_now() + 2;
  for (;;) {
    vs_conn_event e;
    vs_client_status(d.admin_ep, &e);
    const Vspec__Totals *t = e.ev->status->totals;
    uint64_t sub = t->submitted, ended = t->completed + t->failed + t->cancelled;
    printf("  submitted %llu, completed %llu, failed %llu, cancelled %llu\n",
           (unsigned long long)sub, (unsigned long long)t->completed,
           (unsigned long long)t->failed, (unsigned long long)t->cancelled);
    vs_conn_event_free(&e);
    assert_true(sub <= 2 * ROUNDS && ended <= sub);
    if (sub == 2 * ROUNDS && ended == sub) break;
    if (vs_harness_now() > end)
      fail_msg("%llu of %d jobs submitted, %llu counted", (unsigned long long)sub, 2 * ROUNDS,
               (unsigned long long)ended);
    vs_harness_sleep_ms(50);
  }
  stop_ok(&d);
  char path[300];
  snprintf(path, sizeof path, "%s/sched_slowload.so", fx.plugins);
  unlink(path); /* later daemons need not wait for it */
}

/* ---- a continuous-token (MAR) model ------------------------------------------------------ */

enum { MAR_W = 16, MAR_GRID = 16, MAR_CELL = 4, MAR_PX = MAR_W * MAR_W * 3 };

/* The image the engine makes in process: latents through the model's latent decoder. */
static void in_process_pixels(const char *model_dir, const char *method, int class_label,
                              uint64_t seed, uint8_t *rgb) {
  char plugins[600], err[VSPEC_ERRLEN];
  snprintf(plugins, sizeof plugins, "%s/plugins", vs_harness_build());
  vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  vspec_dev *dev;
  vs_registry *reg;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(plugins, &host, &reg, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, model_dir, VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(vs_models_latent_count(models), MAR_GRID * 16);
  float *latents = calloc(vs_models_latent_count(models), sizeof *latents);
  assert_non_null(latents);
  vs_job job = {.method = vs_method_of(method), .class_label = class_label, .seed = seed,
                .sampling = models->defaults, .latents = latents};
  vs_metrics mt;
  if (vs_generate(models, dev, &job, NULL, &mt, err, sizeof err)) fail_msg("%s", err);
  if (vs_models_decode(models, dev, NULL, latents, rgb, err, sizeof err)) fail_msg("%s", err);
  free(latents);
  vs_models_close(models);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
}

/* Decodes a PNG of MAR_W x MAR_W into rgb (libpng's simplified API). */
static void png_pixels(const void *png, size_t len, uint8_t *rgb) {
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  assert_true(png_image_begin_read_from_memory(&im, png, len));
  assert_int_equal(im.width, MAR_W);
  assert_int_equal(im.height, MAR_W);
  im.format = PNG_FORMAT_RGB;
  assert_true(png_image_finish_read(&im, NULL, rgb, 0, NULL));
}

/* Grid cells (MAR_CELL x MAR_CELL pixels each) whose pixels are the same in a and b. */
static int same_cells(const uint8_t *a, const uint8_t *b) {
  int same = 0;
  for (int cy = 0; cy < MAR_W / MAR_CELL; cy++)
    for (int cx = 0; cx < MAR_W / MAR_CELL; cx++) {
      int eq = 1;
      for (int y = cy * MAR_CELL; y < (cy + 1) * MAR_CELL; y++)
        eq &= !memcmp(a + ((size_t)y * MAR_W + cx * MAR_CELL) * 3,
                      b + ((size_t)y * MAR_W + cx * MAR_CELL) * 3, MAR_CELL * 3);
      same += eq;
    }
  return same;
}


/* Cross-job batching ([workers] batch): jobs in flight together, speculative and AR, one of
 * them cancelled mid-run (it leaves the gate the others batch in), all end as they should;
 * results agree with the engine alone (float rounding may move a sample: at most 2 of 16
 * tokens), and the daemon logs its gate's work and stops cleanly (ASan: no leak). */
static void test_batched_jobs(void **state) {
  (void)state;
  vs_daemon d;
  const char *extra[] = {"--workers", "4", "--set", "workers.batch=4", NULL};
  vs_daemon_start(&d, &fx, "batch", extra);
  vs_conn c;
  vs_client_open(&c, d.job_ep);
  enum { NJ = 6 };
  const char *methods[NJ] = {"sd:exact@standard:shape=chain,depth=3,drafter=model", "ar",
                             "sd:exact@standard:shape=chain,depth=2,drafter=model", "ar",
                             "sd:exact@standard:shape=chain,depth=3,drafter=model", "ar"};
  uint64_t rid[NJ], job[NJ];
  uint64_t slow = submit_slow(&c, 30, 1, 0, 64, 0);
  uint64_t slow_job = accepted_job(&c, slow);
  for (int i = 0; i < NJ; i++) {
    Vspec__Submit sb = VSPEC__SUBMIT__INIT;
    sb.model = "self";
    sb.method = (char *)methods[i];
    sb.has_seed = 1;
    sb.seed = 40 + (uint64_t)i;
    sb.has_class_label = 1;
    sb.class_label = 3;
    rid[i] = vs_client_submit(&c, &sb);
  }
  for (int i = 0; i < NJ; i++) job[i] = 0;
  int ended = 0, slow_ended = 0, cancelled = 0;
  while (ended < NJ || !slow_ended) {
    vs_conn_event e;
    vs_client_next(&c, 30000, &e);
    Vspec__Event *ev = e.ev;
    for (int i = 0; i < NJ; i++)
      if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED && ev->request_id == rid[i])
        job[i] = ev->job_id;
    if (ev->has_job_id && ev->job_id == slow_job) {
      if (ev->body_case == VSPEC__EVENT__BODY_PROGRESS && !cancelled) {
        vs_client_cancel(&c, slow_job);
        cancelled = 1;
      } else if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
        assert_int_equal(ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
        slow_ended = 1;
      }
      assert_true(ev->body_case != VSPEC__EVENT__BODY_RESULT);
    }
    for (int i = 0; i < NJ; i++) {
      if (!job[i] || !ev->has_job_id || ev->job_id != job[i]) continue;
      if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("job %d: %s", i, ev->error->message);
      if (ev->body_case != VSPEC__EVENT__BODY_RESULT) continue;
      size_t tl;
      const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tl);
      assert_int_equal(tl, 64);
      int32_t want[16];
      in_process_tokens(fx.self_model, methods[i], 3, 40 + (uint64_t)i, want);
      int diff = 0;
      for (int k = 0; k < 16; k++)
        diff += (int32_t)((uint32_t)tok[4 * k] | (uint32_t)tok[4 * k + 1] << 8 |
                          (uint32_t)tok[4 * k + 2] << 16 | (uint32_t)tok[4 * k + 3] << 24) !=
                want[k];
      if (diff > 2) fail_msg("job %d (%s): %d of 16 tokens differ from the engine alone", i,
                             methods[i], diff);
      ended++;
    }
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
  wait_idle_at(d.admin_ep);
  stop_ok(&d);
  FILE *f = fopen(d.log, "r");
  assert_non_null(f);
  char line[1024];
  int on = 0, summary = 0;
  while (fgets(line, sizeof line, f)) {
    on |= strstr(line, "cross-job batching on") != NULL;
    summary |= strstr(line, "forwards (target and draft) in") != NULL;
  }
  fclose(f);
  assert_true(on);
  assert_true(summary);
}

/* Runs `method` on "mar" with previews of `kind` at every round and checks the stream: the
 * map the deltas build has exactly tokens_done revealed positions at every step (positions
 * come in a random order, so a prefix would lose some), token values are 0, previews are
 * partial and agree with the final image on at least the revealed cells (the micro model's
 * pixel-patch tokenizer decodes each token to its own cell; unknown cells are grey), and the
 * result is the in-process engine's image. */
static void run_mar(const char *method, int kind, uint64_t seed) {
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "mar";
  s.method = (char *)method;
  s.has_class_label = 1;
  s.class_label = 1;
  s.has_seed = 1;
  s.seed = seed;
  s.has_credit = 1;
  s.credit = 64;
  s.has_progress_interval_ms = 1;
  s.progress_interval_ms = 0;
  s.has_preview = 1;
  s.preview = kind;
  s.has_preview_every_tokens = 1;
  s.preview_every_tokens = 1;
  uint64_t rid = vs_client_submit(&c, &s), job = 0;
  uint8_t status[MAR_GRID] = {0};
  enum { MAX_PREVIEWS = 32 };
  uint8_t *previews = calloc(MAX_PREVIEWS, MAR_PX);
  uint32_t preview_done[MAX_PREVIEWS];
  assert_non_null(previews);
  int n_previews = 0, progress = 0, not_prefix = 0;
  uint32_t last_done = 0;
  for (;;) {
    vs_conn_event e;
    vs_client_next(&c, 20000, &e);
    Vspec__Event *ev = e.ev;
    if (!job && ev->has_request_id && ev->request_id == rid) job = ev->job_id;
    if (!ev->has_job_id || ev->job_id != job) {
      if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("refused: %s", ev->error->message);
      vs_conn_event_free(&e);
      continue;
    }
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
      assert_int_equal(ev->accepted->tokens_total, MAR_GRID);
    } else if (ev->body_case == VSPEC__EVENT__BODY_PROGRESS && ev->progress->round >= 0) {
      const Vspec__Progress *p = ev->progress;
      assert_true(p->tokens_done >= last_done);
      last_done = p->tokens_done;
      assert_int_equal(p->n_positions, p->n_status);
      assert_int_equal(p->n_positions, p->n_tokens);
      for (size_t i = 0; i < p->n_positions; i++) {
        assert_true(p->positions[i] < MAR_GRID);
        assert_int_equal(p->tokens[i], 0);
        status[p->positions[i]] = (uint8_t)p->status[i];
      }
      uint32_t revealed = 0;
      int prefix = 1;
      for (int i = 0; i < MAR_GRID; i++) {
        revealed += status[i] != 0;
        if (status[i] && i > 0 && !status[i - 1]) prefix = 0;
      }
      assert_int_equal(revealed, p->tokens_done);
      not_prefix |= !prefix;
      progress++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_PREVIEW) {
      const Vspec__Preview *p = ev->preview;
      size_t len;
      const uint8_t *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
      assert_non_null(png);
      assert_true(is_png(png, len));
      assert_int_equal(p->kind, kind);
      assert_int_equal(p->width, MAR_W);
      assert_true(p->tokens_done > 0 && p->tokens_done < p->tokens_total);
      if (n_previews < MAX_PREVIEWS) {
        png_pixels(png, len, previews + (size_t)n_previews * MAR_PX);
        preview_done[n_previews] = p->tokens_done;
      }
      n_previews++;
    } else if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
      const Vspec__Result *r = ev->result;
      size_t len, tl, sl;
      const uint8_t *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
      const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tl);
      const uint8_t *st = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_STATUS_U8, &sl);
      assert_non_null(png);
      assert_true(is_png(png, len));
      assert_int_equal(png_width(png), MAR_W);
      assert_int_equal(r->width, MAR_W);
      assert_int_equal(r->height, MAR_W);
      assert_int_equal(tl, 4 * MAR_GRID);
      assert_int_equal(sl, MAR_GRID);
      for (size_t i = 0; i < tl; i++) assert_int_equal(tok[i], 0);
      for (int i = 0; i < MAR_GRID; i++) {
        assert_true(st[i] != 0);
        assert_int_equal(status[i], st[i]); /* the deltas rebuilt the final map */
      }
      assert_int_equal(r->stats->tokens, MAR_GRID);
      assert_non_null(strstr(r->describe, "num_iter="));
      uint8_t got[MAR_PX], want[MAR_PX];
      png_pixels(png, len, got);
      in_process_pixels(mar_model, method, 1, seed, want);
      assert_memory_equal(got, want, MAR_PX);
      int n = n_previews < MAX_PREVIEWS ? n_previews : MAX_PREVIEWS;
      for (int k = 0; k < n; k++) {
        int same = same_cells(previews + (size_t)k * MAR_PX, got);
        assert_true(same >= (int)preview_done[k]);
        assert_true(same < MAR_GRID);
      }
      printf("  %s on mar: %d progress events, %d previews (kind %d), %llu target forwards\n",
             method, progress, n_previews, kind, (unsigned long long)r->stats->target_forwards);
      vs_conn_event_free(&e);
      break;
    } else if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      fail_msg("job failed: %s", ev->error->message);
    }
    vs_conn_event_free(&e);
  }
  assert_true(progress >= 2);
  assert_true(n_previews >= 1);
  assert_true(not_prefix);
  free(previews);
  vs_conn_close(&c);
}

static void test_mar_model(void **state) {
  (void)state;
  wait_idle();
  run_mar("ar", VSPEC__PREVIEW_KIND__PREVIEW_LUT, 3);
  run_mar("sd:continuous@standard:shape=chain,depth=2", VSPEC__PREVIEW_KIND__PREVIEW_DECODE, 4);

  /* a discrete rule on continuous tokens is refused with the reason, and the daemon goes on */
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "mar";
  s.method = "sd:exact@standard:shape=chain,depth=2";
  uint64_t rid = vs_client_submit(&c, &s), job = 0;
  vs_conn_event e;
  vs_client_until_end(&c, rid, &job, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_INVALID);
  assert_non_null(strstr(e.ev->error->message, "continuous"));
  printf("  sd:exact on mar: %s\n", e.ev->error->message);
  vs_conn_event_free(&e);
  /* and the continuous rule on a discrete model the same way */
  Vspec__Submit d = VSPEC__SUBMIT__INIT;
  d.model = "self";
  d.method = "sd:continuous@standard:shape=chain,depth=2";
  rid = vs_client_submit(&c, &d);
  job = 0;
  vs_client_until_end(&c, rid, &job, 20000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_non_null(strstr(e.ev->error->message, "discrete tokens"));
  vs_conn_event_free(&e);
  vs_conn_close(&c);
  assert_true(vs_daemon_alive(&dm));

  /* The CLI: continuous SD with --num-iter and --cfg-schedule, previews written; the job after
   * the refused ones runs. */
  char out[300], prev[300], buf[8192];
  snprintf(out, sizeof out, "%s/mar.png", fx.dir);
  snprintf(prev, sizeof prev, "%s/mar-previews", fx.dir);
  const char *a1[] = {"generate", "--server", dm.job_ep, "--model", "mar", "--class", "2",
                      "--accept", "continuous", "--sched-param", "shape=chain,depth=2",
                      "--num-iter", "6", "--cfg-schedule", "constant", "--previews", prev,
                      "--preview-every", "1", "--out", out, "--json", NULL};
  assert_int_equal(vs_run_tool("vspec", a1, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "\"event\": \"result\""));
  assert_non_null(strstr(buf, "\"width\": 16, \"height\": 16"));
  assert_non_null(strstr(buf, "num_iter=6 cfg_schedule=constant"));
  assert_non_null(strstr(buf, "\"event\": \"preview\""));
  struct stat sb;
  char p0[400];
  snprintf(p0, sizeof p0, "%s/preview-000.png", prev);
  assert_int_equal(stat(p0, &sb), 0);
  assert_int_equal(stat(out, &sb), 0);
  /* num_iter reaches the sampler: ar runs one target pass per step */
  const char *a2[] = {"generate", "--server", dm.job_ep, "--model", "mar", "--num-iter", "3",
                      "--out", out, "--json", NULL};
  assert_int_equal(vs_run_tool("vspec", a2, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "\"target_forwards\": 3,"));
  /* refusals map to exit status 4 and name the field */
  const char *bad[][16] = {
      {"generate", "--server", dm.job_ep, "--model", "mar", "--accept", "exact", "--out", out,
       "--json", NULL},
      {"generate", "--server", dm.job_ep, "--model", "mar", "--top-k", "5", "--out", out,
       "--json", NULL},
      {"generate", "--server", dm.job_ep, "--model", "mar", "--num-iter", "17", "--out", out,
       "--json", NULL},
      {"generate", "--server", dm.job_ep, "--model", "mar", "--cfg-interval", "3", "--out", out,
       "--json", NULL},
      {"generate", "--server", dm.job_ep, "--model", "micro", "--num-iter", "4", "--out", out,
       "--json", NULL}};
  const char *says[] = {"continuous tokens", "top_k", "num_iter", "cfg_interval",
                        "discrete tokens"};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(vs_run_tool("vspec", bad[i], buf, sizeof buf), 4);
    if (!strstr(buf, says[i])) fail_msg("case %d: '%s' does not say '%s'", i, buf, says[i]);
  }
  const char *usage[] = {"generate", "--cfg-schedule", "cosine", NULL};
  assert_int_equal(vs_run_tool("vspec", usage, NULL, 0), 2);
  /* status tells which models take those options */
  const char *st[] = {"status", "--admin", dm.admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", st, buf, sizeof buf), 0);
  assert_non_null(strstr(buf, "4x4 continuous tokens"));
  assert_non_null(strstr(buf, "micro      generation 1, 4x4 tokens"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_client_result_matches_engine),
      cmocka_unit_test(test_unset_seed),
      cmocka_unit_test(test_cli_generate),
      cmocka_unit_test(test_previews_in_order),
      cmocka_unit_test(test_credit_bounds_events),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_status_by_endpoint),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_queue_full),
      cmocka_unit_test(test_client_gone_mid_job),
      cmocka_unit_test(test_newcomer_not_behind_backlog),
      cmocka_unit_test(test_proxied_clients_apart),
      cmocka_unit_test(test_totals_count_every_job),
      cmocka_unit_test(test_batched_jobs),
      cmocka_unit_test(test_mar_model),
  };
  /* VSPEC_TEST_FILTER=test_totals_* runs only the matching tests */
  if (getenv("VSPEC_TEST_FILTER")) cmocka_set_test_filter(getenv("VSPEC_TEST_FILTER"));
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
