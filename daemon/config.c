#include "daemon/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/forward_gate.h"
#include "core/log.h"
#include "core/method.h"
#include "core/names.h"
#include "core/paths.h"
#include "kernels/vs_device.h"
#include "vspec/types.h"

void vs_config_defaults(vs_daemon_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->node, sizeof c->node, "vspecd");
  c->node_id = 0;
  snprintf(c->endpoint, sizeof c->endpoint, "tcp://127.0.0.1:5555");
  snprintf(c->admin_endpoint, sizeof c->admin_endpoint, "ipc:///tmp/vspecd-admin.sock");
  c->log_level = VSPEC_LOG_INFO;
  c->workers = 1;
  c->threads = 0;
  c->batch = 1;
  c->batch_wait_ms = 20;
  c->batch_lanes = 1;
  snprintf(c->device_kind, sizeof c->device_kind, "cpu");
  c->queue_size = 64;
  c->per_client = 16;
  c->busy_retry_ms = 1000;
  /* Next to the executable: the build tree's or an installed tree's (core/paths.h). */
  vs_default_plugin_dir(c->plugin_dir, sizeof c->plugin_dir);
  snprintf(c->models[0].name, sizeof c->models[0].name, "fmnist");
  vs_default_data_path("models/fmnist", c->models[0].dir, sizeof c->models[0].dir);
  c->n_models = 1;
  snprintf(c->default_model, sizeof c->default_model, "fmnist");
  snprintf(c->method, sizeof c->method, "ar");
  vs_method_set_ar(&c->default_method);
  c->auto_size = 1;
  c->preview_every_tokens = 0;
  c->credit = 8;
  c->progress_interval_ms = 20;
  /* Room for a LlamaGen t2i caption embedding (120 x 2048 fp32 = 0.94 MiB) in a blob frame;
   * class-conditional jobs need only the 64 KiB protobuf frame. A bigger limit is more memory
   * a peer can make the daemon hold (DESIGN.md, "Wire protocol rules"). */
  c->max_message_bytes = 4l << 20;
  c->max_request_bytes = 64l << 10;
  c->unpack_budget_bytes = 256l << 10;
  c->max_deadline_ms = 3600l * 1000;
  c->max_credit = 64;
  c->max_clients = 1024;
  c->heartbeat_ivl_ms = 1000;
  c->heartbeat_timeout_ms = 5000;
  c->drain = VS_DRAIN_FINISH;
  c->drain_timeout_ms = 30000;
  c->linger_ms = 1000;
  c->curve = 0;
  c->fleet_redis[0] = '\0';
  snprintf(c->fleet_stream, sizeof c->fleet_stream, "vspec:jobs");
  snprintf(c->fleet_group, sizeof c->fleet_group, "vspec");
  snprintf(c->fleet_events_prefix, sizeof c->fleet_events_prefix, "vspec:events:");
  c->fleet_events_ttl_s = 3600;
  c->fleet_heartbeat_ms = 1000;
  c->fleet_claim_idle_ms = VS_FLEET_CLAIM_HEARTBEATS * 1000;
  c->fleet_max_deliveries = 3;
  c->fleet_cancel_poll_ms = 250;
  c->http_listen[0] = '\0';
  c->http_allow_remote = 0;
  c->http_max_body_bytes = 65536;
  c->http_max_connections = 16;
  c->http_timeout_ms = 300000;
  c->http_request_deadline_ms = 10000;
  c->http_max_connections_per_address = 0;
}

static int cf_long(const char *key, const char *v, long lo, long hi, long *out, char *err,
                   size_t errlen) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi) {
    snprintf(err, errlen, "%s = '%s' is not an integer in [%ld, %ld]", key, v, lo, hi);
    return VSPEC_ERANGE;
  }
  *out = x;
  return VSPEC_OK;
}

static int cf_int(const char *key, const char *v, long lo, long hi, int *out, char *err,
                  size_t errlen) {
  long x;
  int rc = cf_long(key, v, lo, hi, &x, err, errlen);
  if (!rc) *out = (int)x;
  return rc;
}

