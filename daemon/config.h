/*
 * daemon/config.h - vspecd's configuration: etc/vspecd.conf (INI) plus command-line
 * overrides.
 *
 * Every key has a default, so vspecd runs without a file. Unknown sections and keys are
 * errors (a typo must not silently fall back to a default). Relative paths are relative to
 * the working directory (the systemd unit sets WorkingDirectory=). `--set section.key=value`
 * on the command line goes through the same parser as the file.
 */
#ifndef VS_DAEMON_CONFIG_H
#define VS_DAEMON_CONFIG_H

#include <stddef.h>

#include "core/method.h"

#define VS_CONF_MAX_MODELS 16
#define VS_CONF_PATH 1024

typedef struct vs_model_conf {
  char name[64];
  char dir[VS_CONF_PATH];
} vs_model_conf;

enum { VS_DRAIN_FINISH = 0, VS_DRAIN_CANCEL = 1 };

typedef struct vs_daemon_config {
  /* [server] */
  char node[64];              /* name in logs, Accepted and Result events */
  unsigned node_id;           /* high bits of job ids, so daemons sharing clients differ */
  char endpoint[256];         /* the job endpoint (ROUTER) */
  char admin_endpoint[256];   /* the admin endpoint: ipc (a file) or loopback tcp ... */
  int admin_allow_remote;     /* ... unless this is set (any tcp address, abstract ipc) */
  int log_level;              /* VSPEC_LOG_* */
  /* [workers] */
  int workers;                /* worker threads, each with its own device context */
  int threads;                /* compute threads per worker; 0 = cores / workers (and of
                                 the batch device with batch > 1; 0 = cores there) */
  int batch;                  /* jobs per batched target forward; 1 = no cross-job batching */
  int batch_wait_ms;          /* the longest a ready forward waits for the other jobs' */
  int batch_lanes;            /* batches that may run at once, each on a share of the cores */
  /* [device] */
  char device_kind[16];       /* "cpu" or "cuda" */
  int device_index;           /* which GPU (cuda:N) */
  long device_memory_mb;      /* bytes the daemon may hold on the GPU, in MiB; 0 = no limit */
  int device_precision;       /* VS_PRECISION_*: 0 = the device's default */
  /* [queue] */
  int queue_size;             /* jobs waiting (running ones not counted) */
  int per_client;             /* jobs (waiting + running) one client may have */
  int busy_retry_ms;          /* retry hint in a "busy" error */
  /* [plugins] */
  char plugin_dir[VS_CONF_PATH];
  int plugins_on_demand;      /* a job naming a plugin not loaded yet loads it (default off) */
  /* [models] */
  vs_model_conf models[VS_CONF_MAX_MODELS];
  int n_models;
  char default_model[64];
  /* [defaults] */
  char method[512];           /* when a submit names no method: as written (GET /v1/models) */
  vs_method default_method;   /* ... and as parsed at load, what such a submit's job gets */
  int auto_size;              /* a speculative method naming no draft size gets size=auto
                                 (defaults.auto_size, default on; core/autotune.h) */
  int preview_every_tokens;   /* 0 = tokens_total / 8, at least 1 */
  int preview_table_exact;    /* 1: the colour table decodes every code (daemon/preview.h);
                                 0: fitted from a few decodes (daemon/preview_fit.h) */
  int credit;                 /* when a submit names no credit */
  int progress_interval_ms;   /* when a submit names none: progress events at most this often */
  /* [limits] */
  long max_message_bytes;     /* ZMQ_MAXMSGSIZE of both ROUTERs (per frame) */
  long max_request_bytes;     /* the protobuf frame of a request */
  long unpack_budget_bytes;   /* what unpacking one request may allocate */
  long max_deadline_ms;
  int max_credit;
  int max_clients;
  int heartbeat_ivl_ms;       /* idle-client probes (Heartbeat events), TCP keepalive */
  int heartbeat_timeout_ms;   /* TCP_USER_TIMEOUT; a client that takes nothing this long is gone */
  /* [shutdown] */
  int drain;                  /* VS_DRAIN_FINISH or VS_DRAIN_CANCEL for running jobs */
  int drain_timeout_ms;       /* then running jobs are cancelled anyway */
  int linger_ms;              /* ZMQ_LINGER at exit: how long final events may take to flush */
  /* [curve] */
  int curve;                  /* CURVE on the job endpoint */
  char curve_secret_file[VS_CONF_PATH]; /* the server's secret key, Z85 */
  char curve_allow_file[VS_CONF_PATH];  /* allowed client public keys, Z85, one per line */
  /* [fleet] (DESIGN.md "Fleet mode"): off while redis is "" */
  char fleet_redis[512];      /* redis://[[user]:password@]host[:port][/db] or a unix socket */
  char fleet_stream[65];      /* the jobs stream */
  char fleet_group[65];       /* the daemons' consumer group */
  char fleet_events_prefix[65];
  long fleet_events_ttl_s;    /* a job's events expire this long after the last one */
  int fleet_heartbeat_ms;     /* refresh of running jobs' claims, and sweep for lost ones */
  int fleet_claim_idle_ms;    /* a job idle this long on another daemon is taken over;
                                 at least VS_FLEET_CLAIM_HEARTBEATS heartbeats */
  int fleet_max_deliveries;   /* a job delivered more often than this is failed (poison) */
  int fleet_cancel_poll_ms;   /* how often running jobs' cancel flags are looked at */
  /* [http] (DESIGN.md "HTTP endpoint"): off while listen is "" */
  char http_listen[128];      /* HOST:PORT (IPv4, [IPv6] or localhost); port 0 = any free one */
  int http_allow_remote;      /* listen on an address other machines can reach */
  long http_max_body_bytes;   /* a request body over this is refused (413) */
  int http_max_connections;   /* HTTP connections at once (each is a thread) */
  int http_timeout_ms;        /* a generation request is cancelled after this long (504) */
  int http_request_deadline_ms; /* a request (headers and body) must arrive within this */
  int http_max_connections_per_address; /* 0 = automatic (http/http_guard.c) */
} vs_daemon_config;

