/*
 * vspec/plugin.h - the vspec plugin ABI, version 1.10.
 *
 * A plugin is a shared object that exports one symbol, `vspec_plugin_entry`, returning a
 * pointer to a const vspec_plugin_desc. The descriptor names the plugin and points at a
 * vtable for its kind: a model backend, an acceptance rule or a scheduler. The host hands
 * the plugin a services table (vspec_host) with logging, allocation, the device's ops
 * table, RNG, parameter parsing and safetensors access, so a plugin needs nothing but
 * this directory to build:
 *
 *     cc -shared -fPIC -fvisibility=hidden -I include my_rule.c -o accept_myrule.so
 *
 * Compatibility rules (see DESIGN.md, "Plugin ABI rules"):
 *  - The first seven fields of vspec_plugin_desc never change.
 *  - The host refuses a plugin whose abi_major differs from its own, or whose abi_minor is
 *    newer than its own, or whose descriptor/vtable struct_size is smaller than the host
 *    needs. The refusal message names both versions.
 *  - Every vtable, every struct crossing the boundary and the host table start with a
 *    uint32_t struct_size and only grow at the end. Check struct_size (or use
 *    VSPEC_HAS_FIELD) before touching a field added in a later minor version. For a
 *    struct the callee fills in (vspec_tensor, vspec_model_info, ...), the caller sets
 *    struct_size to sizeof its own struct and the callee writes no more than that.
 *  - Whoever allocates frees. Errors are negative vspec_status codes plus a message the
 *    callee writes into a caller-provided buffer (err, errlen).
 *  - No protobuf-c types and no device handles owned by a plugin cross the boundary.
 *
 * Threading: a plugin declares VSPEC_PLUGIN_THREAD_SAFE when different objects it created
 * (models, sessions, rules) may be used from different threads at the same time. One
 * object is never used by two threads at once.
 */
#ifndef VSPEC_PLUGIN_H
#define VSPEC_PLUGIN_H

#include <stdarg.h>

#include "vspec/ops.h"
#include "vspec/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of this header. A plugin records the values it was built with. */
#ifndef VSPEC_ABI_MAJOR
#define VSPEC_ABI_MAJOR 1
#endif
#ifndef VSPEC_ABI_MINOR
#define VSPEC_ABI_MINOR 10
#endif

#define VSPEC_STR_(x) #x
#define VSPEC_STR(x) VSPEC_STR_(x)

#if defined(__GNUC__)
#define VSPEC_PLUGIN_EXPORT __attribute__((visibility("default")))
#define VSPEC_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define VSPEC_PLUGIN_EXPORT
#define VSPEC_PRINTF(a, b)
#endif

/* The exported entry symbol. */
#define VSPEC_PLUGIN_ENTRY_SYMBOL "vspec_plugin_entry"

typedef enum vspec_plugin_kind {
  VSPEC_PLUGIN_BACKEND = 1,
  VSPEC_PLUGIN_ACCEPT = 2,
  VSPEC_PLUGIN_SCHED = 3,
  VSPEC_PLUGIN_DRAFTER = 4 /* ABI 1.5 */
} vspec_plugin_kind;

/* Descriptor flags. */
#define VSPEC_PLUGIN_THREAD_SAFE 0x1u     /* distinct objects usable from distinct threads */
#define VSPEC_PLUGIN_MAY_UNLOAD 0x2u      /* the host may dlclose an unused old generation */
#define VSPEC_PLUGIN_HAS_DEVICE_CODE 0x4u /* holds GPU code: never dlclose'd */
/* An acceptance rule that reads the codebook neighbour table (vspec_accept_input's
 * neighbours fields). The host builds the table (seconds for a 16384-code codebook) only
 * for the jobs of such rules; every other rule sees those fields NULL / 0. */
#define VSPEC_PLUGIN_USES_NEIGHBOURS 0x8u
/* An acceptance rule whose output follows the target's distribution exactly (speculative
 * sampling): where no drafter is expected to pay, size=auto may run its methods as plain AR,
 * which samples the same distribution. Relaxed rules must not set it. */
#define VSPEC_PLUGIN_EXACT 0x10u

/* ---- tensors (safetensors files opened by the host) -------------------------------- */

typedef enum vspec_dtype {
  VSPEC_DTYPE_F32 = 1,
  VSPEC_DTYPE_F16 = 2,
  VSPEC_DTYPE_BF16 = 3,
  VSPEC_DTYPE_I32 = 4,
  VSPEC_DTYPE_I64 = 5,
  VSPEC_DTYPE_U8 = 6,
  VSPEC_DTYPE_I8 = 7,
  VSPEC_DTYPE_U16 = 8,
  VSPEC_DTYPE_I16 = 9,
  VSPEC_DTYPE_BOOL = 10,
  VSPEC_DTYPE_F64 = 11
} vspec_dtype;

#define VSPEC_MAX_DIMS 8

typedef struct vspec_tensor_file vspec_tensor_file; /* opaque, owned by the host */

typedef struct vspec_tensor {
  uint32_t struct_size;
  const char *name;
  uint32_t dtype; /* vspec_dtype */
  int32_t ndim;
  int64_t shape[VSPEC_MAX_DIMS];
  int64_t numel;
  const void *data; /* raw little-endian bytes inside the mapped file */
  size_t nbytes;
} vspec_tensor;

/* ---- host services ------------------------------------------------------------------ */

