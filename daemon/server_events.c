/*
 * daemon/server_events.c - vspecd's events to clients: sending with credit, Accepted, terminal events, progress and previews, the workers' news
 * (daemon/server_internal.h).
 */
#include "daemon/server_internal.h"

/* ---- sending ----------------------------------------------------------------------------- */

int vs__send(vs_server *s, int sock, const vs_wire_envelope *env, Vspec__Event *ev,
             vs_wire_blob *blobs, int n_blobs) {
  return vs_wire_send_event(s->sock[sock], env, ev, blobs, n_blobs, ZMQ_DONTWAIT);
}

void vs__reply_error(vs_server *s, int sock, const vs_wire_envelope *env,
                     uint64_t request_id, int code, const char *msg, int retry_ms) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  e.code = code;
  e.message = (char *)msg;
  if (retry_ms > 0) {
    e.has_retry_after_ms = 1;
    e.retry_after_ms = (uint32_t)retry_ms;
  }
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  if (request_id) {
    ev.has_request_id = 1;
    ev.request_id = request_id;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

/* A send to the client failed with EHOSTUNREACH: the ROUTER no longer knows it. Its jobs are
 * dealt with by vs__reap once the current callback is done with them. */
void vs__client_lost(vs_server *s, vs_client *c) {
  if (c->gone) return;
  c->gone = 1;
  s->n_gone++;
}

/* Sends a job event to its client (job id and sequence number filled in). */
int vs__job_send(vs_server *s, vs_djob *j, Vspec__Event *ev, vs_wire_blob *blobs,
                 int n_blobs) {
  vs_client *c = j->lp.client;
  if (!c || c->gone) {
    for (int i = 0; i < n_blobs; i++)
      if (blobs[i].free_fn) blobs[i].free_fn(blobs[i].data, blobs[i].hint);
    return -EHOSTUNREACH;
  }
  ev->has_job_id = 1;
  ev->job_id = j->id;
  ev->has_seq = 1;
  ev->seq = j->lp.seq;
  if (j->lp.request_id) {
    ev->has_request_id = 1;
    ev->request_id = j->lp.request_id;
  }
  int rc = vs__send(s, c->sock, &j->lp.env, ev, blobs, n_blobs);
  if (rc == 0) {
    j->lp.seq++;
    j->lp.last_event = vs_now();
  } else if (rc == -EHOSTUNREACH) {
    vs_log(VSPEC_LOG_INFO, "server", "client %s is gone (unroutable); cancelling its jobs",
           c->text);
    vs__client_lost(s, c);
  }
  return rc;
}

/* ---- Accepted ----------------------------------------------------------------------------- */

/* Sends a job's Accepted (its first event, seq 0). Returns 0 when that is done with (sent, or
 * the client is gone), -EAGAIN when the client's queue is full: then j->lp.accepted_pending
 * stays set, nothing else of the job goes out before it, and the timer retries it (from
 * vs__pump, or with the terminal event from the outbox), so the client always learns its
 * job's id. */
int vs__send_accepted(vs_server *s, vs_djob *j) {
  if (!j->lp.accepted_pending) return 0;
  int pos = vs_job_queue_position(s->queue, j);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted a = VSPEC__ACCEPTED__INIT;
  a.has_queue_position = 1;
  a.queue_position = pos > 0 ? (uint32_t)pos : 0;
  a.model = j->model;
  a.method = j->method.text;
  a.node = s->cfg.node;
  a.has_tokens_total = 1;
  a.tokens_total = (uint32_t)j->tokens_total;
  a.has_seed = 1;
  a.seed = j->seed;
  a.has_class_label = j->has_class;
  a.class_label = j->class_label;
  a.class_name = j->class_name[0] ? j->class_name : NULL;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &a;
  int rc = vs__job_send(s, j, &ev, NULL, 0);
  if (rc == -EAGAIN) return rc;
  j->lp.accepted_pending = 0;
  j->lp.queued_reported = pos;
  return 0;
}

/* ---- terminal events ---------------------------------------------------------------------- */

static const char *events_reason_text(int reason) {
  switch (reason) {
    case VS_CANCEL_CLIENT: return "cancelled by its client";
    case VS_CANCEL_ADMIN: return "cancelled by an operator";
    case VS_CANCEL_DEADLINE: return "its deadline passed";
    case VS_CANCEL_DRAIN: return "the daemon is shutting down";
    case VS_CANCEL_GONE: return "its client is gone";
    default: return "cancelled";
  }
}

static void events_free_blob(void *data, void *hint) {
  (void)hint;
  free(data);
}

/* Sends the Result or Error of a finished job. Returns 0 when the job is done with (sent, or
 * its client is gone), -EAGAIN when the client's queue is full (retry later). */
int vs__send_terminal(vs_server *s, vs_djob *j) {
  /* The Accepted goes first: a client learns the job's id before it hears how it ended. */
  if (vs__send_accepted(s, j) == -EAGAIN) return -EAGAIN;
  char who[40];
  snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Result res = VSPEC__RESULT__INIT;
  Vspec__Stats st = VSPEC__STATS__INIT;
  Vspec__Error er = VSPEC__ERROR__INIT;
  vs_wire_blob blobs[3];
  int n_blobs = 0;
  char msg[700], *notes[VS_DJOB_MAX_NOTES];
  pthread_mutex_lock(&j->mu);
  for (int i = 0; i < j->sh.n_notes; i++) notes[i] = j->sh.notes[i];
  int rc = j->sh.rc;
  int reason = atomic_load(&j->cancel_reason);
  if (rc == 0) {
    const vs_djob_stats *x = &j->sh.stats;
    res.has_width = res.has_height = res.has_grid_h = res.has_grid_w = 1;
    res.width = (uint32_t)j->sh.width;
    res.height = (uint32_t)j->sh.height;
    res.grid_h = (uint32_t)j->sh.grid_h;
    res.grid_w = (uint32_t)j->sh.grid_w;
    res.describe = j->sh.describe;
    res.node = s->cfg.node;
    res.has_seed = 1;
    res.seed = j->seed;
    res.n_notes = (size_t)j->sh.n_notes;
    res.notes = notes;
    st.has_tokens = st.has_target_forwards = st.has_rounds = st.has_drafted = 1;
    st.has_accepted = st.has_tpf = st.has_mal = st.has_accept_rate = 1;
    st.has_generate_s = st.has_decode_s = st.has_queue_s = st.has_preview_s = 1;
    st.has_previews = st.has_skipped_rounds = st.has_unverified_tokens = 1;
    st.has_model_generation = st.has_draft_tokens = st.has_walk_accept_rate = 1;
    st.tokens = (uint64_t)x->tokens;
    st.target_forwards = (uint64_t)x->target_forwards;
    st.rounds = (uint64_t)x->rounds;
    st.drafted = (uint64_t)x->drafted;
    st.accepted = (uint64_t)x->accepted;
    st.tpf = x->tpf;
    st.mal = x->mal;
    st.accept_rate = x->accept_rate;
    st.draft_tokens = (uint64_t)x->draft_tokens;
    st.walk_accept_rate = x->walk_accept_rate;
    st.generate_s = x->generate_s;
    st.decode_s = x->decode_s;
    st.queue_s = x->queue_s;
    st.preview_s = x->preview_s;
    st.previews = (uint32_t)x->previews;
    st.skipped_rounds = (uint64_t)x->skipped_rounds;
    st.unverified_tokens = (uint64_t)x->unverified;
    st.model_generation = x->model_generation;
    if (*x->rule_version) st.rule_version = (char *)x->rule_version;
    if (*x->sched_version) st.sched_version = (char *)x->sched_version;
    res.stats = &st;
    ev.body_case = VSPEC__EVENT__BODY_RESULT;
    ev.result = &res;
    /* Copied by libzmq (free_fn NULL): the job keeps its copy for a retry after EAGAIN. */
    int n = j->tokens_total;
    blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = j->sh.png,
                                      .size = j->sh.png_len};
    int32_t *le = malloc((size_t)n * 4);
    uint8_t *stt = malloc((size_t)n);
    if (le && stt) {
      for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)j->sh.tokens[i];
        uint8_t *b = (uint8_t *)&le[i];
        b[0] = (uint8_t)v;
        b[1] = (uint8_t)(v >> 8);
        b[2] = (uint8_t)(v >> 16);
        b[3] = (uint8_t)(v >> 24);
      }
      memcpy(stt, j->sh.status, (size_t)n);
      blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, .data = le,
                                        .size = (size_t)n * 4, .free_fn = events_free_blob};
      blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_STATUS_U8, .data = stt,
                                        .size = (size_t)n, .free_fn = events_free_blob};
    } else {
      free(le);
      free(stt);
    }
  } else {
    er.code = VSPEC__ERROR_CODE__ERR_INTERNAL;
    if (rc == VSPEC_ECANCELED) {
      er.code = reason == VS_CANCEL_DEADLINE ? VSPEC__ERROR_CODE__ERR_DEADLINE
                : reason == VS_CANCEL_DRAIN  ? VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN
                                             : VSPEC__ERROR_CODE__ERR_CANCELLED;
      snprintf(msg, sizeof msg, "job %llu stopped after %d of %d tokens: %s",
               (unsigned long long)j->id, j->sh.n_tokens, j->tokens_total,
               events_reason_text(reason));
      if (reason == VS_CANCEL_DRAIN) {
        er.has_retry_after_ms = 1;
        er.retry_after_ms = (uint32_t)s->cfg.busy_retry_ms;
      }
    } else {
      if (rc == VSPEC_EINVAL || rc == VSPEC_ERANGE || rc == VSPEC_ENOENT || rc == VSPEC_ENOTSUP)
        er.code = VSPEC__ERROR_CODE__ERR_INVALID;
      snprintf(msg, sizeof msg, "job %llu failed: %s", (unsigned long long)j->id, j->sh.error);
    }
    er.message = msg;
    ev.body_case = VSPEC__EVENT__BODY_ERROR;
    ev.error = &er;
  }
  int src = vs__job_send(s, j, &ev, blobs, n_blobs);
  pthread_mutex_unlock(&j->mu);
  if (src == -EAGAIN) return -EAGAIN;
  if (src == 0)
    vs_log(VSPEC_LOG_DEBUG, who, "terminal event sent (%s)", rc ? vs_wire_error_name(er.code)
                                                               : "result");
  return 0;
}

