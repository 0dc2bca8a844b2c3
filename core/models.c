#include "core/models.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/neighbours.h"
#include "core/params.h"
#include "kernels/vs_kernels.h"

#define VS_MANIFEST "vspec-model.json"

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

static int vs__exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Reads the "defaults" object; unknown keys are errors so a typo is not silently ignored. */
static int vs__read_defaults(json_t *d, vs_sampling *s, const char *path, char *err,
                             size_t errlen) {
  const char *key;
  json_t *v;
  json_object_foreach(d, key, v) {
    if (strcmp(key, "cfg_schedule") == 0) {
      const char *sv = json_string_value(v);
      if (sv && strcmp(sv, "linear") == 0) s->cfg_schedule = VS_CFG_LINEAR;
      else if (sv && strcmp(sv, "constant") == 0) s->cfg_schedule = VS_CFG_CONSTANT;
      else {
        snprintf(err, errlen, "%s: defaults.cfg_schedule must be \"linear\" or \"constant\"",
                 path);
        return VSPEC_EFORMAT;
      }
      continue;
    }
    if (!json_is_number(v)) {
      snprintf(err, errlen, "%s: defaults.%s must be a number", path, key);
      return VSPEC_EFORMAT;
    }
    double x = json_number_value(v);
    if (strcmp(key, "temperature") == 0) s->temperature = (float)x;
    else if (strcmp(key, "top_k") == 0) s->top_k = (int)x;
    else if (strcmp(key, "top_p") == 0) s->top_p = (float)x;
    else if (strcmp(key, "cfg_scale") == 0) s->cfg_scale = (float)x;
    else if (strcmp(key, "cfg_interval") == 0) s->cfg_interval = (int)x;
    else if (strcmp(key, "num_iter") == 0) s->num_iter = (int)x;
    else {
      snprintf(err, errlen, "%s: unknown key defaults.%s (known: temperature, top_k, top_p, "
               "cfg_scale, cfg_interval, num_iter, cfg_schedule)", path, key);
      return VSPEC_EFORMAT;
    }
  }
  return VSPEC_OK;
}

/* Loads the role object {"backend": ..., "gpt": ..., "vq": ...} of the manifest. */
static int vs__load_role(vs_registry *reg, const vspec_host *host, vspec_dev *dev,
                         const char *dir, const char *manifest, const char *role, json_t *obj,
                         vs_backend_model *out, char *err, size_t errlen) {
  if (!json_is_object(obj)) {
    snprintf(err, errlen, "%s: \"%s\" must be an object", manifest, role);
    return VSPEC_EFORMAT;
  }
  const char *backend = json_string_value(json_object_get(obj, "backend"));
  if (!backend) {
    snprintf(err, errlen, "%s: \"%s\" has no \"backend\"", manifest, role);
    return VSPEC_EFORMAT;
  }
  /* File-valued keys other than the main weights become backend parameters with absolute
   * paths, e.g. "vq" -> vq=DIR/vq.safetensors. */
  char main_path[2048] = "-", params[4096] = "";
  size_t used = 0;
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    if (strcmp(key, "backend") == 0) continue;
    const char *s = json_string_value(v);
    char text[64];
    if (!s) {
      if (!json_is_number(v)) {
        snprintf(err, errlen, "%s: %s.%s must be a string or a number", manifest, role, key);
        return VSPEC_EFORMAT;
      }
      snprintf(text, sizeof text, "%g", json_number_value(v));
      s = text;
    }
    if (strcmp(key, "gpt") == 0 || strcmp(key, "weights") == 0) {
      snprintf(main_path, sizeof main_path, "%s/%s", dir, s);
      continue;
    }
    int is_file = strstr(s, ".safetensors") != NULL;
    used += (size_t)snprintf(params + used, used < sizeof params ? sizeof params - used : 0,
                             "%s%s=%s%s%s", used ? "," : "", key, is_file ? dir : "",
                             is_file ? "/" : "", s);
  }
  if (used >= sizeof params) {
    snprintf(err, errlen, "%s: \"%s\" parameters are too long", manifest, role);
    return VSPEC_EFORMAT;
  }
  return vs_backend_model_load(reg, host, dev, backend, main_path, params, out, err, errlen);
}

