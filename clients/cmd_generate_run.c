/*
 * clients/cmd_generate_run.c - vspec generate's job: submit it, follow its events (showing
 * them through clients/gen_view.h), give credit back, cancel it on Ctrl-C, write the image.
 */
#include "clients/generate.h"
#include "clients/last_job.h"
#include "core/png_upscale.h"

/* How long an interrupted client waits for the daemon to confirm the cancel: heartbeats (a
 * queued fleet job) must not keep it waiting forever. */
#define VS_CANCEL_WAIT_S 5.0

typedef struct vs_gen_job {
  vs_gen_opts *g;
  vs_gen_view *v;
  vs_conn *conn;
  uint64_t job, rid;
  int cancel_sent, n_previews;
  double t0, last, cancel_at;
} vs_gen_job;

/* Writes the result's PNG; with upscale > 1, enlarged on this side (core/png_upscale.h).
 * *w, *h: the size written. */
static int cgr_write_image(const char *path, const void *png, size_t len, int upscale,
                           unsigned *w, unsigned *h, char *err, size_t errlen) {
  if (upscale <= 1) return vs__write_file_msg(path, png, len, err, errlen);
  uint8_t *big = NULL;
  size_t big_len = 0;
  int bw, bh;
  char inner[512];
  if (vs_png_upscale(png, len, upscale, &big, &big_len, &bw, &bh, inner, sizeof inner)) {
    snprintf(err, errlen, "--upscale %d: %s", upscale, inner);
    return -1;
  }
  int rc = vs__write_file_msg(path, big, big_len, err, errlen);
  *w = (unsigned)bw;
  *h = (unsigned)bh;
  free(big);
  return rc ? -1 : 0;
}

static void cgr_send_cancel(vs_gen_job *r) {
  Vspec__Request cr = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  char err[1024];
  cc.job_id = r->job;
  cr.body_case = VSPEC__REQUEST__BODY_CANCEL;
  cr.cancel = &cc;
  vs_conn_send(r->conn, &cr, NULL, 0, err, sizeof err);
}

/* Flow control: one more progress or preview may come now that this one is handled. */
static void cgr_send_credit(vs_gen_job *r) {
  Vspec__Request cr = VSPEC__REQUEST__INIT;
  Vspec__Credit cc = VSPEC__CREDIT__INIT;
  char err[1024];
  cc.job_id = r->job;
  cc.grant = 1;
  cr.body_case = VSPEC__REQUEST__BODY_CREDIT;
  cr.credit = &cc;
  vs_conn_send(r->conn, &cr, NULL, 0, err, sizeof err);
}

/* Ctrl-C: cancels an accepted job once and waits a while for the daemon's word. -1 to go on,
 * else the exit status. */
static int cgr_gen_interrupt(vs_gen_job *r, double now) {
  if (!vs__interrupted) return -1;
  if (!r->job)
    return vs_gen_fail(r->v, EXIT_INTERRUPTED, VS_GEN_INTERRUPTED,
                       "interrupted before the daemon accepted the job; if it takes it after "
                       "all, `vspec status` lists it");
  if (!r->cancel_sent) {
    cgr_send_cancel(r);
    r->cancel_sent = 1;
    r->last = r->cancel_at = now;
    if (!r->g->quiet && !r->g->json)
      vs_progress_line_note(&r->v->pl, "cancelling job %llu ...", (unsigned long long)r->job);
  }
  if (now - r->cancel_at > VS_CANCEL_WAIT_S)
    return vs_gen_fail(r->v, EXIT_INTERRUPTED, VS_GEN_INTERRUPTED,
                       "no word on cancelling job %llu within %.0f s; it may still run",
                       (unsigned long long)r->job, VS_CANCEL_WAIT_S);
  return -1;
}

/* Nothing came: -1 to go on waiting, else the exit status. */
static int cgr_gen_silence(vs_gen_job *r, double now) {
  double limit = r->g->net.timeout_s;
  if (r->cancel_sent || now - r->last <= limit) return -1;
  if (!r->job)
    return vs_gen_fail(r->v, EXIT_UNREACHABLE, VS_GEN_TIMEOUT,
                       "no answer from %s within %.1f s: is vspecd running there?",
                       r->g->net.server, limit);
  return vs_gen_fail(r->v, EXIT_UNREACHABLE, VS_GEN_TIMEOUT,
                     "the daemon said nothing about job %llu for %.0f s",
                     (unsigned long long)r->job, limit);
}

/* The first Accepted: the job's id, remembered for `vspec cancel --last`. */
static void cgr_gen_accepted(vs_gen_job *r, const Vspec__Event *ev) {
  char err[1024];
  if (r->job) return;
  r->job = ev->job_id;
  if (vs_last_job_save(r->g->net.server, r->job, err, sizeof err))
    fprintf(stderr, "vspec: note: `vspec cancel --last` will not know job %llu: %s\n",
            (unsigned long long)r->job, err);
}

static void cgr_gen_preview(vs_gen_job *r, const vs_conn_event *e) {
  size_t len;
  const void *png = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
  char path[4200] = "";
  if (r->g->previews && png) {
    snprintf(path, sizeof path, "%s/preview-%03d.png", r->g->previews, r->n_previews);
    if (vs__write_file(path, png, len)) *path = 0;
  }
  r->n_previews++;
  vs_gen_show_preview(r->v, e->ev, path);
}