typedef struct vspec_host {
  uint32_t struct_size;
  uint32_t abi_major, abi_minor; /* the host's ABI version */

  /* logging; `who` is the plugin name */
  void (*log)(int level, const char *who, const char *fmt, ...) VSPEC_PRINTF(3, 4);

  /* host heap (accounted); free(NULL) is a no-op */
  void *(*alloc)(size_t bytes);
  void *(*calloc)(size_t n, size_t size);
  void *(*realloc)(void *ptr, size_t bytes);
  void (*free)(void *ptr);

  /* compute: the CPU ops table. Since ABI 1.1 use dev_ops(dev) instead: each device has
   * its own table, and device pointers go only to the ops of their device. */
  const vspec_ops *ops;

  /* RNG (Philox4x32-10): draws are a pure function of (seed, stream, counter) */
  void (*rng_init)(vspec_rng *rng, uint64_t seed, uint64_t stream);
  double (*rng_uniform)(vspec_rng *rng); /* [0, 1), 53 random bits */
  float (*rng_normal)(vspec_rng *rng);   /* standard normal */

  /* parameters: each getter writes a message naming the key and the allowed range on
   * error; an absent key yields the default */
  int (*param_double)(const vspec_params *p, const char *key, double def, double lo, double hi,
                      double *out, char *err, size_t errlen);
  int (*param_int)(const vspec_params *p, const char *key, long def, long lo, long hi, long *out,
                   char *err, size_t errlen);
  /* choices is NULL-terminated; *out is the index of the chosen value */
  int (*param_choice)(const vspec_params *p, const char *key, const char *const *choices, int def,
                      int *out, char *err, size_t errlen);
  const char *(*param_string)(const vspec_params *p, const char *key); /* NULL if absent */
  /* fails naming the first key that is not in the NULL-terminated `known` list */
  int (*param_check_known)(const vspec_params *p, const char *const *known, char *err,
                           size_t errlen);

  /* safetensors: mmap, validated header, zero copy where possible */
  int (*tensors_open)(const char *path, vspec_tensor_file **out, char *err, size_t errlen);
  void (*tensors_close)(vspec_tensor_file *f);
  /* metadata value from the header's __metadata__, else from config.json beside the file;
   * NULL if absent */
  const char *(*tensors_meta)(const vspec_tensor_file *f, const char *key);
  int (*tensors_find)(const vspec_tensor_file *f, const char *name, vspec_tensor *out);
  /* Tensor `name` as float32 device memory owned by the file (valid until tensors_close).
   * ndim/shape give the expected shape; a shape entry < 0 matches any size. Errors name
   * the file and the tensor. */
  int (*tensors_get_f32)(vspec_tensor_file *f, vspec_dev *dev, const char *name, int ndim,
                         const int64_t *shape, const float **out, char *err, size_t errlen);

  /* ---- ABI 1.1 ---- */
  /* The ops table of `dev` (CPU, CUDA, ...). A plugin built against 1.1 may call it
   * unconditionally: the host refuses plugins newer than itself. */
  const vspec_ops *(*dev_ops)(const vspec_dev *dev);
  /* Devices with equal memory spaces share pointers: memory allocated with one device's
   * ops is usable by the other's (all CPU devices are space 0; each GPU has its own). A
   * model loaded on one device serves sessions only on devices of the same space. */
  uint32_t (*dev_space)(const vspec_dev *dev);

  /* ---- ABI 1.5 ---- */
  /* The n-th uniform of stream `stream` of `seed` (what the n-th rng_uniform after rng_init
   * returns), computed directly: noise keyed by position, recomputed whenever needed. */
  double (*rng_uniform_at)(uint64_t seed, uint64_t stream, uint64_t n);
} vspec_host;

/* ---- backend plugins ------------------------------------------------------------------ */

typedef struct vspec_model vspec_model;     /* a loaded model, owned by the plugin */
typedef struct vspec_session vspec_session; /* one job's decoding state, owned by the plugin */

typedef enum vspec_token_kind {
  VSPEC_TOKENS_DISCRETE = 1,  /* VQ codes */
  VSPEC_TOKENS_CONTINUOUS = 2 /* diffusion-head latents */
} vspec_token_kind;

typedef struct vspec_model_info {
  uint32_t struct_size;
  uint32_t token_kind;  /* vspec_token_kind */
  int32_t grid_h, grid_w; /* token grid; tokens are in raster order */
  int32_t vocab;        /* discrete: number of codes (logit width) */
  int32_t token_dim;    /* discrete: codebook embedding width; continuous: latent width */
  int32_t feature_dim;  /* width of the features forward() returns */
  int32_t n_cond;       /* condition positions before the first image token */
  int32_t num_classes;  /* class-conditional: number of real classes; 0 otherwise */
  int32_t caption_len, caption_dim; /* text-conditional: caption tensor shape; 0 otherwise */
  int32_t image_h, image_w;         /* decoded image size, 0 if no decoder is loaded */
  int32_t max_nodes;                /* largest node batch one forward accepts */
  const float *codebook; /* host [vocab, token_dim] raw codebook rows, or NULL */
  const char *arch;      /* e.g. "llamagen-c2i" */
  int64_t params;        /* parameters of the sequence model */
  int64_t stream_bytes;  /* weight bytes a one-token forward reads (the decode bound) */
  int32_t feature_in_dim; /* feature-conditioned drafters (EAGLE): width of the target
                             features each node takes; 0 for plain language models */
  /* ABI 1.1, continuous-token models (MAR): feature_dim is the width of the condition
   * vectors `condition` returns; token_dim the width of a token. */
  int32_t diffusion_steps;  /* the training diffusion's steps (1000), timesteps 0..steps-1 */
  int32_t sampling_steps;   /* the respaced sampler's steps (100) */
  int32_t num_iter;         /* the model's default generation steps (MAR's num_iter) */
  int32_t clip_denoised;    /* the sampler clamps its x0 estimate to [-1, 1] (pixel-space
                               tokens, as ADM); 0 for MAR's latents */
  /* ---- ABI 1.7 ---- */
  int32_t keeps_features;   /* forward honours vspec_forward_batch.feature_src: a node's
                               input feature may be the session's own output feature at an
                               earlier pending node, which stays on the device */
  /* ---- ABI 1.8 ---- */
  int32_t device_tokens;    /* forward honours vspec_forward_batch.token_dev (and, for a
                               feature-conditioned model, feature_table) and
                               vspec_forward_out.draw, walk_probs, walk_tokens and
                               features_dev: drafts drawn on the device that the host does
                               not see until the walk's result, features that stay there;
                               0 where the model's host lacks what that needs (llamagen and
                               eagle: the fused ops) */
} vspec_model_info;

