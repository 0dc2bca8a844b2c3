/*
 * vspec/ops.h - the compute ops table: one struct of function pointers per device.
 *
 * Model code (backend plugins, the engine) is written once against this table and runs
 * on every device that provides one. The host hands the table to plugins through
 * vspec_host.ops; plugins never link a BLAS or CUDA themselves.
 *
 * Conventions for every op:
 *  - `dev` is the device context of the calling worker thread (scratch arena, thread
 *    count, later a CUDA stream). Ops are not reentrant on one `dev`; each worker has its
 *    own.
 *  - Pointers to float data are device pointers obtained from `alloc` (on the CPU device
 *    these are ordinary host pointers). Integer index arrays (positions, masks) are host
 *    pointers unless stated otherwise.
 *  - Matrices are row-major. Linear-layer weights are stored PyTorch style, [out, in].
 *  - Ops do not allocate on the hot path: temporary memory comes from the device's
 *    scratch arena, sized once at creation and grown outside the round loop by
 *    `reserve_scratch`.
 *
 * The ops themselves, each with its doc comment, are listed once in vspec/ops_list.h, in
 * table order; the struct below is generated from that list.
 *
 * The table only grows at the end (check struct_size before using a newer entry; a plugin
 * built against ABI 1.1 gets a 1.1 table, because the host refuses plugins newer than
 * itself).
 */
#ifndef VSPEC_OPS_H
#define VSPEC_OPS_H

#include "vspec/ops_list.h"
#include "vspec/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vspec_dev vspec_dev; /* device context, owned by the host */
typedef struct vspec_graph vspec_graph; /* ABI 1.5: a recorded sequence of ops (graph_end) */

typedef enum vspec_device_kind {
  VSPEC_DEVICE_CPU = 1,
  VSPEC_DEVICE_CUDA = 2
} vspec_device_kind;

/* ABI 1.4: one layer's KV cache as the fused ops see it. Keys of CFG row r, kv head h and
 * slot s start at k + ((r kv_heads + h) slots + s) head_dim, values likewise at v. Query head
 * q uses kv head q / (n_heads / kv_heads). The layout is fixed: a later op that needs more
 * takes another struct. */
typedef struct vspec_kv_cache {
  float *k, *v; /* device */
  int32_t rows, n_heads, kv_heads, head_dim, slots;
} vspec_kv_cache;

/* ABI 1.4: which cache slots each query of a forward sees (speculative trees). Slots
 * [0, committed) hold the accepted sequence; pending node p (forwarded since the last
 * commit) sits at slot committed + p. The forward's query i is pending node base + i, at slot
 * committed + base + i, and sees slot s < committed + base + n iff
 *   (s < committed, or s - committed is base + i or one of its ancestors by `parents`), and
 *   (s >= n_prefix, or prefix[s] != 0, or s is the query's own slot).
 * The prefix rule is LlamaGen's caption mask (t2i: padding slots hidden, the diagonal kept;
 * generate.py); a prefill is the chain parents[i] = i - 1 with committed = 0.
 * committed and base are device memory, read when the op runs, like every value that changes
 * from one step to the next: a recorded sequence of ops (a CUDA graph) then serves every step
 * whose shapes match. n may include padding nodes (parents -1): no real node has them as
 * ancestors, so nothing real sees them. */
typedef struct vspec_kv_tree_view {
  int32_t n;              /* queries per CFG row */
  int32_t n_prefix;       /* slots under the prefix rule (0: none) */
  const int32_t *lens;    /* device [2]: committed (slots of the accepted sequence), then base
                           * (the pending index of query 0) */
  const int32_t *parents; /* device [base + n]: pending index of the parent, or -1 */
  const uint8_t *prefix;  /* device [n_prefix], NULL when n_prefix is 0 */
} vspec_kv_tree_view;

/* ABI 1.9: one session of a cross-job batch, for the batch ops (norm_qkv_rope_batch,
 * tree_attention_batch): what norm_qkv_rope and tree_attention take for it alone (this
 * layer's caches, its tree, the slots of its nodes) and where its rows sit in the batch's
 * arrays: rows [row0, row0 + kv.rows x tree.n), ordered (CFG row, node) as norm_qkv_rope
 * orders one session's. Every session of a batch has the same n_heads, kv_heads and
 * head_dim. */
typedef struct vspec_kv_batch_entry {
  vspec_kv_cache kv;
  vspec_kv_tree_view tree;
  const int32_t *slots; /* device [tree.n] */
  int32_t row0;
  int32_t reserved;     /* 0 */
} vspec_kv_batch_entry;

