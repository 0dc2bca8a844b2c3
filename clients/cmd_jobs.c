/*
 * clients/cmd_jobs.c - vspec cancel and vspec ping: one request about a job, or a round trip.
 */
#include "clients/cli.h"
#include "clients/last_job.h"

static void usage_cancel(FILE *f) {
  fprintf(f,
          "usage: vspec cancel JOB [options]\n"
          "       vspec cancel --last [options]\n"
          "\n"
          "Cancels job JOB (its id, as `vspec generate` and `vspec status` print it) through the\n"
          "admin endpoint. Its client gets an error event \"cancelled\".\n"
          "\n"
          "  --last               the last job this user submitted with `vspec generate` to\n"
          "                       the job endpoint (--server, $VSPEC_SERVER or the default),\n"
          "                       as recorded in $XDG_STATE_HOME/vspec/last-jobs (else\n"
          "                       ~/.local/state/vspec/last-jobs)\n"
          VS_NET_OPTIONS_HELP
          "\nExit status: 0 cancelling, 2 usage (or no job recorded for --last), 3 daemon\n"
          "unreachable, 4 no such job.\n");
}

/* The job --last means: 1 with *id, else the exit status is in *rc. */
static int cj_last_job(const vs_net_opts *net, unsigned long long *id, int *rc) {
  char err[4400], path[4100] = "?";
  int found = vs_last_job_load(net->server, id, err, sizeof err);
  if (found > 0) {
    fprintf(stderr, "vspec cancel: job %llu, the last one submitted to %s\n", *id, net->server);
    return 1;
  }
  if (found < 0) {
    fprintf(stderr, "vspec cancel --last: %s\n", err);
  } else {
    vs_last_job_path(path, sizeof path, err, sizeof err);
    fprintf(stderr, "vspec cancel --last: no job submitted to %s is recorded in %s (`vspec "
            "generate` records each job it submits; --server chooses the job endpoint); give "
            "the JOB id instead (`vspec status` lists the jobs)\n", net->server, path);
  }
  *rc = EXIT_USAGE;
  return 0;
}

int vs_cmd_cancel(int argc, char **argv) {
  vs_net_opts net;
  static const char *const flags[] = {"last", NULL};
  int last, prc = vs__parse_flags(argc, argv, "cancel", flags, &last, &net, usage_cancel);
  if (prc >= 0) return prc;
  unsigned long long id;
  if (last && optind != argc) {
    fprintf(stderr, "vspec cancel: give a JOB id or --last, not both\n");
    return EXIT_USAGE;
  }
  if (!last && optind + 1 != argc) {
    fprintf(stderr, "vspec cancel: give exactly one JOB id, or --last\n");
    return EXIT_USAGE;
  }
  if (last && !cj_last_job(&net, &id, &prc)) return prc;
  if (!last && !vs_cli_u64("JOB", argv[optind], &id)) return EXIT_USAGE;
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  cc.job_id = id;
  rq.body_case = VSPEC__REQUEST__BODY_CANCEL;
  rq.cancel = &cc;
  vs_conn conn;
  vs_conn_event e;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case == VSPEC__EVENT__BODY_ACK)
    printf("%s\n", e.ev->ack->message ? e.ev->ack->message : "ok");
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}

static void usage_ping(FILE *f) {
  fprintf(f, "usage: vspec ping [--via-admin] [options]\n\nOne round trip to the job endpoint "
          "(or the admin endpoint).\n\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0, 3 daemon unreachable.\n");
}

int vs_cmd_ping(int argc, char **argv) {
  vs_net_opts net;
  static const char *const flags[] = {"via-admin", NULL};
  int admin, prc = vs__parse_flags(argc, argv, "ping", flags, &admin, &net, usage_ping);
  if (prc >= 0) return prc;
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_PING;
  rq.ping = &p;
  vs_conn conn;
  vs_conn_event e;
  double t0 = vs_now();
  int rc = vs__call(&net, admin, &rq, &e, &conn);
  if (rc) return rc;
  printf("pong from %s in %.3f ms\n",
         e.ev->body_case == VSPEC__EVENT__BODY_PONG && e.ev->pong->node ? e.ev->pong->node : "?",
         (vs_now() - t0) * 1000);
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}
