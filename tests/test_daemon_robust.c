/*
 * vspecd against hostile and broken input: random frames, mutated requests, wrong message
 * types, oversized frames and fields, bad framing, and every Submit field out of range. The
 * daemon must answer with an error naming the problem (or drop what it cannot route back),
 * keep serving, and exit cleanly (and, in the ASan run, without leaks) at the end.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/daemon_harness.h"

static vs_fixture fx;
static vs_daemon dm;

static int group_setup(void **state) {
  (void)state;
  vs_fixture_make(&fx);
  /* Small limits so that "too large" is cheap to reach. */
  const char *extra[] = {"--workers", "1", "--set", "limits.max_message_bytes=262144", "--set",
                         "limits.max_request_bytes=65536", "--set",
                         "limits.unpack_budget_bytes=131072", NULL};
  vs_daemon_start(&dm, &fx, "robust", extra);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  int rc = vs_daemon_stop(&dm, SIGTERM, 30000);
  if (rc != 0) vs_daemon_dump_log(&dm);
  vs_fixture_remove(&fx);
  assert_int_equal(rc, 0);
  return 0;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void *raw_dealer(void *ctx) {
  void *s = zmq_socket(ctx, ZMQ_DEALER);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  assert_int_equal(zmq_connect(s, dm.job_ep), 0);
  return s;
}

/* Sends frames[0..n) as one message. */
static void send_frames(void *s, const void *const *frames, const size_t *lens, int n) {
  for (int i = 0; i < n; i++)
    assert_true(zmq_send(s, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* Reads everything that arrives within ms; returns the number of messages. */
static int drain(void *s, int ms) {
  int got = 0;
  double end = vs_harness_now() + ms / 1000.0;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    if (left <= 0) return got;
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, left) <= 0) return got;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;
      }
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    }
    got++;
  }
}

/* The daemon still answers a ping, on a fresh connection. */
static void assert_alive(void) {
  assert_true(vs_daemon_alive(&dm));
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  vs_conn_event e;
  char err[256];
  assert_int_equal(vs_conn_call(&c, &r, 10000, &e, err, sizeof err), 1);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_PONG);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* Sends one raw message and returns the error code of the reply (-1: no reply). */
static int raw_error(void *s, const void *const *frames, const size_t *lens, int n,
                     char *msg, size_t msglen) {
  send_frames(s, frames, lens, n);
  zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
  if (zmq_poll(&it, 1, 5000) <= 0) return -1;
  vs_conn fake = {.sock = s, .max_blob = 1 << 20};
  vs_conn_event e;
  char err[256];
  int rc = vs_conn_recv(&fake, 1000, &e, err, sizeof err);
  assert_int_equal(rc, 1);
  int code = -2;
  if (e.ev->body_case == VSPEC__EVENT__BODY_ERROR) {
    code = e.ev->error->code;
    if (msg) snprintf(msg, msglen, "%s", e.ev->error->message);
  }
  vs_conn_event_free(&e);
  return code;
}

static size_t pack_request(Vspec__Request *r, uint8_t *buf, size_t cap) {
  r->version = 1;
  size_t n = vspec__request__get_packed_size(r);
  assert_true(n <= cap);
  vspec__request__pack(r, buf);
  return n;
}

static void test_random_frames(void **state) {
  (void)state;
  void *ctx = zmq_ctx_new();
  void *s = raw_dealer(ctx);
  static uint8_t buf[6][4096];
  int replies = 0;
  for (int k = 0; k < 400; k++) {
    int n = 1 + (int)(rnd() % 6);
    const void *frames[6];
    size_t lens[6];
    for (int i = 0; i < n; i++) {
      lens[i] = rnd() % (i == 1 ? 3000 : 300);
      for (size_t b = 0; b < lens[i]; b++) buf[i][b] = (uint8_t)rnd();
      frames[i] = buf[i];
    }
    if (k % 2) lens[0] = 0; /* half of them with a proper delimiter */
    send_frames(s, frames, lens, n);
    if (k % 50 == 49) replies += drain(s, 50);
  }
  replies += drain(s, 300);
  printf("  400 random messages, %d error replies\n", replies);
  assert_true(replies > 100);
  zmq_close(s);
  zmq_ctx_term(ctx);
  assert_alive();
}