static int cgr_gen_result(vs_gen_job *r, const vs_conn_event *e, double now) {
  const Vspec__Result *res = e->ev->result;
  size_t len = 0, tlen = 0;
  const void *png = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
  const uint8_t *tok = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tlen);
  char err[4400];
  unsigned w = res->width, h = res->height;
  if (!png)
    return vs_gen_fail(r->v, EXIT_FAIL, VS_GEN_PROTOCOL, "the result of job %llu carries no PNG",
                       (unsigned long long)r->job);
  if (cgr_write_image(r->g->out, png, len, (int)r->g->upscale, &w, &h, err, sizeof err))
    return vs_gen_fail(r->v, EXIT_FAIL, VS_GEN_OUTPUT, "job %llu's image is lost: %s",
                       (unsigned long long)r->job, err);
  vs_gen_written out = {.out = r->g->out, .width = w, .height = h, .upscale = r->g->upscale,
                        .latency_s = now - r->t0, .previews = r->n_previews, .tokens = tok,
                        .tokens_len = tlen};
  vs_gen_show_result(r->v, res, &out);
  return EXIT_OK;
}

/* One event of this job: -1 to go on, else the exit status. */
static int cgr_gen_event(vs_gen_job *r, const vs_conn_event *e, double now) {
  const Vspec__Event *ev = e->ev;
  switch (ev->body_case) {
    case VSPEC__EVENT__BODY_ACCEPTED:
      cgr_gen_accepted(r, ev);
      vs_gen_show_accepted(r->v, ev, now);
      return -1;
    case VSPEC__EVENT__BODY_PROGRESS:
      vs_gen_show_progress(r->v, ev, now);
      cgr_send_credit(r);
      return -1;
    case VSPEC__EVENT__BODY_PREVIEW:
      cgr_gen_preview(r, e);
      cgr_send_credit(r);
      return -1;
    /* Phases and notices are not counted against the job's credit. */
    case VSPEC__EVENT__BODY_PHASE: vs_gen_show_phase(r->v, ev, now); return -1;
    case VSPEC__EVENT__BODY_NOTICE: vs_gen_show_notice(r->v, ev); return -1;
    case VSPEC__EVENT__BODY_RESTARTED: vs_gen_show_restarted(r->v, ev, now); return -1;
    case VSPEC__EVENT__BODY_RESULT: return cgr_gen_result(r, e, now);
    case VSPEC__EVENT__BODY_ERROR: {
      int status = vs__exit_for(ev->error->code);
      if (r->cancel_sent && ev->error->code == VSPEC__ERROR_CODE__ERR_CANCELLED)
        status = EXIT_INTERRUPTED;
      return vs_gen_show_error(r->v, ev->error, status);
    }
    default: return -1;
  }
}

static int cgr_gen_follow(vs_gen_job *r) {
  char err[1024];
  for (;;) {
    int rc = cgr_gen_interrupt(r, vs_now());
    if (rc >= 0) return rc;
    vs_conn_event e;
    rc = vs_conn_recv(r->conn, 200, &e, err, sizeof err);
    if (rc < 0) return vs_gen_fail(r->v, EXIT_UNREACHABLE, VS_GEN_PROTOCOL, "%s", err);
    double now = vs_now();
    if (rc == 0) {
      if ((rc = cgr_gen_silence(r, now)) >= 0) return rc;
      continue;
    }
    r->last = now;
    const Vspec__Event *ev = e.ev;
    int mine = (r->job && ev->has_job_id && ev->job_id == r->job) ||
               (!r->job && ev->has_request_id && ev->request_id == r->rid);
    rc = mine && ev->body_case != VSPEC__EVENT__BODY_HEARTBEAT ? cgr_gen_event(r, &e, now) : -1;
    vs_conn_event_free(&e);
    if (rc >= 0) return rc;
  }
}

int vs__gen_run(vs_gen_opts *g, vs_gen_view *v) {
  /* Installed before connecting: an interrupt while the endpoint is probed ends with the
   * same error object as one later. */
  struct sigaction sa = {.sa_handler = vs__on_sigint};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  vs_conn conn;
  char err[1024];
  vs_gen_job r = {.g = g, .v = v, .conn = &conn, .t0 = vs_now()};
  int rc = vs__connect_msg(&conn, &g->net, g->net.server, 1, err, sizeof err);
  if (rc == 0 && vs__interrupted) vs_conn_close(&conn);
  if (vs__interrupted) return cgr_gen_interrupt(&r, vs_now());
  if (rc) return vs_gen_fail(v, EXIT_UNREACHABLE, VS_GEN_UNREACHABLE, "%s", err);
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  rq.submit = &g->sub;
  if (vs_conn_send(&conn, &rq, NULL, 0, err, sizeof err))
    rc = vs_gen_fail(v, EXIT_UNREACHABLE, VS_GEN_PROTOCOL, "%s", err);
  else {
    r.rid = rq.request_id;
    r.last = vs_now();
    rc = cgr_gen_follow(&r);
  }
  vs_conn_close(&conn);
  return rc;
}