typedef struct vspec_session_config {
  uint32_t struct_size;
  int32_t class_label;          /* class-conditional models */
  const float *caption;         /* text models: host [caption_len, caption_dim], left padded */
  const uint8_t *caption_mask;  /* text models: host [caption_len], nonzero = valid slot */
  int32_t rows;                 /* 1 = conditional only, 2 = [cond ; uncond] for CFG */
  int32_t max_nodes;            /* largest forward batch the session will run */
} vspec_session_config;

/* A batch of tree nodes for one forward.
 *
 * The session keeps the *pending* nodes: every node forwarded since the last commit, in
 * order. With append = 0 the pending nodes are dropped first and batch node i becomes
 * pending node i; with append = 1 batch node i becomes pending node n_pending + i, so a
 * drafter can grow a tree one level per forward. parents[i] is the index of a pending node
 * (an earlier one, or one earlier in this batch) or -1 for the last committed position.
 * A pending node sits at sequence position committed + depth, depth 0 for parent -1, and
 * attends to every committed position, its pending ancestors and itself. */
typedef struct vspec_forward_batch {
  uint32_t struct_size;
  int32_t n_nodes;
  const int32_t *tokens;  /* [n_nodes] token fed at each node */
  const int32_t *parents; /* [n_nodes] pending-node index of the parent, or -1 */
  const float *features;  /* feature-conditioned drafters (EAGLE): [n_nodes, rows, in_dim]
                             host input features; NULL for plain language models */
  int32_t append;         /* 0: replace the pending nodes; 1: add to them */
  /* ---- ABI 1.7 (backends whose info says keeps_features) ----
   * [n_nodes] or NULL: where feature_src[i] = k >= 0, node i's input feature is the
   * session's own output feature (forward_out.features) at pending node k, fed by an earlier
   * forward since the last commit (k below the pending count before this batch), read where
   * the forward left it on the device, so it never crosses to the host and back (EAGLE's
   * tree: a node's input is its parent's output); -1: features' row i, as without it. */
  const int32_t *feature_src;
  /* ---- ABI 1.8 (backends whose info says device_tokens) ----
   * Memory of the forward's device, or NULL: where tokens[i] < 0, node i's token is
   * token_dev[-1 - tokens[i]], one an earlier forward drew on the device
   * (vspec_forward_out.draw_tokens) and the host has not seen. */
  const int32_t *token_dev;
  /* Feature-conditioned models: memory of the device [*, rows, in_dim] (another session's
   * vspec_forward_out.features_dev: the target's), and host [n_nodes]: where feature_row[i]
   * = k >= 0 (and feature_src does not name a node for i), node i's input feature is row k
   * of feature_table; -1: features' row i. The target's features then reach the drafter
   * without crossing to the host. */
  const float *feature_table;
  const int32_t *feature_row;
} vspec_forward_batch;

/* Outputs are caller-provided host buffers; either may be NULL when not needed. A backend
 * running on a device downloads them explicitly (vspec_ops.download): everything the
 * engine reads (logits for sampling and acceptance, features for drafters) is host
 * memory. */
typedef struct vspec_forward_out {
  uint32_t struct_size;
  float *logits;   /* [n_nodes, rows, vocab]: logits of the token after each node, per row */
  float *features; /* [n_nodes, rows, feature_dim] */
  /* ---- ABI 1.4: the draw on the device --------------------------------------------------
   * Where `sample` is set and the backend can (its device has the ops' sample_tokens), the
   * backend draws each node's token on the device as spec says (spec->n = n_nodes; here its
   * guided and u are host arrays, which the backend uploads with its inputs), writes them to
   * tokens [n_nodes] (host), sets sampled to 1 and leaves logits unwritten. Otherwise
   * sampled stays 0 and logits are written as always: the caller draws on the host. */
  const vspec_sample_spec *sample;
  int32_t *tokens;
  int32_t sampled;
  /* ---- ABI 1.6: the verification walk on the device -------------------------------------
   * Where `walk` is set and the backend can (its device has the ops' verify_walk), the
   * backend walks the batch's last walk->sample.n nodes (the tree; nodes before it, such as
   * tokens accepted without verification, are not walked) on the device after the head,
   * writes the result to *walk_result (host), sets walked to 1 and leaves logits unwritten.
   * walk's parents, tokens and sample.guided [n], dist [n] (or NULL) and dists
   * [walk_dists, vocab] are host arrays, which the backend uploads; walk->neighbours is
   * memory of the backend's device (the engine's copy of the table). Otherwise walked stays
   * 0 and logits are written as always: the engine walks on the host. */
  const vspec_walk_spec *walk;
  int32_t walk_dists;
  vspec_walk_result *walk_result;
  int32_t walked;
  /* ---- ABI 1.8: a draft drawn on the device (backends whose info says device_tokens) ----
   * Where `draw` is set, the backend runs the ops' draw_probs over the head of the batch's
   * last draw->n nodes (draw's guided and u are host arrays [draw->n], which it uploads; u
   * NULL: each node's first maximum), writes their distributions to draw_probs
   * [draw->n, vocab] and their tokens to draw_tokens [draw->n], memory of its device, leaves
   * logits unwritten and sets drawn to 1: nothing comes to the host.
   * With a walk: walk_probs, memory of the device or NULL, holds the walk's draft
   * distributions (earlier forwards' draw_probs) instead of walk->dists (walk_dists 0);
   * walk->tokens may hold negative entries, resolved through the batch's token_dev as its
   * tokens are; walk_tokens, a host array [walk->sample.n] or NULL, receives the tree's tokens
   * as walked, in the same download as the result. */
  const vspec_sample_spec *draw;
  float *draw_probs;
  int32_t *draw_tokens;
  int32_t drawn;
  const float *walk_probs;
  int32_t *walk_tokens;
  /* Memory of the device [n_nodes, rows, feature_dim], or NULL: where set, the features go
   * there (a copy on the device) instead of to `features`. */
  float *features_dev;
} vspec_forward_out;

