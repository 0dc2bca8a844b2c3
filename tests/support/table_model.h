/*
 * tests/support/table_model.h - micro "table" models for the speculative-decoding tests.
 *
 * A table model (tests/plugins/backend_table.c) gives the next-token logits of every
 * prefix, cond and uncond rows, so the exact distribution of a whole sequence can be
 * enumerated. Logits are random (a fixed seed), the draft model's are the target's plus
 * noise, so drafts agree with the target only partly, as a trained drafter would.
 */
#ifndef VS_TEST_TABLE_MODEL_H
#define VS_TEST_TABLE_MODEL_H

#include <stdint.h>

#include "core/engine.h"
#include "core/host.h"

typedef struct vs_table_model {
  int vocab, len, rows;
  int64_t n_prefixes;
  float *target, *draft; /* [n_prefixes, rows, vocab] */
  float *codebook;       /* [vocab, 2] */
} vs_table_model;

/* Random tables; `draft_noise` is the std of the draft's deviation from the target. */
void vs_table_model_make(vs_table_model *m, int vocab, int len, uint64_t seed, double scale,
                         double draft_noise);
void vs_table_model_free(vs_table_model *m);
int64_t vs_table_prefix_index(const vs_table_model *m, const int32_t *tokens, int n);
/* Writes a model directory (target, draft, manifest) under `dir`. */
void vs_table_model_write(const vs_table_model *m, const char *dir, const vs_sampling *defaults);
/* Processed next-token distribution of a prefix under the engine's rules. */
void vs_table_dist(const vs_table_model *m, const float *table, const int32_t *prefix, int n,
                   const vs_sampling *s, double *out);
/* Exact target joint over all vocab^len sequences (index = base-vocab value). */
void vs_table_joint(const vs_table_model *m, const vs_sampling *s, double *joint);

/* A plugin directory (a fresh temp dir) holding the engine's plugins and the table backend;
 * returns the path in dir (at least 256 bytes). */
void vs_table_plugin_dir(char *dir);

/* Everything a statistical test needs: a fresh plugin directory, a model directory with
 * random target and draft tables, the engine's device, host, registry and models. */
typedef struct vs_table_world {
  char plugins[256], model_dir[256];
  vs_table_model tm;
  vs_sampling s;
  vspec_host host;
  vs_registry *reg;
  vspec_dev *dev;
  vs_models *models;
  int64_t cells; /* vocab^len */
} vs_table_world;

/* Aborts the test (cmocka fail) on any error. */
void vs_table_world_open(vs_table_world *w, int vocab, int len, uint64_t seed, double scale,
                         double draft_noise, const vs_sampling *s);
void vs_table_world_close(vs_table_world *w);

#endif /* VS_TEST_TABLE_MODEL_H */
