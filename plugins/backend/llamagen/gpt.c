/*
 * The LlamaGen GPT: weights and sessions with a KV cache (the forward: gpt_forward.c).
 *
 * Semantics follow LlamaGen autoregressive/models/gpt.py (masks: generate.py):
 *  - pre-norm blocks, RMSNorm eps from the checkpoint (1e-5), fused bias-free wqkv,
 *    SwiGLU FFN (TransformerBlock, RMSNorm, FeedForward);
 *  - 2-D RoPE on interleaved pairs, rows then columns, zero rotation (not identity) for
 *    the condition positions, so their q and k vanish in every layer
 *    (precompute_freqs_cis_2d, apply_rotary_emb);
 *  - class embedding with the null class row num_classes for the unconditional CFG row,
 *    or the t2i caption MLP with tanh-GELU and the learned uncond_embedding (LabelEmbedder,
 *    CaptionEmbedder);
 *  - t2i emb mask: caption columns masked for every query, diagonal forced on (generate).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lg_internal.h"

#define LG_ERR(...) (snprintf(err, errlen, __VA_ARGS__), 0)

static int lg__get(vspec_model *m, vspec_tensor_file *f, const char *name, int ndim,
                   const int64_t *shape, const float **out, char *err, size_t errlen) {
  return m->host->tensors_get_f32(f, m->load_dev, name, ndim, shape, out, err, errlen);
}

static int lg__dims(vspec_model *m, vspec_tensor_file *f, const char *name, vspec_tensor *t) {
  memset(t, 0, sizeof *t);
  t->struct_size = sizeof *t;
  return m->host->tensors_find(f, name, t);
}

/* Asks for (VSPEC_WEIGHTS_INT8) or withdraws (VSPEC_WEIGHTS_DEFAULT) int8 for every linear
 * weight; returns how many requests the device will use. */
static int lg__weight_format(vspec_model *m, int format) {
  const vspec_ops *ops = m->host->dev_ops(m->load_dev);
  if (!VSPEC_HAS_FIELD(ops, vspec_ops, weight_format) || !ops->weight_format) return 0;
  const lg_gpt *g = &m->gpt;
  int d = g->dim, hd = g->head_dim, qkv_rows = (g->n_head + 2 * g->n_kv_head) * hd, used = 0;
  vspec_dev *dev = m->load_dev;
  for (int l = 0; l < g->n_layer; l++) {
    const lg_layer *L = &g->layers[l];
    used += ops->weight_format(dev, L->wqkv, qkv_rows, d, format) == VSPEC_OK;
    used += ops->weight_format(dev, L->wo, d, g->n_head * hd, format) == VSPEC_OK;
    used += ops->weight_format(dev, L->w1, g->ffn_hidden, d, format) == VSPEC_OK;
    used += ops->weight_format(dev, L->w3, g->ffn_hidden, d, format) == VSPEC_OK;
    used += ops->weight_format(dev, L->w2, d, g->ffn_hidden, format) == VSPEC_OK;
  }
  used += ops->weight_format(dev, g->output, g->vocab, d, format) == VSPEC_OK;
  return used;
}

void lg_gpt_ask_int8(vspec_model *m) {
  int used = lg__weight_format(m, VSPEC_WEIGHTS_INT8);
  m->int8_asked = 1;
  m->host->log(VSPEC_LOG_DEBUG, "llamagen", "weight_format=int8: the device takes %d of %d "
               "linear weights in int8", used, 5 * m->gpt.n_layer + 1);
}

/* The shape: vocab and width from the embeddings, the layers counted, heads from the
 * metadata (they cannot be derived from the weights). */
