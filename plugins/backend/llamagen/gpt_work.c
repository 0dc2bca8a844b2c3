/*
 * plugins/backend/llamagen/gpt_work.c - a session's work buffers (lg_work, lg_internal.h). A
 * leaf: sessions (gpt.c) and batched forwards (gpt_forward.c) size them.
 */
#include <string.h>

#include "lg_internal.h"

int lg_work_alloc(const vspec_host *H, const vspec_ops *ops, vspec_dev *dev, const lg_gpt *g,
                  size_t rows, size_t h_rows, size_t idx_ints, lg_work *w) {
  size_t f = sizeof(float), qkv_w = (size_t)(g->n_head + 2 * g->n_kv_head) * g->head_dim;
  memset(w, 0, sizeof *w);
  /* Not zero-filled: a forward writes the rows it reads. A speculative job's target session
   * is sized for the largest tree (rows = 2 x 128), and zeroing these and the KV cache was
   * 4.5 % of a Cool-SD job on models/fmnist (perf, memset under session_open). */
  w->x = vspec_alloc_uninit(ops, dev, rows * g->dim * f);
  w->h = vspec_alloc_uninit(ops, dev, (h_rows > rows ? h_rows : rows) * g->dim * f);
  w->qkv = vspec_alloc_uninit(ops, dev, rows * qkv_w * f);
  w->att = vspec_alloc_uninit(ops, dev, rows * g->n_head * g->head_dim * f);
  w->ff1 = vspec_alloc_uninit(ops, dev, rows * g->ffn_hidden * f);
  w->ff3 = vspec_alloc_uninit(ops, dev, rows * g->ffn_hidden * f);
  w->logits = vspec_alloc_uninit(ops, dev, rows * g->vocab * f);
  w->pos = H->calloc(rows, sizeof(int32_t));
  w->tok = H->calloc(rows, sizeof(int32_t));
  if (idx_ints < LG_IDX_INTS(rows)) idx_ints = LG_IDX_INTS(rows);
  w->idx_host = H->calloc(idx_ints, sizeof(int32_t));
  w->idx_dev = vspec_alloc_uninit(ops, dev, idx_ints * sizeof(int32_t));
  w->rows = rows;
  w->idx_ints = idx_ints;
  return w->x && w->h && w->qkv && w->att && w->ff1 && w->ff3 && w->logits && w->pos &&
                 w->tok && w->idx_host && w->idx_dev
             ? VSPEC_OK
             : VSPEC_ENOMEM;
}

void lg_work_free(const vspec_host *H, const vspec_ops *ops, vspec_dev *dev, lg_work *w) {
  float *bufs[] = {w->x, w->h, w->qkv, w->att, w->ff1, w->ff3, w->logits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) ops->free(dev, bufs[i]);
  if (w->idx_dev) ops->free(dev, w->idx_dev);
  H->free(w->pos);
  H->free(w->tok);
  H->free(w->idx_host);
  memset(w, 0, sizeof *w);
}
