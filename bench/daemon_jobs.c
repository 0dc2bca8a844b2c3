#include "bench/daemon_jobs.h"

#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "bench/daemon_proc.h"

int vs_bench_jobs_no_progress;

static Vspec__Submit make_submit(uint64_t seed, int cls, const char *method, int preview) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.has_seed = 1;
  s.seed = seed;
  s.has_class_label = 1;
  s.class_label = cls;
  s.method = (char *)method;
  s.has_credit = 1;
  s.credit = 8;
  if (vs_bench_jobs_no_progress) {
    s.has_progress = 1;
    s.progress = 0;
  }
  if (preview) {
    s.has_preview = 1;
    s.preview = preview;
  }
  return s;
}

/* Runs jobs with `inflight` in flight until `total` are done; fills res[] in completion order.
 * Returns the wall time, or < 0 on failure. */
double vs_bench_run_jobs(vs_conn *c, int total, int inflight, uint64_t seed0, int cls,
                         const char *method, int preview, vs_bench_jobres *res) {
  typedef struct { uint64_t rid, job; double t0; } slot;
  slot *s = calloc((size_t)inflight, sizeof *s);
  int submitted = 0, done = 0;
  double t0 = vs_bench_now();
  char err[512];
  while (done < total) {
    for (int i = 0; i < inflight && submitted < total; i++) {
      if (s[i].rid) continue;
      Vspec__Submit sub = make_submit(seed0 + (uint64_t)submitted, cls, method, preview);
      Vspec__Request r = VSPEC__REQUEST__INIT;
      r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
      r.submit = &sub;
      s[i].t0 = vs_bench_now();
      if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) goto fail;
      s[i].rid = r.request_id;
      s[i].job = 0;
      submitted++;
    }
    vs_conn_event e;
    int rc = vs_conn_recv(c, 60000, &e, err, sizeof err);
    if (rc == 0 && vs_bench_now() - t0 < 60) continue; /* a signal woke the poll */
    if (rc <= 0) {
      if (rc == 0) snprintf(err, sizeof err, "no event for 60 s");
      goto fail;
    }
    Vspec__Event *ev = e.ev;
    int k = -1;
    for (int i = 0; i < inflight; i++)
      if (s[i].rid && ((ev->has_job_id && s[i].job == ev->job_id) ||
                       (ev->has_request_id && ev->request_id == s[i].rid && !s[i].job)))
        k = i;
    if (k >= 0) {
      switch (ev->body_case) {
        case VSPEC__EVENT__BODY_ACCEPTED: s[k].job = ev->job_id; break;
        case VSPEC__EVENT__BODY_PROGRESS:
        case VSPEC__EVENT__BODY_PREVIEW: vs_bench_daemon_grant(c, s[k].job); break;
        case VSPEC__EVENT__BODY_RESULT: {
          vs_bench_jobres *r = &res[done++];
          r->latency = vs_bench_now() - s[k].t0;
          r->generate_s = ev->result->stats->generate_s;
          r->preview_s = ev->result->stats->preview_s;
          r->decode_s = ev->result->stats->decode_s;
          r->previews = (int)ev->result->stats->previews;
          s[k].rid = 0;
          break;
        }
        case VSPEC__EVENT__BODY_ERROR:
          fprintf(stderr, "vspecd-bench: job failed: %s\n", ev->error->message);
          vs_conn_event_free(&e);
          goto fail;
        default: break;
      }
    }
    vs_conn_event_free(&e);
  }
  free(s);
  return vs_bench_now() - t0;
fail:
  free(s);
  fprintf(stderr, "vspecd-bench: %s\n", err);
  return -1;
}