static int lg__gpt_shape(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_gpt *g = &m->gpt;
  vspec_tensor t;
  int rc;
  /* Shapes the original code hard-codes or derives are read from the weights. */
  if ((rc = lg__dims(m, f, "tok_embeddings.weight", &t)) || t.ndim != 2) {
    snprintf(err, errlen, "%s: GPT tensor 'tok_embeddings.weight' %s",
             "gpt", rc ? "not found" : "must be 2-D [vocab, dim]");
    return rc ? rc : VSPEC_ESHAPE;
  }
  g->vocab = (int)t.shape[0];
  g->dim = (int)t.shape[1];
  for (g->n_layer = 0; g->n_layer < LG_MAX_LAYERS; g->n_layer++) {
    char key[96];
    snprintf(key, sizeof key, "layers.%d.attention.wqkv.weight", g->n_layer);
    if (lg__dims(m, f, key, &t)) break;
  }
  if (g->n_layer == 0) {
    snprintf(err, errlen, "GPT weights have no 'layers.0.attention.wqkv.weight'");
    return VSPEC_ENOENT;
  }
  long v;
  if ((rc = lg_meta_int(m, f, "n_head", -1, &v, err, errlen))) return rc;
  if (v <= 0) {
    snprintf(err, errlen, "GPT metadata 'n_head' is missing: it cannot be derived from the "
             "weights (convert with tools/convert_llamagen.py --preset or --n-head)");
    return VSPEC_EINVAL;
  }
  g->n_head = (int)v;
  if ((rc = lg_meta_int(m, f, "n_kv_head", g->n_head, &v, err, errlen))) return rc;
  g->n_kv_head = (int)v;
  if (g->dim % g->n_head || (g->dim / g->n_head) % 4 || g->n_kv_head <= 0 ||
      g->n_head % g->n_kv_head) {
    snprintf(err, errlen, "GPT shape: dim %d, n_head %d, n_kv_head %d: head_dim must be an "
             "integer divisible by 4 (2-D RoPE) and n_head a multiple of n_kv_head",
             g->dim, g->n_head, g->n_kv_head);
    return VSPEC_EINVAL;
  }
  g->head_dim = g->dim / g->n_head;
  return VSPEC_OK;
}

/* The model type (c2i or t2i), the grid, the condition length, RoPE base and norm eps. */
static int lg__gpt_meta(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_gpt *g = &m->gpt;
  vspec_tensor t;
  long v;
  double dv;
  int rc;
  const char *mt = m->host->tensors_meta(f, "model_type");
  int has_caption = lg__dims(m, f, "cls_embedding.cap_proj.fc1.weight", &t) == 0;
  if (mt && strcmp(mt, "t2i") != 0 && strcmp(mt, "c2i") != 0) {
    snprintf(err, errlen, "GPT metadata 'model_type' = '%s': expected c2i or t2i", mt);
    return VSPEC_EINVAL;
  }
  g->t2i = mt ? strcmp(mt, "t2i") == 0 : has_caption;

  if ((rc = lg_meta_int(m, f, "block_size", -1, &v, err, errlen))) return rc;
  if (v <= 0) {
    snprintf(err, errlen, "GPT metadata 'block_size' (image tokens, G*G) is missing: it is not "
             "recoverable from the weights (only the RoPE table depends on it)");
    return VSPEC_EINVAL;
  }
  g->n_image = (int)v;
  g->grid = (int)lround(sqrt((double)v));
  if (g->grid * g->grid != g->n_image) {
    snprintf(err, errlen, "GPT metadata 'block_size' = %d is not a square grid", g->n_image);
    return VSPEC_EINVAL;
  }
  if ((rc = lg_meta_int(m, f, "cls_token_num", g->t2i ? 120 : 1, &v, err, errlen))) return rc;
  g->n_cond = (int)v;
  if ((rc = lg_meta_double(m, f, "rope_base", 10000.0, &dv, err, errlen))) return rc;
  g->rope_base = (float)dv;
  if ((rc = lg_meta_double(m, f, "norm_eps", 1e-5, &dv, err, errlen))) return rc;
  g->norm_eps = (float)dv;
  return VSPEC_OK;
}

