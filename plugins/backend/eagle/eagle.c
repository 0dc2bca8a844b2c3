/*
 * The `eagle` backend: an EAGLE-1 draft head over a LlamaGen target's features
 * (EAGLE, arXiv 2401.15077; SafeAILab/EAGLE eagle/model/cnets.py, Model; parameter names of
 * LANTERN's LlamaGen drafter, jadohu/LANTERN models/drafters/cnets_llamagen.py).
 *
 * Row p of the drafter sequence embeds image token p and reads the target feature that
 * precedes it (the final-RMSNorm output at the previous position, the lm_head input):
 *   h_p   = fc(concat(E[x_p], f_{p-1}))                      fc: Linear(2d -> d) with bias
 *   h_p  += o_proj(attention(h_p))     layer 0 has no input RMSNorm
 *   h_p  += mlp(post_attention_layernorm(h_p))               SwiGLU: gate, up, down
 *   f^_p  = h_p (no final norm);  logits_p = output(f^_p), the target's lm_head
 * Further layers, if a checkpoint has them, use an input_layernorm. Attention uses the
 * LlamaGen 2-D RoPE table with cls_token_num = the target's minus one (0 for c2i), so row p
 * rotates like image token p. E and lm_head are the target's tok_embeddings and output,
 * read from the target file (parameter target=FILE).
 *
 * load(path, params): path = the head's safetensors; target=FILE (required); max_nodes=N;
 * graphs=G, how fused forwards run (ABI 1.5 graphs, eagle_graph.c), as llamagen's parameter
 * of that name: on (padded to a node-count bucket, one recorded graph per bucket and head
 * kind replayed every step), off (unpadded, eagerly), pad (padded, eagerly: what replay must
 * equal bit for bit), auto (default: on where the device records graphs and is not the CPU,
 * whose graphs are a checker, not a speed-up); without it VSPEC_GRAPHS (the same values).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eg_internal.h"

static int eg_meta_num(const vspec_host *H, vspec_tensor_file *f, const char *key, double def,
                       double *out, char *err, size_t errlen) {
  const char *v = H->tensors_meta(f, key);
  if (!v || !*v) {
    *out = def;
    return def == def ? VSPEC_OK : VSPEC_EINVAL; /* NaN default = required */
  }
  char *end;
  errno = 0;
  *out = strtod(v, &end);
  if (end == v || *end || errno) {
    snprintf(err, errlen, "metadata '%s' = '%s' is not a number", key, v);
    return VSPEC_EFORMAT;
  }
  return VSPEC_OK;
}

static void eg_unload(vspec_model *m) {
  if (!m) return;
  const vspec_ops *ops = m->host->dev_ops(m->dev);
  for (int l = 0; l < m->n_layer; l++)
    if (m->layers[l].wqkv) ops->free(m->dev, m->layers[l].wqkv);
  if (m->rope) ops->free(m->dev, m->rope);
  if (m->f) m->host->tensors_close(m->f);
  if (m->target) m->host->tensors_close(m->target);
  m->host->free(m);
}

#define EG_GET(file, name, out, ...)                                                        \
  do {                                                                                      \
    int64_t shp_[] = {__VA_ARGS__};                                                         \
    if ((rc = H->tensors_get_f32(file, m->dev, name, (int)(sizeof shp_ / sizeof shp_[0]),   \
                                 shp_, out, err, errlen)))                                  \
      return rc;                                                                            \
  } while (0)

/* The head's shape: width from fc.weight, vocab from the target's embeddings, the rest from
 * the head's metadata. */
