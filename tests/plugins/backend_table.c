/*
 * `table` backend for statistical tests: a micro model whose next-token logits are given
 * by a table indexed by the whole prefix, so the exact joint distribution of a sequence
 * can be enumerated. It speaks the full backend ABI (CFG rows, pending trees, append,
 * commit), so the engine runs unchanged on it, a million jobs in seconds.
 *
 * File (safetensors): logits F32 [n_prefixes, rows, vocab], prefixes of length 0..L-1 in
 * order of length then base-vocab value; optional codebook F32 [vocab, dim];
 * metadata: vocab, length (L), rows.
 *
 * Features: a node's output feature is the length of its prefix (itself included), so
 * the target's feature at image index j is j + 1. With parameter mode=head the table acts
 * as an EAGLE-style feature head: it takes one input feature per node and checks that the
 * engine fed it exactly the feature an EAGLE head must see at that position (the target's
 * feature at the previous index for committed rows, its own output at the parent for tree
 * nodes, both equal to the node's position), failing the forward otherwise. With the
 * parameter log=PATH (a manifest key of the eagle role) it fails nothing and appends
 * "position row feature" to PATH for every input that differs, so a test can check which
 * features the engine hands the head where it must not give the exact ones (VVS's reused
 * features of unverified tokens).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/plugin.h"

#define TB_MAX_LEN 8
#define TB_MAX_PENDING 1200

struct vspec_model {
  const vspec_host *host;
  int head;
  char log[512]; /* mode=head: where to record wrong features instead of failing ("": fail) */
  vspec_tensor_file *f;
  int vocab, len, rows, dim;
  const float *logits, *codebook;
  int64_t offset[TB_MAX_LEN + 1]; /* first prefix index of each length */
};

struct vspec_session {
  vspec_model *m;
  int rows;
  int committed;              /* image tokens committed */
  int32_t tokens[TB_MAX_LEN]; /* committed image tokens */
  int prefilled;
  int n_pending;
  int32_t ptok[TB_MAX_PENDING], ppar[TB_MAX_PENDING];
};

static int tb_meta(const vspec_host *h, vspec_tensor_file *f, const char *k) {
  const char *v = h->tensors_meta(f, k);
  return v ? atoi(v) : -1;
}

static void tb_unload(vspec_model *m) {
  if (!m) return;
  if (m->f) m->host->tensors_close(m->f);
  m->host->free(m);
}

static int tb_load(const vspec_host *h, vspec_dev *dev, const char *path, const vspec_params *p,
                   vspec_model **out, char *err, size_t errlen) {
  static const char *const modes[] = {"model", "head", NULL};
  int mode = 0;
  int rc0 = h->param_choice(p, "mode", modes, 0, &mode, err, errlen);
  if (rc0) return rc0;
  vspec_model *m = h->calloc(1, sizeof *m);
  m->host = h;
  m->head = mode == 1;
  const char *log = h->param_string(p, "log");
  if (log) snprintf(m->log, sizeof m->log, "%s", log);
  int rc = h->tensors_open(path, &m->f, err, errlen);
  if (rc) {
    tb_unload(m);
    return rc;
  }
  m->vocab = tb_meta(h, m->f, "vocab");
  m->len = tb_meta(h, m->f, "length");
  m->rows = tb_meta(h, m->f, "rows");
  if (m->vocab < 2 || m->len < 1 || m->len > TB_MAX_LEN || m->rows < 1 || m->rows > 2) {
    snprintf(err, errlen, "%s: bad table metadata", path);
    tb_unload(m);
    return VSPEC_EFORMAT;
  }
  int64_t n = 0, pw = 1;
  for (int l = 0; l < m->len; l++) {
    m->offset[l] = n;
    n += pw;
    pw *= m->vocab;
  }
  m->offset[m->len] = n;
  int64_t shape[] = {n, m->rows, m->vocab};
  if ((rc = h->tensors_get_f32(m->f, dev, "logits", 3, shape, &m->logits, err, errlen))) {
    tb_unload(m);
    return rc;
  }
  vspec_tensor t = {.struct_size = sizeof t};
  if (h->tensors_find(m->f, "codebook", &t) == 0) {
    int64_t cs[] = {m->vocab, -1};
    if ((rc = h->tensors_get_f32(m->f, dev, "codebook", 2, cs, &m->codebook, err, errlen))) {
      tb_unload(m);
      return rc;
    }
    m->dim = (int)t.shape[1];
  }
  *out = m;
  return VSPEC_OK;
}

static int tb_info(const vspec_model *m, vspec_model_info *o) {
  vspec_model_info i = {.struct_size = sizeof i};
  i.token_kind = VSPEC_TOKENS_DISCRETE;
  i.grid_h = 1;
  i.grid_w = m->len;
  i.vocab = m->vocab;
  i.token_dim = m->dim;
  i.feature_dim = 1;
  i.feature_in_dim = m->head ? 1 : 0;
  i.n_cond = 1;
  i.num_classes = 1;
  i.max_nodes = TB_MAX_PENDING;
  i.codebook = m->codebook;
  i.arch = "table";
  size_t n = o->struct_size && o->struct_size < sizeof i ? o->struct_size : sizeof i;
  memcpy(o, &i, n);
  return VSPEC_OK;
}

