/*
 * http/http_jobs.c - the n jobs of one HTTP generation (n of 1..10), run together over one
 * inproc connection to the daemon: submitted at once so that the queue and the workers see
 * them together, waited for together, and cancelled together when one fails (the answer is
 * all n images or an error), when the HTTP client goes away, when the daemon stops or when
 * [http] timeout_ms runs out.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/log.h"
#include "core/metrics.h" /* vs_now */
#include "vspec/types.h"

#define VS__POLL_MS 50          /* how often the HTTP client and the stop flag are looked at */
#define VS__CANCEL_GRACE_S 2.0  /* waiting for the terminal events of cancelled jobs */

/* Whether the HTTP client has gone. An end of its stream alone does not say so: a client
 * that shut only its write side after a complete request (nc -N, socat and some HTTP tools
 * do) waits for the answer, and a client that closed entirely
 * sends the same FIN. What tells them apart is a write: the gone one's kernel answers it
 * with a reset. So the first end seen sends an interim "100 Continue" (HTTP/1.1 clients must
 * take and ignore one, RFC 9110 15.2; MHD writes nothing until the handler returns, so it
 * comes before the answer; in a streamed answer's body it is an SSE comment, written by the
 * stream), and from then on only a reset or an error counts. An HTTP/1.0 client may not be
 * sent a 1xx: its end is taken as a half-close, and its jobs run out. */
