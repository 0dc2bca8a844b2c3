#include "core/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/manifest.h"
#include "core/params.h"
#include "core/suggest.h"
#include "kernels/vs_kernels.h"

int vs_backend_model_load(vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                          const char *backend, const char *path, const char *params,
                          vs_backend_model *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  vspec_params *p = NULL;
  int rc = vs_params_parse(params, &p, err, errlen);
  if (rc) return rc;
  rc = vs_registry_acquire(reg, VSPEC_PLUGIN_BACKEND, backend, &out->plugin, err, errlen);
  if (rc) goto done;
  out->vt = vs_plugin_vtable(out->plugin);
  char inner[VSPEC_ERRLEN] = "";
  rc = out->vt->load(host, dev, path, p, &out->model, inner, sizeof inner);
  if (rc) {
    const char *why = rc == VSPEC_ENOMEM ? vs_dev_alloc_error(dev) : "";
    snprintf(err, errlen, "backend '%s' could not load %s: %s%s%s%s", backend, path,
             *inner ? inner : "no message", *why ? " (" : "", why, *why ? ")" : "");
    vs_plugin_release(out->plugin);
    out->plugin = NULL;
    goto done;
  }
  out->info.struct_size = sizeof out->info;
  out->vt->info(out->model, &out->info);
  /* Weights a backend filled with asynchronous device copies are on the device before a
   * worker's context reads them. */
  if ((rc = vs_dev_sync(dev))) {
    snprintf(err, errlen, "backend '%s' loading %s: the device failed to finish the load (%d)",
             backend, path, rc);
    vs_backend_model_unload(out);
  }
done:
  vs_params_free(p);
  return rc;
}

void vs_backend_model_unload(vs_backend_model *bm) {
  if (!bm || !bm->model) return;
  bm->vt->unload(bm->model);
  vs_plugin_release(bm->plugin);
  memset(bm, 0, sizeof *bm);
}

const char *vs_models_class_name(const vs_models *m, int label) {
  return m && label >= 0 && label < m->n_class_names ? m->class_names[label] : NULL;
}

char **vs_models_class_names_copy(const vs_models *m, int *n) {
  *n = 0;
  if (!m->class_names) return NULL;
  size_t bytes = (size_t)m->n_class_names * sizeof(char *);
  for (int i = 0; i < m->n_class_names; i++) bytes += strlen(m->class_names[i]) + 1;
  char **copy = malloc(bytes);
  if (!copy) return NULL;
  char *text = (char *)(copy + m->n_class_names);
  for (int i = 0; i < m->n_class_names; i++) {
    size_t l = strlen(m->class_names[i]) + 1;
    copy[i] = memcpy(text, m->class_names[i], l);
    text += l;
  }
  *n = m->n_class_names;
  return copy;
}

int vs_models_class_label(const vs_models *m, const char *text, int *label, char *err,
                          size_t errlen) {
  int classes = m->target.info.num_classes;
  char *end;
  long v = strtol(text, &end, 10);
  if (end != text && !*end && v >= 0 && v < classes) {
    *label = (int)v;
    return VSPEC_OK;
  }
  for (int i = 0; i < m->n_class_names; i++)
    if (!strcasecmp(text, m->class_names[i])) {
      *label = i;
      return VSPEC_OK;
    }
  size_t used = (size_t)snprintf(err, errlen, "--class '%s': model '%s' has classes 0..%d", text,
                                 m->name, classes - 1);
  for (int i = 0; i < m->n_class_names && used + 1 < errlen; i++)
    used += (size_t)snprintf(err + used, errlen - used, "%s%d %s", i ? ", " : " (", i,
                             m->class_names[i]);
  if (m->n_class_names && used + 1 < errlen)
    used += (size_t)snprintf(err + used, errlen - used, ")");
  int near = vs_suggest_nearest(text, (const char *const *)m->class_names, m->n_class_names);
  if (near >= 0 && used + 1 < errlen)
    snprintf(err + used, errlen - used, "; did you mean '%s'?", m->class_names[near]);
  return VSPEC_EINVAL;
}

int vs_models_backends(const vs_models *m, char names[3][64]) {
  const vs_backend_model *roles[] = {&m->target, &m->draft, &m->eagle};
  int n = 0;
  for (int r = 0; r < 3; r++) {
    if (!roles[r]->plugin) continue;
    const char *name = vs_plugin_name(roles[r]->plugin);
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = !strcmp(names[i], name);
    if (!seen) snprintf(names[n++], 64, "%s", name);
  }
  return n;
}

size_t vs_models_latent_count(const vs_models *m) {
  const vspec_model_info *in = &m->target.info;
  if (in->token_kind != VSPEC_TOKENS_CONTINUOUS) return 0;
  return (size_t)in->grid_h * in->grid_w * (size_t)in->token_dim;
}