static int tb_open(vspec_model *m, vspec_dev *dev, const vspec_session_config *c,
                   vspec_session **out, char *err, size_t errlen) {
  (void)dev;
  if (c->rows < 1 || c->rows > m->rows) {
    snprintf(err, errlen, "table has %d rows, session wants %d", m->rows, c->rows);
    return VSPEC_EINVAL;
  }
  vspec_session *s = m->host->calloc(1, sizeof *s);
  s->m = m;
  s->rows = c->rows;
  *out = s;
  return VSPEC_OK;
}

static void tb_close(vspec_session *s) { s->m->host->free(s); }

/* Copies the rows of the prefix tokens[0..n) into out [rows, vocab]. */
static void tb_lookup(const vspec_session *s, const int32_t *tokens, int n, float *logits,
                      float *features) {
  const vspec_model *m = s->m;
  int64_t idx = 0;
  for (int i = 0; i < n; i++) idx = idx * m->vocab + tokens[i];
  idx += m->offset[n < m->len ? n : m->len - 1];
  if (n >= m->len) idx = m->offset[m->len - 1]; /* past the end: any valid row */
  if (logits)
    for (int r = 0; r < s->rows; r++)
      memcpy(logits + (size_t)r * m->vocab, m->logits + ((size_t)idx * m->rows + r) * m->vocab,
             (size_t)m->vocab * sizeof(float));
  if (features)
    for (int r = 0; r < s->rows; r++) features[r] = (float)n;
}

static int tb_prefill(vspec_session *s, vspec_forward_out *o, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  s->prefilled = 1;
  tb_lookup(s, s->tokens, 0, o ? o->logits : NULL, o ? o->features : NULL);
  return VSPEC_OK;
}

static int tb_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *o,
                      char *err, size_t errlen) {
  int base = b->append ? s->n_pending : 0;
  if (!s->prefilled || base + b->n_nodes > TB_MAX_PENDING) {
    snprintf(err, errlen, "table: bad forward");
    return VSPEC_EINVAL;
  }
  for (int i = 0; i < b->n_nodes; i++) {
    int p = b->parents[i];
    if (p < -1 || p >= base + i || b->tokens[i] < 0 || b->tokens[i] >= s->m->vocab) {
      snprintf(err, errlen, "table: bad node %d", i);
      return VSPEC_EINVAL;
    }
    s->ptok[base + i] = b->tokens[i];
    s->ppar[base + i] = p;
    /* prefix = committed tokens + the node's ancestors + itself */
    int32_t pre[TB_MAX_LEN + 64];
    int depth = 0;
    for (int a = base + i; a >= 0; a = s->ppar[a]) depth++;
    if (s->committed + depth > TB_MAX_LEN + 63) {
      snprintf(err, errlen, "table: too deep");
      return VSPEC_ERANGE;
    }
    memcpy(pre, s->tokens, (size_t)s->committed * sizeof(int32_t));
    int k = s->committed + depth;
    for (int a = base + i; a >= 0; a = s->ppar[a]) pre[--k] = s->ptok[a];
    size_t V = (size_t)s->m->vocab;
    if (s->m->head) {
      /* Position of this node = index of the token it embeds. */
      int pos = s->committed + depth - 1;
      for (int r = 0; r < s->rows; r++)
        if (!b->features || b->features[(size_t)i * s->rows + r] != (float)pos) {
          double got = b->features ? b->features[(size_t)i * s->rows + r] : -1.0;
          FILE *lf = b->features && s->m->log[0] ? fopen(s->m->log, "a") : NULL;
          if (lf) {
            fprintf(lf, "%d %d %.6g\n", pos, r, got);
            fclose(lf);
            continue;
          }
          snprintf(err, errlen, "table head: node %d (position %d) got feature %g, expected %d",
                   i, pos, got, pos);
          return VSPEC_EINVAL;
        }
    }
    tb_lookup(s, pre, s->committed + depth, o && o->logits ? o->logits + (size_t)i * s->rows * V : NULL,
              o && o->features ? o->features + (size_t)i * s->rows : NULL);
  }
  s->n_pending = base + b->n_nodes;
  return VSPEC_OK;
}

static int tb_commit(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen) {
  for (int j = 0; j < n; j++) {
    if (path[j] < 0 || path[j] >= s->n_pending || s->ppar[path[j]] != (j ? path[j - 1] : -1) ||
        s->committed >= s->m->len) {
      snprintf(err, errlen, "table: bad commit");
      return VSPEC_EINVAL;
    }
    s->tokens[s->committed++] = s->ptok[path[j]];
  }
  s->n_pending = 0;
  return VSPEC_OK;
}

static int32_t tb_committed(const vspec_session *s) { return 1 + s->committed; }

static int tb_decode(vspec_model *m, vspec_dev *dev, const int32_t *t, uint8_t *rgb, char *err,
                     size_t errlen) {
  (void)m, (void)dev, (void)t, (void)rgb;
  snprintf(err, errlen, "table: no decoder");
  return VSPEC_ENOTSUP;
}

static const vspec_backend_vtable tb_vtable = {
    .struct_size = sizeof(vspec_backend_vtable),
    .load = tb_load, .unload = tb_unload, .info = tb_info,
    .session_open = tb_open, .session_close = tb_close,
    .prefill = tb_prefill, .forward = tb_forward, .commit = tb_commit,
    .committed = tb_committed, .decode = tb_decode,
};

static const vspec_plugin_desc tb_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_BACKEND, "table", "test",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "prefix-table micro model for statistical tests",
    .vtable = &tb_vtable,
};

VSPEC_PLUGIN_DEFINE(tb_desc)
