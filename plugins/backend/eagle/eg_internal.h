/*
 * plugins/backend/eagle/eg_internal.h - internal types of the EAGLE head's backend plugin.
 *
 * Its files call one way: eagle.c (load, sessions, the unfused forward, the vtable) ->
 * eagle_graph.c (the forward on the fused ops of ABI 1.4, eager or padded to a node-count
 * bucket and replayed from an ABI 1.5 graph).
 */
#ifndef EG_INTERNAL_H
#define EG_INTERNAL_H

#include "../device_tokens.h"
#include "../kv_tree.h"
#include "vspec/plugin.h"

#define EG_MAX_LAYERS 8
#define EG_DEFAULT_MAX_NODES 256

typedef struct eg_layer {
  const float *input_norm; /* NULL for layer 0 */
  float *wqkv;             /* device [3d, d]: q_proj, k_proj, v_proj stacked */
  const float *wo, *post_norm, *gate, *up, *down;
} eg_layer;

/* ABI 1.5 graphs (eagle_graph.c): how a session runs its fused forwards. */
enum {
  EG_GRAPHS_OFF = 0, /* eagerly, n nodes as asked */
  EG_GRAPHS_ON = 1,  /* padded to a node-count bucket, through a recorded graph per bucket */
  EG_GRAPHS_PAD = 2  /* padded to the bucket, eagerly: the reference replay must equal */
};

/* Buckets of 1, 2, 4 .. 256 nodes; what a forward's head computes (a graph per kind: each
 * issues other ops): nothing downloaded, features, or logits (and features). */
#define EG_GRAPH_BUCKETS 9
enum {
  EG_HEAD_NONE = 0,
  EG_HEAD_FEATURES = 1,
  EG_HEAD_LOGITS = 2,
  EG_HEAD_DRAFT = 3, /* ABI 1.8: a draft drawn on the device (vspec_forward_out.draw) */
  EG_GRAPH_HEADS = 4
};

struct vspec_model {
  const vspec_host *host;
  vspec_dev *dev;
  vspec_tensor_file *f, *target;
  int dim, n_head, head_dim, ffn, vocab, n_layer, grid, n_image, n_cond, max_nodes;
  int graphs; /* EG_GRAPHS_*: the load parameter graphs=, else VSPEC_GRAPHS, else on where
               * the device has graphs and is not the CPU (eagle.c, eg_graphs_mode) */
  float norm_eps, rope_base;
  const float *fc_w, *fc_b, *embed, *output;
  eg_layer layers[EG_MAX_LAYERS];
  float *rope; /* device [(n_cond + n_image), head_dim/2, 2] */
};

struct vspec_session {
  vspec_model *m;
  const vspec_host *host;
  const vspec_ops *ops;
  vspec_dev *dev;
  int rows, max_nodes, prefilled;
  vs_kv_tree kv;
  float *cat, *h, *qkv, *att, *ff1, *ff3, *logits; /* [rows * max_nodes, ...] */
  uint8_t *mask;
  int32_t *pos;
  /* The fused path's device area, stage_dev, in blocks of F = rows * max_nodes rows of dim
   * floats (eg_block): 0 `keep`, ABI 1.7's output feature of every pending node ([rows,
   * max_nodes, dim]: what vspec_forward_batch.feature_src names); 1 the embeddings of a
   * forward's tokens, then (padded forwards) keep's copy while it is rewritten; 2 the
   * residual stream x; 3 the uploaded features; after them the integers (eagle_graph.c,
   * eg_stage). One gather over blocks 0-3 makes a forward's inputs, so a tree node's input
   * (its parent's output) never crosses to the host and back. stage_host mirrors blocks 3
   * on (what one upload carries). */
  int fused;
  char *stage_host, *stage_dev;
  float *keep, *x;
  /* ABI 1.5: EG_GRAPHS_* for this session (OFF where the device lacks fused ops or graphs),
   * its graphs by (bucket, head kind), failed recordings so far (eagle_graph.c,
   * eg_graph_get: those that would have had to allocate or wait count apart) */
  int graphs;
  vspec_graph *graph[EG_GRAPH_BUCKETS][EG_GRAPH_HEADS];
  int graph_failures, graph_busy;
  /* ABI 1.8, a draft drawn on the device (eagle_graph.c), allocated at the first: every
   * node's distribution [max_nodes, vocab] and token [max_nodes], and the draw's uniforms
   * [max_nodes] and guidance bytes [max_nodes] after one upload each forward (draw_host
   * stages them) */
  float *draft_probs;
  int32_t *draft_tok;
  char *draw_dev, *draw_host;
};

/* Block k of the fused path's device area (see stage_dev). */
static inline float *eg_block(const vspec_session *s, int k) {
  return (float *)(void *)s->stage_dev + (size_t)k * s->rows * s->max_nodes * s->m->dim;
}

/* Integers one fused forward uploads at most (eagle_graph.c, eg_stage). */
static inline size_t eg_stage_ints(int rows, int max_nodes) {
  size_t F = (size_t)rows * max_nodes;
  return 7 * F + 3 * (size_t)max_nodes + 8;
}

/* Padding nodes a forward of at most max_nodes nodes may add (so many cache slots a session
 * keeps after its last pending one). */
int eg_graph_pad_room(int max_nodes);
/* The forward of a checked batch on the fused ops, its nodes already pending from base on;
 * src: vspec_forward_batch.feature_src or NULL. */
void eg_forward_fused(vspec_session *s, const vspec_forward_batch *b, const int32_t *src,
                      int base, vspec_forward_out *out);
/* Frees a session's graphs. */
void eg_graphs_free(vspec_session *s);
/* The room a draft drawn on the device needs (draft_probs .. draw_host), allocated once; 0
 * when it cannot be. */
int eg_draft_room(vspec_session *s);
/* Bytes of a draw's staging: uniforms then guidance bytes for max_nodes nodes. */
#define EG_DRAW_BYTES(max_nodes) ((size_t)(max_nodes) * (sizeof(double) + 1))

#endif /* EG_INTERNAL_H */