/* ABI 1.9: the sessions of a batch for one layer's batch ops. The same entries twice: in
 * host memory, read when the op is issued (checks, launch shapes, a GPU's session-by-session
 * fallback), and in device memory, read when it runs; a forward uploads them with its other
 * indices. Recorded in a graph (ABI 1.5), an op keeps count, m and max_slots and reads the
 * sessions from entries_dev at each launch, so one graph serves every batch of that shape
 * whose entries are uploaded to the same place; a device that would run it from the host copy
 * refuses to record it (the recording fails and the caller runs the ops eagerly). */
typedef struct vspec_kv_batch {
  int32_t count;     /* sessions */
  int32_t m;         /* batch rows: the sum of kv.rows x tree.n */
  int32_t max_slots; /* the largest kv.slots (a GPU sizes its shared memory by it) */
  int32_t reserved;  /* 0 */
  const vspec_kv_batch_entry *entries;     /* host [count] */
  const vspec_kv_batch_entry *entries_dev; /* device [count] */
} vspec_kv_batch;

/* ABI 1.4: how sample_tokens draws one token per node (LlamaGen generate.py sample; the same
 * rules as the engine's host sampler). */
typedef struct vspec_sample_spec {
  int32_t n;             /* nodes: logits [n, rows, vocab], node-major as a forward returns them */
  int32_t rows;          /* 1, or 2: the conditional row, then the unconditional one */
  int32_t vocab;
  int32_t top_k;         /* keep values >= the k-th largest (ties kept); 0 or >= vocab: off */
  float cfg_scale;       /* rows 2, guided node: uncond + cfg_scale (cond - uncond) */
  float temperature;     /* logits / max(temperature, 1e-5); <= 0: greedy, the first argmax */
  float top_p;           /* the smallest descending prefix crossing top_p; >= 1: off */
  const uint8_t *guided; /* [n]: 0 where a node is not guided (LlamaGen's cfg_interval: the
                          * conditional row alone); NULL: every node guided */
  const double *u;       /* [n]: each node's uniform in [0, 1) (not read when greedy) */
} vspec_sample_spec;

/* ABI 1.10: how draw_children draws a tree's children from draw_probs' rows. */
typedef struct vspec_children_spec {
  int32_t n;             /* rows of probs */
  int32_t vocab;
  int32_t max_count;     /* the largest counts[i] (at most VSPEC_CHILDREN_MAX) */
  int32_t reserved;      /* 0 */
  const int32_t *counts; /* device [n]: row i's children */
  const int32_t *first;  /* device [n]: the index of row i's first child in tokens and drawn */
  const int32_t *node;   /* device [n]: the child (an index in tokens) row i is the distribution
                          * of, or -1 (the caller's root) */
  const double *u;       /* device: the uniforms, in [0, 1), taken in order; NULL: greedy,
                          * each child the first maximum of what is left (no cursor) */
  int32_t *cursor;       /* device [1]: the index in u of the next uniform; each draw adds 1 */
  uint8_t *drawn;        /* device [children]: 1 where a child was drawn, 0 where it is absent */
} vspec_children_spec;
#define VSPEC_CHILDREN_MAX 64

/* ABI 1.6: a built-in acceptance rule as the verify_walk op runs it. The rule's plugin fills it
 * (vspec_accept_vtable.walk_rule); the per-element maths is kernels/common/vs_walk_rules.h,
 * which the plugins themselves compute with (docs/SPECULATIVE.md has the rules). */
enum {
  VSPEC_WALK_EXACT = 1,    /* exact: min(1, q(x)/p(x)), residual max(0, q - p) */
  VSPEC_WALK_OMEGA = 2,    /* uniform_rsd, coolsd: min(1, omega_d q(x)/p(x)) */
  VSPEC_WALK_PROXIMITY = 3 /* lantern, lanternpp: min(1, q(A(x))/p(x)) over codebook neighbours */
};
#define VSPEC_WALK_MAX_DEPTH 64  /* omega[] holds depths 1..64; deeper drafts use omega[64] */
#define VSPEC_WALK_MAX_PATH 128  /* nodes of the accepted path, root included */

typedef struct vspec_walk_rule {
  int32_t kind;      /* VSPEC_WALK_* */
  int32_t optimal;   /* OMEGA, PROXIMITY: Cool-SD's resampling G* (resample=optimal) */
  int32_t reference; /* PROXIMITY: the authors' residual and greedy test (reject=reference) */
  int32_t k;         /* PROXIMITY: neighbours searched */
  double budget_abs, budget_rel; /* PROXIMITY: the pool's budget abs + rel q(x): LANTERN
                                  * (delta, 0), LANTERN++ (0, lambda - 1) */
  double omega[VSPEC_WALK_MAX_DEPTH + 1]; /* OMEGA: omega at draft depth d, [min(d, 64)] */
} vspec_walk_rule;

