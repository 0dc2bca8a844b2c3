/*
 * daemon/submit.h - from a Submit request to a queued job: every field checked against the
 * model it names and the daemon's limits, with a message that names the field, its value and
 * what is allowed. Nothing here trusts the client: every string field holds only the
 * characters of its kind (core/names.h; plugin names [a-z0-9_]) and is echoed quoted, enums
 * are range-checked, the caption blob's size must match the model's caption shape, and plugin
 * parameters are tried by creating (and dropping) the rule and the scheduler once, so a typo
 * fails at submission, not on a worker.
 */
#ifndef VS_SUBMIT_H
#define VS_SUBMIT_H

#include "core/registry.h"
#include "daemon/config.h"
#include "daemon/job.h"
#include "daemon/model_set.h"
#include "proto/wire.h"

typedef struct vs_submit_ctx {
  const vs_daemon_config *cfg;
  vs_model_table *models;
  vs_registry *reg;
  const vspec_host *host;
} vs_submit_ctx;

/* Builds job `id` from request r (body: submit) and the message's blob frames. On failure
 * returns NULL with *code a Vspec__ErrorCode and a message. */
vs_djob *vs_submit_build(const vs_submit_ctx *c, const Vspec__Request *r, const vs_wire_msg *m,
                         uint64_t id, int *code, char *err, size_t errlen);

#endif /* VS_SUBMIT_H */
