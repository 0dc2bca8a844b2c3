/*
 * What size=auto tunes for a method (core/autotune.h): the axes the method leaves open
 * (drafter, shape, size), the candidates of each (drafter, shape) family, and the spelling of
 * a choice ("drafter=model,shape=chain,depth=3") that the cache stores and checks.
 */
#include "core/autotune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/names.h"
#include "core/params.h"

/* The scheduler parameters that set a draft size: a method naming one is not tuned. */
static const char *const at_size_keys[] = {"size", "depth", "total_tokens", "tree"};

/* Static trees by name (plugins/sched/shape.h): verified nodes without the root, depth. */
static const struct {
  const char *name;
  int nodes, depth;
} at_static_trees[] = {
    {"chain1", 1, 1}, {"chain2", 2, 2}, {"chain3", 3, 3}, {"chain4", 4, 4},
    {"fmnist", 15, 4}, {"mc_sim_7b_63", 25, 5}, {"wide1", 4, 1}, {"wide2", 8, 2},
};
static const char *const at_chain_depths[] = {"1", "2", "3", "4", "5", "6", "7", "8"};
static const char *const at_dynamic_totals[] = {"2", "4", "8", "12", "16", "24", "32", "48", "58"};
/* The dynamic tree's expansion steps when the method names none (plugins/sched/shape.h):
 * its tree is at most one deeper. */
#define AT_DYNAMIC_STEPS 4

int vs_autotune_wanted(const vs_method *m) {
  return m->kind == VS_METHOD_SD && m->size == VS_METHOD_SIZE_AUTO;
}

int vs_autotune_default(vs_method *m, int continuous) {
  if (m->kind != VS_METHOD_SD || continuous || strcmp(m->sched, "standard") != 0) return 0;
  int named = m->size == VS_METHOD_SIZE_AUTO;
  for (size_t i = 0; i < sizeof at_size_keys / sizeof at_size_keys[0]; i++)
    named |= vs_param_string(&m->sched_set, at_size_keys[i]) != NULL;
  /* A drafter plugin (Jacobi decoding) keeps its own default window unless size=auto is
   * asked for by name: its tuning is a chain's depths only. */
  named |= vs_method_drafter(m) == VSPEC_DRAFTER_PLUGIN;
  if (named) return 0;
  char err[VSPEC_ERRLEN];
  char sp[sizeof m->sched_params];
  if ((size_t)snprintf(sp, sizeof sp, "%s%ssize=auto", m->sched_params,
                       *m->sched_params ? "," : "") >= sizeof sp)
    return 0;
  /* The spelling vs_method_parse would give m with size=auto written last among the
   * scheduler's parameters; the parameters themselves stay as they are. */
  char text[sizeof m->text];
  if ((size_t)vs_method_compose(m, sp, text, sizeof text) >= sizeof text ||
      vs_name_check(&vs_name_method, "method", text, err, sizeof err))
    return 0;
  memcpy(m->text, text, sizeof text);
  m->size = VS_METHOD_SIZE_AUTO;
  return 1;
}

/* Adds the family (drafter, shape) with its sizes. */
static void at_add_family(vs_at_space *sp, const char *drafter, const char *shape, int shape_id,
                          int free_shape) {
  vs_at_family *f = &sp->fam[sp->n_fam++];
  memset(f, 0, sizeof *f);
  f->drafter = drafter;
  f->shape = free_shape ? shape : NULL;
  f->shape_id = shape_id;
  if (shape_id == 0) {
    f->size_key = "depth";
    for (int i = 0; i < 8; i++) {
      f->sizes[f->n_sizes] = at_chain_depths[i];
      f->nodes[f->n_sizes] = i + 2;
      f->max_tokens[f->n_sizes++] = i + 2;
    }
  } else if (shape_id == 2) {
    f->size_key = "total_tokens";
    for (int i = 0; i < 9; i++) {
      int total = atoi(at_dynamic_totals[i]);
      f->sizes[f->n_sizes] = at_dynamic_totals[i];
      f->nodes[f->n_sizes] = total + 1;
      f->max_tokens[f->n_sizes++] =
          (total < AT_DYNAMIC_STEPS + 1 ? total : AT_DYNAMIC_STEPS + 1) + 1;
    }
  } else {
    /* A free shape leaves chainN to shape=chain, which drafts the same tokens. */
    f->size_key = "tree";
    for (size_t i = 0; i < sizeof at_static_trees / sizeof at_static_trees[0]; i++) {
      if (free_shape && !strncmp(at_static_trees[i].name, "chain", 5)) continue;
      f->sizes[f->n_sizes] = at_static_trees[i].name;
      f->nodes[f->n_sizes] = at_static_trees[i].nodes + 1;
      f->max_tokens[f->n_sizes++] = at_static_trees[i].depth + 1;
    }
  }
}

