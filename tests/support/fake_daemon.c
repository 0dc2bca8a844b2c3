/*
 * tests/support/fake_daemon.c - a fake vspecd driven by the test (tests/support/fake_daemon.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tests/support/fake_daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/png_write.h"

void vs_fake_open(vs_fake *f) {
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/vspec-fake-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->ep, sizeof f->ep, "ipc://%s/job.sock", f->dir);
  f->ctx = zmq_ctx_new();
  f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
  int linger = 0;
  zmq_setsockopt(f->sock, ZMQ_LINGER, &linger, sizeof linger);
  assert_int_equal(zmq_bind(f->sock, f->ep), 0);
}

void vs_fake_close(vs_fake *f) {
  zmq_close(f->sock);
  zmq_ctx_term(f->ctx);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  assert_int_equal(system(cmd), 0);
}

Vspec__Request *vs_fake_recv(vs_fake *f, int wait_ms, vs_wire_msg *m, vs_wire_alloc *a) {
  zmq_pollitem_t it = {.socket = f->sock, .events = ZMQ_POLLIN};
  char err[256];
  int code;
  if (zmq_poll(&it, 1, wait_ms) <= 0) return NULL;
  assert_int_equal(vs_wire_recv_request(f->sock, 1, m, 1 << 20, 1 << 20, err, sizeof err), 1);
  vs_wire_alloc_init(a, 1 << 20);
  Vspec__Request *rq = vs_wire_unpack_request(m, a, &code, err, sizeof err);
  assert_non_null(rq);
  f->env = m->env;
  f->credits += rq->body_case == VSPEC__REQUEST__BODY_CREDIT;
  f->cancels += rq->body_case == VSPEC__REQUEST__BODY_CANCEL;
  return rq;
}

void vs_fake_drain(vs_fake *f, int wait_ms) {
  vs_wire_msg m;
  vs_wire_alloc a;
  for (Vspec__Request *rq; (rq = vs_fake_recv(f, wait_ms, &m, &a));) {
    vs_wire_request_free(rq, &a);
    vs_wire_msg_close(&m);
  }
}

void vs_fake_send(vs_fake *f, Vspec__Event *ev, vs_wire_blob *blobs, int n) {
  ev->has_job_id = 1;
  ev->job_id = VS_FAKE_JOB;
  ev->has_seq = 1;
  ev->seq = f->seq++;
  assert_int_equal(vs_wire_send_event(f->sock, &f->env, ev, blobs, n, 0), 0);
}

uint64_t vs_fake_submit(vs_fake *f, int wait_ms, int *has_seed) {
  vs_wire_msg m;
  vs_wire_alloc a;
  Vspec__Request *rq = vs_fake_recv(f, wait_ms, &m, &a);
  assert_non_null(rq);
  assert_int_equal(rq->body_case, VSPEC__REQUEST__BODY_SUBMIT);
  *has_seed = rq->submit->has_seed;
  uint64_t rid = rq->request_id;
  vs_wire_request_free(rq, &a);
  vs_wire_msg_close(&m);
  return rid;
}

void vs_fake_accepted(vs_fake *f, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted a = VSPEC__ACCEPTED__INIT;
  ev.has_request_id = 1;
  ev.request_id = rid;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &a;
  a.model = "m";
  a.method = "sd:exact";
  a.node = "fake";
  a.has_tokens_total = a.has_seed = 1;
  a.tokens_total = 4;
  a.seed = VS_FAKE_SEED;
  vs_fake_send(f, &ev, NULL, 0);
}

void vs_fake_progress(vs_fake *f) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Progress p = VSPEC__PROGRESS__INIT;
  ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
  ev.progress = &p;
  p.has_round = p.has_tokens_done = p.has_tokens_total = 1;
  p.tokens_done = 2;
  p.tokens_total = 4;
  vs_fake_send(f, &ev, NULL, 0);
}

void vs_fake_result(vs_fake *f, char **notes, size_t n_notes) {
  uint8_t rgb[2 * 2 * 3] = {0}, *png;
  size_t len;
  char err[256];
  assert_int_equal(vs_png_encode(rgb, 2, 2, NULL, 0, &png, &len, err, sizeof err), 0);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Result r = VSPEC__RESULT__INIT;
  Vspec__Stats st = VSPEC__STATS__INIT;
  ev.body_case = VSPEC__EVENT__BODY_RESULT;
  ev.result = &r;
  r.stats = &st;
  r.has_width = r.has_height = r.has_seed = 1;
  r.width = r.height = 2;
  r.seed = VS_FAKE_SEED;
  r.notes = notes;
  r.n_notes = n_notes;
  vs_wire_blob b = {.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = png, .size = len};
  vs_fake_send(f, &ev, &b, 1);
  free(png);
}
