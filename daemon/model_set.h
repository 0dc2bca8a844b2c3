/*
 * daemon/model_set.h - the models vspecd serves, one generation at a time.
 *
 * A model set is one loaded model directory (core/models.h) plus what the daemon derives
 * from it at load (the preview colour table of a discrete-token model). Sets are shared
 * read-only by all workers (the backends are thread-safe for distinct sessions) and
 * reference-counted: the table holds one reference on each current set, every job one on
 * the set it runs with. Reloading a backend plugin opens new sets with the new plugin
 * generation and makes them current; a job that is running keeps its old set, which is
 * closed when its last job releases it.
 */
#ifndef VS_MODEL_SET_H
#define VS_MODEL_SET_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/forward_gate.h"
#include "core/models.h"
#include "daemon/config.h"
#include "daemon/preview.h"
#include "kernels/vs_device.h"

typedef struct vs_model_table vs_model_table;

typedef struct vs_model_set {
  char name[64];
  char dir[VS_CONF_PATH];
  unsigned generation; /* 1 for the first load of this name, +1 per reload */
  atomic_int refs;
  vs_model_table *table;
  vs_models *models;
  vs_preview_lut lut; /* lut.rgb == NULL when the model has no image decoder, and for a
                         continuous-token model, which has no codes to paint */
  int continuous;     /* the target's tokens are latents (VSPEC_TOKENS_CONTINUOUS, MAR) */
  int previews;       /* lut/decode previews can be rendered: a colour table, or the latent
                         decoder of a continuous-token model (which renders both kinds) */
  /* cross-job batching ([workers] batch > 1): this generation's jobs batch their target
   * forwards here (core/forward_gate.h); NULL when off */
  vs_forward_gate *gate;
  vspec_dev *gate_dev[VS_FORWARD_GATE_MAX_LANES]; /* what its batches run on, one per lane */
  int gate_lanes;
  double load_s;
  int retired; /* replaced by a newer generation (guarded by the table's lock) */
  /* what one target forward issues (kernels/vs_device.h), counted at load with the default
   * CFG rows: a one-token step and a 16-node verify; costed 0 for a continuous-token model */
  int costed;
  vs_dev_counters step_cost, verify16_cost;
} vs_model_set;

/* Summary for status replies. */
typedef struct vs_model_status {
  char name[64];
  char dir[VS_CONF_PATH];
  int loaded; /* 0: the directory failed to load (see error) */
  char error[256];
  unsigned generation;
  int jobs;          /* references held by jobs on the current set */
  int retired_alive; /* older sets still held by jobs */
  vspec_model_info info;
  int has_draft, has_eagle;
  char backends[3][64]; /* the plugins its target, draft and eagle use, each once */
  int n_backends;
  int costed; /* the set's costs below are known */
  vs_dev_counters step_cost, verify16_cost;
} vs_model_status;

/* The loading side: registry, host and a device used only for loading (backends keep the
 * load device for the lifetime of a model, so it outlives every set). */
int vs_model_table_open(vs_registry *reg, const vspec_host *host, vspec_dev *load_dev,
                        const vs_daemon_config *cfg, vs_model_table **out, char *err,
                        size_t errlen);
/* Drops the table's references; sets held by jobs close with their last job. */
void vs_model_table_close(vs_model_table *t);

/* Current set of model `name` with one reference, or NULL (unknown or failed to load; err
 * says which and lists the models that are there). */
vs_model_set *vs_model_table_acquire(vs_model_table *t, const char *name, char *err,
                                     size_t errlen);
void vs_model_set_release(vs_model_set *s);

/* Reloads every model whose target, draft or eagle uses backend plugin `backend` (after the
 * registry has a new generation of it). Heavy (weights, colour table): call it off the loop
 * thread. Fills names[] with the reloaded models; returns their number or a negative status. */
int vs_model_table_reload_backend(vs_model_table *t, const char *backend, char names[][64],
                                  int max, char *err, size_t errlen);

int vs_model_table_status(vs_model_table *t, vs_model_status *out, int max);
/* A copy of the class names of the current set of model number i (vs_model_table_status's
 * order) in one allocation (free() it), or NULL with *n = 0: not loaded, or no names. */
char **vs_model_table_class_names(vs_model_table *t, int i, int *n);

#endif /* VS_MODEL_SET_H */