/* Counts a finished job and sends its terminal event; forgets it once that is done. */
static void events_finish(vs_server *s, vs_djob *j) {
  if (j->lp.terminal_sent || j->lp.in_outbox) return;
  vs__count(s, j);
  if (vs__send_terminal(s, j) == -EAGAIN) {
    j->lp.in_outbox = 1;
    j->lp.outbox_since = vs_now();
    j->lp.outbox_next = s->outbox;
    s->outbox = j;
    vs__start_tick(s);
    return;
  }
  vs__job_unlink(s, j);
}

/* Ends a job that never reached a worker (cancelled, deadline, drain) or was just taken
 * from the queue. */
void vs__finish_unstarted(vs_server *s, vs_djob *j, int reason) {
  int none = VS_CANCEL_NONE;
  atomic_compare_exchange_strong(&j->cancel_reason, &none, reason);
  atomic_store(&j->cancel, 1);
  pthread_mutex_lock(&j->mu);
  if (!j->sh.finished) {
    j->sh.finished = 1;
    j->sh.rc = VSPEC_ECANCELED;
    snprintf(j->sh.error, sizeof j->sh.error, "%s", events_reason_text(reason));
  }
  pthread_mutex_unlock(&j->mu);
  events_finish(s, j);
}

/* ---- phases and notices ---------------------------------------------------------------------- */

