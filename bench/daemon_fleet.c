#include "bench/daemon_fleet.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "bench/bench.h"
#include "daemon/config.h" /* VS_FLEET_CLAIM_HEARTBEATS */

#define VS__START_TIMEOUT_S 60.0 /* a daemon loads its model before it answers */

int vs_bench_fleet_spawn_daemon(vs_bench_fleet *f, int i) {
  char model[1200], workers[16], threads[16], redis[400], claim[64], hb[64];
  snprintf(model, sizeof model, "bench=%s", f->o.model_dir);
  snprintf(workers, sizeof workers, "%d", f->o.workers);
  snprintf(threads, sizeof threads, "%d", f->o.threads);
  snprintf(redis, sizeof redis, "fleet.redis=%s", f->redis.url);
  snprintf(claim, sizeof claim, "fleet.claim_idle_ms=%d", f->o.claim_idle_ms);
  /* the slowest heartbeat the claim time allows (vspecd refuses a slower one) */
  snprintf(hb, sizeof hb, "fleet.heartbeat_ms=%d",
           f->o.claim_idle_ms / VS_FLEET_CLAIM_HEARTBEATS);
  /* As vspecd-bench runs its daemon (models.fmnist= drops the built-in model), plus fleet
   * mode under this daemon's own consumer name. */
  const char *args[] = {"--model", model, "--set", "models.fmnist=", "--default-model", "bench",
                        "--workers", workers, "--threads", threads, "--node", f->d_name[i],
                        "--set", redis, "--set", claim, "--set", hb, "--log-level", "info",
                        NULL};
  return vs_bench_daemon_spawn(&f->d[i], args, NULL);
}

int vs_bench_fleet_spawn_gateway(vs_bench_fleet *f, int i) {
  const char *args[] = {"--front", f->gw_ep[i], "--redis", f->redis.url, "--node",
                        f->gw_name[i], "--log-level", "info", NULL};
  return vs_bench_proc_spawn(&f->gw[i], args);
}

static int df_paths(vs_bench_fleet *f, char *err, size_t errlen) {
  snprintf(f->dir, sizeof f->dir, "/tmp/vspecd-fleet-bench-XXXXXX");
  if (!mkdtemp(f->dir)) {
    f->dir[0] = 0;
    snprintf(err, errlen, "mkdtemp failed");
    return -1;
  }
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++) {
    if (vs_bench_daemon_init(&f->d[i], "vspecd-fleet-bench")) {
      snprintf(err, errlen, "cannot make the daemons' directories");
      return -1;
    }
    f->d[i].die_with_parent = 1;
    snprintf(f->d_name[i], sizeof f->d_name[i], "d%d", i);
  }
  for (int i = 0; i < VS_BENCH_FLEET_GATEWAYS; i++) {
    snprintf(f->gw[i].path, sizeof f->gw[i].path, "%s/vspec-gateway", f->d[0].exe_dir);
    snprintf(f->gw[i].log, sizeof f->gw[i].log, "%s/gw%d.log", f->dir, i);
    snprintf(f->gw_ep[i], sizeof f->gw_ep[i], "ipc://%s/gw%d.sock", f->dir, i);
    snprintf(f->gw_name[i], sizeof f->gw_name[i], "gw%d", i);
  }
  return 0;
}

/* The daemons are started together (each loads the model), then waited for. */
static int df_start_members(vs_bench_fleet *f, char *err, size_t errlen) {
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++)
    if (vs_bench_fleet_spawn_daemon(f, i)) {
      snprintf(err, errlen, "cannot fork vspecd");
      return -1;
    }
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++)
    if (vs_bench_daemon_wait_up(&f->d[i], VS__START_TIMEOUT_S)) {
      snprintf(err, errlen, "vspecd %s did not start (see %s)", f->d_name[i], f->d[i].log);
      return -1;
    }
  for (int i = 0; i < VS_BENCH_FLEET_GATEWAYS; i++)
    if (vs_bench_fleet_spawn_gateway(f, i) ||
        vs_bench_ping_until_up(f->gw_ep[i], f->gw[i].pid, 10)) {
      snprintf(err, errlen, "vspec-gateway %s did not start (see %s)", f->gw_name[i],
               f->gw[i].log);
      return -1;
    }
  return 0;
}

int vs_bench_fleet_start(vs_bench_fleet *f, const vs_bench_fleet_opts *o, char *err,
                         size_t errlen) {
  memset(f, 0, sizeof *f);
  f->o = *o;
  if (df_paths(f, err, errlen)) return -1;
  if (vs_bench_redis_init(&f->redis, f->dir, o->appendfsync, err, errlen) ||
      vs_bench_redis_start(&f->redis, 10, err, errlen))
    return -1;
  if (df_start_members(f, err, errlen)) return -1;
  vs_fleet_opts fo;
  vs_fleet_opts_defaults(&fo);
  fo.url = f->redis.url;
  return vs_fleet_queue_open(&fo, &f->q, err, errlen) ? -1 : 0;
}

int vs_bench_fleet_daemon_index(const vs_bench_fleet *f, const char *node) {
  for (int i = 0; node && i < VS_BENCH_FLEET_DAEMONS; i++)
    if (!strcmp(node, f->d_name[i])) return i;
  return -1;
}