static int eg_load_shape(vspec_model *m, const char *path, const char *target, char *err,
                         size_t errlen) {
  const vspec_host *H = m->host;
  int rc;
  vspec_tensor t = {.struct_size = sizeof t};
  if ((rc = H->tensors_find(m->f, "fc.weight", &t)) || t.ndim != 2 || t.shape[1] != 2 * t.shape[0]) {
    snprintf(err, errlen, "%s: the head needs 'fc.weight' [d, 2d]", path);
    return rc ? rc : VSPEC_ESHAPE;
  }
  m->dim = (int)t.shape[0];
  vspec_tensor e = {.struct_size = sizeof e};
  if ((rc = H->tensors_find(m->target, "tok_embeddings.weight", &e)) || e.ndim != 2 ||
      e.shape[1] != m->dim) {
    snprintf(err, errlen, "%s: target 'tok_embeddings.weight' missing or not [vocab, %d]", target,
             m->dim);
    return rc ? rc : VSPEC_ESHAPE;
  }
  m->vocab = (int)e.shape[0];
  double v;
  if ((rc = eg_meta_num(H, m->f, "n_head", NAN, &v, err, errlen))) {
    if (rc == VSPEC_EINVAL) snprintf(err, errlen, "%s: metadata 'n_head' is required", path);
    return rc;
  }
  m->n_head = (int)v;
  if (m->n_head <= 0 || m->dim % m->n_head || (m->dim / m->n_head) % 4) {
    snprintf(err, errlen, "%s: dim %d and n_head %d: head_dim must be divisible by 4", path,
             m->dim, m->n_head);
    return VSPEC_EINVAL;
  }
  m->head_dim = m->dim / m->n_head;
  if ((rc = eg_meta_num(H, m->f, "norm_eps", 1e-6, &v, err, errlen))) return rc;
  m->norm_eps = (float)v;
  if ((rc = eg_meta_num(H, m->f, "rope_base", 10000, &v, err, errlen))) return rc;
  m->rope_base = (float)v;
  if ((rc = eg_meta_num(H, m->f, "block_size", NAN, &v, err, errlen))) {
    if (rc == VSPEC_EINVAL) snprintf(err, errlen, "%s: metadata 'block_size' is required", path);
    return rc;
  }
  m->n_image = (int)v;
  m->grid = (int)lround(sqrt(v));
  if (m->grid * m->grid != m->n_image) {
    snprintf(err, errlen, "%s: block_size %d is not a square grid", path, m->n_image);
    return VSPEC_EINVAL;
  }
  if ((rc = eg_meta_num(H, m->f, "cls_token_num", 0, &v, err, errlen))) return rc;
  m->n_cond = (int)v;
  return VSPEC_OK;
}

/* Decoder layer l (its q_proj found): its weights, q, k and v fused into one projection. */
static int eg_load_layer(vspec_model *m, int l, const char *path, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  const vspec_ops *ops = H->dev_ops(m->dev);
  int rc, d = m->dim;
  char key[128];
  eg_layer *L = &m->layers[l];
  vspec_tensor g = {.struct_size = sizeof g};
  snprintf(key, sizeof key, "layers.%d.mlp.gate_proj.weight", l);
  if ((rc = H->tensors_find(m->f, key, &g)) || g.ndim != 2) {
    snprintf(err, errlen, "%s: '%s' missing", path, key);
    return rc ? rc : VSPEC_ESHAPE;
  }
  if (l == 0) m->ffn = (int)g.shape[0];
  const float *wq, *wk, *wv;
#define EG_L(field, name, ...)                                         \
  do {                                                                 \
    snprintf(key, sizeof key, "layers.%d.%s", l, name);                \
    EG_GET(m->f, key, field, __VA_ARGS__);                             \
  } while (0)
  EG_L(&wq, "self_attn.q_proj.weight", d, d);
  EG_L(&wk, "self_attn.k_proj.weight", d, d);
  EG_L(&wv, "self_attn.v_proj.weight", d, d);
  EG_L(&L->wo, "self_attn.o_proj.weight", d, d);
  EG_L(&L->post_norm, "post_attention_layernorm.weight", d);
  EG_L(&L->gate, "mlp.gate_proj.weight", m->ffn, d);
  EG_L(&L->up, "mlp.up_proj.weight", m->ffn, d);
  EG_L(&L->down, "mlp.down_proj.weight", d, m->ffn);
  /* EAGLE skips the first layer's input norm (the fc output goes in directly). */
  if (l > 0) EG_L(&L->input_norm, "input_layernorm.weight", d);
#undef EG_L
  /* One fused projection, as the attention path expects [q | k | v] per row. */
  size_t blk = (size_t)d * d * sizeof(float);
  L->wqkv = ops->alloc(m->dev, 3 * blk);
  if (!L->wqkv) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  ops->copy(m->dev, L->wqkv, wq, blk);
  ops->copy(m->dev, (char *)L->wqkv + blk, wk, blk);
  ops->copy(m->dev, (char *)L->wqkv + 2 * blk, wv, blk);
  return VSPEC_OK;
}