/* Sends the newest phase state and the notices the client has not had. They cost no credit:
 * the worker sends a phase a few times a second at most, and a job has a few notices. Returns
 * -EAGAIN when the client's queue is full (the tick tries again). */
static int events_send_side_events(vs_server *s, vs_djob *j) {
  char name[16], msg[256], note[VS_DJOB_NOTE_LEN], kind[16];
  double done = 0;
  pthread_mutex_lock(&j->mu);
  int phase = j->sh.phase_dirty, notes = j->sh.n_notes;
  if (phase) {
    snprintf(name, sizeof name, "%s", j->sh.phase_name);
    snprintf(msg, sizeof msg, "%s", j->sh.phase_msg);
    done = j->sh.phase_done;
    j->sh.phase_dirty = 0;
  }
  pthread_mutex_unlock(&j->mu);
  if (phase) {
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Phase ph = VSPEC__PHASE__INIT;
    ph.name = name;
    ph.message = msg;
    ph.has_done = 1;
    ph.done = done;
    ev.body_case = VSPEC__EVENT__BODY_PHASE;
    ev.phase = &ph;
    int rc = vs__job_send(s, j, &ev, NULL, 0);
    if (rc == -EAGAIN) {
      pthread_mutex_lock(&j->mu);
      j->sh.phase_dirty = 1; /* unless a newer state came meanwhile: the same flag */
      pthread_mutex_unlock(&j->mu);
      return rc;
    }
  }
  while (j->lp.notes_sent < notes) {
    pthread_mutex_lock(&j->mu);
    snprintf(note, sizeof note, "%s", j->sh.notes[j->lp.notes_sent]);
    snprintf(kind, sizeof kind, "%s", j->sh.note_kinds[j->lp.notes_sent]);
    pthread_mutex_unlock(&j->mu);
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Notice nt = VSPEC__NOTICE__INIT;
    nt.kind = kind;
    nt.message = note;
    ev.body_case = VSPEC__EVENT__BODY_NOTICE;
    ev.notice = &nt;
    int rc = vs__job_send(s, j, &ev, NULL, 0);
    if (rc == -EAGAIN) return rc;
    j->lp.notes_sent++; /* sent, or the client is gone */
  }
  return 0;
}

