/*
 * core/models.h - a model directory: the target (GPT + decoder), optional drafters, and
 * the sampling defaults that suit it.
 *
 * A model directory holds safetensors files and a manifest, vspec-model.json:
 *   { "name": "fmnist",
 *     "target": {"backend": "llamagen", "gpt": "target.safetensors", "vq": "vq.safetensors"},
 *     "draft":  {"backend": "llamagen", "gpt": "draft.safetensors"},
 *     "eagle":  {"backend": "eagle", "weights": "eagle.safetensors"},
 *     "class_names": ["T-shirt/top", "Trouser", ...],      (optional: one per class label)
 *     "defaults": {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
 *                  "cfg_interval": -1} }
 * Without a manifest, gpt.safetensors (or target.safetensors) and vq.safetensors are
 * used as the target with LlamaGen's sampling defaults.
 */
#ifndef VS_MODELS_H
#define VS_MODELS_H

#include <pthread.h>

#include "core/registry.h"

typedef struct vs_sampling {
  float temperature;  /* <= 0: greedy */
  int top_k;          /* 0: off */
  float top_p;        /* 1: off */
  float cfg_scale;    /* <= 1: no CFG (one row) */
  int cfg_interval;   /* -1: guide every step; else only decode steps <= cfg_interval */
  /* continuous-token (MAR) models */
  int num_iter;       /* generation steps; 0 = the model's default */
  int cfg_schedule;   /* VS_CFG_LINEAR (MAR's default) or VS_CFG_CONSTANT */
} vs_sampling;

enum { VS_CFG_LINEAR = 0, VS_CFG_CONSTANT = 1 };

/* One loaded backend model and the plugin generation that serves it. */
typedef struct vs_backend_model {
  vs_plugin *plugin;
  const vspec_backend_vtable *vt;
  vspec_model *model;
  vspec_model_info info;
} vs_backend_model;

typedef struct vs_models {
  char dir[1024];
  char name[64];
  vs_registry *reg;       /* where the models' backends came from; rules and schedulers too */
  const vspec_host *host;
  vs_backend_model target;
  vs_backend_model draft; /* a small draft GPT; .model == NULL when absent */
  vs_backend_model eagle; /* an EAGLE head over the target's features; .model == NULL when absent */
  vs_sampling defaults;
  /* The manifest's class_names, one per label of the target (core/manifest.h); NULL when
   * it has none. One allocation, freed with the models. */
  char **class_names;
  int n_class_names;
  /* Codebook neighbours of the target's tokens for LANTERN-style rules (core/neighbours.h):
   * built (or read from the disk cache) by vs_models_neighbours on the first job whose rule
   * uses them, never for the others; NULL until then and when the target has no codebook.
   * Guarded by neighbours_mu until set, read-only after. */
  pthread_mutex_t neighbours_mu;
  int32_t *neighbours;
  int neighbours_k;
  int neighbours_builds; /* times the table was computed (not read from the cache) */
} vs_models;

/* Role selection for vs_models_open. */
#define VS_ROLE_TARGET 0x1
#define VS_ROLE_DRAFT 0x2
#define VS_ROLE_EAGLE 0x4
#define VS_ROLE_ALL 0x7
/* Neighbours kept per code: LANTERN's default search size k = 1000 (jadohu/LANTERN
 * entrypoints/generate_images.py, --lantern_k) plus one, because the authors' rejection
 * zeroes the first k+1 neighbours (`reject=reference`, plugins/accept/proximity.h). */
#define VS_NEIGHBOURS_K 1001

int vs_models_open(vs_registry *reg, const vspec_host *host, vspec_dev *dev, const char *dir,
                   unsigned roles, vs_models **out, char *err, size_t errlen);
void vs_models_close(vs_models *m);

/* The codebook neighbour table of the target (*table NULL when it has no codebook), made
 * once per vs_models however many threads ask at once: read from the disk cache
 * (core/disk_cache.h, purpose "neighbours/<k>") or built and stored there. Returns 0 or a
 * negative status with err set (out of memory). core/neighbour_table.c */
int vs_models_neighbours(vs_models *m, const int32_t **table, int *k, char *err, size_t errlen);

/* Loads one backend model through the registry (used by vs_models_open and tools). */
int vs_backend_model_load(vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                          const char *backend, const char *path, const char *params,
                          vs_backend_model *out, char *err, size_t errlen);
void vs_backend_model_unload(vs_backend_model *bm);

/* The name of class `label`, or NULL (no class_names, or out of range). */
const char *vs_models_class_name(const vs_models *m, int label);
/* A copy of the class names in one allocation (free() it), or NULL (none, or out of
 * memory); *n gets their number. For status replies, which outlive no model. */
char **vs_models_class_names_copy(const vs_models *m, int *n);
/* A --class argument: a label 0..num_classes-1, or one of the class names (letter case
 * ignored). 0 with *label, or VSPEC_EINVAL with a message naming the labels and names. */
int vs_models_class_label(const vs_models *m, const char *text, int *label, char *err,
                          size_t errlen);

/* The backend plugins of the loaded roles (target, draft, eagle), each name once, into
 * names; returns how many. */
int vs_models_backends(const vs_models *m, char names[3][64]);

/* Values one job's latents hold for a continuous-token target (grid x token_dim; the
 * buffer vs_job.latents must have), 0 for a discrete one. */
size_t vs_models_latent_count(const vs_models *m);

/* The target's pixels [image_h, image_w, 3] of a token grid: ids through the backend's
 * decode, latents (continuous-token models; unknown positions zero) through decode_latents.
 * VSPEC_ENOTSUP when the target has no image decoder. */
int vs_models_decode(const vs_models *m, vspec_dev *dev, const int32_t *tokens,
                     const float *latents, uint8_t *rgb, char *err, size_t errlen);

#endif /* VS_MODELS_H */