static int cf_bool(const char *key, const char *v, int *out, char *err, size_t errlen) {
  if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1")) {
    *out = 1;
  } else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0")) {
    *out = 0;
  } else {
    snprintf(err, errlen, "%s = '%s' is not a boolean (true/false)", key, v);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

static int cfg_str(const char *key, const char *v, char *dst, size_t cap, char *err,
                   size_t errlen) {
  if (strlen(v) >= cap) {
    snprintf(err, errlen, "%s is longer than %zu characters", key, cap - 1);
    return VSPEC_ERANGE;
  }
  snprintf(dst, cap, "%s", v);
  return VSPEC_OK;
}

static int cf_endpoint(const char *key, const char *v, char *dst, size_t cap, char *err,
                       size_t errlen) {
  if (strncmp(v, "tcp://", 6) && strncmp(v, "ipc://", 6) && strncmp(v, "inproc://", 9)) {
    snprintf(err, errlen, "%s = '%s' is not a ZeroMQ endpoint (tcp://, ipc://)", key, v);
    return VSPEC_EINVAL;
  }
  return cfg_str(key, v, dst, cap, err, errlen);
}

int vs_config_model(const vs_daemon_config *c, const char *name) {
  for (int i = 0; i < c->n_models; i++)
    if (!strcmp(c->models[i].name, name)) return i;
  return -1;
}

/* One function per section: the key k of section s set to v, or CFG_UNKNOWN_KEY. */
#define CFG_UNKNOWN_KEY 1

static int cfg_server(vs_daemon_config *c, const char *key, const char *k, const char *v,
                      char *err, size_t errlen) {
  if (!strcmp(k, "node")) {
    /* The node's name goes out in every Accepted and Result: a model name's set. */
    if (vs_name_check(&vs_name_model, key, v, err, errlen)) return VSPEC_EINVAL;
    return cfg_str(key, v, c->node, sizeof c->node, err, errlen);
  }
  if (!strcmp(k, "node_id")) {
    int x;
    int rc = cf_int(key, v, 0, 65535, &x, err, errlen);
    if (!rc) c->node_id = (unsigned)x;
    return rc;
  }
  if (!strcmp(k, "endpoint"))
    return cf_endpoint(key, v, c->endpoint, sizeof c->endpoint, err, errlen);
  if (!strcmp(k, "admin_endpoint"))
    return cf_endpoint(key, v, c->admin_endpoint, sizeof c->admin_endpoint, err, errlen);
  if (!strcmp(k, "admin_allow_remote"))
    return cf_bool(key, v, &c->admin_allow_remote, err, errlen);
  if (!strcmp(k, "log_level")) {
    int l = vs_log_parse_level(v);
    if (l < 0) {
      snprintf(err, errlen, "%s = '%s' is not one of error, warn, info, debug", key, v);
      return VSPEC_EINVAL;
    }
    c->log_level = l;
    return VSPEC_OK;
  }
  return CFG_UNKNOWN_KEY;
}

static int cfg_workers(vs_daemon_config *c, const char *key, const char *k, const char *v,
                       char *err, size_t errlen) {
  if (!strcmp(k, "count")) return cf_int(key, v, 1, 256, &c->workers, err, errlen);
  if (!strcmp(k, "threads")) return cf_int(key, v, 0, 1024, &c->threads, err, errlen);
  if (!strcmp(k, "batch")) return cf_int(key, v, 1, 64, &c->batch, err, errlen);
  if (!strcmp(k, "batch_wait_ms"))
    return cf_int(key, v, 1, 10000, &c->batch_wait_ms, err, errlen);
  if (!strcmp(k, "batch_lanes"))
    return cf_int(key, v, 1, VS_FORWARD_GATE_MAX_LANES, &c->batch_lanes, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_device(vs_daemon_config *c, const char *key, const char *k, const char *v,
                      char *err, size_t errlen) {
  if (!strcmp(k, "kind")) {
    if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
      snprintf(err, errlen, "%s = '%s' is not one of cpu, cuda", key, v);
      return VSPEC_EINVAL;
    }
    return cfg_str(key, v, c->device_kind, sizeof c->device_kind, err, errlen);
  }
  if (!strcmp(k, "index")) return cf_int(key, v, 0, 1023, &c->device_index, err, errlen);
  if (!strcmp(k, "memory_limit_mb"))
    return cf_long(key, v, 0, 1l << 30, &c->device_memory_mb, err, errlen);
  if (!strcmp(k, "precision")) {
    if (!strcmp(v, "default")) c->device_precision = VS_PRECISION_DEFAULT;
    else if (!strcmp(v, "fp32")) c->device_precision = VS_PRECISION_FP32;
    else if (!strcmp(v, "bf16")) c->device_precision = VS_PRECISION_BF16;
    else {
      snprintf(err, errlen, "%s = '%s' is not one of default, fp32, bf16", key, v);
      return VSPEC_EINVAL;
    }
    return VSPEC_OK;
  }
  return CFG_UNKNOWN_KEY;
}

static int cfg_queue(vs_daemon_config *c, const char *key, const char *k, const char *v,
                     char *err, size_t errlen) {
  if (!strcmp(k, "size")) return cf_int(key, v, 1, 1 << 20, &c->queue_size, err, errlen);
  if (!strcmp(k, "per_client")) return cf_int(key, v, 1, 1 << 20, &c->per_client, err, errlen);
  if (!strcmp(k, "busy_retry_ms"))
    return cf_int(key, v, 1, 3600000, &c->busy_retry_ms, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_plugins(vs_daemon_config *c, const char *key, const char *k, const char *v,
                       char *err, size_t errlen) {
  if (!strcmp(k, "dir")) return cfg_str(key, v, c->plugin_dir, sizeof c->plugin_dir, err, errlen);
  if (!strcmp(k, "on_demand")) return cf_bool(key, v, &c->plugins_on_demand, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_models(vs_daemon_config *c, const char *key, const char *k, const char *v,
                      char *err, size_t errlen) {
  if (!strcmp(k, "default")) {
    if (vs_name_check(&vs_name_model, key, v, err, errlen)) return VSPEC_EINVAL;
    return cfg_str(key, v, c->default_model, sizeof c->default_model, err, errlen);
  }
  /* Names clients will send (Submit.model): the same set as the submit checks. */
  if (vs_name_check(&vs_name_model, "model name", k, err, errlen)) return VSPEC_EINVAL;
  int i = vs_config_model(c, k);
  if (i < 0) {
    if (c->n_models == VS_CONF_MAX_MODELS) {
      snprintf(err, errlen, "more than %d models", VS_CONF_MAX_MODELS);
      return VSPEC_ERANGE;
    }
    i = c->n_models++;
    snprintf(c->models[i].name, sizeof c->models[i].name, "%s", k);
  }
  /* An empty directory removes a model (e.g. the built-in fmnist entry). */
  if (!*v) {
    c->models[i] = c->models[--c->n_models];
    return VSPEC_OK;
  }
  return cfg_str(key, v, c->models[i].dir, sizeof c->models[i].dir, err, errlen);
}

static int cfg_defaults(vs_daemon_config *c, const char *key, const char *k, const char *v,
                        char *err, size_t errlen) {
  if (!strcmp(k, "method")) {
    vs_method m;
    int rc = vs_method_parse(v, &m, err, errlen);
    if (!rc) rc = cfg_str(key, v, c->method, sizeof c->method, err, errlen);
    if (!rc) c->default_method = m;
    return rc;
  }
  if (!strcmp(k, "auto_size")) return cf_bool(key, v, &c->auto_size, err, errlen);
  if (!strcmp(k, "preview_table")) {
    if (strcmp(v, "fit") && strcmp(v, "exact")) {
      snprintf(err, errlen, "%s = '%s': expected fit or exact", key, v);
      return VSPEC_EINVAL;
    }
    c->preview_table_exact = !strcmp(v, "exact");
    return VSPEC_OK;
  }
  if (!strcmp(k, "preview_every_tokens"))
    return cf_int(key, v, 0, 1 << 20, &c->preview_every_tokens, err, errlen);
  if (!strcmp(k, "credit")) return cf_int(key, v, 1, 1024, &c->credit, err, errlen);
  if (!strcmp(k, "progress_interval_ms"))
    return cf_int(key, v, 0, 60000, &c->progress_interval_ms, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_limits(vs_daemon_config *c, const char *key, const char *k, const char *v,
                      char *err, size_t errlen) {
  if (!strcmp(k, "max_message_bytes"))
    return cf_long(key, v, 1024, 1l << 30, &c->max_message_bytes, err, errlen);
  if (!strcmp(k, "max_request_bytes"))
    return cf_long(key, v, 256, 1l << 30, &c->max_request_bytes, err, errlen);
  if (!strcmp(k, "unpack_budget_bytes"))
    return cf_long(key, v, 4096, 1l << 30, &c->unpack_budget_bytes, err, errlen);
  if (!strcmp(k, "max_deadline_ms"))
    return cf_long(key, v, 1, 7l * 24 * 3600 * 1000, &c->max_deadline_ms, err, errlen);
  if (!strcmp(k, "max_credit")) return cf_int(key, v, 1, 1024, &c->max_credit, err, errlen);
  if (!strcmp(k, "max_clients"))
    return cf_int(key, v, 1, 1 << 20, &c->max_clients, err, errlen);
  if (!strcmp(k, "heartbeat_ivl_ms"))
    return cf_int(key, v, 10, 3600000, &c->heartbeat_ivl_ms, err, errlen);
  if (!strcmp(k, "heartbeat_timeout_ms"))
    return cf_int(key, v, 10, 3600000, &c->heartbeat_timeout_ms, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_shutdown(vs_daemon_config *c, const char *key, const char *k, const char *v,
                        char *err, size_t errlen) {
  if (!strcmp(k, "drain")) {
    if (!strcmp(v, "finish")) c->drain = VS_DRAIN_FINISH;
    else if (!strcmp(v, "cancel")) c->drain = VS_DRAIN_CANCEL;
    else {
      snprintf(err, errlen, "%s = '%s' is not 'finish' or 'cancel'", key, v);
      return VSPEC_EINVAL;
    }
    return VSPEC_OK;
  }
  if (!strcmp(k, "timeout_ms"))
    return cf_int(key, v, 0, 24 * 3600 * 1000, &c->drain_timeout_ms, err, errlen);
  if (!strcmp(k, "linger_ms")) return cf_int(key, v, 0, 600000, &c->linger_ms, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_curve(vs_daemon_config *c, const char *key, const char *k, const char *v,
                     char *err, size_t errlen) {
  if (!strcmp(k, "enabled")) return cf_bool(key, v, &c->curve, err, errlen);
  if (!strcmp(k, "secret_key_file"))
    return cfg_str(key, v, c->curve_secret_file, sizeof c->curve_secret_file, err, errlen);
  if (!strcmp(k, "allowed_clients"))
    return cfg_str(key, v, c->curve_allow_file, sizeof c->curve_allow_file, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_fleet(vs_daemon_config *c, const char *key, const char *k, const char *v,
                     char *err, size_t errlen) {
  if (!strcmp(k, "redis")) return cfg_str(key, v, c->fleet_redis, sizeof c->fleet_redis, err, errlen);
  if (!strcmp(k, "stream"))
    return cfg_str(key, v, c->fleet_stream, sizeof c->fleet_stream, err, errlen);
  if (!strcmp(k, "group"))
    return cfg_str(key, v, c->fleet_group, sizeof c->fleet_group, err, errlen);
  if (!strcmp(k, "events_prefix"))
    return cfg_str(key, v, c->fleet_events_prefix, sizeof c->fleet_events_prefix, err, errlen);
  if (!strcmp(k, "events_ttl_s"))
    return cf_long(key, v, 1, 30l * 24 * 3600, &c->fleet_events_ttl_s, err, errlen);
  if (!strcmp(k, "heartbeat_ms"))
    return cf_int(key, v, 50, 60000, &c->fleet_heartbeat_ms, err, errlen);
  if (!strcmp(k, "claim_idle_ms"))
    return cf_int(key, v, 300, 24 * 3600 * 1000, &c->fleet_claim_idle_ms, err, errlen);
  if (!strcmp(k, "max_deliveries"))
    return cf_int(key, v, 1, 1000, &c->fleet_max_deliveries, err, errlen);
  if (!strcmp(k, "cancel_poll_ms"))
    return cf_int(key, v, 10, 60000, &c->fleet_cancel_poll_ms, err, errlen);
  return CFG_UNKNOWN_KEY;
}

static int cfg_http(vs_daemon_config *c, const char *key, const char *k, const char *v,
                    char *err, size_t errlen) {
  if (!strcmp(k, "listen"))
    return cfg_str(key, v, c->http_listen, sizeof c->http_listen, err, errlen);
  if (!strcmp(k, "allow_remote")) return cf_bool(key, v, &c->http_allow_remote, err, errlen);
  if (!strcmp(k, "max_body_bytes"))
    return cf_long(key, v, 1024, 16l << 20, &c->http_max_body_bytes, err, errlen);
  if (!strcmp(k, "max_connections"))
    return cf_int(key, v, 1, 1024, &c->http_max_connections, err, errlen);
  if (!strcmp(k, "timeout_ms"))
    return cf_int(key, v, 100, 24 * 3600 * 1000, &c->http_timeout_ms, err, errlen);
  if (!strcmp(k, "request_deadline_ms"))
    return cf_int(key, v, 100, 3600 * 1000, &c->http_request_deadline_ms, err, errlen);
  if (!strcmp(k, "max_connections_per_address"))
    return cf_int(key, v, 0, 1024, &c->http_max_connections_per_address, err, errlen);
  return CFG_UNKNOWN_KEY;
}
static const struct {
  const char *name;
  int (*set)(vs_daemon_config *c, const char *key, const char *k, const char *v, char *err,
             size_t errlen);
} cfg_sections[] = {
    {"server", cfg_server},
    {"workers", cfg_workers},
    {"device", cfg_device},
    {"queue", cfg_queue},
    {"plugins", cfg_plugins},
    {"models", cfg_models},
    {"defaults", cfg_defaults},
    {"limits", cfg_limits},
    {"shutdown", cfg_shutdown},
    {"curve", cfg_curve},
    {"fleet", cfg_fleet},
    {"http", cfg_http},
};

int vs_config_set(vs_daemon_config *c, const char *s, const char *k, const char *v, char *err,
                  size_t errlen) {
  char key[160];
  snprintf(key, sizeof key, "%s.%s", s, k);
  for (size_t i = 0; i < sizeof cfg_sections / sizeof cfg_sections[0]; i++) {
    if (strcmp(s, cfg_sections[i].name)) continue;
    int rc = cfg_sections[i].set(c, key, k, v, err, errlen);
    if (rc != CFG_UNKNOWN_KEY) return rc;
    snprintf(err, errlen, "unknown key '%s' in section [%s]", k, s);
    return VSPEC_EINVAL;
  }
  snprintf(err, errlen, "unknown section [%s] (known: server, workers, queue, plugins, models, "
           "defaults, limits, shutdown, curve, fleet, http)", s);
  return VSPEC_EINVAL;
}

typedef struct cf_ini_ctx {
  vs_daemon_config *c;
  const char *path;
  char *err;
  size_t errlen;
  int rc;
} cf_ini_ctx;

static int cf_ini_handler(void *user, const char *section, const char *name, const char *value) {
  cf_ini_ctx *x = user;
  if (x->rc) return 0;
  char inner[VSPEC_ERRLEN];
  int rc = vs_config_set(x->c, section, name, value, inner, sizeof inner);
  if (rc) {
    x->rc = rc;
    snprintf(x->err, x->errlen, "%s: %s", x->path, inner);
    return 0;
  }
  return 1;
}

/* inih's answer (0, the first bad line, or < 0 when it could not read at all) into a status
 * and a message naming the source and the line. */
static int cf_ini_result(const cf_ini_ctx *x, int line, char *err, size_t errlen) {
  if (x->rc) {
    size_t n = strlen(err);
    if (line > 0 && n + 16 < errlen) snprintf(err + n, errlen - n, " (line %d)", line);
    return x->rc;
  }
  if (line < 0) {
    snprintf(err, errlen, "%s: cannot read it (out of memory)", x->path);
    return VSPEC_ENOMEM;
  }
  if (line != 0) {
    snprintf(err, errlen, "%s: syntax error on line %d", x->path, line);
    return VSPEC_EFORMAT;
  }
  return VSPEC_OK;
}

int vs_config_load(vs_daemon_config *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot open config %s: %s", path, strerror(errno));
    return VSPEC_ENOENT;
  }
  cf_ini_ctx x = {.c = c, .path = path, .err = err, .errlen = errlen};
  int line = ini_parse_file(f, cf_ini_handler, &x);
  fclose(f);
  return cf_ini_result(&x, line, err, errlen);
}

int vs_config_load_text(vs_daemon_config *c, const char *text, const char *name, char *err,
                        size_t errlen) {
  cf_ini_ctx x = {.c = c, .path = name, .err = err, .errlen = errlen};
  return cf_ini_result(&x, ini_parse_string(text, cf_ini_handler, &x), err, errlen);
}

int vs_config_set_arg(vs_daemon_config *c, const char *arg, char *err, size_t errlen) {
  const char *dot = strchr(arg, '.'), *eq = strchr(arg, '=');
  if (!dot || !eq || dot > eq || dot == arg || eq == dot + 1) {
    snprintf(err, errlen, "--set '%s': expected section.key=value", arg);
    return VSPEC_EINVAL;
  }
  char s[64], k[128];
  if ((size_t)(dot - arg) >= sizeof s || (size_t)(eq - dot - 1) >= sizeof k) {
    snprintf(err, errlen, "--set '%s': section or key too long", arg);
    return VSPEC_EINVAL;
  }
  memcpy(s, arg, (size_t)(dot - arg));
  s[dot - arg] = 0;
  memcpy(k, dot + 1, (size_t)(eq - dot - 1));
  k[eq - dot - 1] = 0;
  return vs_config_set(c, s, k, eq + 1, err, errlen);
}

/* Whether only this machine can reach an endpoint bound there, with file permissions doing
 * the rest for ipc: an ipc socket file (not an abstract "@name", which has no permissions),
 * inproc, or tcp on a loopback address. */
static int cf_local_endpoint(const char *ep) {
  if (!strncmp(ep, "inproc://", 9)) return 1;
  if (!strncmp(ep, "ipc://", 6)) return ep[6] && ep[6] != '@';
  if (strncmp(ep, "tcp://", 6)) return 0;
  const char *host = ep + 6, *colon = strrchr(host, ':');
  if (!colon || colon == host) return 0;
  char h[128];
  size_t n = (size_t)(colon - host);
  if (host[0] == '[' && n >= 2 && host[n - 1] == ']') host++, n -= 2;
  if (n >= sizeof h) return 0;
  memcpy(h, host, n);
  h[n] = 0;
  if (!strcmp(h, "localhost")) return 1;
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, h, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, h, &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  return 0; /* "*", 0.0.0.0, an interface name, another host */
}

void vs_config_device_spec(const vs_daemon_config *c, char *spec, size_t len) {
  if (!strcmp(c->device_kind, "cuda")) snprintf(spec, len, "cuda:%d", c->device_index);
  else snprintf(spec, len, "cpu");
}

int vs_config_check(const vs_daemon_config *c, char *err, size_t errlen) {
  if (!strcmp(c->device_kind, "cpu") &&
      (c->device_index != 0 || c->device_memory_mb != 0)) {
    snprintf(err, errlen, "[device] kind = cpu takes no index or memory_limit_mb (they are for "
             "kind = cuda)");
    return VSPEC_EINVAL;
  }
  if (c->batch > c->workers) {
    snprintf(err, errlen, "[workers] batch = %d needs count >= %d: a batched forward holds the "
             "jobs of different workers, one each (count = %d)", c->batch, c->batch, c->workers);
    return VSPEC_EINVAL;
  }
  if (c->n_models == 0) {
    snprintf(err, errlen, "no models configured ([models] NAME = DIR)");
    return VSPEC_EINVAL;
  }
  if (vs_config_model(c, c->default_model) < 0) {
    snprintf(err, errlen, "the default model '%s' is not in [models]", c->default_model);
    return VSPEC_EINVAL;
  }
  if (!strcmp(c->endpoint, c->admin_endpoint)) {
    snprintf(err, errlen, "the admin endpoint must differ from the job endpoint (%s)",
             c->endpoint);
    return VSPEC_EINVAL;
  }
  if (!c->admin_allow_remote && !cf_local_endpoint(c->admin_endpoint)) {
    snprintf(err, errlen, "server.admin_endpoint = %s can be reached from other machines or "
             "by any local user (admin requests reload plugins and cancel any job): use an ipc "
             "socket file or a loopback tcp address, or set server.admin_allow_remote = true",
             c->admin_endpoint);
    return VSPEC_EINVAL;
  }
  if (c->curve && (!*c->curve_secret_file || !*c->curve_allow_file)) {
    snprintf(err, errlen, "[curve] enabled needs secret_key_file and allowed_clients");
    return VSPEC_EINVAL;
  }
  if (c->max_request_bytes > c->max_message_bytes) {
    snprintf(err, errlen, "limits.max_request_bytes (%ld) is over limits.max_message_bytes (%ld)",
             c->max_request_bytes, c->max_message_bytes);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}