/* Whether the method's rule says it samples the target's distribution. */
static int at_rule_exact(vs_models *models, const char *rule) {
  vs_plugin *p;
  char err[VSPEC_ERRLEN];
  if (vs_registry_acquire(models->reg, VSPEC_PLUGIN_ACCEPT, rule, &p, err, sizeof err))
    return 0; /* the job fails with the registry's reason when it runs */
  int exact = (vs_plugin_desc(p)->flags & VSPEC_PLUGIN_EXACT) != 0;
  vs_plugin_release(p);
  return exact;
}

/* The drafter the method names for the tuning to keep (NULL: auto, the tuning's choice). */
static const char *at_named_drafter(const vspec_params *p) {
  const char *drafter = vs_param_string(p, "drafter");
  return drafter && !strcmp(drafter, "auto") ? NULL : drafter;
}

/* Whether the scheduler's parameter `key` stays in a tuned method: everything but the size
 * and the keys the tuning sets. */
static int at_kept(const vspec_params *p, const char *key) {
  return strcmp(key, "size") && (at_named_drafter(p) || strcmp(key, "drafter")) &&
         (vs_param_string(p, "shape") || strcmp(key, "shape"));
}

int vs__autotune_space(vs_models *models, const vs_method *m, vs_at_space *sp, char *err,
                       size_t errlen) {
  memset(sp, 0, sizeof *sp);
  const vspec_params *p = &m->sched_set;
  const char *shape = vs_param_string(p, "shape"), *drafter = at_named_drafter(p);
  size_t used = 0;
  for (size_t i = 0; i < vs_params_count(p); i++) {
    const char *k = vs_params_key(p, i);
    if (!at_kept(p, k)) continue;
    used += (size_t)snprintf(sp->rest + used, used < sizeof sp->rest ? sizeof sp->rest - used : 0,
                             "%s%s=%s", used ? "," : "", k, vs_params_value(p, i));
  }
  static const char *const drafters[] = {"model", "head"};
  int have[2] = {models->draft.model != NULL, models->eagle.model != NULL};
  /* A drafter plugin named (jacobi): its window is a chain's depth, tuned as one. */
  if (drafter && strcmp(drafter, "model") && strcmp(drafter, "head") &&
      (!shape || !strcmp(shape, "chain")))
    at_add_family(sp, NULL, "chain", 0, !shape);
  for (int d = 0; d < 2; d++) {
    if (drafter ? strcmp(drafter, drafters[d]) != 0 : !have[d]) continue;
    const char *dn = drafter ? NULL : drafters[d];
    if (!shape || !strcmp(shape, "chain")) at_add_family(sp, dn, "chain", 0, !shape);
    if (!shape || !strcmp(shape, "dynamic")) at_add_family(sp, dn, "dynamic", 2, !shape);
    if (!shape || !strcmp(shape, "static")) at_add_family(sp, dn, "static", 1, !shape);
  }
  if (sp->n_fam == 0) {
    snprintf(err, errlen, "size=auto: model '%s' has no drafter to tune (a draft model or an "
             "EAGLE head in its vspec-model.json)%s", models->name,
             shape && strcmp(shape, "chain") && strcmp(shape, "dynamic") && strcmp(shape, "static")
                 ? ", or the shape is not chain, dynamic or static" : "");
    return VSPEC_EINVAL;
  }
  sp->exact = at_rule_exact(models, m->rule);
  return VSPEC_OK;
}

