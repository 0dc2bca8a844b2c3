/*
 * daemon/server_tick.c - vspecd's loop callbacks (daemon/server_internal.h): the tick
 * (deadlines, retries, heartbeats, queue positions, the drain timeout), the workers' wake-up,
 * the signals that drain, and the stop once drained. server.c registers them with the loop;
 * the events re-arm the tick through s->on_tick (vs__start_tick), so that sending calls
 * nothing here.
 */
#include "daemon/server_internal.h"

#include <signal.h>

/* ---- the timer: deadlines, retries, heartbeats, queue positions, drain ----------------------- */

/* When anything last went along the routing envelope of job j: its own events and those of
 * the connection's other jobs with the same envelope, and heartbeats. */
static double tick_envelope_last(const vs_client *c, const vs_djob *j) {
  double last = j->lp.last_event;
  for (const vs_djob *k = c->jobs; k; k = k->lp.client_next)
    if (k->lp.last_event > last && vs_wire_envelope_equal(&k->lp.env, &j->lp.env))
      last = k->lp.last_event;
  return last;
}

/* A Heartbeat goes along each routing envelope of the connection's jobs that got nothing for
 * heartbeat_ivl_ms: a client waiting for a queued job hears the daemon is there (vspec gives
 * up after --timeout of silence), through a proxy each of the proxy's clients does, and a
 * connection that vanished shows up as unroutable. */
static void tick_heartbeat(vs_server *s, vs_client *c, double now) {
  double ivl = s->cfg.heartbeat_ivl_ms / 1000.0;
  for (vs_djob *j = c->jobs; j && !c->gone; j = j->lp.client_next) {
    if (now - tick_envelope_last(c, j) < ivl) continue;
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Heartbeat hb = VSPEC__HEARTBEAT__INIT;
    ev.body_case = VSPEC__EVENT__BODY_HEARTBEAT;
    ev.heartbeat = &hb;
    int rc = vs__send(s, c->sock, &j->lp.env, &ev, NULL, 0);
    if (rc == 0) {
      j->lp.last_event = now;
    } else if (rc == -EHOSTUNREACH) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s is gone (heartbeat); cancelling its jobs",
             c->text);
      vs__client_lost(s, c);
    }
  }
}

void vs__on_tick(uv_timer_t *h) {
  vs_server *s = h->data;
  double now = vs_now();
  int heartbeat = now - s->last_heartbeat >= s->cfg.heartbeat_ivl_ms / 1000.0;
  if (heartbeat) s->last_heartbeat = now;
  /* Collect first: finishing a job changes the table. */
  int cap = s->n_jobs, n = 0;
  vs_djob **all = cap ? malloc((size_t)cap * sizeof *all) : NULL;
  for (int b = 0; all && b < VS_BUCKETS; b++)
    for (vs_djob *j = s->jobs[b]; j && n < cap; j = j->lp.id_next) {
      vs_djob_retain(j);
      all[n++] = j;
    }
  for (int i = 0; i < n; i++) {
    vs_djob *j = all[i];
    if (j->lp.terminal_sent) continue;
    if (j->deadline > 0 && now >= j->deadline && !atomic_load(&j->cancel)) {
      char who[40];
      snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
      vs_log(VSPEC_LOG_INFO, who, "deadline passed");
      if (vs_job_queue_remove(s->queue, j)) vs__finish_unstarted(s, j, VS_CANCEL_DEADLINE);
      else vs_djob_cancel(j, VS_CANCEL_DEADLINE);
      continue;
    }
    if (s->hard_cancel && !atomic_load(&j->cancel)) vs_djob_cancel(j, VS_CANCEL_DRAIN);
    if (j->lp.retry) vs__pump(s, j);
    /* Waiting jobs hear where they are in the queue when it changes. */
    if (heartbeat && j->progress && j->lp.credit > 0 && !j->lp.accepted_pending &&
        j->lp.client && !j->lp.client->gone) {
      int pos = vs_job_queue_position(s->queue, j);
      if (pos >= 0 && pos != j->lp.queued_reported) {
        Vspec__Event ev = VSPEC__EVENT__INIT;
        Vspec__Progress p = VSPEC__PROGRESS__INIT;
        p.has_round = p.has_queue_position = p.has_tokens_total = 1;
        p.round = -1;
        p.queue_position = (uint32_t)pos;
        p.tokens_total = (uint32_t)j->tokens_total;
        ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
        ev.progress = &p;
        if (vs__job_send(s, j, &ev, NULL, 0) == 0) {
          j->lp.credit--;
          j->lp.queued_reported = pos;
        }
      }
    }
  }
  for (int i = 0; i < n; i++) vs_djob_release(all[i]);
  free(all);

  /* Terminal events that met a full queue: retry; a client that takes nothing for a whole
   * heartbeat timeout is treated as gone. */
  vs_djob *ob = s->outbox;
  s->outbox = NULL;
  while (ob) {
    vs_djob *j = ob;
    ob = j->lp.outbox_next;
    j->lp.outbox_next = NULL;
    int rc = vs__send_terminal(s, j);
    if (rc == -EAGAIN && now - j->lp.outbox_since < s->cfg.heartbeat_timeout_ms / 1000.0) {
      j->lp.outbox_next = s->outbox;
      s->outbox = j;
      continue;
    }
    if (rc == -EAGAIN && j->lp.client) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s took nothing for %d ms: treated as gone",
             j->lp.client->text, s->cfg.heartbeat_timeout_ms);
      vs__client_lost(s, j->lp.client);
    }
    j->lp.in_outbox = 0;
    vs__job_unlink(s, j);
  }

  if (heartbeat)
    for (int b = 0; b < VS_BUCKETS; b++)
      for (vs_client *c = s->clients[b]; c; c = c->hnext) tick_heartbeat(s, c, now);
  vs__reap(s);

  if (s->draining && !s->hard_cancel && s->cfg.drain_timeout_ms >= 0 &&
      now - s->drain_started >= s->cfg.drain_timeout_ms / 1000.0 && s->n_jobs) {
    vs_log(VSPEC_LOG_WARN, "server", "drain timeout (%d ms): cancelling %d job(s)",
           s->cfg.drain_timeout_ms, s->n_jobs);
    s->hard_cancel = 1;
  }
  if (!s->n_jobs && !s->outbox && !s->draining) {
    uv_timer_stop(&s->tick);
    s->tick_running = 0;
  }
  vs__check_drained(s);
}