static void test_mutated_requests(void **state) {
  (void)state;
  void *ctx = zmq_ctx_new();
  void *s = raw_dealer(ctx);
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  sub.model = "micro";
  sub.method = "ar";
  sub.has_class_label = 1;
  sub.class_label = 2;
  sub.has_seed = 1;
  sub.seed = 9;
  sub.has_temperature = 1;
  sub.temperature = 0.9f;
  sub.has_preview = 1;
  sub.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  sub.has_credit = 1;
  sub.credit = 4;
  r.has_request_id = 1;
  r.request_id = 77;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &sub;
  uint8_t good[512], bad[512];
  size_t n = pack_request(&r, good, sizeof good);
  for (int k = 0; k < 300; k++) {
    memcpy(bad, good, n);
    size_t len = n;
    int flips = 1 + (int)(rnd() % 4);
    for (int f = 0; f < flips; f++) bad[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
    if (k % 5 == 0) len = rnd() % n; /* truncated */
    const void *frames[] = {"", bad};
    size_t lens[] = {0, len};
    send_frames(s, frames, lens, 2);
    if (k % 25 == 24) drain(s, 30);
  }
  drain(s, 500);
  zmq_close(s);
  zmq_ctx_term(ctx);
  assert_alive();
}

static void test_wrong_types_and_framing(void **state) {
  (void)state;
  void *ctx = zmq_ctx_new();
  void *s = raw_dealer(ctx);
  char msg[600];
  uint8_t buf[70000];
  /* an Event where a Request belongs: field 10 is a message in both, but Accepted's fields
   * have other wire types than Submit's */
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted acc = VSPEC__ACCEPTED__INIT;
  acc.has_queue_position = 1;
  acc.queue_position = 3;
  acc.model = "x";
  ev.version = 1;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &acc;
  size_t n = vspec__event__pack(&ev, buf);
  const void *f1[] = {"", buf};
  size_t l1[] = {0, n};
  int code = raw_error(s, f1, l1, 2, msg, sizeof msg);
  assert_true(code == VSPEC__ERROR_CODE__ERR_MALFORMED || code == VSPEC__ERROR_CODE__ERR_INVALID);
  /* field 10 (submit) with the varint wire type */
  const uint8_t wrong_wire[] = {0x08, 0x01, 0x50, 0x05};
  const void *f2[] = {"", wrong_wire};
  size_t l2[] = {0, sizeof wrong_wire};
  assert_int_equal(raw_error(s, f2, l2, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  /* a length prefix far beyond the frame */
  const uint8_t huge_len[] = {0x08, 0x01, 0x52, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00};
  const void *f3[] = {"", huge_len};
  size_t l3[] = {0, sizeof huge_len};
  assert_int_equal(raw_error(s, f3, l3, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  /* no delimiter */
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  n = pack_request(&r, buf, sizeof buf);
  const void *f4[] = {buf};
  size_t l4[] = {n};
  assert_int_equal(raw_error(s, f4, l4, 1, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  assert_non_null(strstr(msg, "delimiter"));
  /* a delimiter and nothing after it */
  const void *f5[] = {""};
  size_t l5[] = {0};
  assert_int_equal(raw_error(s, f5, l5, 1, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  /* another protocol version */
  r.version = 2;
  n = vspec__request__get_packed_size(&r);
  vspec__request__pack(&r, buf);
  const void *f6[] = {"", buf};
  size_t l6[] = {0, n};
  assert_int_equal(raw_error(s, f6, l6, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_VERSION);
  /* no body */
  Vspec__Request empty = VSPEC__REQUEST__INIT;
  n = pack_request(&empty, buf, sizeof buf);
  const void *f7[] = {"", buf};
  size_t l7[] = {0, n};
  assert_int_equal(raw_error(s, f7, l7, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  /* blobs that do not match their descriptors */
  Vspec__Blob b = VSPEC__BLOB__INIT, *bp = &b;
  b.kind = VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE;
  b.size = 100;
  r.version = 1;
  r.n_blobs = 1;
  r.blobs = &bp;
  n = pack_request(&r, buf, sizeof buf);
  const void *f8[] = {"", buf, "short"};
  size_t l8[] = {0, n, 5};
  assert_int_equal(raw_error(s, f8, l8, 3, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  assert_non_null(strstr(msg, "declares 100 bytes"));
  const void *f9[] = {"", buf};
  size_t l9[] = {0, n};
  assert_int_equal(raw_error(s, f9, l9, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_MALFORMED);
  b.kind = 99;
  b.size = 5;
  n = pack_request(&r, buf, sizeof buf);
  assert_int_equal(raw_error(s, f8, (size_t[]){0, n, 5}, 3, msg, sizeof msg),
                   VSPEC__ERROR_CODE__ERR_MALFORMED);
  r.n_blobs = 0;
  r.blobs = NULL;
  /* too many frames */
  n = pack_request(&r, buf, sizeof buf);
  const void *f10[] = {"", buf, "a", "b", "c", "d", "e"};
  size_t l10[] = {0, n, 1, 1, 1, 1, 1};
  assert_int_equal(raw_error(s, f10, l10, 7, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_TOO_LARGE);
  /* a protobuf frame over limits.max_request_bytes (64 KiB): refused before unpacking */
  memset(buf, 0, sizeof buf);
  const void *f11[] = {"", buf};
  size_t l11[] = {0, 65537};
  assert_int_equal(raw_error(s, f11, l11, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_TOO_LARGE);
  assert_non_null(strstr(msg, "over the limit"));
  /* small on the wire, big to unpack: 6000 blob descriptors under a 128 KiB budget */
  Vspec__Blob **many = calloc(6000, sizeof *many);
  Vspec__Blob one = VSPEC__BLOB__INIT;
  one.kind = 1;
  one.size = 0;
  for (int i = 0; i < 6000; i++) many[i] = &one;
  r.n_blobs = 6000;
  r.blobs = many;
  n = pack_request(&r, buf, sizeof buf);
  free(many);
  r.n_blobs = 0;
  r.blobs = NULL;
  assert_true(n < 65536);
  const void *f12[] = {"", buf};
  size_t l12[] = {0, n};
  assert_int_equal(raw_error(s, f12, l12, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_TOO_LARGE);
  /* admin requests on the job endpoint */
  Vspec__ReloadRequest rr = VSPEC__RELOAD_REQUEST__INIT;
  rr.name = "exact";
  r.body_case = VSPEC__REQUEST__BODY_RELOAD;
  r.reload = &rr;
  n = pack_request(&r, buf, sizeof buf);
  const void *f13[] = {"", buf};
  size_t l13[] = {0, n};
  assert_int_equal(raw_error(s, f13, l13, 2, msg, sizeof msg), VSPEC__ERROR_CODE__ERR_FORBIDDEN);
  zmq_close(s);

  /* a frame over ZMQ_MAXMSGSIZE (256 KiB): libzmq drops the connection, nothing else */
  s = raw_dealer(ctx);
  char *big = calloc(1, 300000);
  const void *f14[] = {"", big};
  size_t l14[] = {0, 300000};
  send_frames(s, f14, l14, 2);
  free(big);
  assert_int_equal(drain(s, 300), 0);
  zmq_close(s);
  zmq_ctx_term(ctx);
  assert_alive();
}

typedef struct bad_case {
  const char *what; /* expected in the message */
  void (*set)(Vspec__Submit *s);
} bad_case;

static void b_class(Vspec__Submit *s) { s->has_class_label = 1, s->class_label = 10; }
static void b_class_neg(Vspec__Submit *s) { s->has_class_label = 1, s->class_label = -1; }
static void b_temp(Vspec__Submit *s) { s->has_temperature = 1, s->temperature = -1; }
static void b_temp_nan(Vspec__Submit *s) { s->has_temperature = 1, s->temperature = NAN; }
static void b_topk(Vspec__Submit *s) { s->has_top_k = 1, s->top_k = 100000; }
static void b_topp(Vspec__Submit *s) { s->has_top_p = 1, s->top_p = 0; }
static void b_cfg(Vspec__Submit *s) { s->has_cfg_scale = 1, s->cfg_scale = 1000; }
static void b_cfgi(Vspec__Submit *s) { s->has_cfg_interval = 1, s->cfg_interval = -5; }
static void b_num_iter(Vspec__Submit *s) { s->has_num_iter = 1, s->num_iter = -1; }
static void b_num_iter_vq(Vspec__Submit *s) { s->has_num_iter = 1, s->num_iter = 4; }
static void b_cfg_schedule(Vspec__Submit *s) { s->cfg_schedule = "cosine"; }
static void b_cfg_schedule_vq(Vspec__Submit *s) { s->cfg_schedule = "linear"; }
static void b_continuous_rule(Vspec__Submit *s) {
  s->model = "self", s->method = "sd:continuous@standard:shape=chain,depth=2";
}
static void b_method(Vspec__Submit *s) { s->method = "bogus"; }
static void b_method_path(Vspec__Submit *s) { s->method = "sd:../../x@standard"; }
static void b_method_long(Vspec__Submit *s) {
  static char m[1500];
  memset(m, 'a', sizeof m - 1);
  s->method = m;
}
static void b_accept_name(Vspec__Submit *s) { s->model = "self", s->accept = "Bad-Name"; }
static void b_accept_unknown(Vspec__Submit *s) { s->model = "self", s->accept = "nosuch"; }
static void b_accept_param(Vspec__Submit *s) {
  s->model = "self", s->accept = "lantern", s->accept_params = "delta=banana";
}
static void b_sched_unknown(Vspec__Submit *s) {
  s->model = "self", s->accept = "exact", s->sched = "nosuch";
}
static void b_draft(Vspec__Submit *s) { s->model = "self", s->accept = "exact", s->draft = "x"; }
static void b_no_eagle(Vspec__Submit *s) {
  s->model = "self", s->accept = "exact", s->draft = "head";
}
static void b_no_drafter(Vspec__Submit *s) { s->accept = "exact"; }
static void b_both(Vspec__Submit *s) { s->method = "ar", s->accept = "exact"; }
static void b_sched_alone(Vspec__Submit *s) { s->sched = "standard"; }
static void b_preview(Vspec__Submit *s) { s->has_preview = 1, s->preview = 99; }
static void b_cadence(Vspec__Submit *s) {
  s->has_preview_every_tokens = 1, s->preview_every_tokens = 1000;
}
static void b_credit0(Vspec__Submit *s) { s->has_credit = 1, s->credit = 0; }
static void b_credit_big(Vspec__Submit *s) { s->has_credit = 1, s->credit = 100000; }
static void b_deadline(Vspec__Submit *s) { s->has_deadline_ms = 1, s->deadline_ms = 4000000000u; }
static void b_priority(Vspec__Submit *s) { s->has_priority = 1, s->priority = 50; }
static void b_tag(Vspec__Submit *s) { s->tag = "bad\ntag"; }
static void b_model(Vspec__Submit *s) { s->model = "nope"; }
static void b_caption(Vspec__Submit *s) {
  s->has_caption_len = 1, s->caption_len = 4, s->has_caption_dim = 1, s->caption_dim = 4;
}

static void test_out_of_range_fields(void **state) {
  (void)state;
  const bad_case cases[] = {
      {"class_label", b_class},       {"class_label", b_class_neg},
      {"temperature", b_temp},        {"temperature", b_temp_nan},
      {"top_k", b_topk},              {"top_p", b_topp},
      {"cfg_scale", b_cfg},           {"cfg_interval", b_cfgi},
      {"num_iter: -1", b_num_iter},   {"num_iter: model 'micro' has discrete", b_num_iter_vq},
      {"cfg_schedule: 'cosine'", b_cfg_schedule},
      {"cfg_schedule: model 'micro' has discrete", b_cfg_schedule_vq},
      {"for continuous tokens; model 'self' has discrete", b_continuous_rule},
      {"method", b_method},           {"method", b_method_path},
      {"method", b_method_long},      {"accept", b_accept_name},
      {"nosuch", b_accept_unknown},   {"delta", b_accept_param},
      {"scheduler 'nosuch'", b_sched_unknown}, {"draft", b_draft},
      {"eagle", b_no_eagle},          {"no drafter", b_no_drafter},
      {"not both", b_both},           {"without an acceptance rule", b_sched_alone},
      {"preview", b_preview},         {"preview_every_tokens", b_cadence},
      {"credit", b_credit0},          {"credit", b_credit_big},
      {"deadline_ms", b_deadline},    {"priority", b_priority},
      {"tag", b_tag},                 {"unknown model", b_model},
      {"caption", b_caption},
  };
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Vspec__Submit s = VSPEC__SUBMIT__INIT;
    s.model = "micro";
    cases[i].set(&s);
    uint64_t rid = vs_client_submit(&c, &s);
    vs_conn_event e;
    for (;;) {
      vs_client_next(&c, 10000, &e);
      if (e.ev->has_request_id && e.ev->request_id == rid) break;
      vs_conn_event_free(&e);
    }
    if (e.ev->body_case != VSPEC__EVENT__BODY_ERROR)
      fail_msg("case %zu (%s) was accepted", i, cases[i].what);
    assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_INVALID);
    if (!strstr(e.ev->error->message, cases[i].what))
      fail_msg("case %zu: message '%s' does not name '%s'", i, e.ev->error->message,
               cases[i].what);
    assert_false(e.ev->has_job_id);
    vs_conn_event_free(&e);
  }
  /* cancel and credit for jobs that do not exist */
  for (int i = 0; i < 50; i++) {
    vs_client_credit(&c, rnd(), (uint32_t)rnd());
    vs_client_cancel(&c, rnd());
  }
  int errors = 0;
  for (;;) {
    vs_conn_event e;
    char err[256];
    if (vs_conn_recv(&c, 500, &e, err, sizeof err) != 1) break;
    errors += e.ev->body_case == VSPEC__EVENT__BODY_ERROR &&
              e.ev->error->code == VSPEC__ERROR_CODE__ERR_NOT_FOUND;
    vs_conn_event_free(&e);
  }
  assert_int_equal(errors, 50); /* cancels answer, credits do not */
  vs_conn_close(&c);
  assert_alive();
  vs_conn_event e;
  vs_client_status(dm.admin_ep, &e);
  assert_true(e.ev->status->totals->malformed > 100);
  vs_conn_event_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_frames),
      cmocka_unit_test(test_mutated_requests),
      cmocka_unit_test(test_wrong_types_and_framing),
      cmocka_unit_test(test_out_of_range_fields),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