/* fc, the target's embeddings and lm_head, and every decoder layer. */
static int eg_load_weights(vspec_model *m, const char *path, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  int rc, d = m->dim;
  EG_GET(m->f, "fc.weight", &m->fc_w, d, 2 * d);
  EG_GET(m->f, "fc.bias", &m->fc_b, d);
  EG_GET(m->target, "tok_embeddings.weight", &m->embed, m->vocab, d);
  EG_GET(m->target, "output.weight", &m->output, m->vocab, d);
  for (m->n_layer = 0; m->n_layer < EG_MAX_LAYERS; m->n_layer++) {
    char key[128];
    snprintf(key, sizeof key, "layers.%d.self_attn.q_proj.weight", m->n_layer);
    vspec_tensor q = {.struct_size = sizeof q};
    if (H->tensors_find(m->f, key, &q)) break;
    if ((rc = eg_load_layer(m, m->n_layer, path, err, errlen))) return rc;
  }
  if (m->n_layer == 0) {
    snprintf(err, errlen, "%s: no 'layers.0.self_attn.q_proj.weight'", path);
    return VSPEC_ENOENT;
  }
  return VSPEC_OK;
}

/* The RoPE table of every position: condition + image. */
static int eg_load_rope(vspec_model *m, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  const vspec_ops *ops = H->dev_ops(m->dev);
  size_t rows = (size_t)(m->n_cond + m->n_image);
  size_t bytes = rows * (size_t)m->head_dim * sizeof(float);
  float *table = H->alloc(bytes);
  m->rope = ops->alloc(m->dev, bytes);
  if (!table || !m->rope) {
    H->free(table);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  ops->rope2d_table(m->n_cond, m->grid, m->head_dim, m->rope_base, table);
  ops->upload(m->dev, m->rope, table, bytes);
  H->free(table);
  return VSPEC_OK;
}

/* EG_GRAPHS_* from the parameter graphs=, else VSPEC_GRAPHS, else auto. */
static int eg_graphs_mode(const vspec_host *H, vspec_dev *dev, const char *param, int *mode,
                          char *err, size_t errlen) {
  const char *v = param ? param : getenv("VSPEC_GRAPHS");
  const vspec_ops *ops = H->dev_ops(dev);
  if (!v || !*v || strcmp(v, "auto") == 0)
    *mode = ops->device != VSPEC_DEVICE_CPU && vspec_has_graphs(ops) ? EG_GRAPHS_ON
                                                                     : EG_GRAPHS_OFF;
  else if (strcmp(v, "on") == 0 || strcmp(v, "1") == 0)
    *mode = EG_GRAPHS_ON;
  else if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0)
    *mode = EG_GRAPHS_OFF;
  else if (strcmp(v, "pad") == 0)
    *mode = EG_GRAPHS_PAD;
  else {
    snprintf(err, errlen, "eagle: graphs=%s%s: use auto, on, off or pad", v,
             param ? "" : " (VSPEC_GRAPHS)");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

static int eg_load(const vspec_host *H, vspec_dev *dev, const char *path,
                   const vspec_params *params, vspec_model **out, char *err, size_t errlen) {
  static const char *const known[] = {"target", "max_nodes", "graphs", NULL};
  int rc = H->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  int graphs;
  if ((rc = eg_graphs_mode(H, dev, H->param_string(params, "graphs"), &graphs, err, errlen)))
    return rc;
  long max_nodes;
  if ((rc = H->param_int(params, "max_nodes", EG_DEFAULT_MAX_NODES, 1, 4096, &max_nodes, err,
                         errlen)))
    return rc;
  const char *target = H->param_string(params, "target");
  if (!target) {
    snprintf(err, errlen, "eagle: parameter target=FILE (the target GPT whose embeddings and "
             "lm_head the head uses) is required");
    return VSPEC_EINVAL;
  }
  vspec_model *m = H->calloc(1, sizeof *m);
  if (!m) return VSPEC_ENOMEM;
  m->host = H;
  m->dev = dev;
  m->max_nodes = (int)max_nodes;
  m->graphs = graphs;
  if (!(rc = H->tensors_open(path, &m->f, err, errlen)) &&
      !(rc = H->tensors_open(target, &m->target, err, errlen)) &&
      !(rc = eg_load_shape(m, path, target, err, errlen)) &&
      !(rc = eg_load_weights(m, path, err, errlen)) && !(rc = eg_load_rope(m, err, errlen))) {
    *out = m;
    return VSPEC_OK;
  }
  eg_unload(m);
  return rc;
}

static int eg_info(const vspec_model *m, vspec_model_info *o) {
  vspec_model_info i;
  memset(&i, 0, sizeof i);
  i.struct_size = sizeof i;
  i.token_kind = VSPEC_TOKENS_DISCRETE;
  i.grid_h = i.grid_w = m->grid;
  i.vocab = m->vocab;
  i.feature_dim = m->dim;
  i.feature_in_dim = m->dim;
  i.max_nodes = m->max_nodes;
  i.keeps_features = 1; /* feature_src: eg_forward */
  /* token_dev, feature_table, draw, features_dev (eagle_graph.c): on the fused ops alone */
  i.device_tokens = vspec_has_fused_ops(m->host->dev_ops(m->dev));
  i.arch = "eagle-llamagen";
  int64_t d = m->dim;
  i.params = 2 * d * d + d + m->n_layer * (4 * d * d + 3 * d * m->ffn + 2 * d);
  i.stream_bytes = (int64_t)sizeof(float) * (i.params + (int64_t)m->vocab * d);
  size_t n = o->struct_size && o->struct_size < sizeof i ? o->struct_size : sizeof i;
  memcpy(o, &i, n);
  o->struct_size = (uint32_t)n;
  return VSPEC_OK;
}

static void eg_close(vspec_session *s) {
  if (!s) return;
  eg_graphs_free(s);
  float *bufs[] = {s->cat, s->h, s->qkv, s->att, s->ff1, s->ff3, s->logits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) s->ops->free(s->dev, bufs[i]);
  if (s->stage_dev) s->ops->free(s->dev, s->stage_dev);
  s->host->free(s->stage_host);
  void *draft[] = {s->draft_probs, s->draft_tok, s->draw_dev};
  for (size_t i = 0; i < sizeof draft / sizeof draft[0]; i++)
    if (draft[i]) s->ops->free(s->dev, draft[i]);
  s->host->free(s->draw_host);
  vs_kv_tree_free(&s->kv, s->host);
  s->host->free(s->mask);
  s->host->free(s->pos);
  s->host->free(s);
}

static int eg_open(vspec_model *m, vspec_dev *dev, const vspec_session_config *cfg,
                   vspec_session **out, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  if (cfg->rows != 1 && cfg->rows != 2) {
    snprintf(err, errlen, "session rows = %d: use 1 or 2", cfg->rows);
    return VSPEC_EINVAL;
  }
  int max_nodes = cfg->max_nodes > 0 ? cfg->max_nodes : 1;
  if (max_nodes > m->max_nodes) {
    snprintf(err, errlen, "session max_nodes %d exceeds the backend limit %d", max_nodes,
             m->max_nodes);
    return VSPEC_ERANGE;
  }
  if (H->dev_space(dev) != H->dev_space(m->dev)) {
    snprintf(err, errlen, "eagle: the head was loaded on %s device memory and cannot run a "
             "session on %s", H->dev_ops(m->dev)->name, H->dev_ops(dev)->name);
    return VSPEC_EINVAL;
  }
  vspec_session *s = H->calloc(1, sizeof *s);
  if (!s) return VSPEC_ENOMEM;
  s->m = m;
  s->host = H;
  s->ops = H->dev_ops(dev);
  s->dev = dev;
  s->rows = cfg->rows;
  s->max_nodes = max_nodes;
  s->fused = vspec_has_fused_ops(s->ops);
  s->graphs = !s->fused ? EG_GRAPHS_OFF
              : m->graphs == EG_GRAPHS_ON && !vspec_has_graphs(s->ops) ? EG_GRAPHS_OFF
                                                                      : m->graphs;
  /* committed rows never pass n_image; pending nodes sit after them, and with graphs a
   * forward's padding nodes after those (eagle_graph.c) */
  int pad = s->graphs != EG_GRAPHS_OFF ? eg_graph_pad_room(max_nodes) : 0;
  int slots = (m->n_image + max_nodes + pad + 7) / 8 * 8;
  int rc = vs_kv_tree_init(&s->kv, H, dev, m->n_layer, s->rows, m->n_head, m->head_dim, slots,
                           max_nodes);
  size_t M = (size_t)s->rows * max_nodes, d = (size_t)m->dim;
  s->cat = s->ops->alloc(dev, M * 2 * d * sizeof(float));
  s->h = s->ops->alloc(dev, M * d * sizeof(float));
  s->qkv = s->ops->alloc(dev, M * 3 * d * sizeof(float));
  s->att = s->ops->alloc(dev, M * d * sizeof(float));
  s->ff1 = s->ops->alloc(dev, M * (size_t)m->ffn * sizeof(float));
  s->ff3 = s->ops->alloc(dev, M * (size_t)m->ffn * sizeof(float));
  s->logits = s->ops->alloc(dev, M * (size_t)m->vocab * sizeof(float));
  s->mask = H->calloc((size_t)max_nodes * slots, 1);
  s->pos = H->calloc(M, sizeof(int32_t));
  /* the host side of one upload: block 3 and the integers (eg_internal.h, stage_dev) */
  size_t stage = M * d * sizeof(float) + eg_stage_ints(s->rows, max_nodes) * sizeof(int32_t);
  s->stage_host = H->calloc(stage, 1);
  s->stage_dev = vspec_alloc_uninit(s->ops, dev, 3 * M * d * sizeof(float) + stage);
  if (s->stage_dev) s->keep = eg_block(s, 0), s->x = eg_block(s, 2);
  if (rc || !s->cat || !s->h || !s->qkv || !s->att || !s->ff1 || !s->ff3 ||
      !s->logits || !s->mask || !s->pos || !s->stage_host || !s->stage_dev) {
    eg_close(s);
    snprintf(err, errlen, "out of memory for a draft-head session");
    return VSPEC_ENOMEM;
  }
  /* the fused ops' temporaries, as llamagen reserves them (gpt.c) */
  if (s->ops->reserve_scratch(dev, M * (d + (size_t)m->ffn) * sizeof(float) + 64)) {
    eg_close(s);
    snprintf(err, errlen, "out of memory for a draft-head session's scratch");
    return VSPEC_ENOMEM;
  }
  *out = s;
  return VSPEC_OK;
}

/* A feature head has no condition positions: its first row already needs a token and the
 * target feature before it, so prefill only marks the session ready. */
static int eg_prefill(vspec_session *s, vspec_forward_out *out, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  s->prefilled = 1;
  if (out && out->logits) memset(out->logits, 0, (size_t)s->rows * s->m->vocab * sizeof(float));
  if (out && out->features) memset(out->features, 0, (size_t)s->rows * s->m->dim * sizeof(float));
  return VSPEC_OK;
}

/* The ABI 1.7 feature sources of a batch (NULL: every node's from b->features), checked:
 * each is -1 (then ABI 1.8's feature_row, or b->features, must give it) or a node pending
 * before this batch. */
static int eg_feature_src(const vspec_session *s, const vspec_forward_batch *b,
                          const int32_t **src, char *err, size_t errlen) {
  *src = VSPEC_HAS_FIELD(b, vspec_forward_batch, feature_src) ? b->feature_src : NULL;
  const int32_t *row = vs_bk_feature_row(b);
  int before = b->append ? s->kv.n_pending : 0, host = 0;
  for (int i = 0; i < b->n_nodes; i++) {
    if (*src && ((*src)[i] < -1 || (*src)[i] >= before)) {
      snprintf(err, errlen, "feature_src[%d] = %d: give -1 or a node pending before the batch "
               "(%d)", i, (*src)[i], before);
      return VSPEC_EINVAL;
    }
    host |= (!*src || (*src)[i] < 0) && !(row && row[i] >= 0);
  }
  if (host && !b->features) {
    snprintf(err, errlen, "the draft head needs the target features of every node");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* The unfused path's input rows concat(E[x], f) per (row, node) (the ABI's features are
 * (node, row) ordered; a feature_src row comes from keep). */
static void eg_inputs_unfused(vspec_session *s, const vspec_forward_batch *b,
                              const int32_t *src, int base) {
  const vspec_model *m = s->m;
  int n = b->n_nodes, R = s->rows, d = m->dim, L = s->kv.committed;
  size_t row = (size_t)d * sizeof(float);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < n; i++) {
      float *in = s->cat + (size_t)(r * n + i) * 2 * d;
      s->ops->copy(s->dev, in, m->embed + (size_t)b->tokens[i] * d, row);
      if (src && src[i] >= 0)
        s->ops->copy(s->dev, in + d, s->keep + ((size_t)r * s->max_nodes + src[i]) * d, row);
      else
        s->ops->upload(s->dev, in + d, b->features + ((size_t)i * R + r) * d, row);
      s->pos[r * n + i] = m->n_cond + L + s->kv.depth[base + i];
    }
}

static int eg_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out,
                      char *err, size_t errlen) {
  const vspec_model *m = s->m;
  const vspec_ops *ops = s->ops;
  vspec_dev *dev = s->dev;
  if (!s->prefilled) {
    snprintf(err, errlen, "forward before prefill");
    return VSPEC_EINVAL;
  }
  const int32_t *src;
  int rc = eg_feature_src(s, b, &src, err, errlen);
  if (rc) return rc;
  int drafts = vs_bk_drafts(s->ops, out, b->n_nodes, s->max_nodes);
  if ((vs_bk_token_dev(b) || vs_bk_feature_row(b) || drafts || vs_bk_features_dev(out)) &&
      !s->fused) {
    snprintf(err, errlen, "tokens or features kept on the device need the fused ops, which "
             "device '%s' lacks", ops->name);
    return VSPEC_ENOTSUP;
  }
  if (drafts && !eg_draft_room(s)) {
    snprintf(err, errlen, "out of device memory for a draft's distributions");
    return VSPEC_ENOMEM;
  }
  int n = b->n_nodes, R = s->rows, d = m->dim, H = m->n_head, hd = m->head_dim;
  /* The head's committed rows are image tokens only (its condition rows, if any, are
   * RoPE-table offsets), so positions run 0 .. n_image - 1. */
  int base;
  if ((rc = vs_kv_tree_add(&s->kv, b, m->vocab, m->n_image - 1, &base, err, errlen))) return rc;
  if (s->fused) {
    eg_forward_fused(s, b, src, base, out);
    return VSPEC_OK;
  }
  int L = s->kv.committed, M = R * n;
  vs_kv_tree_mask(&s->kv, base, n, NULL, 0, s->mask);
  eg_inputs_unfused(s, b, src, base);
  ops->linear(dev, s->cat, M, 2 * d, m->fc_w, d, m->fc_b, s->x);
  for (int l = 0; l < m->n_layer; l++) {
    const eg_layer *W = &m->layers[l];
    const float *a = s->x;
    if (W->input_norm) {
      ops->rmsnorm(dev, s->x, W->input_norm, M, d, m->norm_eps, s->h);
      a = s->h;
    }
    ops->linear(dev, a, M, d, W->wqkv, 3 * d, NULL, s->qkv);
    ops->rope_apply(dev, s->qkv, M, 3 * d, H, hd, s->pos, m->rope);
    ops->rope_apply(dev, s->qkv + d, M, 3 * d, H, hd, s->pos, m->rope);
    vs_kv_store(&s->kv, l, n, L + base, s->qkv, 3 * d, d, 2 * d);
    for (int r = 0; r < R; r++)
      ops->attention(dev, s->qkv + (size_t)r * n * 3 * d, n, 3 * d, H, H, hd,
                     vs_kv_at(&s->kv, s->kv.k, l, r, 0), vs_kv_at(&s->kv, s->kv.v, l, r, 0),
                     s->kv.slots, L + base + n, s->mask, s->att + (size_t)r * n * d);
    ops->linear(dev, s->att, M, d, W->wo, d, NULL, s->h);
    ops->add(dev, s->x, s->h, (size_t)M * d);
    ops->rmsnorm(dev, s->x, W->post_norm, M, d, m->norm_eps, s->h);
    ops->linear(dev, s->h, M, d, W->gate, m->ffn, NULL, s->ff1);
    ops->linear(dev, s->h, M, d, W->up, m->ffn, NULL, s->ff3);
    ops->swiglu(dev, s->ff1, s->ff3, (size_t)M * m->ffn, s->ff1);
    ops->linear(dev, s->ff1, M, m->ffn, W->down, d, NULL, s->h);
    ops->add(dev, s->x, s->h, (size_t)M * d);
  }
  for (int r = 0; r < R; r++) /* for later forwards' feature_src */
    ops->copy(dev, s->keep + ((size_t)r * s->max_nodes + base) * d, s->x + (size_t)r * n * d,
              (size_t)n * d * sizeof(float));
  /* (row, node) -> the ABI's (node, row) order. */
  if (out && out->features)
    for (int i = 0; i < n; i++)
      for (int r = 0; r < R; r++)
        ops->download(dev, out->features + ((size_t)i * R + r) * d, s->x + (size_t)(r * n + i) * d,
                      (size_t)d * sizeof(float));
  if (out && out->logits) {
    ops->linear(dev, s->x, M, d, m->output, m->vocab, NULL, s->logits);
    for (int i = 0; i < n; i++)
      for (int r = 0; r < R; r++)
        ops->download(dev, out->logits + ((size_t)i * R + r) * m->vocab,
                      s->logits + (size_t)(r * n + i) * m->vocab, (size_t)m->vocab * sizeof(float));
  }
  return VSPEC_OK;
}

static int eg_commit(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen) {
  return vs_kv_tree_commit(&s->kv, path, n, s->m->n_image, err, errlen);
}

static int32_t eg_committed(const vspec_session *s) { return s->kv.committed; }

static int eg_decode(vspec_model *m, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb,
                     char *err, size_t errlen) {
  (void)m, (void)dev, (void)tokens, (void)rgb;
  snprintf(err, errlen, "the eagle draft head has no image decoder");
  return VSPEC_ENOTSUP;
}

static const vspec_backend_vtable eg_vtable = {
    .struct_size = sizeof(vspec_backend_vtable),
    .load = eg_load, .unload = eg_unload, .info = eg_info,
    .session_open = eg_open, .session_close = eg_close,
    .prefill = eg_prefill, .forward = eg_forward, .commit = eg_commit,
    .committed = eg_committed, .decode = eg_decode,
};

static const vspec_plugin_desc eg_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_BACKEND, "eagle", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "EAGLE-1 draft head over LlamaGen target features (LANTERN's names)",
    .vtable = &eg_vtable,
};

VSPEC_PLUGIN_DEFINE(eg_desc)