static int hjobs_client_gone(vs_http_batch *b) {
  int fd = b->client_fd;
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (p.revents & (POLLHUP | POLLERR)) return 1; /* a reset, or both directions shut */
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  if (n > 0 || b->client_probed) return 0; /* a pipelined request: still there */
  b->client_probed = 1;
  if (b->in_body) {
    b->probe_due = 1;
    return 0;
  }
  if (!b->client_interim) return 0;
  static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
  ssize_t w = send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  return w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void hjobs_cancel(vs_conn *c, uint64_t job) {
  char err[VSPEC_ERRLEN];
  Vspec__Request q = VSPEC__REQUEST__INIT;
  Vspec__Cancel cn = VSPEC__CANCEL__INIT;
  cn.job_id = job;
  q.body_case = VSPEC__REQUEST__BODY_CANCEL;
  q.cancel = &cn;
  vs_conn_send(c, &q, NULL, 0, err, sizeof err);
}

/* Cancels every accepted job that has not ended; one accepted later is cancelled when its
 * Accepted comes (hjobs_event). */
static void hjobs_cancel_all(vs_http_batch *b) {
  b->cancelled = 1;
  for (int i = 0; i < b->n; i++)
    if (b->jobs[i].id && !b->jobs[i].done) hjobs_cancel(&b->conn, b->jobs[i].id);
}

int vs__http_jobs_start(vs_http_batch *b, vs_http_reply *r) {
  char err[VSPEC_ERRLEN];
  if (vs__http_connect(b->h, &b->conn, err, sizeof err)) {
    vs__http_error(r, 500, NULL, "cannot reach the daemon: %s", err);
    return -1;
  }
  b->connected = 1;
  b->t0 = vs_now();
  b->end = b->t0 + b->h->cfg->http_timeout_ms / 1000.0;
  Vspec__Submit s = *(const Vspec__Submit *)b->submit;
  for (int i = 0; i < b->n; i++) {
    Vspec__Request q = VSPEC__REQUEST__INIT;
    s.has_seed = b->has_seed;
    s.seed = b->seed + (uint64_t)i; /* consecutive, wrapping as the seeds do */
    q.body_case = VSPEC__REQUEST__BODY_SUBMIT;
    q.submit = &s;
    if (vs_conn_send(&b->conn, &q, NULL, 0, err, sizeof err)) {
      vs__http_error(r, 500, NULL, "cannot submit to the daemon: %s", err);
      b->n = i; /* those sent are cancelled by the caller's free */
      hjobs_cancel_all(b);
      return -1;
    }
    b->jobs[i].rid = q.request_id;
  }
  return 0;
}

/* One event of the daemon's for job i; 1 when the job keeps it (its Result). */
static int hjobs_event(vs_http_batch *b, int i, vs_conn_event *e) {
  vs_http_job *j = &b->jobs[i];
  const Vspec__Event *ev = e->ev;
  switch (ev->body_case) {
  case VSPEC__EVENT__BODY_ACCEPTED: {
    const Vspec__Accepted *a = ev->accepted;
    j->id = ev->has_job_id ? ev->job_id : 0;
    j->seed = a->seed;
    j->has_class = a->has_class_label;
    j->class_label = a->class_label;
    snprintf(j->class_name, sizeof j->class_name, "%s", a->class_name ? a->class_name : "");
    snprintf(j->model, sizeof j->model, "%s", a->model ? a->model : "");
    snprintf(j->method, sizeof j->method, "%s", a->method ? a->method : "");
    if (b->cancelled && j->id) hjobs_cancel(&b->conn, j->id);
    break;
  }
  case VSPEC__EVENT__BODY_RESULT:
    j->done = 1;
    j->result = e; /* the answer is built from it */
    return 1;
  case VSPEC__EVENT__BODY_ERROR:
    j->done = 1;
    j->err_code = ev->error->code ? (int)ev->error->code : VSPEC__ERROR_CODE__ERR_INTERNAL;
    snprintf(j->err_msg, sizeof j->err_msg, "%s", ev->error->message ? ev->error->message : "");
    j->retry_after_ms = ev->error->has_retry_after_ms ? ev->error->retry_after_ms : 0;
    /* all n images or none: the others are not worth their time */
    if (!b->cancelled) hjobs_cancel_all(b);
    break;
  default:
    if (b->on_event && !b->gave_up && b->on_event(b->arg, i, e)) b->gave_up = VS_HTTP_CLIENT_GONE;
  }
  return 0;
}

int vs__http_jobs_step(vs_http_batch *b) {
  if (b->over) return 1;
  double now = vs_now();
  if (!b->gave_up) {
    if (hjobs_client_gone(b)) b->gave_up = VS_HTTP_CLIENT_GONE;
    else if (atomic_load(&b->h->stopping)) b->gave_up = VS_HTTP_STOPPING;
    else if (now > b->end) b->gave_up = VS_HTTP_TIMED_OUT;
  }
  if (b->gave_up && !b->give_up) {
    b->give_up = now + VS__CANCEL_GRACE_S;
    hjobs_cancel_all(b);
  }
  int left = 0;
  for (int i = 0; i < b->n; i++) left += !b->jobs[i].done;
  if (!left || (b->gave_up && now > b->give_up)) return b->over = 1;
  char err[VSPEC_ERRLEN];
  vs_conn_event *e = malloc(sizeof *e);
  int rc = e ? vs_conn_recv(&b->conn, VS__POLL_MS, e, err, sizeof err) : 0;
  if (rc <= 0) free(e);
  if (rc < 0) {
    for (int i = 0; i < b->n; i++)
      if (!b->jobs[i].done) {
        b->jobs[i].done = 1;
        b->jobs[i].err_code = VSPEC__ERROR_CODE__ERR_INTERNAL;
        snprintf(b->jobs[i].err_msg, sizeof b->jobs[i].err_msg, "from the daemon: %s", err);
      }
    return b->over = 1;
  }
  if (rc == 0) return 0;
  const Vspec__Event *ev = e->ev;
  int kept = 0;
  for (int i = 0; i < b->n; i++) {
    const vs_http_job *j = &b->jobs[i];
    if ((ev->has_request_id && ev->request_id == j->rid) ||
        (j->id && ev->has_job_id && ev->job_id == j->id)) {
      kept = hjobs_event(b, i, e);
      break;
    }
  }
  if (!kept) {
    vs_conn_event_free(e);
    free(e);
  }
  return 0;
}

int vs__http_jobs_run(vs_http_batch *b, vs_http_reply *r) {
  if (vs__http_jobs_start(b, r)) return -1;
  while (!vs__http_jobs_step(b)) {
  }
  if (b->gave_up == VS_HTTP_CLIENT_GONE)
    vs_log(VSPEC_LOG_INFO, "http", "client went away: %d job(s) cancelled", b->n);
  return 0;
}

const vs_http_job *vs__http_jobs_failed(const vs_http_batch *b) {
  /* the first error in time is the cause; the others are its cancellations */
  for (int i = 0; i < b->n; i++)
    if (b->jobs[i].err_code && b->jobs[i].err_code != VSPEC__ERROR_CODE__ERR_CANCELLED)
      return &b->jobs[i];
  for (int i = 0; i < b->n; i++)
    if (b->jobs[i].err_code) return &b->jobs[i];
  return NULL;
}

void vs__http_jobs_free(vs_http_batch *b) {
  if (b->connected && !b->over) hjobs_cancel_all(b);
  for (int i = 0; i < b->n; i++)
    if (b->jobs[i].result) {
      vs_conn_event_free(b->jobs[i].result);
      free(b->jobs[i].result);
      b->jobs[i].result = NULL;
    }
  if (b->connected) vs_conn_close(&b->conn);
  b->connected = 0;
}
