/*
 * vspecd-bench --batch B [--lanes L]: throughput of cross-job batching against the daemon
 * without it.
 *
 * Three daemons run side by side (idle ones cost nothing: their workers wait on the queue):
 *   one job   1 worker with every core, one job in flight: the time of one image;
 *   workers   a worker per core, one thread each, B x L jobs in flight: throughput
 *             without batching (jobs share the cores, each reads all weights for itself);
 *   batched   B x L workers and [workers] batch = B, batch_lanes = L, B x L jobs in flight:
 *             the jobs' target and draft forwards run as batches of up to B, L at a time,
 *             each lane on cores / L threads (core/forward_gate.h).
 * With --device cuda[:N] all three run on the GPU, and the unbatched daemon has a worker (a
 * context with its own stream) per job in flight; `vspecd-bench --gpt-b --device cuda --batch 8`
 * is issue 29's goal (8 concurrent GPT-B jobs at least 5x one job's throughput: the first
 * ratio). The batched daemon's log line also counts the device orderings its batches issued.
 * Each round measures every configuration once, in an order that rotates from round to round,
 * so drift on a shared machine falls on all three; ratios are taken within a round and their
 * median reported. The batched daemon's own count of batches is printed from its log.
 */
#include "bench/daemon_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bootstrap.h" /* vs_quantile */
#include "bench/daemon_jobs.h"
#include "bench/daemon_proc.h"

enum { VS_CFG_ONE, VS_CFG_WORKERS, VS_CFG_BATCHED, VS_NCFG };

typedef struct vs__cfg {
  const char *name;
  int workers, threads, batch, lanes, inflight;
  vs_bench_daemon d;
  vs_conn conn;
  int up;
  double ips[64]; /* images/s per round */
} vs__cfg;

static int db_start(vs__cfg *c, const vs_batch_bench_opts *o) {
  char model[1200], w[16], t[16], b[48], prec[64], lanes[48], kind[48], index[48];
  snprintf(model, sizeof model, "bench=%s", o->model_dir);
  snprintf(w, sizeof w, "%d", c->workers);
  snprintf(t, sizeof t, "%d", c->threads);
  snprintf(b, sizeof b, "workers.batch=%d", c->batch);
  snprintf(prec, sizeof prec, "device.precision=%s", o->precision ? o->precision : "default");
  snprintf(lanes, sizeof lanes, "workers.batch_lanes=%d", c->lanes);
  /* cuda[:N] -> [device] kind = cuda, index = N */
  int gpu = o->device && !strncmp(o->device, "cuda", 4);
  snprintf(kind, sizeof kind, "device.kind=%s", gpu ? "cuda" : "cpu");
  snprintf(index, sizeof index, "device.index=%d",
           gpu && o->device[4] == ':' ? atoi(o->device + 5) : 0);
  const char *args[] = {"--model", model, "--set", "models.fmnist=", "--default-model", "bench",
                        "--workers", w, "--threads", t, "--set", b, "--set", prec,
                        "--set", lanes, "--set", kind, "--log-level", "info",
                        gpu ? "--set" : NULL, index, NULL};
  char err[512];
  if (vs_bench_daemon_init(&c->d, o->prog) || vs_bench_daemon_start(&c->d, args, NULL))
    return -1;
  if (vs_conn_open(&c->conn, c->d.job_ep, NULL, err, sizeof err)) {
    fprintf(stderr, "vspecd-bench: %s\n", err);
    return -1;
  }
  c->up = 1;
  return 0;
}

/* The median of n values (type 7: the mean of the middle two for even n), v left as it is. */
static double dbatch_median(const double *v, int n) {
  double c[64];
  memcpy(c, v, (size_t)n * sizeof *c);
  return vs_quantile(c, n, 0.5);
}

/* Median, min and max over rounds of cfg a's images/s over cfg b's. */
static void db_ratio(const vs__cfg *a, const vs__cfg *b, int rounds) {
  double r[64], lo = 1e300, hi = 0;
  for (int i = 0; i < rounds; i++) {
    r[i] = a->ips[i] / b->ips[i];
    lo = r[i] < lo ? r[i] : lo;
    hi = r[i] > hi ? r[i] : hi;
  }
  printf("| %s / %s | %.2fx | %.2fx - %.2fx |\n", a->name, b->name, dbatch_median(r, rounds), lo,
         hi);
}

/* The batched daemon's summary line ("... forwards (target and draft) in ... batches ..."),
 * logged when its model set closes at shutdown. */