int vs_bench_fleet_is_gateway(const vs_bench_fleet *f, const char *node) {
  for (int i = 0; node && i < VS_BENCH_FLEET_GATEWAYS; i++)
    if (!strcmp(node, f->gw_name[i])) return 1;
  return 0;
}

/* XPENDING's summary: [count, first id, last id, [[consumer, "count"], ...] or nil]. Its own
 * connection: the queue API reports the group's total only. */
int vs_bench_fleet_held(vs_bench_fleet *f, int *held, char *err, size_t errlen) {
  memset(held, 0, VS_BENCH_FLEET_DAEMONS * sizeof *held);
  redisContext *c = redisConnectUnixWithTimeout(f->redis.sock, (struct timeval){2, 0});
  if (!c || c->err) {
    snprintf(err, errlen, "redis at %s: %s", f->redis.sock, c ? c->errstr : "out of memory");
    redisFree(c);
    return -1;
  }
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  redisReply *r = redisCommand(c, "XPENDING %s %s", o.stream, o.group);
  int rc = -1;
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 4) {
    snprintf(err, errlen, "XPENDING: %s", r && r->type == REDIS_REPLY_ERROR ? r->str : "no reply");
  } else {
    rc = 0;
    const redisReply *per = r->element[3];
    for (size_t i = 0; per->type == REDIS_REPLY_ARRAY && i < per->elements; i++) {
      const redisReply *e = per->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
          e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_STRING)
        continue;
      int d = vs_bench_fleet_daemon_index(f, e->element[0]->str);
      if (d >= 0) held[d] = atoi(e->element[1]->str);
    }
  }
  if (r) freeReplyObject(r);
  redisFree(c);
  return rc;
}

int vs_bench_fleet_check_up(vs_bench_fleet *f, double timeout_s, char *err, size_t errlen) {
  double end = vs_bench_now() + timeout_s;
  while (!vs_bench_redis_listening(&f->redis)) {
    if (vs_bench_proc_exited(&f->redis.proc) || vs_bench_now() > end) {
      snprintf(err, errlen, "redis-server is not running (see %s)", f->redis.proc.log);
      return -1;
    }
    usleep(10000);
  }
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++)
    if (f->d[i].pid <= 0 ||
        vs_bench_ping_until_up(f->d[i].admin_ep, f->d[i].pid, end - vs_bench_now() + 1)) {
      snprintf(err, errlen, "vspecd %s does not answer (see %s)", f->d_name[i], f->d[i].log);
      return -1;
    }
  for (int i = 0; i < VS_BENCH_FLEET_GATEWAYS; i++)
    if (f->gw[i].pid <= 0 ||
        vs_bench_ping_until_up(f->gw_ep[i], f->gw[i].pid, end - vs_bench_now() + 1)) {
      snprintf(err, errlen, "vspec-gateway %s does not answer (see %s)", f->gw_name[i],
               f->gw[i].log);
      return -1;
    }
  return 0;
}

int vs_bench_fleet_drained(vs_bench_fleet *f, double timeout_s, long long *length,
                           long long *pending, double *took_s, char *err, size_t errlen) {
  double t0 = vs_bench_now();
  int rc;
  for (;;) {
    /* A connection left over from before a Redis restart fails once, then reconnects. */
    rc = vs_fleet_depth(f->q, length, pending, err, errlen);
    if (rc == VSPEC_EIO) rc = vs_fleet_depth(f->q, length, pending, err, errlen);
    *took_s = vs_bench_now() - t0;
    if (rc) return -1;
    if (*length == 0 && *pending == 0) return 0;
    if (*took_s > timeout_s) return 1;
    usleep(50000);
  }
}

/* Members a failed start never got to have no log. */
static int df_has_log(const char *path) { return path[0] && access(path, R_OK) == 0; }

void vs_bench_fleet_dump_logs(const vs_bench_fleet *f) {
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++) {
    if (!df_has_log(f->d[i].log)) continue;
    fprintf(stderr, "---- vspecd %s (%s)\n", f->d_name[i], f->d[i].log);
    fflush(stderr);
    vs_bench_daemon_dump_log(&f->d[i], 25);
  }
  for (int i = 0; i < VS_BENCH_FLEET_GATEWAYS; i++)
    if (df_has_log(f->gw[i].log)) vs_bench_proc_dump_log(&f->gw[i], f->gw_name[i], 25);
  if (df_has_log(f->redis.proc.log)) vs_bench_proc_dump_log(&f->redis.proc, "redis-server", 15);
}

int vs_bench_fleet_stop(vs_bench_fleet *f, int keep) {
  vs_fleet_queue_destroy(&f->q);
  for (int i = 0; i < VS_BENCH_FLEET_GATEWAYS; i++) vs_bench_proc_stop(&f->gw[i], SIGTERM, 3000);
  int rc = 0;
  /* The daemons before Redis: their agents leave cleanly while it is there. */
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++) {
    if (keep) {
      vs_bench_daemon_stop(&f->d[i], 30000);
      if (f->d[i].tmp[0]) fprintf(stderr, "kept: %s (vspecd %s)\n", f->d[i].tmp, f->d_name[i]);
    } else if (vs_bench_daemon_cleanup(&f->d[i])) {
      rc = -1;
    }
  }
  vs_bench_redis_stop(&f->redis);
  if (keep && f->dir[0]) fprintf(stderr, "kept: %s (redis-server, gateways)\n", f->dir);
  if (f->dir[0] && !keep) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd)) rc = -1;
  }
  return rc;
}
