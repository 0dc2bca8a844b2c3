/*
 * tests/support/fake_daemon.h - a fake vspecd for testing the CLI's side of the protocol: a
 * ZeroMQ ROUTER on a private ipc socket in a temporary folder, driven by the test (which
 * request it waits for, which events it sends when), so that the tests can produce events
 * and timings a real daemon makes hard to get (a phase, a notice, silence).
 */
#ifndef VS_FAKE_DAEMON_H
#define VS_FAKE_DAEMON_H

#include <stdint.h>

#include "proto/wire.h"

#define VS_FAKE_JOB 77
#define VS_FAKE_SEED 8808317955088799277ull

typedef struct vs_fake {
  char dir[64], ep[200];
  void *ctx, *sock;
  vs_wire_envelope env; /* the client's */
  uint64_t seq;
  int credits, cancels; /* requests of these kinds received */
} vs_fake;

void vs_fake_open(vs_fake *f);
void vs_fake_close(vs_fake *f); /* also removes the folder */
/* The next request within wait_ms (NULL if none came), counted; free with
 * vs_wire_request_free(rq, a) and vs_wire_msg_close(m). */
Vspec__Request *vs_fake_recv(vs_fake *f, int wait_ms, vs_wire_msg *m, vs_wire_alloc *a);
/* Takes every request that comes within wait_ms of the previous one. */
void vs_fake_drain(vs_fake *f, int wait_ms);
/* Sends ev as job VS_FAKE_JOB's next event. */
void vs_fake_send(vs_fake *f, Vspec__Event *ev, vs_wire_blob *blobs, int n);
/* Waits (at most wait_ms) for the Submit: its request id; *has_seed whether it had a seed. */
uint64_t vs_fake_submit(vs_fake *f, int wait_ms, int *has_seed);
/* Accepted (method sd:exact, 4 tokens, seed VS_FAKE_SEED), answering request rid. */
void vs_fake_accepted(vs_fake *f, uint64_t rid);
/* A progress event: 2 of 4 tokens. */
void vs_fake_progress(vs_fake *f);
/* The result: a 2x2 PNG, seed VS_FAKE_SEED, the given notes. */
void vs_fake_result(vs_fake *f, char **notes, size_t n_notes);

#endif /* VS_FAKE_DAEMON_H */