/* ---- progress and previews ------------------------------------------------------------------ */

/* Sends the worker's newest preview, if one waits. A preview that cannot go now waits for the
 * next pump, unless the job has finished (`final`): then the result is what matters. */
static void events_send_preview(vs_server *s, vs_djob *j, int final) {
  pthread_mutex_lock(&j->mu);
  uint8_t *png = j->sh.preview_png;
  size_t len = j->sh.preview_len;
  int64_t round = j->sh.preview_round;
  int tokens = j->sh.preview_tokens, w = j->sh.preview_w, h = j->sh.preview_h;
  j->sh.preview_png = NULL;
  pthread_mutex_unlock(&j->mu);
  if (png) {
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Preview p = VSPEC__PREVIEW__INIT;
    p.has_kind = p.has_round = p.has_tokens_done = p.has_tokens_total = 1;
    p.has_width = p.has_height = 1;
    p.kind = j->preview_kind;
    p.round = round;
    p.tokens_done = (uint32_t)tokens;
    p.tokens_total = (uint32_t)j->tokens_total;
    p.width = (uint32_t)w;
    p.height = (uint32_t)h;
    ev.body_case = VSPEC__EVENT__BODY_PREVIEW;
    ev.preview = &p;
    vs_wire_blob b = {.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = png, .size = len};
    int rc = vs__job_send(s, j, &ev, &b, 1);
    if (rc == 0) {
      j->lp.credit--;
      vs_stats_preview_sent(&s->stats, len);
      free(png);
    } else if (final) {
      free(png);
    } else {
      /* Put it back unless the worker has a newer one already. */
      pthread_mutex_lock(&j->mu);
      if (!j->sh.preview_png) {
        j->sh.preview_png = png;
        png = NULL;
      }
      pthread_mutex_unlock(&j->mu);
      free(png);
      if (rc == -EAGAIN) {
        j->lp.retry = 1;
        vs__start_tick(s);
      }
    }
  }
}

/* The token-map delta since the last progress event and the figures that go with it. */
typedef struct events_delta {
  uint32_t *pos, *stv;
  int32_t *tok;
  int nd, n_tokens, coalesced;
  int64_t round;
  double tpf, mal, acc, wacc, elapsed;
} events_delta;

/* Takes the delta under the job's lock, into arrays it allocates (the caller frees them);
 * 0 when there is nothing new. */
static int events_take_delta(vs_djob *j, events_delta *d) {
  int n = j->tokens_total, have = 0;
  pthread_mutex_lock(&j->mu);
  if (j->sh.dirty) {
    d->pos = malloc((size_t)n * sizeof *d->pos);
    d->tok = malloc((size_t)n * sizeof *d->tok);
    d->stv = malloc((size_t)n * sizeof *d->stv);
  }
  if (j->sh.dirty && d->pos && d->tok && d->stv) {
    have = 1;
    d->n_tokens = j->sh.n_tokens;
    /* Raster order: the first n_tokens entries are the map, and each of them goes out once
     * even when it equals what the client was sent. A continuous-token model reveals
     * positions in any order: its whole map is current and a position goes out when its
     * status changes. */
    int whole = j->sh.whole_map;
    int cur = whole ? n : d->n_tokens;
    for (int i = 0; i < n; i++) {
      int32_t t = i < cur ? j->sh.tokens[i] : 0;
      uint8_t st = i < cur ? j->sh.status[i] : 0;
      if (t != j->lp.sent_tokens[i] || st != j->lp.sent_status[i] ||
          (!whole && i < d->n_tokens && i >= j->lp.sent_n)) {
        d->pos[d->nd] = (uint32_t)i;
        d->tok[d->nd] = t;
        d->stv[d->nd] = st;
        d->nd++;
      }
    }
    d->round = j->sh.round;
    d->coalesced = j->sh.coalesced;
    d->tpf = j->sh.tpf;
    d->mal = j->sh.mal;
    d->acc = j->sh.accept_rate;
    d->wacc = j->sh.walk_accept_rate;
    d->elapsed = j->sh.elapsed_s;
    j->sh.dirty = 0;
    j->sh.coalesced = 0;
  }
  pthread_mutex_unlock(&j->mu);
  return have;
}