void vs_config_defaults(vs_daemon_config *c);
/* "cpu" or "cuda:N", for vs_device_open. */
void vs_config_device_spec(const vs_daemon_config *c, char *spec, size_t len);
/* Reads an INI file over the current values. Returns 0 or a negative status; the message
 * names the file, line, section and key. */
int vs_config_load(vs_daemon_config *c, const char *path, char *err, size_t errlen);
/* The same for the text of a config file (NUL-terminated); `name` stands for the path in
 * messages. For the fuzzer (tests/fuzz/fuzz_config.c). */
int vs_config_load_text(vs_daemon_config *c, const char *text, const char *name, char *err,
                        size_t errlen);
/* Sets one key ("server", "endpoint", "tcp://...") - the file parser and --set use it. */
int vs_config_set(vs_daemon_config *c, const char *section, const char *key, const char *value,
                  char *err, size_t errlen);
/* "section.key=value" */
int vs_config_set_arg(vs_daemon_config *c, const char *arg, char *err, size_t errlen);
/* Cross-key checks after everything is read (a default model that exists, CURVE files, an
 * admin endpoint that only this machine can reach unless admin_allow_remote). The sections
 * of the fronts above the service are checked by theirs: [fleet] by vs_fleet_config_check
 * (fleet/fleet_config.h), [http] by vs_http_config_check (http/http_server.h). */
int vs_config_check(const vs_daemon_config *c, char *err, size_t errlen);
/* [fleet] claim_idle_ms >= this many heartbeat_ms: a live daemon keeps its jobs through two
 * refreshes missed or late (DESIGN.md, "Fleet mode"). */
#define VS_FLEET_CLAIM_HEARTBEATS 3
/* Index of model `name` or -1. */
int vs_config_model(const vs_daemon_config *c, const char *name);

#endif /* VS_DAEMON_CONFIG_H */