typedef struct vspec_backend_vtable {
  uint32_t struct_size;
  /* Loads weights from `path` (a file, or a directory the plugin understands). */
  int (*load)(const vspec_host *host, vspec_dev *dev, const char *path, const vspec_params *params,
              vspec_model **out, char *err, size_t errlen);
  void (*unload)(vspec_model *model);
  int (*info)(const vspec_model *model, vspec_model_info *out);

  int (*session_open)(vspec_model *model, vspec_dev *dev, const vspec_session_config *cfg,
                      vspec_session **out, char *err, size_t errlen);
  void (*session_close)(vspec_session *s);
  /* Runs the condition positions; out holds one node: the prediction of image token 0. */
  int (*prefill)(vspec_session *s, vspec_forward_out *out, char *err, size_t errlen);
  /* Runs a batch of tree nodes after the committed prefix (see vspec_forward_batch); out
   * holds the batch's nodes only. The pending nodes' keys and values are kept until the next
   * commit or non-appending forward. */
  int (*forward)(vspec_session *s, const vspec_forward_batch *batch, vspec_forward_out *out,
                 char *err, size_t errlen);
  /* Appends pending nodes to the committed prefix: path[0] has parent -1 and path[j] is the
   * parent of path[j+1]. Their cache entries are compacted in place; every pending node is
   * dropped. */
  int (*commit)(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen);
  /* Number of committed positions (condition positions included). */
  int32_t (*committed)(const vspec_session *s);

  /* Decodes a full token grid (grid_h*grid_w raster-order codes) to 8-bit RGB, row-major
   * [image_h, image_w, 3], into a caller buffer. */
  int (*decode)(vspec_model *model, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb,
                char *err, size_t errlen);

  /* ---- ABI 1.1: continuous tokens (VSPEC_TOKENS_CONTINUOUS, MAR-style models) ----------
   * A masked bidirectional model: each generation step conditions every unknown position
   * on the known ones, and a small diffusion head turns a position's condition into a
   * token. The engine owns the order, the mask schedule and the diffusion sampler; these
   * entries are the two networks. NULL for discrete backends. All buffers are host memory.
   */
  /* Runs the transformer over the grid: tokens [N, token_dim] (values at known positions;
   * the rest is ignored), known [N] (nonzero = known). Writes the condition vectors of the
   * n_out positions `out_pos` to cond [n_out, rows, feature_dim] (rows as the session:
   * [conditional ; unconditional] with CFG). */
  int (*condition)(vspec_session *s, const float *tokens, const uint8_t *known,
                   const int32_t *out_pos, int32_t n_out, float *cond, char *err,
                   size_t errlen);
  /* One evaluation of the diffusion head for n rows: x [n, token_dim] noisy tokens,
   * timestep [n] (the training diffusion's step index, 0..diffusion_steps-1), cond
   * [n, feature_dim]. Writes out [n, 2 * token_dim]: the noise prediction, then the
   * variance interpolation v (learned-range variance). */
  int (*denoise)(vspec_session *s, const float *x, const int32_t *timestep, const float *cond,
                 int32_t n, float *out, char *err, size_t errlen);
  /* Decodes a grid of continuous tokens [grid_h*grid_w, token_dim] to 8-bit RGB. */
  int (*decode_latents)(vspec_model *model, vspec_dev *dev, const float *latents, uint8_t *rgb,
                        char *err, size_t errlen);

  /* ---- ABI 1.2: cross-job batching ------------------------------------------------------
   * forward() for `count` sessions of this model at once: session i runs batch[i] into
   * out[i] exactly as forward() would (the walk out[i] asks for too, ABI 1.6, where `dev` has
   * verify_walk), but the weights are read once for the rows of all of them (a busy server
   * verifies the trees of several jobs per weight pass). The work runs on
   * `dev`, a device of the sessions' memory space that nothing else uses during the call
   * (the sessions' own devices may be busy elsewhere, drafting). Results equal separate
   * forwards up to float rounding (the products run with more rows). The caller guarantees
   * that no session is in use by another thread during the call, and orders the devices'
   * queues: what the sessions' own devices queued before the call runs before what it queues
   * on `dev`, and what they queue after it runs after (on a GPU, each context's stream waits
   * on an event of the other's), so GPU sessions of other contexts than `dev` may be
   * batched. On failure no session has changed; a backend may refuse sessions it cannot
   * batch (VSPEC_EINVAL), and the caller then runs them one by one. A backend may keep
   * what it needs per batch device (a workspace, graphs) until the model unloads, freeing it
   * with that device: `dev` must stay open until then. NULL or absent (struct_size): no
   * batching. */
  int (*forward_multi)(vspec_dev *dev, vspec_session *const *sessions,
                       const vspec_forward_batch *const *batch, vspec_forward_out *const *out,
                       int32_t count, char *err, size_t errlen);
} vspec_backend_vtable;