/* ABI 1.6: a verified tree and how verify_walk walks it (core/verify_walk.c's walk). The
 * sampling is sample's (n nodes, rows, vocab, CFG, temperature, top-k, top-p, guided [n] in
 * device memory; u is not read). */
typedef struct vspec_walk_spec {
  vspec_sample_spec sample;
  const int32_t *parents;    /* device [n]: each node's parent (a smaller index), -1 for node 0,
                              * the root; a node's children are tried in index order */
  const int32_t *tokens;     /* device [n]: the drafted tokens (node 0's is not read) */
  const float *dists;        /* device [*, vocab]: draft distributions, or NULL */
  const int32_t *dist;       /* device [n]: the row of dists a node's children were drawn from,
                              * -1 (or dist NULL) for one-hot drafts (top-k: p(x) := 1) */
  const int32_t *neighbours; /* device [vocab, table_k]: codebook neighbours (PROXIMITY), or NULL */
  int32_t table_k;
  vspec_walk_rule rule;
  vspec_rng accept;          /* the stream of the acceptance uniforms, at its position */
  vspec_rng target;          /* the stream of the residual and bonus draws, at its position */
} vspec_walk_spec;

/* ABI 1.6: what verify_walk writes (device memory): the few bytes a round downloads. */
typedef struct vspec_walk_result {
  int32_t status;       /* VSPEC_OK; VSPEC_EINVAL for a bad spec or a target distribution
                         * without mass (next -1) */
  int32_t n_path;       /* nodes on the accepted path, root included (1: nothing accepted) */
  int32_t next;         /* the token sampled after the path (bonus or residual draw) */
  int32_t accept_draws; /* uniforms taken from spec->accept (vs_rng_uniform: 2 words each) */
  int32_t target_draws; /* ... and from spec->target */
  int32_t tried;        /* candidates judged (metrics: siblings_tried) */
  int32_t fallbacks;    /* residuals without mass (metrics: residual_fallbacks) */
  int32_t path[VSPEC_WALK_MAX_PATH]; /* the path's nodes, path[0] = 0 */
} vspec_walk_result;

typedef struct vspec_ops {
  uint32_t struct_size; /* sizeof(vspec_ops) as built into the host */
  uint32_t device;      /* vspec_device_kind */
  const char *name;     /* "cpu", "cuda" */

  /* The ops, in ABI order: one function pointer per entry of vspec/ops_list.h, which holds
   * each op's doc comment ("ret (*name) params;"). */
#define VSPEC__OPS_MEMBER(ret, name, params, args, minor, kind) ret(*name) params;
  VSPEC_OPS(VSPEC__OPS_MEMBER)
#undef VSPEC__OPS_MEMBER
} vspec_ops;

/* Formats for weight_format. */
enum {
  VSPEC_WEIGHTS_DEFAULT = 0, /* the device's precision: withdraws an earlier request */
  VSPEC_WEIGHTS_INT8 = 1     /* int8 per output channel (scale = max |row| / 127); activations
                              * quantised per row when the product runs */
};

/* alloc_uninit where the device has it and the host's table is recent enough, else alloc. */
static inline void *vspec_alloc_uninit(const vspec_ops *ops, vspec_dev *dev, size_t bytes) {
  if (VSPEC_HAS_FIELD(ops, vspec_ops, alloc_uninit) && ops->alloc_uninit)
    return ops->alloc_uninit(dev, bytes);
  return ops->alloc(dev, bytes);
}

/* Whether a device (and the host's table) has every fused op of ABI 1.4. */
static inline int vspec_has_fused_ops(const vspec_ops *ops) {
  return VSPEC_HAS_FIELD(ops, vspec_ops, tree_attention) && ops->gather_rows &&
         ops->rmsnorm_rows && ops->linear_add && ops->norm_swiglu && ops->norm_qkv_rope &&
         ops->tree_attention;
}

/* Whether a device (and the host's table) has the batch ops of ABI 1.9. */
static inline int vspec_has_batch_ops(const vspec_ops *ops) {
  return VSPEC_HAS_FIELD(ops, vspec_ops, tree_attention_batch) && ops->norm_qkv_rope_batch &&
         ops->tree_attention_batch;
}

/* Whether a device (and the host's table) records and replays graphs (ABI 1.5). */
static inline int vspec_has_graphs(const vspec_ops *ops) {
  return VSPEC_HAS_FIELD(ops, vspec_ops, graph_free) && ops->graph_begin && ops->graph_end &&
         ops->graph_launch && ops->graph_free;
}

#ifdef __cplusplus
}
#endif
#endif /* VSPEC_OPS_H */