/* ---- shutdown ------------------------------------------------------------------------------- */

static void tick_watch_closed(vs_zwatch *w, void *user) {
  vs_server *s = user;
  (void)w;
  s->watches_open--;
}

static void tick_stop_loop(vs_server *s) {
  if (s->stopping) return;
  s->stopping = 1;
  vs_log(VSPEC_LOG_INFO, "server", "drained: stopping");
  /* Workers first: after they are joined nobody calls uv_async_send any more. */
  vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  vs__drain_mail(s);
  uv_timer_stop(&s->tick);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_close((uv_handle_t *)&s->async, NULL);
  uv_signal_stop(&s->sig_term);
  uv_signal_stop(&s->sig_int);
  uv_signal_stop(&s->sig_hup);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  /* Stopping the watchers gives the signals back their default action, which kills: a
   * second SIGTERM (a supervisor's, a user's Ctrl-C) landing during the bounded teardown
   * would turn a clean exit into a death by signal. The teardown is short; SIGKILL stays. */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  for (int i = 0; i < 2; i++) vs_zwatch_close(&s->watch[i], tick_watch_closed);
}

void vs__check_drained(vs_server *s) {
  if (s->draining && !s->stopping && !s->n_jobs && !s->outbox && !s->reload) tick_stop_loop(s);
}

static void tick_begin_drain(vs_server *s, const char *why) {
  if (s->draining) {
    if (!s->hard_cancel) {
      vs_log(VSPEC_LOG_WARN, "server", "%s again: cancelling the running jobs", why);
      s->hard_cancel = 1;
    }
    vs__start_tick(s);
    return;
  }
  s->draining = 1;
  s->drain_started = vs_now();
  vs_sd_notify("STOPPING=1\nSTATUS=draining");
  for (int i = 0; i < s->n_fronts; i++)
    if (s->fronts[i].drain) s->fronts[i].drain(s->front[i]);
  vs_djob *q[4096];
  int n, total = 0;
  while ((n = vs_job_queue_take_all(s->queue, q, 4096)) > 0) {
    for (int i = 0; i < n; i++) {
      vs__finish_unstarted(s, q[i], VS_CANCEL_DRAIN);
      vs_djob_release(q[i]); /* the queue's reference */
    }
    total += n;
  }
  if (s->cfg.drain == VS_DRAIN_CANCEL) s->hard_cancel = 1;
  vs_log(VSPEC_LOG_INFO, "server", "%s: draining; %d waiting job(s) refused, %d running job(s) "
         "%s", why, total, s->n_jobs, s->hard_cancel ? "cancelled" : "finishing");
  vs__reap(s);
  vs__start_tick(s);
  vs__check_drained(s);
}

/* SIGTERM and SIGINT drain; a second one cancels the running jobs. */
void vs__on_signal(uv_signal_t *h, int signum) {
  vs_server *s = h->data;
  tick_begin_drain(s, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* The workers posted news (vs__post): take it all, then deal with the clients found gone. */
void vs__on_async(uv_async_t *h) {
  vs_server *s = h->data;
  vs__drain_mail(s);
  vs__reap(s);
  vs__check_drained(s);
}