/* ---- acceptance-rule plugins ---------------------------------------------------------- */

typedef struct vspec_rule vspec_rule; /* a configured rule, owned by the plugin */

/* One candidate at one tree node. Distributions are normalised over `vocab` and are the
 * processed ones (CFG, temperature, top-k, top-p applied), as acceptance uses them.
 * Notation: q = target, p = draft (docs/SPECULATIVE.md). */
typedef struct vspec_accept_input {
  uint32_t struct_size;
  int32_t vocab;
  int32_t token;         /* the drafted token x */
  int32_t depth;         /* 1 = first drafted token after the root */
  int32_t max_depth;     /* draft depth of this round (L) */
  int32_t sibling;       /* 0-based rank among the siblings tried at this node */
  float p_x;             /* probability with which x was proposed: p(x) for a chain, the
                            conditional without-replacement probability for a sampled tree,
                            1 for deterministic (top-k) drafts */
  const float *p;        /* the distribution x was drawn from (earlier siblings removed and
                            renormalised), or NULL for deterministic drafts (one-hot at x) */
  const float *q;        /* current target residual at this node */
  /* Codebook neighbours (for LANTERN-style rules): row y of the table lists y's nearest
   * codes by L2 distance of the raw codebook rows, closest first, y itself excluded.
   * NULL / 0 when the model has no codebook, and for a rule whose descriptor lacks
   * VSPEC_PLUGIN_USES_NEIGHBOURS. */
  const int32_t *neighbours;     /* row of x: neighbour_table + x * table_k */
  int32_t n_neighbours;          /* = table_k */
  const int32_t *neighbour_table; /* [vocab, table_k] */
  int32_t table_k;
} vspec_accept_input;

/* One drafted continuous token and the Gaussians its final diffusion step was drawn from
 * (ABI 1.1). Draft and target ran their samplers with the same noises up to the final step
 * (trajectory alignment, CSpD arXiv 2411.11925 §3.2); the drafted token is a sample of the
 * draft's final-step Gaussian. Variances are diagonal; sigma includes the temperature. */
typedef struct vspec_continuous_input {
  uint32_t struct_size;
  int32_t dim;
  const float *x;                   /* the drafted token [dim] */
  const float *mu_d, *sigma_d;      /* the draft's final-step Gaussian [dim] */
  const float *mu_g, *sigma_g;      /* the target's final-step Gaussian [dim] */
  /* Sums over the earlier (noisy) steps of log sigma per dimension, without the
   * temperature, for rules that weigh whole trajectories (the reference code's factor). */
  const float *sum_log_sigma_d, *sum_log_sigma_g;
} vspec_continuous_input;

typedef struct vspec_accept_vtable {
  uint32_t struct_size;
  int (*create)(const vspec_host *host, const vspec_params *params, vspec_rule **out, char *err,
                size_t errlen);
  void (*destroy)(vspec_rule *rule);
  /* Probability of accepting x, in [0, 1]. */
  double (*accept_prob)(vspec_rule *rule, const vspec_accept_input *in);
  /* After x was rejected: overwrite q_out [vocab] with the (unnormalised, nonnegative)
   * distribution to continue from. The engine normalises it; if its mass is zero the
   * engine applies its documented fallback (docs/SPECULATIVE.md). */
  int (*residual)(vspec_rule *rule, const vspec_accept_input *in, float *q_out);
  /* Greedy decoding (temperature 0): nonzero if x is accepted. NULL means the exact rule,
   * x == argmax q (first maximum). */
  int (*greedy_accept)(vspec_rule *rule, const vspec_accept_input *in);

  /* ---- ABI 1.1: continuous tokens (rules for diffusion-head models) -----------------------
   * NULL for rules of discrete tokens. */
  /* Probability of accepting the drafted token in->x. */
  double (*accept_prob_continuous)(vspec_rule *rule, const vspec_continuous_input *in);
  /* After a rejection: draws the replacement token into y [dim] with `rng`, and reports in
   * *rounds the proposals it took. Returns VSPEC_OK, or VSPEC_ERANGE when the rule's
   * proposal budget ran out (the engine then applies its documented fallback). */
  int (*residual_continuous)(vspec_rule *rule, const vspec_continuous_input *in, vspec_rng *rng,
                             float *y, int32_t *rounds);

  /* ---- ABI 1.6: the walk on the device ----------------------------------------------------
   * The rule as one of the built-in kinds the ops' verify_walk runs (include/vspec/ops.h,
   * vspec_walk_rule) for a round of draft depth max_depth: VSPEC_OK and *out filled when its
   * accept_prob, residual and greedy_accept are exactly that kind's, VSPEC_ENOTSUP otherwise.
   * NULL: the engine walks on the host. */
  int (*walk_rule)(vspec_rule *rule, int32_t max_depth, vspec_walk_rule *out);
} vspec_accept_vtable;

/* ---- scheduler plugins ----------------------------------------------------------------- */

typedef struct vspec_sched vspec_sched; /* a configured scheduler, owned by the plugin */

