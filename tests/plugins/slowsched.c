/*
 * A scheduler plugin for the daemon tests: a draft chain from the separate draft model,
 * always verified, after sleeping `ms` milliseconds in every plan() call. Jobs on the micro
 * test model take milliseconds; this one makes them last long enough to cancel them, lose
 * their client, fill the queue, drain on SIGTERM or reload a plugin under them.
 *
 * Built with SS_INIT_MS (as slowload.so, scheduler "slowload"), its init sleeps that long:
 * the registry initialises a plugin on the thread that loads it, so a reload on vspecd's
 * admin endpoint holds the daemon's loop thread for a known time while workers go on.
 */
#include <errno.h>
#include <time.h>

#include "vspec/plugin.h"

#ifndef SS_NAME
#define SS_NAME "slow"
#endif

static void ss_sleep_ms(long ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

#ifdef SS_INIT_MS
static int ss_init(const vspec_host *host, char *err, size_t errlen) {
  (void)host, (void)err, (void)errlen;
  ss_sleep_ms(SS_INIT_MS);
  return VSPEC_OK;
}
#endif

struct vspec_sched {
  const vspec_host *host;
  long ms, depth;
};

static int ss_create(const vspec_host *host, const vspec_params *params, vspec_sched **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"ms", "depth", "drafter", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_sched *s = host->calloc(1, sizeof *s);
  if (!s) return VSPEC_ENOMEM;
  s->host = host;
  if ((rc = host->param_int(params, "ms", 20, 0, 10000, &s->ms, err, errlen)) ||
      (rc = host->param_int(params, "depth", 2, 1, 8, &s->depth, err, errlen))) {
    host->free(s);
    return rc;
  }
  *out = s;
  return VSPEC_OK;
}

static void ss_destroy(vspec_sched *s) { s->host->free(s); }

static int ss_plan(vspec_sched *s, const vspec_round_state *state, vspec_round_plan *plan) {
  (void)state;
  ss_sleep_ms(s->ms);
  plan->shape = VSPEC_DRAFT_CHAIN;
  plan->depth = (int32_t)s->depth;
  plan->drafter = VSPEC_DRAFTER_MODEL;
  return VSPEC_OK;
}

static const vspec_sched_vtable ss_vtable = {
    .struct_size = sizeof(vspec_sched_vtable),
    .create = ss_create,
    .destroy = ss_destroy,
    .plan = ss_plan,
    .decide = NULL,
};

static const vspec_plugin_desc ss_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_SCHED, SS_NAME, "test-1",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "test scheduler: a draft chain after a sleep",
    .vtable = &ss_vtable,
#ifdef SS_INIT_MS
    .init = ss_init,
#endif
};

VSPEC_PLUGIN_DEFINE(ss_desc)
