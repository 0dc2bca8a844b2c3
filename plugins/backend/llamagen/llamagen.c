/*
 * The `llamagen` backend plugin: LlamaGen GPT (c2i and t2i) + VQ decoder.
 *
 * load(path, params):
 *   path          the GPT safetensors file (tools/convert_llamagen.py output), or "-" for
 *                 a decoder-only model
 *   vq=FILE       the VQ tokenizer safetensors, needed for decode()
 *   max_nodes=N   the largest tree one forward may verify (default 256)
 *   weight_format=F
 *                 default: the linear layers at the device's precision; int8: ask the device
 *                 for int8 copies of them (weight_format op) where it runs below fp32 (a CPU
 *                 with AMX-INT8 at bf16 precision; elsewhere the device's precision stays).
 *                 Meant for a draft GPT: its weights are read once per drafted token, and a
 *                 draft's quality moves only the acceptance rate, not what exact SD samples.
 *   graphs=G      how tree forwards run (ABI 1.5 graphs, gpt_forward.c): on (padded to a
 *                 node-count bucket, one recorded graph per bucket replayed every step),
 *                 off (eagerly, unpadded), pad (padded, eagerly: the reference a replay must
 *                 equal bit for bit), auto (default: on where the device records graphs and
 *                 is not the CPU, whose graphs are a checker, not a speed-up). Without the
 *                 parameter the environment variable VSPEC_GRAPHS (the same values) decides.
 *   multi=M       how cross-job batches (forward_multi) run: fused (on the fused ops: per
 *                 layer every session's QKV and attention, as two ops for all of them where
 *                 the device has the batch ops of ABI 1.9, else two per session, and three
 *                 over every row), sessions (fused, two ops per session even where the device
 *                 has the batch ops: the A/B switch against them), unfused ((12 + 3 x rows)
 *                 per layer: the CPU's outputs as they were), auto (default: fused where the
 *                 batch's device has the fused ops and is not the CPU). Without the parameter
 *                 the environment variable VSPEC_MULTI decides.
 *   multi_graphs=B  whether a fused batch with the batch ops runs its trunk through a graph
 *                 per batch shape where the session's forwards use graphs (graphs=on): on
 *                 (default) or off, the A/B switch; else the environment variable
 *                 VSPEC_MULTI_GRAPHS.
 * The same plugin serves the target and a small standalone draft GPT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lg_internal.h"

#define LG_DEFAULT_MAX_NODES 256


static void lg_unload(vspec_model *m) {
  if (!m) return;
  lg_lanes_free(m);
  lg_gpt_unload(m);
  lg_vq_unload(m);
  if (m->gpt_file) m->host->tensors_close(m->gpt_file);
  if (m->vq_file) m->host->tensors_close(m->vq_file);
  m->host->free(m);
}

/* LG_GRAPHS_* from the parameter graphs=, else VSPEC_GRAPHS, else auto. */
static int lg_graphs_mode(const vspec_host *host, vspec_dev *dev, const char *param, int *mode,
                          char *err, size_t errlen) {
  const char *v = param ? param : getenv("VSPEC_GRAPHS");
  const vspec_ops *ops = host->dev_ops(dev);
  if (!v || !*v || strcmp(v, "auto") == 0)
    *mode = ops->device != VSPEC_DEVICE_CPU && vspec_has_graphs(ops) ? LG_GRAPHS_ON
                                                                     : LG_GRAPHS_OFF;
  else if (strcmp(v, "on") == 0 || strcmp(v, "1") == 0)
    *mode = LG_GRAPHS_ON;
  else if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0)
    *mode = LG_GRAPHS_OFF;
  else if (strcmp(v, "pad") == 0)
    *mode = LG_GRAPHS_PAD;
  else {
    snprintf(err, errlen, "llamagen: graphs=%s%s: use auto, on, off or pad", v,
             param ? "" : " (VSPEC_GRAPHS)");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* multi_graphs= (else VSPEC_MULTI_GRAPHS, else on): 1 on, 0 off. */
static int lg_multi_graphs(const char *param, int *on, char *err, size_t errlen) {
  const char *v = param ? param : getenv("VSPEC_MULTI_GRAPHS");
  *on = !v || !*v || strcmp(v, "on") == 0 || strcmp(v, "auto") == 0;
  if (*on || strcmp(v, "off") == 0) return VSPEC_OK;
  snprintf(err, errlen, "llamagen: multi_graphs=%s%s: use on or off", v,
           param ? "" : " (VSPEC_MULTI_GRAPHS)");
  return VSPEC_EINVAL;
}

/* LG_MULTI_* from the parameter multi=, else VSPEC_MULTI, else auto. */
static int lg_multi_mode(const char *param, int *mode, char *err, size_t errlen) {
  const char *v = param ? param : getenv("VSPEC_MULTI");
  if (!v || !*v || strcmp(v, "auto") == 0) *mode = LG_MULTI_AUTO;
  else if (strcmp(v, "fused") == 0) *mode = LG_MULTI_FUSED;
  else if (strcmp(v, "unfused") == 0) *mode = LG_MULTI_UNFUSED;
  else if (strcmp(v, "sessions") == 0) *mode = LG_MULTI_SESSIONS;
  else {
    snprintf(err, errlen, "llamagen: multi=%s%s: use auto, fused, sessions or unfused", v,
             param ? "" : " (VSPEC_MULTI)");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

static int lg_load(const vspec_host *host, vspec_dev *dev, const char *path,
                   const vspec_params *params, vspec_model **out, char *err, size_t errlen) {
  static const char *const known[] = {"vq",    "max_nodes", "weight_format", "graphs",
                                      "multi", "multi_graphs", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  long max_nodes;
  if ((rc = host->param_int(params, "max_nodes", LG_DEFAULT_MAX_NODES, 1, 4096, &max_nodes, err,
                            errlen)))
    return rc;
  const char *weights = host->param_string(params, "weight_format");
  if (weights && strcmp(weights, "default") != 0 && strcmp(weights, "int8") != 0) {
    snprintf(err, errlen, "llamagen: weight_format=%s: use default or int8", weights);
    return VSPEC_EINVAL;
  }
  int graphs, multi, multi_graphs;
  if ((rc = lg_graphs_mode(host, dev, host->param_string(params, "graphs"), &graphs, err,
                           errlen)) ||
      (rc = lg_multi_mode(host->param_string(params, "multi"), &multi, err, errlen)) ||
      (rc = lg_multi_graphs(host->param_string(params, "multi_graphs"), &multi_graphs, err,
                            errlen)))
    return rc;
  const char *vq_path = host->param_string(params, "vq");
  int want_gpt = path && *path && strcmp(path, "-") != 0;
  if (!want_gpt && !vq_path) {
    snprintf(err, errlen, "llamagen: nothing to load: give a GPT file and/or vq=FILE");
    return VSPEC_EINVAL;
  }
  vspec_model *m = host->calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  m->host = host;
  m->load_dev = dev;
  m->max_nodes = (int)max_nodes;
  m->graphs = graphs;
  m->multi = multi;
  m->multi_graphs = multi_graphs;
  char inner[VSPEC_ERRLEN];
  if (want_gpt) {
    if ((rc = host->tensors_open(path, &m->gpt_file, err, errlen))) goto fail;
    if ((rc = lg_gpt_load(m, m->gpt_file, inner, sizeof inner))) {
      snprintf(err, errlen, "%s: %s", path, inner);
      goto fail;
    }
    m->has_gpt = 1;
    if (weights && strcmp(weights, "int8") == 0) lg_gpt_ask_int8(m);
  }
  if (vq_path) {
    if ((rc = host->tensors_open(vq_path, &m->vq_file, err, errlen))) goto fail;
    if ((rc = lg_vq_load(m, m->vq_file, inner, sizeof inner))) {
      snprintf(err, errlen, "%s: %s", vq_path, inner);
      goto fail;
    }
    m->has_vq = 1;
    if (m->has_gpt && m->vq.codebook_size != m->gpt.vocab) {
      snprintf(err, errlen, "GPT vocabulary %d does not match the VQ codebook size %d (%s, %s)",
               m->gpt.vocab, m->vq.codebook_size, path, vq_path);
      rc = VSPEC_ESHAPE;
      goto fail;
    }
    if (!m->has_gpt) {
      long img, ds;
      if ((rc = lg_meta_int(m, m->vq_file, "image_size", 0, &img, err, errlen))) goto fail;
      ds = 1;
      for (int s = 0; s < m->vq.n_stages; s++) ds <<= m->vq.stages[s].has_upsample;
      m->gpt.grid = img > 0 ? (int)(img / ds) : 0;
      if (m->gpt.grid <= 0) {
        snprintf(err, errlen, "%s: a decoder-only model needs metadata image_size", vq_path);
        rc = VSPEC_EINVAL;
        goto fail;
      }
      m->gpt.n_image = m->gpt.grid * m->gpt.grid;
    }
  }
  snprintf(m->arch, sizeof m->arch, "llamagen-%s", !m->has_gpt ? "vq" : m->gpt.t2i ? "t2i" : "c2i");
  *out = m;
  return VSPEC_OK;
fail:
  lg_unload(m);
  return rc;
}

static int lg_info(const vspec_model *m, vspec_model_info *out) {
  vspec_model_info i;
  memset(&i, 0, sizeof i);
  i.struct_size = sizeof i;
  i.token_kind = VSPEC_TOKENS_DISCRETE;
  i.grid_h = i.grid_w = m->gpt.grid;
  i.vocab = m->has_gpt ? m->gpt.vocab : m->vq.codebook_size;
  i.token_dim = m->has_vq ? m->vq.embed_dim : 0;
  i.feature_dim = m->gpt.dim;
  i.n_cond = m->gpt.n_cond;
  i.num_classes = m->gpt.t2i ? 0 : m->gpt.num_classes;
  i.caption_len = m->gpt.caption_len;
  i.caption_dim = m->gpt.caption_dim;
  if (m->has_vq) {
    int side = m->gpt.grid;
    for (int s = 0; s < m->vq.n_stages; s++) side <<= m->vq.stages[s].has_upsample;
    i.image_h = i.image_w = side;
    i.codebook = m->vq.codebook_raw;
  }
  i.max_nodes = m->max_nodes;
  i.arch = m->arch;
  /* gpt_forward.c: token_dev, draw, walk_probs, walk_tokens; on the fused ops alone, so a
   * host whose ops table lacks them gets host drafts (lg_forward refuses the rest) */
  i.device_tokens = vspec_has_fused_ops(m->host->dev_ops(m->load_dev));
  if (m->has_gpt) {
    /* Per layer 4d^2 + 3dF + 2d: wqkv + wo, w1/w2/w3, two RMSNorm weights (MHA; wqkv
     * generalised for GQA); gpt.py's GPT_* comments (111M, 343M, 775M, ...) match it. */
    const lg_gpt *g = &m->gpt;
    int64_t d = g->dim, hd = g->head_dim, F = g->ffn_hidden;
    int64_t layer = (g->n_head + 2 * g->n_kv_head) * hd * d + d * g->n_head * hd + 3 * d * F + 2 * d;
    int64_t cond = g->t2i ? (int64_t)g->caption_dim * d + d * d
                          : (int64_t)(g->num_classes + g->has_null_class) * d;
    i.params = g->n_layer * layer + 2 * (int64_t)g->vocab * d + d + cond;
    /* Embedding tables contribute one row per token; everything else is read in full. */
    i.stream_bytes = (int64_t)sizeof(float) * (g->n_layer * layer + (int64_t)g->vocab * d + d);
  }
  /* Copy no more than the caller's struct holds. */
  size_t n = out->struct_size && out->struct_size < sizeof i ? out->struct_size : sizeof i;
  memcpy(out, &i, n);
  out->struct_size = (uint32_t)n;
  return VSPEC_OK;
}

static int32_t lg_committed(const vspec_session *s) { return s->kv.committed; }

static int lg_decode(vspec_model *m, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb,
                     char *err, size_t errlen) {
  return lg_vq_decode(m, dev, tokens, rgb, err, errlen);
}

static int lg_init(const vspec_host *host, char *err, size_t errlen) {
  if (host->struct_size < sizeof(vspec_host)) {
    snprintf(err, errlen, "host services table too small (%u < %zu bytes)", host->struct_size,
             sizeof(vspec_host));
    return VSPEC_EABI;
  }

  return VSPEC_OK;
}

static const vspec_backend_vtable lg_vtable = {
    .struct_size = sizeof(vspec_backend_vtable),
    .load = lg_load,
    .unload = lg_unload,
    .info = lg_info,
    .session_open = lg_session_open,
    .session_close = lg_session_close,
    .prefill = lg_prefill,
    .forward = lg_forward,
    .commit = lg_commit,
    .committed = lg_committed,
    .decode = lg_decode,
    .forward_multi = lg_forward_multi,
};

static const vspec_plugin_desc lg_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_BACKEND, "llamagen", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "LlamaGen GPT (c2i/t2i) with KV-cached tree forward, and the LlamaGen VQ "
                   "decoder",
    .vtable = &lg_vtable,
    .init = lg_init,
    .shutdown = NULL,
};

VSPEC_PLUGIN_DEFINE(lg_desc)