/* Every layer's weights, the embeddings, the final norm and the output head. */
static int lg__gpt_weights(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_gpt *g = &m->gpt;
  vspec_tensor t;
  int rc;
  int d = g->dim, hd = g->head_dim;
  int qkv_rows = (g->n_head + 2 * g->n_kv_head) * hd;
  if ((rc = lg__dims(m, f, "layers.0.feed_forward.w1.weight", &t))) {
    snprintf(err, errlen, "GPT tensor 'layers.0.feed_forward.w1.weight' not found");
    return rc;
  }
  g->ffn_hidden = (int)t.shape[0];

  for (int l = 0; l < g->n_layer; l++) {
    lg_layer *L = &g->layers[l];
    char key[128];
#define LG_W(field, name, ...)                                                  \
  do {                                                                          \
    int64_t shp[] = {__VA_ARGS__};                                              \
    snprintf(key, sizeof key, "layers.%d.%s", l, name);                         \
    if ((rc = lg__get(m, f, key, (int)(sizeof shp / sizeof shp[0]), shp, &L->field, err, errlen))) \
      return rc;                                                                \
  } while (0)
    LG_W(attention_norm, "attention_norm.weight", d);
    LG_W(wqkv, "attention.wqkv.weight", qkv_rows, d);
    LG_W(wo, "attention.wo.weight", d, g->n_head * hd);
    LG_W(ffn_norm, "ffn_norm.weight", d);
    LG_W(w1, "feed_forward.w1.weight", g->ffn_hidden, d);
    LG_W(w3, "feed_forward.w3.weight", g->ffn_hidden, d);
    LG_W(w2, "feed_forward.w2.weight", d, g->ffn_hidden);
#undef LG_W
  }
  int64_t s_emb[] = {g->vocab, d}, s_norm[] = {d};
  if ((rc = lg__get(m, f, "tok_embeddings.weight", 2, s_emb, &g->tok_embeddings, err, errlen)))
    return rc;
  if ((rc = lg__get(m, f, "norm.weight", 1, s_norm, &g->norm, err, errlen))) return rc;
  return lg__get(m, f, "output.weight", 2, s_emb, &g->output, err, errlen);
}