void vs__autotune_param(const vs_at_space *sp, int fam, int size, char *out, size_t cap) {
  const vs_at_family *f = &sp->fam[fam];
  snprintf(out, cap, "%s%s%s%s%s%s%s=%s", f->drafter ? "drafter=" : "",
           f->drafter ? f->drafter : "", f->drafter ? "," : "", f->shape ? "shape=" : "",
           f->shape ? f->shape : "", f->shape ? "," : "", f->size_key, f->sizes[size]);
}

/* The family and size whose spelling is `choice`; 0 when none is. */
static int at_find(const vs_at_space *sp, const char *choice, int *fam, int *size) {
  char param[VS_AUTOTUNE_PARAM_LEN];
  for (int f = 0; f < sp->n_fam; f++)
    for (int s = 0; s < sp->fam[f].n_sizes; s++) {
      vs__autotune_param(sp, f, s, param, sizeof param);
      if (!strcmp(param, choice)) {
        *fam = f, *size = s;
        return 1;
      }
    }
  return 0;
}

int vs__autotune_valid(const vs_at_space *sp, const char *choice) {
  if (!strcmp(choice, VS_AUTOTUNE_AR)) return sp->exact;
  int f, s;
  return at_find(sp, choice, &f, &s);
}

/* The tuned method's drafter and scheduler parameters: what stays of m's, then the choice's
 * keys in the order they are spelt (vs__autotune_param), set from its family rather than read
 * back from the spelling. */
static int at_tuned_set(const vs_method *m, const vs_at_space *sp, const char *choice,
                        vs_method *out, char *err, size_t errlen) {
  const vspec_params *p = &m->sched_set;
  int f, s, rc = VSPEC_OK;
  if (!at_find(sp, choice, &f, &s)) {
    snprintf(err, errlen, "size=auto: %s is not a choice for %s", choice, m->text);
    return VSPEC_EINVAL;
  }
  const vs_at_family *fam = &sp->fam[f];
  /* The family names the drafter when the method left it open; else m's stays. */
  if (fam->drafter) snprintf(out->drafter, sizeof out->drafter, "%s", fam->drafter);
  vspec_params *o = &out->sched_set;
  char inner[VSPEC_ERRLEN];
  memset(o, 0, sizeof *o);
  for (size_t i = 0; !rc && i < vs_params_count(p); i++)
    if (at_kept(p, vs_params_key(p, i)))
      rc = vs_params_set(o, vs_params_key(p, i), vs_params_value(p, i), inner, sizeof inner);
  if (!rc && fam->drafter) rc = vs_params_set(o, "drafter", fam->drafter, inner, sizeof inner);
  if (!rc && fam->shape) rc = vs_params_set(o, "shape", fam->shape, inner, sizeof inner);
  if (!rc) rc = vs_params_set(o, fam->size_key, fam->sizes[s], inner, sizeof inner);
  /* as the scheduler said it when it parsed the spelling (a size key the method gave too) */
  if (rc) snprintf(err, errlen, "scheduler '%s': %s", m->sched, inner);
  return rc;
}

int vs__autotune_method(const vs_method *m, const vs_at_space *sp, const char *choice,
                        vs_method *out, char *err, size_t errlen) {
  if (!strcmp(choice, VS_AUTOTUNE_AR)) {
    vs_method_set_ar(out);
    return VSPEC_OK;
  }
  *out = *m;
  out->size = VS_METHOD_SIZE_FIXED;
  int rc = at_tuned_set(m, sp, choice, out, err, errlen);
  if (rc) return rc;
  size_t n = (size_t)snprintf(out->sched_params, sizeof out->sched_params, "%s%s%s", sp->rest,
                              *sp->rest ? "," : "", choice);
  if (n >= sizeof out->sched_params ||
      (size_t)vs_method_compose(out, out->sched_params, out->text, sizeof out->text) >=
          sizeof out->text) {
    snprintf(err, errlen, "size=auto: %s with %s is too long", m->text, choice);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}