int vs_models_decode(const vs_models *m, vspec_dev *dev, const int32_t *tokens,
                     const float *latents, uint8_t *rgb, char *err, size_t errlen) {
  const vs_backend_model *t = &m->target;
  if (!t->model || !t->info.image_h || !t->info.image_w) {
    snprintf(err, errlen, "model '%s' has no image decoder", m->name);
    return VSPEC_ENOTSUP;
  }
  if (t->info.token_kind == VSPEC_TOKENS_CONTINUOUS) {
    if (!VSPEC_HAS_FIELD(t->vt, vspec_backend_vtable, decode_latents) || !t->vt->decode_latents) {
      snprintf(err, errlen, "model '%s': its backend cannot decode latents", m->name);
      return VSPEC_ENOTSUP;
    }
    if (!latents) {
      snprintf(err, errlen, "model '%s' has continuous tokens: decoding needs its latents",
               m->name);
      return VSPEC_EINVAL;
    }
    return t->vt->decode_latents(t->model, dev, latents, rgb, err, errlen);
  }
  return t->vt->decode(t->model, dev, tokens, rgb, err, errlen);
}

static int models_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Loads one role the manifest describes. */
static int mdl_load_role(vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                         const vs_manifest_role *r, vs_backend_model *out, char *err,
                         size_t errlen) {
  return vs_backend_model_load(reg, host, dev, r->backend, r->weights, r->params, out, err,
                               errlen);
}

/* A directory without a manifest: gpt.safetensors (or target.safetensors) and, if present,
 * vq.safetensors as a LlamaGen target. */
static int mdl_load_bare(vs_models *m, vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                         const char *dir, char *err, size_t errlen) {
  char gpt[2048], vq[2048], params[2100] = "";
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", dir);
  if (!models_exists(gpt)) snprintf(gpt, sizeof gpt, "%s/target.safetensors", dir);
  if (!models_exists(gpt)) {
    snprintf(err, errlen, "model directory '%s' has neither %s nor gpt.safetensors / "
             "target.safetensors", dir, VS_MANIFEST_FILE);
    return VSPEC_ENOENT;
  }
  snprintf(vq, sizeof vq, "%s/vq.safetensors", dir);
  if (models_exists(vq)) snprintf(params, sizeof params, "vq=%s", vq);
  return vs_backend_model_load(reg, host, dev, "llamagen", gpt, params, &m->target, err, errlen);
}

/* One class name per class label of the target, which the manifest could not know. */
static int mdl_check_class_names(const vs_models *m, char *err, size_t errlen) {
  int classes = m->target.info.num_classes;
  if (!m->class_names || !m->target.model || m->n_class_names == classes) return VSPEC_OK;
  snprintf(err, errlen, "%s/%s: class_names has %d name(s), the target has %d class label(s): "
           "give one name per label, in label order", m->dir, VS_MANIFEST_FILE,
           m->n_class_names, classes);
  return VSPEC_EFORMAT;
}

int vs_models_open(vs_registry *reg, const vspec_host *host, vspec_dev *dev, const char *dir,
                   unsigned roles, vs_models **out, char *err, size_t errlen) {
  vs_models *m = calloc(1, sizeof *m);
  vs_manifest *mf = calloc(1, sizeof *mf);
  int rc = VSPEC_OK;
  if (m) pthread_mutex_init(&m->neighbours_mu, NULL);
  if (!m || !mf) {
    snprintf(err, errlen, "out of memory");
    rc = VSPEC_ENOMEM;
    goto fail;
  }
  snprintf(m->dir, sizeof m->dir, "%s", dir);
  m->reg = reg;
  m->host = host;
  const char *base = strrchr(dir, '/');
  snprintf(m->name, sizeof m->name, "%s", base && base[1] ? base + 1 : dir);
  /* LlamaGen sample_c2i.py defaults, with top_k off: our vocabularies are small. */
  m->defaults = (vs_sampling){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                              .cfg_scale = 4.0f, .cfg_interval = -1};
  if (!models_exists(dir)) {
    snprintf(err, errlen, "model directory '%s' does not exist", dir);
    rc = VSPEC_ENOENT;
    goto fail;
  }
  rc = vs_manifest_read(dir, &m->defaults, roles, mf, err, errlen);
  if (rc == VSPEC_ENOENT) {
    rc = (roles & VS_ROLE_TARGET) ? mdl_load_bare(m, reg, host, dev, dir, err, errlen) : VSPEC_OK;
    if (rc) goto fail;
  } else if (rc) {
    goto fail;
  } else {
    if (*mf->name) snprintf(m->name, sizeof m->name, "%s", mf->name);
    m->defaults = mf->defaults;
    m->class_names = mf->class_names; /* the models own them now */
    m->n_class_names = mf->n_class_names;
    mf->class_names = NULL;
    if ((mf->target.present &&
         (rc = mdl_load_role(reg, host, dev, &mf->target, &m->target, err, errlen))) ||
        (mf->draft.present &&
         (rc = mdl_load_role(reg, host, dev, &mf->draft, &m->draft, err, errlen))) ||
        (mf->eagle.present &&
         (rc = mdl_load_role(reg, host, dev, &mf->eagle, &m->eagle, err, errlen))))
      goto fail;
    if ((rc = mdl_check_class_names(m, err, errlen))) goto fail;
  }
  free(mf);
  *out = m;
  return VSPEC_OK;
fail:
  free(mf);
  vs_models_close(m);
  return rc;
}

void vs_models_close(vs_models *m) {
  if (!m) return;
  free(m->class_names);
  free(m->neighbours);
  pthread_mutex_destroy(&m->neighbours_mu);
  vs_backend_model_unload(&m->eagle);
  vs_backend_model_unload(&m->draft);
  vs_backend_model_unload(&m->target);
  free(m);
}