int vs_models_open(vs_registry *reg, const vspec_host *host, vspec_dev *dev, const char *dir,
                   unsigned roles, vs_models **out, char *err, size_t errlen) {
  vs_models *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  snprintf(m->dir, sizeof m->dir, "%s", dir);
  m->reg = reg;
  m->host = host;
  const char *base = strrchr(dir, '/');
  snprintf(m->name, sizeof m->name, "%s", base && base[1] ? base + 1 : dir);
  /* LlamaGen sample_c2i.py defaults, with top_k off: our vocabularies are small. */
  m->defaults = (vs_sampling){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                              .cfg_scale = 4.0f, .cfg_interval = -1};
  char manifest[2048];
  snprintf(manifest, sizeof manifest, "%s/%s", dir, VS_MANIFEST);
  int rc = VSPEC_OK;
  json_t *root = NULL;
  if (!vs__exists(dir)) {
    snprintf(err, errlen, "model directory '%s' does not exist", dir);
    rc = VSPEC_ENOENT;
    goto fail;
  }
  if (vs__exists(manifest)) {
    json_error_t je;
    root = json_load_file(manifest, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
      snprintf(err, errlen, "%s: %s (line %d)", manifest, root ? "not a JSON object" : je.text,
               je.line);
      rc = VSPEC_EFORMAT;
      goto fail;
    }
    const char *name = json_string_value(json_object_get(root, "name"));
    if (name) snprintf(m->name, sizeof m->name, "%s", name);
    json_t *d = json_object_get(root, "defaults");
    if (d && (rc = vs__read_defaults(d, &m->defaults, manifest, err, errlen))) goto fail;
    if (roles & VS_ROLE_TARGET) {
      json_t *t = json_object_get(root, "target");
      if (!t) {
        snprintf(err, errlen, "%s: no \"target\" model", manifest);
        rc = VSPEC_EFORMAT;
        goto fail;
      }
      if ((rc = vs__load_role(reg, host, dev, dir, manifest, "target", t, &m->target, err,
                              errlen)))
        goto fail;
    }
    json_t *dr = json_object_get(root, "draft");
    if ((roles & VS_ROLE_DRAFT) && dr &&
        (rc = vs__load_role(reg, host, dev, dir, manifest, "draft", dr, &m->draft, err, errlen)))
      goto fail;
    json_t *ea = json_object_get(root, "eagle");
    if ((roles & VS_ROLE_EAGLE) && ea &&
        (rc = vs__load_role(reg, host, dev, dir, manifest, "eagle", ea, &m->eagle, err, errlen)))
      goto fail;
  } else if (roles & VS_ROLE_TARGET) {
    char gpt[2048], vq[2048], params[2100] = "";
    snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", dir);
    if (!vs__exists(gpt)) snprintf(gpt, sizeof gpt, "%s/target.safetensors", dir);
    if (!vs__exists(gpt)) {
      snprintf(err, errlen, "model directory '%s' has neither %s nor gpt.safetensors / "
               "target.safetensors", dir, VS_MANIFEST);
      rc = VSPEC_ENOENT;
      goto fail;
    }
    snprintf(vq, sizeof vq, "%s/vq.safetensors", dir);
    if (vs__exists(vq)) snprintf(params, sizeof params, "vq=%s", vq);
    if ((rc = vs_backend_model_load(reg, host, dev, "llamagen", gpt, params, &m->target, err,
                                    errlen)))
      goto fail;
  }
  if (m->target.model && m->target.info.codebook && m->target.info.token_dim > 0) {
    m->neighbours = vs_neighbours_build(m->target.info.codebook, m->target.info.vocab,
                                        m->target.info.token_dim, VS_NEIGHBOURS_K,
                                        &m->neighbours_k);
    if (!m->neighbours) {
      snprintf(err, errlen, "out of memory for the codebook neighbour table");
      rc = VSPEC_ENOMEM;
      goto fail;
    }
  }
  json_decref(root);
  *out = m;
  return VSPEC_OK;
fail:
  json_decref(root);
  vs_models_close(m);
  return rc;
}

void vs_models_close(vs_models *m) {
  if (!m) return;
  free(m->neighbours);
  vs_backend_model_unload(&m->eagle);
  vs_backend_model_unload(&m->draft);
  vs_backend_model_unload(&m->target);
  free(m);
}
