/*
 * plugins/backend/device_tokens.h - what a backend's forward keeps on its device for a draft
 * drawn there (ABI 1.8, include/vspec/plugin.h): the batch's and outputs' fields read with
 * their struct_size checked, a draft's draw over every node of a forward, and the tokens drawn
 * on the device copied into a forward's uploaded ones. Shared by the backends (llamagen's
 * gpt_device.c, eagle's eagle_graph.c), header-only as kv_tree.h is.
 */
#ifndef VS_BACKEND_DEVICE_TOKENS_H
#define VS_BACKEND_DEVICE_TOKENS_H

#include <stdint.h>
#include <string.h>

#include "vspec/plugin.h"

/* The batch's tokens drawn on the device, or NULL. */
static inline const int32_t *vs_bk_token_dev(const vspec_forward_batch *b) {
  return VSPEC_HAS_FIELD(b, vspec_forward_batch, token_dev) ? b->token_dev : NULL;
}

/* The batch's feature table and its rows (host [n_nodes]), or NULL. */
static inline const int32_t *vs_bk_feature_row(const vspec_forward_batch *b) {
  return VSPEC_HAS_FIELD(b, vspec_forward_batch, feature_row) && b->feature_table
             ? b->feature_row
             : NULL;
}

/* Where the forward's features go on the device, or NULL. */
static inline float *vs_bk_features_dev(const vspec_forward_out *out) {
  return out && VSPEC_HAS_FIELD(out, vspec_forward_out, features_dev) ? out->features_dev : NULL;
}

/* Whether `out` asks for a draft drawn on the device over the last draw->n of n head nodes,
 * and the device can (draw_probs), for a forward of at most max_n nodes. */
static inline int vs_bk_drafts(const vspec_ops *ops, const vspec_forward_out *out, int n,
                               int max_n) {
  return n <= max_n && out && VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) &&
         out->draw && out->draw_probs && out->draw_tokens && out->draw->n >= 1 &&
         out->draw->n <= n && out->draw->temperature > 0.0f &&
         VSPEC_HAS_FIELD(ops, vspec_ops, draw_probs) && ops->draw_probs;
}

/* A draft's draw as a draw over all n nodes of the forward, the drawn ones last (the others
 * draw at u = 0, guided, into rows nobody reads). u and guided: host room for n entries. */
static inline vspec_sample_spec vs_bk_draft_spec(const vspec_sample_spec *draw, int n, double *u,
                                                 uint8_t *guided) {
  vspec_sample_spec sp = *draw;
  int first = n - draw->n;
  memset(u, 0, (size_t)n * sizeof *u);
  memset(guided, 1, (size_t)n);
  if (draw->u) memcpy(u + first, draw->u, (size_t)draw->n * sizeof *u);
  if (draw->guided) memcpy(guided + first, draw->guided, (size_t)draw->n);
  sp.n = n;
  sp.u = u;
  sp.guided = guided;
  return sp;
}

/* Tokens drawn on the device into an uploaded token array dst [rows, stride] (device): host
 * entry host[r stride + i] = -1 - j is token_dev[j]; a copy per run of consecutive j per row
 * (a chain's drafts are one run). Ordered after the upload on dev's queue. */
static inline void vs_bk_patch_tokens(const vspec_ops *ops, vspec_dev *dev, const int32_t *host,
                                      const int32_t *token_dev, int rows, int n, int stride,
                                      int32_t *dst) {
  if (!token_dev) return;
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < n;) {
      int32_t t = host[r * stride + i];
      int len = 1;
      if (t >= 0) {
        i++;
        continue;
      }
      while (i + len < n && host[r * stride + i + len] == t - len) len++;
      ops->copy(dev, dst + r * stride + i, token_dev + (-1 - t), (size_t)len * sizeof(int32_t));
      i += len;
    }
}

#endif /* VS_BACKEND_DEVICE_TOKENS_H */