static void db_print_gate_line(const vs_bench_daemon *d) {
  FILE *f = fopen(d->log, "r");
  char line[1024];
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, "forwards (target and draft) in"))
      printf("\nbatched daemon: %s", strstr(line, "bench"));
  if (f) fclose(f);
}

int vs_daemon_batch_bench(const vs_batch_bench_opts *o) {
  int rounds = o->rounds < 1 ? 1 : o->rounds > 64 ? 64 : o->rounds;
  int lanes = o->lanes > 0 ? o->lanes : 1;
  /* On a GPU the unbatched daemon has a worker (a stream) per job in flight: its cores are
   * not what bounds it. */
  int gpu = o->device && !strncmp(o->device, "cuda", 4);
  vs__cfg cfg[VS_NCFG] = {
      {.name = "one job", .workers = 1, .threads = o->cores, .batch = 1, .lanes = 1,
       .inflight = 1},
      {.name = "workers", .workers = gpu ? o->batch * lanes : o->cores, .threads = 1,
       .batch = 1, .lanes = 1, .inflight = o->batch * lanes},
      /* workers: cores / count threads (at least 1); batches: a device with every core */
      {.name = "batched", .workers = o->batch * lanes, .threads = 0, .batch = o->batch,
       .lanes = lanes, .inflight = o->batch * lanes}};
  vs_bench_jobres *res = calloc((size_t)o->jobs, sizeof *res);
  int status = 1;
  for (int k = 0; k < VS_NCFG; k++) {
    if (db_start(&cfg[k], o)) goto done;
    /* warm-up: page in the weights, let every worker allocate */
    if (vs_bench_run_jobs(&cfg[k].conn, cfg[k].inflight, cfg[k].inflight, 900, 1, o->method, 0,
                          res) < 0)
      goto done;
  }
  printf("### 4. cross-job batching (%d jobs in flight, device %s, %d core(s), %s precision, "
         "%d jobs per measurement, %d rounds, interleaved)\n\n", o->batch * lanes,
         o->device ? o->device : "cpu", o->cores, o->precision ? o->precision : "default",
         o->jobs, rounds);
  for (int r = 0; r < rounds; r++)
    for (int j = 0; j < VS_NCFG; j++) {
      vs__cfg *c = &cfg[(j + r) % VS_NCFG];
      double wall = vs_bench_run_jobs(&c->conn, o->jobs, c->inflight, 1000 + 100 * (uint64_t)r,
                                      1, o->method, 0, res);
      if (wall <= 0) goto done;
      c->ips[r] = o->jobs / wall;
    }
  printf("| configuration | workers x threads | jobs in flight | images/s, median |\n"
         "|---|---|---|---|\n");
  for (int k = 0; k < VS_NCFG; k++) {
    int threads = cfg[k].threads ? cfg[k].threads : o->cores / cfg[k].workers;
    char how[160] = "";
    if (k == VS_CFG_BATCHED)
      snprintf(how, sizeof how, ", batches of up to %d on %d lane(s) of %d thread(s)", o->batch,
               lanes, o->cores / lanes > 0 ? o->cores / lanes : 1);
    printf("| %s | %d x %d%s | %d | %.2f |\n", cfg[k].name, cfg[k].workers,
           threads > 0 ? threads : 1, how, cfg[k].inflight, dbatch_median(cfg[k].ips, rounds));
  }
  printf("\n| ratio of images/s | median over rounds | range |\n|---|---|---|\n");
  db_ratio(&cfg[VS_CFG_BATCHED], &cfg[VS_CFG_ONE], rounds);
  db_ratio(&cfg[VS_CFG_BATCHED], &cfg[VS_CFG_WORKERS], rounds);
  db_ratio(&cfg[VS_CFG_WORKERS], &cfg[VS_CFG_ONE], rounds);
  status = 0;
done:
  for (int k = 0; k < VS_NCFG; k++) {
    if (cfg[k].up) vs_conn_close(&cfg[k].conn);
    if (status && cfg[k].d.pid) vs_bench_daemon_dump_log(&cfg[k].d, 20);
    vs_bench_daemon_stop(&cfg[k].d, 30000);
    if (!status && k == VS_CFG_BATCHED) db_print_gate_line(&cfg[k].d);
    if (cfg[k].d.tmp[0] && vs_bench_daemon_cleanup(&cfg[k].d)) status = 1;
  }
  free(res);
  return status;
}
