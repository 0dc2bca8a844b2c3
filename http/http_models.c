/*
 * http/http_models.c - GET /v1/models and GET /v1/models/{id}: the daemon's models in
 * OpenAI's shape ({"object": "list", "data": [{"id", "object": "model", "created",
 * "owned_by"}]}), from its StatusReply, each with what a caller needs to ask for an image in
 * the extension field "vspec": the classes (a prompt names one), the image size, the method
 * a request that names none runs with.
 */
#include "http/http_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "vspec/types.h"

/* One model as OpenAI's Model object. */
static json_t *models_model(const Vspec__ModelInfo *m, const Vspec__StatusReply *st,
                            const char *method, json_int_t created) {
  json_t *v = json_pack("{s:b,s:s}", "default",
                        st->default_model && m->name && !strcmp(st->default_model, m->name),
                        "default_method", method);
  if (m->has_num_classes) { /* loaded: what it makes is known */
    json_t *classes = json_array();
    for (size_t c = 0; c < m->num_classes; c++)
      json_array_append_new(classes, json_pack("{s:I,s:s?}", "label", (json_int_t)c, "name",
                                               c < m->n_class_names ? m->class_names[c] : NULL));
    json_object_set_new(v, "classes", classes);
    json_object_set_new(v, "width", json_integer(m->image_w));
    json_object_set_new(v, "height", json_integer(m->image_h));
    char size[32];
    snprintf(size, sizeof size, "%ux%u", m->image_w, m->image_h);
    json_object_set_new(v, "size", json_string(size));
    json_object_set_new(v, "grid", json_pack("[i,i]", (int)m->grid_h, (int)m->grid_w));
    json_object_set_new(v, "has_draft", json_boolean(m->has_draft));
    json_object_set_new(v, "has_eagle", json_boolean(m->has_eagle));
    json_object_set_new(v, "continuous", json_boolean(m->continuous));
  }
  if (m->has_generation) json_object_set_new(v, "generation", json_integer(m->generation));
  return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", m->name ? m->name : "", "object", "model",
                   "created", created, "owned_by", "vspec", "vspec", v);
}

void vs__http_models(vs_http *h, const char *id, vs_http_reply *r) {
  vs_conn_event e;
  char err[VSPEC_ERRLEN];
  if (!vs__http_status(h, &e, err, sizeof err)) {
    vs__http_error(r, 503, NULL, "the daemon's status: %s", err);
    r->retry_after_s = 1;
    return;
  }
  const Vspec__StatusReply *st = e.ev->status;
  /* OpenAI's "created" is when the model was made; here, when the daemon started serving */
  double up = st->totals && st->totals->has_uptime_s ? st->totals->uptime_s : 0;
  json_int_t created = (json_int_t)(time(NULL) - (time_t)up);
  json_t *data = json_array(), *one = NULL;
  for (size_t i = 0; i < st->n_models; i++) {
    const Vspec__ModelInfo *m = st->models[i];
    if (id && (!m->name || strcmp(m->name, id))) continue;
    json_t *o = models_model(m, st, h->cfg->method, created);
    if (id) one = o;
    else json_array_append_new(data, o);
  }
  if (id && !one) {
    size_t used = (size_t)snprintf(err, sizeof err, "model '%.100s' is not served here "
                                   "(models:", id);
    for (size_t i = 0; i < st->n_models && used + 1 < sizeof err; i++)
      used += (size_t)snprintf(err + used, sizeof err - used, " %s", st->models[i]->name);
    if (used + 1 < sizeof err) snprintf(err + used, sizeof err - used, ")");
    vs__http_error_code(r, 404, "model", "model_not_found", "%s", err);
    json_decref(data);
  } else if (id) {
    vs__http_json(r, 200, one);
    json_decref(data);
  } else {
    vs__http_json(r, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
  }
  vs_conn_event_free(&e);
}
