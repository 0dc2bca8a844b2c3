/*
 * clients/cmd_jobs.c - vspec cancel and vspec ping: one request about a job, or a round trip.
 */
#include "clients/cli.h"

static void usage_cancel(FILE *f) {
  fprintf(f,
          "usage: vspec cancel JOB [options]\n"
          "\n"
          "Cancels job JOB (its id, as `vspec generate` and `vspec status` print it) through the\n"
          "admin endpoint. Its client gets an error event \"cancelled\".\n"
          "\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0 cancelling, 2 usage, 3 daemon unreachable, 4 no such job.\n");
}

int vs_cmd_cancel(int argc, char **argv) {
  vs_net_opts net;
  int prc = vs__parse_flags(argc, argv, "cancel", NULL, NULL, &net, usage_cancel);
  if (prc >= 0) return prc;
  unsigned long long id;
  if (optind + 1 != argc) {
    fprintf(stderr, "vspec cancel: give exactly one JOB id\n");
    return EXIT_USAGE;
  }
  if (!vs_cli_u64("JOB", argv[optind], &id)) return EXIT_USAGE;
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