typedef enum vspec_draft_shape {
  VSPEC_DRAFT_NONE = 0,    /* plain autoregressive step */
  VSPEC_DRAFT_CHAIN = 1,   /* separate draft model, one path */
  VSPEC_DRAFT_STATIC = 2,  /* EAGLE-1 static tree */
  VSPEC_DRAFT_DYNAMIC = 3  /* EAGLE-2 dynamic tree */
} vspec_draft_shape;

typedef enum vspec_drafter_kind {
  VSPEC_DRAFTER_AUTO = 0,  /* the feature head if the model has one, else the draft model */
  VSPEC_DRAFTER_MODEL = 1, /* a separate small draft model (the model directory's "draft") */
  VSPEC_DRAFTER_HEAD = 2,  /* an EAGLE-style head over target features ("eagle") */
  VSPEC_DRAFTER_PLUGIN = 3 /* ABI 1.5: a drafter plugin, named by the scheduler parameter
                              drafter=NAME (the engine resolves the name) */
} vspec_drafter_kind;

typedef struct vspec_round_state {
  uint32_t struct_size;
  int32_t round;            /* 0-based round index, skipped rounds included; -1 for the
                               call before the first round that fixes the drafter and sizes
                               the job's buffers (plan the full shape there) */
  int32_t tokens_done;      /* tokens emitted so far (verified + unverified) */
  int32_t tokens_total;     /* tokens of the whole image */
  int32_t unverified;       /* tokens accepted without verification, not yet through the
                               target */
  int32_t last_skipped;     /* 1 if the previous round skipped verification */
  int32_t max_nodes;        /* largest tree the target may verify in one forward */
  int32_t verified_rounds;  /* rounds that called the target so far, prefill included */
} vspec_round_state;

typedef struct vspec_round_plan {
  uint32_t struct_size;
  uint32_t shape;           /* vspec_draft_shape */
  int32_t depth;            /* chain length / dynamic tree expansion steps */
  int32_t top_k;            /* dynamic tree branching */
  int32_t total_tokens;     /* dynamic tree size (nodes after the root) */
  /* Static tree shape, without the root: node i hangs below static_parents[i] (-1 = the
   * root, otherwise an earlier node); siblings are ranked in index order. Owned by the
   * scheduler, valid until its next plan() call. */
  int32_t n_static;
  const int32_t *static_parents;
  uint32_t drafter;         /* vspec_drafter_kind; read once, at the first round of a job */
} vspec_round_plan;

/* A drafted tree, as the scheduler sees it when deciding whether to verify. */
typedef struct vspec_tree_view {
  uint32_t struct_size;
  int32_t n_nodes;          /* node 0 is the root (the last emitted token) */
  const int32_t *tokens;
  const int32_t *parents;   /* parents[0] = -1 */
  const int32_t *depth;
  const float *score;       /* draft log-probability of the path to each node */
  const float *codebook;    /* [vocab, token_dim] raw codebook, or NULL */
  int32_t token_dim;
} vspec_tree_view;

/* Where the drafter's input features come from for tokens accepted without verification
 * (VVS §4.3). */
typedef enum vspec_feature_source {
  VSPEC_FEATURES_STALE = 0, /* the most recent cached target features, as many as tokens */
  VSPEC_FEATURES_DRAFT = 1, /* the drafter's own predicted features along the path */
  VSPEC_FEATURES_BLEND = 2  /* the mean of the two */
} vspec_feature_source;

typedef struct vspec_skip_decision {
  uint32_t struct_size;
  int32_t skip;             /* 1 = accept a path without calling the target */
  int32_t leaf;             /* node whose root-to-node path is accepted (skip only) */
  int32_t length;           /* number of drafted tokens of that path to accept (>= 1) */
  uint32_t features;        /* vspec_feature_source for the accepted tokens */
  int32_t extra_staleness;  /* stale features: skip this many more recent ones (ablation) */
} vspec_skip_decision;

typedef struct vspec_sched_vtable {
  uint32_t struct_size;
  int (*create)(const vspec_host *host, const vspec_params *params, vspec_sched **out, char *err,
                size_t errlen);
  void (*destroy)(vspec_sched *sched);
  /* Before drafting: the shape of this round's draft. */
  int (*plan)(vspec_sched *sched, const vspec_round_state *state, vspec_round_plan *out);
  /* After drafting: verify (skip = 0) or accept a path unverified. NULL = always verify. */
  int (*decide)(vspec_sched *sched, const vspec_round_state *state, const vspec_tree_view *tree,
                vspec_rng *rng, vspec_skip_decision *out);
} vspec_sched_vtable;

/* ---- drafter plugins (ABI 1.5; driven level by level since 1.6) ---------------------
 *
 * A drafter proposes the tokens a round verifies and learns how each round ended (end): the
 * accepted tokens and, on demand, the target's distribution at any node of the verified tree.
 * It works in one of two ways:
 *  - it builds the whole tree below the root itself (propose). Speculative Jacobi Decoding
 *    (plugins/drafter/jacobi.c) does: its drafts are the target's earlier outputs;
 *  - ABI 1.6: the engine grows the tree (a chain, EAGLE's static tree or EAGLE-2's dynamic
 *    one, as the scheduler plans) and the drafter gives the distribution below each node,
 *    one level per call (begin, expand), usually by running a draft model the engine loaded
 *    from the model directory and serves through vspec_drafter_job.model. The draft GPT and
 *    the EAGLE head are such a drafter (plugins/drafter/model.c). */

typedef struct vspec_drafter vspec_drafter; /* one job's drafter, owned by the plugin */