/* Sends the delta as a Progress event; what was sent is remembered, what was not goes out
 * (or a newer state does) next time. */
static void events_send_delta(vs_server *s, vs_djob *j, const events_delta *d, double now) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Progress p = VSPEC__PROGRESS__INIT;
  p.has_round = p.has_tokens_done = p.has_tokens_total = p.has_tpf = p.has_mal = 1;
  p.has_elapsed_s = p.has_coalesced = p.has_accept_rate = 1;
  p.round = d->round;
  p.tokens_done = (uint32_t)d->n_tokens;
  p.tokens_total = (uint32_t)j->tokens_total;
  p.tpf = d->tpf;
  p.mal = d->mal;
  p.accept_rate = d->acc;
  p.has_walk_accept_rate = 1;
  p.walk_accept_rate = d->wacc;
  p.elapsed_s = d->elapsed;
  p.coalesced = (uint32_t)d->coalesced;
  p.n_positions = p.n_tokens = p.n_status = (size_t)d->nd;
  p.positions = d->pos;
  p.tokens = d->tok;
  p.status = d->stv;
  ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
  ev.progress = &p;
  int rc = vs__job_send(s, j, &ev, NULL, 0);
  if (rc == 0) {
    j->lp.credit--;
    j->lp.last_progress = now;
    for (int k = 0; k < d->nd; k++) {
      j->lp.sent_tokens[d->pos[k]] = d->tok[k];
      j->lp.sent_status[d->pos[k]] = (uint8_t)d->stv[k];
    }
    if (d->n_tokens > j->lp.sent_n) j->lp.sent_n = d->n_tokens;
  } else {
    /* Not sent: the same state (or a newer one) goes out next time. */
    pthread_mutex_lock(&j->mu);
    j->sh.dirty = 1;
    pthread_mutex_unlock(&j->mu);
    if (rc == -EAGAIN) {
      j->lp.retry = 1;
      vs__start_tick(s);
    }
  }
}

/* A progress event with the token-map delta, when the map changed. */
static void events_progress(vs_server *s, vs_djob *j, double now) {
  events_delta d = {0};
  if (events_take_delta(j, &d)) events_send_delta(s, j, &d, now);
  free(d.pos);
  free(d.tok);
  free(d.stv);
}

/* Sends what the job's client can take now: the token-map delta since the last progress
 * event and the newest preview, each costing one credit; or the terminal event. */
void vs__pump(vs_server *s, vs_djob *j) {
  if (j->lp.terminal_sent || j->lp.in_outbox) return;
  vs_client *c = j->lp.client;
  j->lp.retry = 0;
  pthread_mutex_lock(&j->mu);
  int finished = j->sh.finished;
  pthread_mutex_unlock(&j->mu);
  if (!c || c->gone) {
    if (finished) events_finish(s, j);
    return;
  }
  /* Nothing goes out before the Accepted; a finished job's waits in the outbox with its
   * terminal event, which sends both in order. */
  if (vs__send_accepted(s, j) == -EAGAIN) {
    if (finished) {
      events_finish(s, j);
    } else {
      j->lp.retry = 1;
      vs__start_tick(s);
    }
    return;
  }
  if (events_send_side_events(s, j) == -EAGAIN) {
    j->lp.retry = 1;
    vs__start_tick(s);
    if (!finished) return;
  }
  /* The last state goes out before the terminal event (credit permitting), so a client that
   * follows the deltas ends up with the complete map. */
  double now = vs_now();
  int progress_due = finished || j->progress_interval <= 0 ||
                     now - j->lp.last_progress >= j->progress_interval;
  if (j->progress && j->lp.credit > 0 && !progress_due) {
    /* Too soon after the last one: the tick sends the newest state when it is due. */
    pthread_mutex_lock(&j->mu);
    int dirty = j->sh.dirty;
    pthread_mutex_unlock(&j->mu);
    if (dirty) {
      j->lp.retry = 1;
      vs__start_tick(s);
    }
  }
  if (j->progress && j->lp.credit > 0 && progress_due) events_progress(s, j, now);

  /* A preview rendered before the job ended still goes out, ahead of the result: a fast
   * job would otherwise end before the loop took any. */
  if (j->lp.credit > 0 && !c->gone) events_send_preview(s, j, finished);
  if (finished) events_finish(s, j);
}

