/*
 * plugins/backend/kv_tree.h - a KV cache with committed and pending tree nodes, shared by
 * the transformer backends (header-only: each backend is its own plugin and links nothing
 * but the host table).
 *
 * Slots [0, committed) hold the accepted sequence; pending node j (forwarded since the last
 * commit) sits at slot committed + j and at sequence position committed + depth(j). The
 * semantics are those of vspec_forward_batch and the backend vtable's commit
 * (include/vspec/plugin.h).
 */
#ifndef VSPEC_BACKEND_KV_TREE_H
#define VSPEC_BACKEND_KV_TREE_H

#include <stdio.h>
#include <string.h>

#include "vspec/plugin.h"

typedef struct vs_kv_tree {
  const vspec_ops *ops;
  vspec_dev *dev;
  int layers, rows, kv_heads, head_dim, slots;
  float *k, *v;          /* device [layers][rows][kv_heads][slots][head_dim] */
  int committed;
  int n_pending, max_pending;
  int32_t *parents, *depth; /* host [max_pending] */
} vs_kv_tree;

static inline size_t vs_kv_layer_elems(const vs_kv_tree *t) {
  return (size_t)t->rows * t->kv_heads * t->slots * t->head_dim;
}

/* Cache of (layer, row, kv head): [slots, head_dim]. */
static inline float *vs_kv_at(const vs_kv_tree *t, float *base, int layer, int row, int kvh) {
  return base + (size_t)layer * vs_kv_layer_elems(t) +
         ((size_t)row * t->kv_heads + kvh) * t->slots * t->head_dim;
}

static inline int vs_kv_tree_init(vs_kv_tree *t, const vspec_host *host, vspec_dev *dev,
                                  int layers, int rows, int kv_heads, int head_dim, int slots,
                                  int max_pending) {
  memset(t, 0, sizeof *t);
  t->ops = host->dev_ops(dev);
  t->dev = dev;
  t->layers = layers;
  t->rows = rows;
  t->kv_heads = kv_heads;
  t->head_dim = head_dim;
  t->slots = slots;
  t->max_pending = max_pending;
  size_t bytes = (size_t)layers * vs_kv_layer_elems(t) * sizeof(float);
  /* not zero-filled: a slot is read only once a forward has written it */
  t->k = vspec_alloc_uninit(t->ops, dev, bytes);
  t->v = vspec_alloc_uninit(t->ops, dev, bytes);
  t->parents = host->calloc((size_t)max_pending, sizeof(int32_t));
  t->depth = host->calloc((size_t)max_pending, sizeof(int32_t));
  return t->k && t->v && t->parents && t->depth ? VSPEC_OK : VSPEC_ENOMEM;
}

static inline void vs_kv_tree_free(vs_kv_tree *t, const vspec_host *host) {
  if (t->k) t->ops->free(t->dev, t->k);
  if (t->v) t->ops->free(t->dev, t->v);
  host->free(t->parents);
  host->free(t->depth);
  memset(t, 0, sizeof *t);
}

/* Checks a forward batch and records its nodes as pending; *base receives the pending
 * index of its first node. Positions may not pass max_pos. */
static inline int vs_kv_tree_add(vs_kv_tree *t, const vspec_forward_batch *b, int vocab,
                                 int max_pos, int *base, char *err, size_t errlen) {
  int n = b->n_nodes;
  int first = b->append ? t->n_pending : 0;
  if (n < 1 || first + n > t->max_pending) {
    snprintf(err, errlen, "forward of %d nodes after %d pending: this session holds at most %d "
             "pending nodes", n, first, t->max_pending);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < n; i++) {
    int p = b->parents[i];
    if (p < -1 || p >= first + i) {
      snprintf(err, errlen, "node %d has parent %d: parents must be earlier pending nodes or -1",
               i, p);
      return VSPEC_EINVAL;
    }
    /* a negative token is one drawn on the device (ABI 1.8, token_dev) */
    if ((b->tokens[i] < 0 && !(VSPEC_HAS_FIELD(b, vspec_forward_batch, token_dev) &&
                               b->token_dev)) ||
        b->tokens[i] >= vocab) {
      snprintf(err, errlen, "node %d has token %d outside the vocabulary 0..%d", i, b->tokens[i],
               vocab - 1);
      return VSPEC_ERANGE;
    }
    int depth = p < 0 ? 0 : t->depth[p] + 1;
    if (t->committed + depth > max_pos) {
      snprintf(err, errlen, "node %d would sit at position %d, past the last position %d", i,
               t->committed + depth, max_pos);
      return VSPEC_ERANGE;
    }
    t->depth[first + i] = depth;
    t->parents[first + i] = p;
  }
  t->n_pending = first + n;
  *base = first;
  return VSPEC_OK;
}

