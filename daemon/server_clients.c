/*
 * daemon/server_clients.c - vspecd's clients and the job table: who is connected, which jobs each holds
 * (daemon/server_internal.h).
 */
#include "daemon/server_internal.h"

/* ---- clients ------------------------------------------------------------------------ */

/* The connection of an envelope: its first routing frame. */
static void clients_connection(const vs_wire_envelope *env, vs_wire_envelope *conn) {
  conn->n = env->n > 0;
  if (conn->n) {
    conn->len[0] = env->len[0];
    memcpy(conn->id[0], env->id[0], env->len[0]);
  }
}

/* The client key of the connection m came on (the hash table's and the queue's fairness). */
uint64_t vs__client_key(int sock, const vs_wire_msg *m) {
  vs_wire_envelope conn;
  clients_connection(&m->env, &conn);
  return vs_wire_envelope_hash(&conn) ^ (uint64_t)sock;
}

vs_client *vs__client_find(vs_server *s, int sock, const vs_wire_msg *m) {
  vs_wire_envelope conn;
  clients_connection(&m->env, &conn);
  uint64_t key = vs__client_key(sock, m);
  for (vs_client *c = s->clients[key % VS_BUCKETS]; c; c = c->hnext)
    if (c->key == key && c->sock == sock && vs_wire_envelope_equal(&c->env, &conn) &&
        !strcmp(c->user_id, m->user_id))
      return c;
  return NULL;
}

vs_client *vs__client_add(vs_server *s, int sock, const vs_wire_msg *m) {
  vs_client *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  clients_connection(&m->env, &c->env);
  memcpy(c->user_id, m->user_id, sizeof c->user_id);
  c->sock = sock;
  c->key = vs__client_key(sock, m);
  vs_wire_envelope_text(&c->env, c->text, sizeof c->text);
  const char *name = *c->user_id ? vs_zap_name(s->zap, c->user_id) : NULL;
  if (name) {
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof c->text - n, " (%s)", name);
  }
  vs_client **b = &s->clients[c->key % VS_BUCKETS];
  c->hnext = *b;
  *b = c;
  s->n_clients++;
  return c;
}

static void clients_client_free(vs_server *s, vs_client *c) {
  for (vs_client **p = &s->clients[c->key % VS_BUCKETS]; *p; p = &(*p)->hnext)
    if (*p == c) {
      *p = c->hnext;
      break;
    }
  s->n_clients--;
  free(c);
}

/* ---- the job table ---------------------------------------------------------------------- */

vs_djob *vs__job_find(vs_server *s, uint64_t id) {
  for (vs_djob *j = s->jobs[id % VS_BUCKETS]; j; j = j->lp.id_next)
    if (j->id == id) return j;
  return NULL;
}

/* The same socket, whole routing envelope (through a proxy, the same client of the proxy)
 * and CURVE key. */
int vs__job_owned_by(const vs_djob *j, int sock, const vs_wire_msg *m) {
  const vs_client *c = j->lp.client;
  return c && c->sock == sock && vs_wire_envelope_equal(&j->lp.env, &m->env) &&
         !strcmp(c->user_id, m->user_id);
}

void vs__job_link(vs_server *s, vs_djob *j, vs_client *c, const vs_wire_envelope *env) {
  vs_djob **b = &s->jobs[j->id % VS_BUCKETS];
  j->lp.id_next = *b;
  *b = j;
  s->n_jobs++;
  j->lp.client = c;
  j->lp.env = *env;
  j->lp.last_event = vs_now();
  j->lp.client_next = c->jobs;
  c->jobs = j;
  c->n_jobs++;
}

/* Counts a job in the status totals by how it ended (a job that never finished was
 * cancelled), once: every job that leaves the table passes here, whichever way it left. */
void vs__count(vs_server *s, vs_djob *j) {
  if (j->lp.counted) return;
  j->lp.counted = 1;
  pthread_mutex_lock(&j->mu);
  int finished = j->sh.finished, rc = j->sh.rc;
  int64_t tokens = j->sh.stats.tokens;
  vs_djob_stats st = j->sh.stats;
  pthread_mutex_unlock(&j->mu);
  vs_stats_job_ended(&s->stats, j->method.text, finished && rc == 0, finished, &st);
  if (!finished || rc == VSPEC_ECANCELED) {
    s->totals.cancelled++;
  } else if (rc == 0) {
    s->totals.completed++;
    s->totals.tokens += (uint64_t)tokens;
  } else {
    s->totals.failed++;
  }
}

/* Forgets a job whose terminal event is sent (or whose client is gone): counts it if nothing
 * did yet and drops the loop's reference. The client goes with its last job. */
void vs__job_unlink(vs_server *s, vs_djob *j) {
  vs__count(s, j);
  for (vs_djob **p = &s->jobs[j->id % VS_BUCKETS]; *p; p = &(*p)->lp.id_next)
    if (*p == j) {
      *p = j->lp.id_next;
      s->n_jobs--;
      break;
    }
  for (vs_djob **p = &s->outbox; *p; p = &(*p)->lp.outbox_next)
    if (*p == j) {
      *p = j->lp.outbox_next;
      break;
    }
  vs_client *c = j->lp.client;
  if (c) {
    for (vs_djob **p = &c->jobs; *p; p = &(*p)->lp.client_next)
      if (*p == j) {
        *p = j->lp.client_next;
        c->n_jobs--;
        break;
      }
    j->lp.client = NULL;
    if (!c->n_jobs && !c->gone) clients_client_free(s, c);
  }
  j->lp.terminal_sent = 1;
  vs_djob_release(j);
}