/* Deals with clients found gone: waiting jobs are dropped, running ones cancelled (the worker
 * stops at the next round and the job is freed then), finished ones forgotten. */
void vs__reap(vs_server *s) {
  if (!s->n_gone) return;
  for (int b = 0; b < VS_BUCKETS; b++) {
    vs_client **pc = &s->clients[b];
    while (*pc) {
      vs_client *c = *pc;
      if (!c->gone) {
        pc = &c->hnext;
        continue;
      }
      s->totals.clients_lost++;
      while (c->jobs) {
        vs_djob *j = c->jobs;
        c->jobs = j->lp.client_next;
        c->n_jobs--;
        j->lp.client = NULL;
        char who[40];
        snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
        if (vs_job_queue_remove(s->queue, j)) {
          vs_log(VSPEC_LOG_INFO, who, "dropped from the queue: its client is gone");
          vs__job_unlink(s, j); /* counted as cancelled */
          continue;
        }
        pthread_mutex_lock(&j->mu);
        int finished = j->sh.finished;
        pthread_mutex_unlock(&j->mu);
        if (finished) {
          /* Finished, perhaps before the loop heard of it (its news may still be in the
           * mailbox): counted here by how it ended, unless events_finish counted it already. */
          vs__job_unlink(s, j);
        } else {
          vs_log(VSPEC_LOG_INFO, who, "cancelled: its client is gone");
          vs_djob_cancel(j, VS_CANCEL_GONE);
          /* Stays in the job table until the worker finishes; then events_finish drops it. */
        }
      }
      *pc = c->hnext;
      s->n_clients--;
      s->n_gone--;
      free(c);
    }
  }
}


/* ---- worker news ----------------------------------------------------------------------------- */

void vs__post(vs_djob *j, void *user) {
  vs_server *s = user;
  pthread_mutex_lock(&s->mail_mu);
  if (!j->in_mail) {
    j->in_mail = 1;
    vs_djob_retain(j);
    j->mail_next = s->mail;
    s->mail = j;
  }
  pthread_mutex_unlock(&s->mail_mu);
  uv_async_send(&s->async);
}

void vs__drain_mail(vs_server *s) {
  /* uv_async_send coalesces wake-ups, so take everything that is there. */
  pthread_mutex_lock(&s->mail_mu);
  vs_djob *list = s->mail;
  s->mail = NULL;
  for (vs_djob *j = list; j; j = j->mail_next) {
    j->in_mail = 0;
    j->taken_next = j->mail_next;
  }
  pthread_mutex_unlock(&s->mail_mu);
  while (list) {
    vs_djob *j = list;
    list = j->taken_next;
    if (!j->lp.terminal_sent) {
      if (!j->lp.client) {
        /* Client gone while it ran: now that it has stopped, forget it. */
        pthread_mutex_lock(&j->mu);
        int finished = j->sh.finished;
        pthread_mutex_unlock(&j->mu);
        if (finished) vs__job_unlink(s, j); /* counted by how it ended */
      } else {
        vs__pump(s, j);
      }
    }
    vs_djob_release(j);
  }
}

/* Arms the tick, with the callback server.c registered (s->on_tick, server_tick.c): a send
 * that has to be retried asks for it without calling into the loop's code. */
void vs__start_tick(vs_server *s) {
  if (s->tick_running || s->stopping) return;
  s->tick_running = 1;
  uv_timer_start(&s->tick, s->on_tick, VS_TICK_MS, VS_TICK_MS);
}
