#include "daemon/zap.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/log.h"
#include "core/log_limit.h"
#include "daemon/allow_list.h"
#include "proto/curve_keys.h"
#include "vspec/types.h"

/* A refused peer retries every 100 ms or so, forever: one line per peer address per
 * interval, with the count of the refusals in between (issue 32, finding 5). */
#define VS_ZAP_LOG_INTERVAL_S 10.0

struct vs_zap {
  void *sock;
  pthread_t thread;
  atomic_int stop;
  vs_allow_entry *allow;
  int n;
  vs_log_limit refusals; /* used by the ZAP thread, then by vs_zap_stop after joining it */
};

static double zap_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A refusal of the peer at `addr`, rate-limited; `why` says what was refused. */
static void zap_log_refusal(vs_zap *z, const char *addr, const char *why) {
  uint64_t before = 0;
  const char *peer = *addr ? addr : "a local peer";
  if (!vs_log_limit_allow(&z->refusals, peer, zap_mono(), &before)) return;
  if (before)
    vs_log(VSPEC_LOG_WARN, "zap", "refused a CURVE client from %s: %s (%llu more refusal(s) "
           "of it not logged in the last %.0f s)", peer, why, (unsigned long long)before,
           VS_ZAP_LOG_INTERVAL_S);
  else
    vs_log(VSPEC_LOG_WARN, "zap", "refused a CURVE client from %s: %s (further refusals of "
           "it: one line per %.0f s)", peer, why, VS_ZAP_LOG_INTERVAL_S);
}

/* The counts of peers that went quiet (all of them with now = INFINITY, at stop). */
static void zap_log_quiet(vs_zap *z, double now) {
  char peer[64];
  uint64_t n;
  while (vs_log_limit_take_quiet(&z->refusals, now, peer, sizeof peer, &n))
    vs_log(VSPEC_LOG_WARN, "zap", "%llu more refusal(s) of CURVE clients from %s not logged "
           "one by one", (unsigned long long)n, peer);
}

static const char *zap_lookup(const vs_zap *z, const uint8_t *key, size_t len) {
  if (len != 32) return NULL;
  for (int i = 0; i < z->n; i++)
    if (!memcmp(z->allow[i].key, key, 32)) return z->allow[i].name;
  return NULL;
}

static void *zap_main(void *arg) {
  vs_zap *z = arg;
  while (!atomic_load(&z->stop)) {
    zmq_pollitem_t it = {.socket = z->sock, .events = ZMQ_POLLIN};
    int ready = zmq_poll(&it, 1, 100);
    zap_log_quiet(z, zap_mono());
    if (ready <= 0) continue;
    /* version, request id, domain, address, identity, mechanism, credentials... */
    zmq_msg_t part[8];
    int n = 0, more = 1;
    while (more) {
      zmq_msg_t tmp;
      zmq_msg_init(&tmp);
      if (zmq_msg_recv(&tmp, z->sock, 0) < 0) {
        zmq_msg_close(&tmp);
        break;
      }
      more = zmq_msg_more(&tmp);
      if (n < 8) {
        zmq_msg_init(&part[n]);
        zmq_msg_move(&part[n], &tmp);
        n++;
      }
      zmq_msg_close(&tmp);
    }
    const char *status = "400", *text = "malformed ZAP request", *user = "";
    char user_key[41], addr[64] = "";
    if (n >= 4) {
      size_t al = zmq_msg_size(&part[3]);
      snprintf(addr, sizeof addr, "%.*s", (int)(al < 63 ? al : 63),
               (const char *)zmq_msg_data(&part[3]));
    }
    if (n >= 6) {
      size_t mlen = zmq_msg_size(&part[5]);
      const char *mech = zmq_msg_data(&part[5]);
      if (mlen == 5 && !memcmp(mech, "CURVE", 5) && n >= 7) {
        const char *name = zap_lookup(z, zmq_msg_data(&part[6]), zmq_msg_size(&part[6]));
        if (name) {
          status = "200";
          text = "OK";
          /* The key itself: names on the list need not be unique, keys are. */
          zmq_z85_encode(user_key, zmq_msg_data(&part[6]), 32);
          user = user_key;
        } else {
          text = "client key not on the allow-list";
        }
      } else {
        text = "only CURVE is accepted";
      }
    }
    if (strcmp(status, "200")) zap_log_refusal(z, addr, text);
    /* Reply: version, request id (echoed), status code, text, user id, metadata. */
    zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2) zmq_send(z->sock, zmq_msg_data(&part[1]), zmq_msg_size(&part[1]), ZMQ_SNDMORE);
    else zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, status, 3, ZMQ_SNDMORE);
    zmq_send(z->sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->sock, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&part[i]);
  }
  return NULL;
}

int vs_zap_start(void *zctx, const char *allow_file, vs_zap **out, char *err, size_t errlen) {
  vs_zap *z = calloc(1, sizeof *z);
  if (!z) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  atomic_init(&z->stop, 0);
  vs_log_limit_init(&z->refusals, VS_ZAP_LOG_INTERVAL_S);
  int rc = vs_allow_list_read(allow_file, &z->allow, &z->n, err, errlen);
  if (rc) goto fail;
  z->sock = zmq_socket(zctx, ZMQ_REP);
  int linger = 0;
  if (!z->sock || zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof linger) ||
      zmq_bind(z->sock, "inproc://zeromq.zap.01")) {
    snprintf(err, errlen, "cannot bind the ZAP handler: %s", zmq_strerror(errno));
    rc = VSPEC_EIO;
    goto fail;
  }
  /* The socket moves to the thread; pthread_create is the memory barrier libzmq asks for. */
  if (pthread_create(&z->thread, NULL, zap_main, z)) {
    snprintf(err, errlen, "cannot start the ZAP thread");
    rc = VSPEC_ENOMEM;
    goto fail;
  }
  vs_log(VSPEC_LOG_INFO, "zap", "CURVE allow-list %s: %d client key(s)", allow_file, z->n);
  *out = z;
  return VSPEC_OK;
fail:
  if (z->sock) zmq_close(z->sock);
  vs_log_limit_destroy(&z->refusals);
  free(z->allow);
  free(z);
  return rc;
}

void vs_zap_stop(vs_zap *z) {
  if (!z) return;
  atomic_store(&z->stop, 1);
  pthread_join(z->thread, NULL);
  zap_log_quiet(z, INFINITY); /* the counts not said yet */
  vs_log_limit_destroy(&z->refusals);
  zmq_close(z->sock);
  free(z->allow);
  free(z);
}

int vs_zap_count(const vs_zap *z) { return z ? z->n : 0; }

const char *vs_zap_name(const vs_zap *z, const char *user_id) {
  uint8_t key[32];
  if (!z || strlen(user_id) != 40 || !vs_curve_is_z85(user_id, 40) ||
      !zmq_z85_decode(key, user_id))
    return NULL;
  return zap_lookup(z, key, 32);
}