/* What a drafter knows of its job; fixed for the job. */
typedef struct vspec_drafter_job {
  uint32_t struct_size;
  int32_t vocab;     /* the target's */
  int32_t n_image;   /* tokens of the image; image index 0 is the prefill's token */
  int32_t max_depth; /* deepest draft this job asks for: propose's depth never exceeds it */
  int32_t greedy;    /* temperature 0: the walk accepts a draft iff it is the target's argmax */
  uint64_t seed;     /* the job's seed: a drafter draws from its own streams of it
                        (host->rng_init(rng, seed, VSPEC_STREAM_DRAFTER + k)) */
  /* ---- ABI 1.6 ---- */
  int32_t rows;               /* CFG rows of the target (1, or 2: [cond ; uncond]) */
  int32_t max_nodes;          /* most nodes one round feeds a draft model: a catch-up chain
                                 (the tokens emitted since it last ran), the root and every
                                 node the round expands */
  int32_t max_tree_nodes;     /* node indices begin / expand / node_feature see are below it
                                 (the tree, or EAGLE-2's candidate pool) */
  int32_t target_feature_dim; /* width of the target's features (0: it gives none) */
  /* The model directory's draft model for the kinds that take one (drafter=model: "draft",
   * drafter=head: "eagle"; a drafter named by the scheduler gets "draft" where there is
   * one), NULL otherwise. */
  const struct vspec_draft_model *model;
  /* ---- ABI 1.7 ---- */
  int32_t may_skip;  /* the scheduler may accept a path unverified (VVS): node_feature may be
                        asked; 0: every round is verified and node_feature is never asked, so
                        a drafter need not bring its nodes' features to the host */
} vspec_drafter_job;

/* A draft model the engine loaded, served to a drafter (ABI 1.6). Sessions and forwards go
 * through the engine so that it can batch the forwards of several jobs (the daemon's
 * [workers] batch) and count them. */
typedef struct vspec_draft_model {
  uint32_t struct_size;
  const vspec_model_info *info;
  void *ctx;
  /* A session of the job's condition (class or caption), the job's CFG rows and room for
   * vspec_drafter_job.max_nodes per forward, with its condition positions run (prefill). */
  int (*open)(void *ctx, vspec_session **out, char *err, size_t errlen);
  void (*close)(void *ctx, vspec_session *s);
  /* As vspec_backend_vtable's forward and commit. */
  int (*forward)(void *ctx, vspec_session *s, const vspec_forward_batch *batch,
                 vspec_forward_out *out, char *err, size_t errlen);
  int (*commit)(void *ctx, vspec_session *s, const int32_t *path, int32_t n, char *err,
                size_t errlen);
  /* The draft distribution [vocab] of logits [rows, vocab] predicting image index
   * `image_index`: processed as the target's is there (CFG scale and schedule, temperature,
   * top-k, top-p), except that temperature 0 counts as 1, so that a tree is ranked by the
   * drafter's softmax rather than a one-hot argmax (EAGLE's top-k). */
  void (*distribution)(void *ctx, const float *logits, int32_t image_index, float *probs);
} vspec_draft_model;

/* First RNG stream id free for drafters (the engine's own are below). */
#define VSPEC_STREAM_DRAFTER 0x40000000ull

/* The tree a round verifies, as a drafter builds it. Node 0 is the root (the last emitted
 * token, image index root_index); a node at depth d stands for image index root_index + d.
 * The walk tries a node's children in the order they were added, each judged against the
 * distribution of its parent (dist) without the earlier siblings, renormalised: children
 * must be drawn from it that way (without replacement) for exact rules to stay exact. */
typedef struct vspec_draft_builder {
  uint32_t struct_size;
  void *ctx;
  /* Adds a child of `parent` carrying `token`, proposed with probability p_cond (what it was
   * drawn with, given the earlier siblings; 1 for a deterministic draft); returns its index,
   * or -1 when the tree is full. */
  int32_t (*add)(void *ctx, int32_t parent, int32_t token, float p_cond);
  /* The distribution [vocab] the children of `node` are drawn from, for the drafter to fill
   * before adding them; NULL when no more nodes can hold one. */
  float *(*dist)(void *ctx, int32_t node);
  /* ---- ABI 1.6: for begin / expand ---- */
  /* Token, parent (-1 for the root) and depth of `node`; VSPEC_EINVAL for no such node. */
  int (*node)(void *ctx, int32_t node, int32_t *token, int32_t *parent, int32_t *depth);
  /* The drafter's mark on `node` (-1 until it sets one): what it needs to find the node
   * again, typically the pending index it fed the node at. The engine carries marks
   * through the round, also when it rebuilds a dynamic tree from its candidate pool, and
   * hands them back in vspec_round_result.marks. */
  int32_t *(*mark)(void *ctx, int32_t node);
} vspec_draft_builder;

/* How a round ended. */
typedef struct vspec_round_result {
  uint32_t struct_size;
  int32_t root_index;
  int32_t n_accepted;       /* drafted tokens accepted after the root */
  const int32_t *path;      /* [n_accepted + 1] their nodes, path[0] = 0 (the root) */
  int32_t next_root;        /* the token sampled after them: image index root_index +
                               n_accepted + 1 */
  int32_t n_nodes;          /* the verified tree */
  const int32_t *tokens, *parents, *depth; /* [n_nodes] */
  void *ctx;
  /* The target's processed distribution at `node` (CFG, temperature, top-k, top-p: what the
   * walk compares with) for image index root_index + depth[node] + 1, into probs [vocab];
   * computed on demand. */
  int (*target_dist)(void *ctx, int32_t node, float *probs);
  /* ---- ABI 1.6 ---- */
  const int32_t *marks;     /* [n_nodes] the drafter's marks (vspec_draft_builder.mark) */
  /* [n_accepted + 1, rows, target_feature_dim]: the target's features at the root and at
   * each accepted node (the input of the token after it), for drafters that use features;
   * NULL otherwise. */
  const float *features;
  int32_t verified;         /* 0: the scheduler skipped the target this round (VVS): the
                               path was accepted unverified, target_dist fails and features
                               are what the scheduler chose (stale target or the drafter's
                               own, node_feature) */
  /* ---- ABI 1.8 ----
   * Where the target's features stayed on the device (features NULL): feature_table, memory
   * of the drafter's device [*, rows, target_feature_dim], and feature_rows [n_accepted + 1],
   * the rows of the root's and each accepted node's feature in it. The table holds them
   * until the next round's first forward (vspec_forward_batch.feature_table) has read them. */
  const float *feature_table;
  const int32_t *feature_rows;
} vspec_round_result;