/* c2i: the class table, with the null class row of the unconditional CFG row. */
static int lg__gpt_classes(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_gpt *g = &m->gpt;
  vspec_tensor t;
  long v;
  int rc, d = g->dim;
  if ((rc = lg__dims(m, f, "cls_embedding.embedding_table.weight", &t)) || t.ndim != 2 ||
      t.shape[1] != d) {
    snprintf(err, errlen, "c2i GPT needs 'cls_embedding.embedding_table.weight' [classes, %d]",
             d);
    return rc ? rc : VSPEC_ESHAPE;
  }
  int table_rows = (int)t.shape[0];
  /* The table has num_classes + (class_dropout_prob > 0) rows; the extra row is the
   * null class used for the unconditional CFG row (gpt.py LabelEmbedder; generate() feeds
   * label num_classes). */
  if ((rc = lg_meta_int(m, f, "num_classes", table_rows - 1, &v, err, errlen))) return rc;
  if (v != table_rows && v != table_rows - 1) {
    snprintf(err, errlen, "c2i GPT: metadata num_classes = %ld but the class table has %d rows",
             v, table_rows);
    return VSPEC_ESHAPE;
  }
  g->num_classes = (int)v;
  g->has_null_class = table_rows == g->num_classes + 1;
  int64_t shp[] = {table_rows, d};
  if ((rc = lg__get(m, f, "cls_embedding.embedding_table.weight", 2, shp, &g->class_table, err,
                    errlen)))
    return rc;
  if (g->n_cond != 1) {
    snprintf(err, errlen, "c2i GPT: cls_token_num = %d, LlamaGen c2i uses exactly 1", g->n_cond);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* t2i: the caption MLP and the learned unconditional caption. */
static int lg__gpt_caption(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  lg_gpt *g = &m->gpt;
  vspec_tensor t;
  int rc, d = g->dim;
  if ((rc = lg__dims(m, f, "cls_embedding.uncond_embedding", &t)) || t.ndim != 2) {
    snprintf(err, errlen, "t2i GPT needs 'cls_embedding.uncond_embedding' [120, caption_dim]");
    return rc ? rc : VSPEC_ESHAPE;
  }
  g->caption_len = (int)t.shape[0];
  g->caption_dim = (int)t.shape[1];
  if (g->caption_len != g->n_cond) {
    snprintf(err, errlen, "t2i GPT: cls_token_num = %d but uncond_embedding has %d slots; "
             "LlamaGen t2i needs them equal", g->n_cond, g->caption_len);
    return VSPEC_EINVAL;
  }
  int64_t s1[] = {d, g->caption_dim}, s2[] = {d, d}, s3[] = {g->caption_len, g->caption_dim};
  if ((rc = lg__get(m, f, "cls_embedding.cap_proj.fc1.weight", 2, s1, &g->cap_fc1, err, errlen)))
    return rc;
  if ((rc = lg__get(m, f, "cls_embedding.cap_proj.fc2.weight", 2, s2, &g->cap_fc2, err, errlen)))
    return rc;
  return lg__get(m, f, "cls_embedding.uncond_embedding", 2, s3, &g->uncond_caption, err,
                 errlen);
}

/* RoPE table for every position a forward may use: condition + image positions. */
static int lg__gpt_rope(vspec_model *m, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  lg_gpt *g = &m->gpt;
  const vspec_ops *ops = H->dev_ops(m->load_dev);
  size_t rows = (size_t)(g->n_cond + g->n_image);
  size_t bytes = rows * (size_t)g->head_dim * sizeof(float);
  float *host_table = H->alloc(bytes);
  g->rope_table = ops->alloc(m->load_dev, bytes);
  if (!host_table || !g->rope_table) {
    H->free(host_table);
    snprintf(err, errlen, "out of memory for the RoPE table");
    return VSPEC_ENOMEM;
  }
  ops->rope2d_table(g->n_cond, g->grid, g->head_dim, g->rope_base, host_table);
  ops->upload(m->load_dev, g->rope_table, host_table, bytes);
  H->free(host_table);
  return VSPEC_OK;
}

int lg_gpt_load(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen) {
  memset(&m->gpt, 0, sizeof m->gpt);
  int rc = lg__gpt_shape(m, f, err, errlen);
  if (!rc) rc = lg__gpt_meta(m, f, err, errlen);
  if (!rc) rc = lg__gpt_weights(m, f, err, errlen);
  if (!rc) rc = m->gpt.t2i ? lg__gpt_caption(m, f, err, errlen) : lg__gpt_classes(m, f, err, errlen);
  if (!rc) rc = lg__gpt_rope(m, err, errlen);
  return rc;
}

void lg_gpt_unload(vspec_model *m) {
  if (m->int8_asked) (void)lg__weight_format(m, VSPEC_WEIGHTS_DEFAULT); /* before the file closes */
  m->int8_asked = 0;
  if (m->gpt.rope_table) m->host->dev_ops(m->load_dev)->free(m->load_dev, m->gpt.rope_table);
  m->gpt.rope_table = NULL;
}

/* ---- sessions ---------------------------------------------------------------------- */

size_t lg_scratch_bytes(const lg_gpt *g, size_t rows) {
  size_t fused = rows * ((size_t)g->dim + g->ffn_hidden) * sizeof(float) + 64;
  size_t walk = 4 * (size_t)g->vocab * sizeof(float); /* the device walk's (ops.h, verify_walk) */
  return fused > walk ? fused : walk;
}

void lg_session_close(vspec_session *s) {
  if (!s) return;
  lg_graphs_free(s);
  if (s->cond_embed) s->ops->free(s->dev, s->cond_embed);
  if (s->prefix_dev) s->ops->free(s->dev, s->prefix_dev);
  lg_work_free(s->host, s->ops, s->dev, &s->w);
  if (s->walk_dev) s->ops->free(s->dev, s->walk_dev);
  s->host->free(s->walk_host);
  if (s->draft_probs) s->ops->free(s->dev, s->draft_probs);
  vs_kv_tree_free(&s->kv, s->host);
  s->host->free(s->cond_valid);
  s->host->free(s->mask);
  s->host->free(s);
}

/* Caption projection (CaptionEmbedder, MLP): fc1 -> tanh-GELU -> fc2, both bias-free. */
static void lg__caption_embed(vspec_session *s, const float *caption_dev, float *out) {
  const lg_gpt *g = &s->m->gpt;
  const vspec_ops *ops = s->ops;
  float *h = s->w.h;
  ops->linear(s->dev, caption_dev, g->caption_len, g->caption_dim, g->cap_fc1, g->dim, NULL, h);
  ops->gelu_tanh(s->dev, h, (size_t)g->caption_len * g->dim);
  ops->linear(s->dev, h, g->caption_len, g->dim, g->cap_fc2, g->dim, NULL, out);
}

/* Whether a session of cfg can run this model on dev; *max_nodes the nodes a forward takes. */
static int lg__session_check(vspec_model *m, vspec_dev *dev, const vspec_session_config *cfg,
                             int *max_nodes, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  const lg_gpt *g = &m->gpt;
  if (!m->has_gpt) {
    snprintf(err, errlen, "this llamagen model has no GPT loaded (decoder only)");
    return VSPEC_ENOTSUP;
  }
  if (cfg->rows != 1 && cfg->rows != 2) {
    snprintf(err, errlen, "session rows = %d: use 1 (conditional) or 2 (CFG: cond + uncond)",
             cfg->rows);
    return VSPEC_EINVAL;
  }
  if (!g->t2i) {
    if (cfg->class_label < 0 || cfg->class_label >= g->num_classes) {
      snprintf(err, errlen, "class label %d is out of range: this model has classes 0..%d",
               cfg->class_label, g->num_classes - 1);
      return VSPEC_ERANGE;
    }
    if (cfg->rows == 2 && !g->has_null_class) {
      snprintf(err, errlen, "CFG needs the null class row, but this model's class table has none "
               "(trained without class dropout)");
      return VSPEC_ENOTSUP;
    }
  } else if (!cfg->caption) {
    snprintf(err, errlen, "text-conditional model: the job must supply caption embeddings "
             "[%d, %d]", g->caption_len, g->caption_dim);
    return VSPEC_EINVAL;
  }
  *max_nodes = cfg->max_nodes > 0 ? cfg->max_nodes : 1;
  if (*max_nodes > m->max_nodes) {
    snprintf(err, errlen, "session max_nodes %d exceeds the backend limit %d", *max_nodes,
             m->max_nodes);
    return VSPEC_ERANGE;
  }
  if (H->dev_space(dev) != H->dev_space(m->load_dev)) {
    snprintf(err, errlen, "the model was loaded on %s device memory and cannot run a session "
             "on %s: load it on the device the job runs on", H->dev_ops(m->load_dev)->name,
             H->dev_ops(dev)->name);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* The KV cache, the work buffers, the condition's rows and mask, and the fused ops' scratch
 * (the caller closes s on failure). */
static int lg__session_buffers(vspec_session *s, int max_nodes, char *err, size_t errlen) {
  const vspec_host *H = s->host;
  const vspec_model *m = s->m;
  const lg_gpt *g = &m->gpt;
  vspec_dev *dev = s->dev;
  /* Committed positions never exceed T + N; pending nodes sit after them, and with graphs
   * a forward's padding nodes after those (gpt_forward.c, lg__forward_graph). */
  s->graphs = !vspec_has_fused_ops(s->ops) ? LG_GRAPHS_OFF
              : m->graphs == LG_GRAPHS_ON && !vspec_has_graphs(s->ops) ? LG_GRAPHS_OFF
                                                                      : m->graphs;
  int pad = s->graphs != LG_GRAPHS_OFF ? lg_graph_pad_room(max_nodes, s->max_nodes) : 0;
  int slots = (g->n_cond + g->n_image + max_nodes + pad + 7) / 8 * 8;
  int kv_rc = vs_kv_tree_init(&s->kv, H, dev, g->n_layer, s->rows, g->n_kv_head, g->head_dim,
                              slots, max_nodes);

  const vspec_ops *ops = s->ops;
  size_t M = (size_t)s->rows * s->max_nodes;
  size_t cache = (size_t)g->n_layer * vs_kv_layer_elems(&s->kv) * sizeof(float);
  s->cond_embed = ops->alloc(dev, (size_t)s->rows * g->n_cond * g->dim * sizeof(float));
  int work_rc = lg_work_alloc(H, ops, dev, g, M, (size_t)g->caption_len, 0, &s->w);
  s->cond_valid = H->calloc((size_t)g->n_cond, 1);
  s->mask = H->calloc((size_t)s->max_nodes * slots, 1);
  if (kv_rc || work_rc || !s->cond_embed || !s->cond_valid || !s->mask) {
    snprintf(err, errlen, "out of memory for a session (%zu MiB of KV cache)", 2 * cache >> 20);
    return VSPEC_ENOMEM;
  }
  /* The fused ops' temporaries at the largest forward (the normed rows and the up
   * projection of norm_swiglu, the most any of them takes), reserved now: a device that grew
   * its scratch inside a forward would wait for its queue there and, on a GPU, free memory
   * while other workers' streams run. */
  if (ops->reserve_scratch(dev, lg_scratch_bytes(g, M))) {
    snprintf(err, errlen, "out of memory for a session's scratch (%zu rows)", M);
    return VSPEC_ENOMEM;
  }
  return VSPEC_OK;
}

/* t2i: the caption through the caption MLP into the condition rows (the caller closes s on
 * failure). */
static int lg__session_caption(vspec_session *s, const vspec_session_config *cfg, char *err,
                               size_t errlen) {
  const vspec_host *H = s->host;
  const lg_gpt *g = &s->m->gpt;
  const vspec_ops *ops = s->ops;
  vspec_dev *dev = s->dev;
  size_t row_bytes = (size_t)g->n_cond * g->dim * sizeof(float);
  /* sample_t2i.py multiplies the caption features by their mask (pad slots = 0); doing
   * it here too makes a caller's unzeroed padding harmless. Both CFG rows use the
   * conditional prompt's mask (generate.py: torch.cat([emb_masks, emb_masks])). */
  size_t n = (size_t)g->caption_len * g->caption_dim;
  float *cap = H->alloc(n * sizeof(float));
  float *cap_dev = ops->alloc(dev, n * sizeof(float));
  if (!cap || !cap_dev) {
    H->free(cap);
    if (cap_dev) ops->free(dev, cap_dev);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  for (int t = 0; t < g->caption_len; t++) {
    int valid = cfg->caption_mask ? cfg->caption_mask[t] != 0 : 1;
    s->cond_valid[t] = (uint8_t)valid;
    for (int c = 0; c < g->caption_dim; c++)
      cap[(size_t)t * g->caption_dim + c] = valid ? cfg->caption[(size_t)t * g->caption_dim + c]
                                                  : 0.0f;
  }
  ops->upload(dev, cap_dev, cap, n * sizeof(float));
  s->prefix_dev = ops->alloc(dev, (size_t)g->n_cond);
  if (s->prefix_dev) ops->upload(dev, s->prefix_dev, s->cond_valid, (size_t)g->n_cond);
  lg__caption_embed(s, cap_dev, s->cond_embed);
  if (s->rows == 2) {
    /* The unconditional row feeds the learned uncond_embedding through the same MLP. */
    lg__caption_embed(s, g->uncond_caption, (float *)((char *)s->cond_embed + row_bytes));
  }
  ops->free(dev, cap_dev);
  H->free(cap);
  if (!s->prefix_dev) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  return VSPEC_OK;
}

/* c2i: the class's row, and the null class's for the unconditional row. */
static void lg__session_class(vspec_session *s) {
  const lg_gpt *g = &s->m->gpt;
  size_t row_bytes = (size_t)g->n_cond * g->dim * sizeof(float);
  for (int i = 0; i < g->n_cond; i++) s->cond_valid[i] = 1;
  s->ops->copy(s->dev, s->cond_embed, g->class_table + (size_t)s->class_label * g->dim,
               (size_t)g->dim * sizeof(float));
  if (s->rows == 2)
    s->ops->copy(s->dev, (char *)s->cond_embed + row_bytes,
                 g->class_table + (size_t)g->num_classes * g->dim,
                 (size_t)g->dim * sizeof(float));
}

int lg_session_open(vspec_model *m, vspec_dev *dev, const vspec_session_config *cfg,
                    vspec_session **out, char *err, size_t errlen) {
  const vspec_host *H = m->host;
  const lg_gpt *g = &m->gpt;
  int max_nodes;
  int rc = lg__session_check(m, dev, cfg, &max_nodes, err, errlen);
  if (rc) return rc;
  vspec_session *s = H->calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->m = m;
  s->host = H;
  s->ops = H->dev_ops(dev);
  s->dev = dev;
  s->rows = cfg->rows;
  s->class_label = cfg->class_label;
  /* The prefill runs n_cond positions through the same buffers as a forward. */
  s->max_nodes = max_nodes > g->n_cond ? max_nodes : g->n_cond;
  rc = lg__session_buffers(s, max_nodes, err, errlen);
  if (!rc && !g->t2i) lg__session_class(s);
  else if (!rc) rc = lg__session_caption(s, cfg, err, errlen);
  if (rc) {
    lg_session_close(s);
    return rc;
  }
  s->fused = vspec_has_fused_ops(s->ops);
  *out = s;
  return VSPEC_OK;
}