/* Attention mask of the batch's nodes [n, committed + base + n]: committed slots visible
 * where visible_prefix says so (NULL = all; only the first n_prefix_rule slots are
 * checked), pending slots along the node's ancestor chain, itself included. */
static inline void vs_kv_tree_mask(const vs_kv_tree *t, int base, int n,
                                   const uint8_t *visible_prefix, int n_prefix_rule,
                                   uint8_t *mask) {
  int L = t->committed, kv = L + base + n;
  for (int i = 0; i < n; i++) {
    uint8_t *row = mask + (size_t)i * kv;
    for (int j = 0; j < L; j++)
      row[j] = (uint8_t)(!visible_prefix || j >= n_prefix_rule || visible_prefix[j]);
    memset(row + L, 0, (size_t)(base + n));
    for (int a = base + i; a >= 0; a = t->parents[a]) row[L + a] = 1;
  }
}

/* Stores keys and values of `n` rows, row i at slot `first_slot + i`. Row i of (row r)
 * starts at src + (r * n + i) * stride; k at k_off, v at v_off, head after head. The copies
 * run on `dev` (ops its table): the device that computed src, which a cross-job batch's is
 * and the cache's own need not be (on a GPU another stream: a copy there would not wait for
 * src). */
static inline void vs_kv_store_on(vs_kv_tree *t, const vspec_ops *ops, vspec_dev *dev, int layer,
                                  int n, int first_slot, const float *src, int stride, int k_off,
                                  int v_off) {
  size_t hd = (size_t)t->head_dim, f = sizeof(float);
  /* Per row: a = kv head, b = node. */
  for (int r = 0; r < t->rows; r++) {
    const float *rows = src + (size_t)r * n * stride;
    float *kc = vs_kv_at(t, t->k, layer, r, 0), *vc = vs_kv_at(t, t->v, layer, r, 0);
    ops->copy3d(dev, kc + (size_t)first_slot * hd, t->slots * hd * f, hd * f, rows + k_off,
                hd * f, (size_t)stride * f, hd * f, t->kv_heads, n);
    ops->copy3d(dev, vc + (size_t)first_slot * hd, t->slots * hd * f, hd * f, rows + v_off,
                hd * f, (size_t)stride * f, hd * f, t->kv_heads, n);
  }
}

/* vs_kv_store_on the cache's own device. */
static inline void vs_kv_store(vs_kv_tree *t, int layer, int n, int first_slot, const float *src,
                               int stride, int k_off, int v_off) {
  vs_kv_store_on(t, t->ops, t->dev, layer, n, first_slot, src, stride, k_off, v_off);
}

/* Appends pending nodes `path` to the committed sequence, compacting their cache slots. */
static inline int vs_kv_tree_commit(vs_kv_tree *t, const int32_t *path, int n, int max_committed,
                                    char *err, size_t errlen) {
  int L = t->committed;
  if (n < 0 || n > t->n_pending) {
    snprintf(err, errlen, "commit of %d nodes, but only %d are pending", n, t->n_pending);
    return VSPEC_EINVAL;
  }
  for (int j = 0; j < n; j++) {
    int node = path[j], want = j == 0 ? -1 : path[j - 1];
    if (node < 0 || node >= t->n_pending || t->parents[node] != want) {
      snprintf(err, errlen, "commit path entry %d (node %d) is not a child of %d among the "
               "pending nodes", j, node, want);
      return VSPEC_EINVAL;
    }
  }
  if (L + n > max_committed) {
    snprintf(err, errlen, "commit would pass the end of the sequence");
    return VSPEC_ERANGE;
  }
  /* Parents precede children, so path[j] >= j: copying upwards never overwrites a later
   * source. */
  /* One strided copy per moved node and cache: a = layer, b = (row, kv head). */
  size_t hd = (size_t)t->head_dim, f = sizeof(float);
  size_t layer_bytes = vs_kv_layer_elems(t) * f, head_bytes = (size_t)t->slots * hd * f;
  int blocks = t->rows * t->kv_heads;
  for (int j = 0; j < n; j++) {
    if (path[j] == j) continue;
    size_t to = (size_t)(L + j) * hd, from = (size_t)(L + path[j]) * hd;
    t->ops->copy3d(t->dev, t->k + to, layer_bytes, head_bytes, t->k + from, layer_bytes,
                   head_bytes, hd * f, t->layers, blocks);
    t->ops->copy3d(t->dev, t->v + to, layer_bytes, head_bytes, t->v + from, layer_bytes,
                   head_bytes, hd * f, t->layers, blocks);
  }
  t->committed = L + n;
  t->n_pending = 0;
  return VSPEC_OK;
}

#endif /* VSPEC_BACKEND_KV_TREE_H */