typedef struct vspec_drafter_vtable {
  uint32_t struct_size;
  int (*create)(const vspec_host *host, const vspec_params *params, const vspec_drafter_job *job,
                vspec_drafter **out, char *err, size_t errlen);
  void (*destroy)(vspec_drafter *d);
  /* After the target's prefill: image token 0. */
  int (*start)(vspec_drafter *d, int32_t root_token, char *err, size_t errlen);
  /* This round's tree below the root (image index root_index), at most `depth` deep. */
  int (*propose)(vspec_drafter *d, int32_t root_index, int32_t depth,
                 const vspec_draft_builder *b, char *err, size_t errlen);
  /* After the walk of a round it proposed. */
  int (*end)(vspec_drafter *d, const vspec_round_result *r, char *err, size_t errlen);
  /* After a round it sat out (an AR step): the target emitted next_root at root_index + 1. */
  int (*skip)(vspec_drafter *d, int32_t next_root, char *err, size_t errlen);

  /* ---- ABI 1.6: drafters the engine drives level by level ------------------------------
   * A drafter sets either propose or begin + expand; the entries below serve the latter
   * only (the engine does not call them on a drafter that proposes). */
  /* The round starts at the root (node 0, image index root_index): fill b->dist(0). */
  int (*begin)(vspec_drafter *d, int32_t root_index, const vspec_draft_builder *b, char *err,
               size_t errlen);
  /* Fill b->dist(nodes[i]) for n nodes of one level whose parents were begun or expanded
   * earlier this round. The engine adds the children itself (b->add is NULL here). */
  int (*expand)(vspec_drafter *d, int32_t root_index, const int32_t *nodes, int32_t n,
                const vspec_draft_builder *b, char *err, size_t errlen);
  /* Nonzero if the drafter reads the target's features: the engine then has the target
   * return them and calls start_feature / skip_feature instead of start / skip. */
  int (*uses_features)(const vspec_drafter *d);
  /* start and skip with the target's feature at the new root ([rows, target_feature_dim],
   * the input of the token after it). */
  int (*start_feature)(vspec_drafter *d, int32_t root_token, const float *root_feature,
                       char *err, size_t errlen);
  int (*skip_feature)(vspec_drafter *d, int32_t next_root, const float *root_feature,
                      char *err, size_t errlen);
  /* The drafter's own predicted feature at an expanded node ([rows, target_feature_dim]),
   * which VVS may feed in place of the target's for tokens accepted unverified; NULL where
   * it has none. May be NULL. */
  const float *(*node_feature)(const vspec_drafter *d, int32_t node);
  /* Forwards it ran and the nodes they fed, for the job's metrics. May be NULL (none). */
  void (*counts)(const vspec_drafter *d, int64_t *forwards, int64_t *nodes);
} vspec_drafter_vtable;

/* ---- the descriptor ------------------------------------------------------------------- */

typedef struct vspec_plugin_desc {
  /* frozen head: never reordered, never removed */
  uint32_t abi_major;
  uint32_t abi_minor;
  uint32_t struct_size; /* sizeof(vspec_plugin_desc) as the plugin was built */
  uint32_t kind;        /* vspec_plugin_kind */
  const char *name;     /* [a-z0-9_]+, unique per kind */
  const char *version;  /* the plugin's own version string */
  uint64_t flags;       /* VSPEC_PLUGIN_* */
  /* ABI 1.0 */
  const char *description;
  const void *vtable; /* vspec_backend_vtable / vspec_accept_vtable / vspec_sched_vtable /
                         vspec_drafter_vtable (ABI 1.5) */
  /* Called once after loading, before any other call. May be NULL. */
  int (*init)(const vspec_host *host, char *err, size_t errlen);
  /* Called once before the generation is closed; every object it created is gone. */
  void (*shutdown)(void);
} vspec_plugin_desc;

typedef const vspec_plugin_desc *(*vspec_plugin_entry_fn)(void);

/* Declares the entry symbol. Use once per plugin:
 *   VSPEC_PLUGIN_DEFINE(my_desc)  where my_desc is a static const vspec_plugin_desc. */
#define VSPEC_PLUGIN_DEFINE(desc)                                   \
  VSPEC_PLUGIN_EXPORT const vspec_plugin_desc *vspec_plugin_entry(void); \
  VSPEC_PLUGIN_EXPORT const vspec_plugin_desc *vspec_plugin_entry(void) { return &(desc); }

/* Initialiser for the frozen head of a descriptor built against this header. */
#define VSPEC_PLUGIN_HEAD(kind, name, version, flags) \
  VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR, (uint32_t)sizeof(vspec_plugin_desc), (kind), (name), (version), (flags)

#ifdef __cplusplus
}
#endif
#endif /* VSPEC_PLUGIN_H */
