/*
 * Fuzz target: what vspecd does with a message a peer sends to its job or admin endpoint,
 * up to the point where the server's own state (clients, the queue) comes in:
 *
 *   the frames, through a real ROUTER (inproc), read by vs_wire_recv_request (envelope,
 *   delimiter, frame counts and sizes), then vs_wire_unpack_request under the daemon's
 *   allocator budget (protobuf, version, blob descriptors against the frames), then per body
 *   what daemon/server.c runs: vs_submit_build for a submit (every field against the models
 *   and the loaded plugins, rule and scheduler created with their parameters), and
 *   vs_plugin_ref_parse for an admin reload.
 *
 * The daemon's context is real: the micro test models (class-conditional with a VQ decoder,
 * one drafting for itself, a text-conditional one taking captions, a continuous-token one)
 * served by the plugins of this build, and the daemon's config with smaller limits, so
 * that the size checks are reached by inputs of a few KB.
 *
 * Input: the frames the peer sends, each as a 2-byte little-endian length and its bytes (a
 * length past the end takes the rest; at most 8 frames). tests/fuzz/request_seeds.c writes
 * the seed corpus in this form.
 *
 * Checks beyond "no crash": a refused message comes with an error code and a message;
 * unpacking, failed or not, returns every byte it took from the budget; a job that was built
 * has a method whose canonical text parses again into the same method, credit, and a preview
 * kind in range.
 */
#include "tests/fuzz/fuzz.h"

#include <errno.h>
#include <sys/stat.h>
#include <zmq.h>

#include "core/host.h"
#include "core/log.h"
#include "core/method.h"
#include "daemon/config.h"
#include "daemon/model_set.h"
#include "daemon/plugin_ref.h"
#include "daemon/submit.h"
#include "kernels/vs_kernels.h"

#define MAX_FRAMES 8

static vs_daemon_config cfg;
static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;
static vs_model_table *models;
static vs_submit_ctx ctx;
static void *zctx, *router, *dealer;
static char tmp_dir[64];
static uint64_t next_id;
static int verbose; /* VSPEC_FUZZ_VERBOSE=1: say what each input came to (checking seeds) */

static void say(const char *what, const char *err) {
  if (verbose) fprintf(stderr, "fuzz_request: %s%s%s\n", what, *err ? ": " : "", err);
}

static void die(const char *what, const char *err) {
  fprintf(stderr, "fuzz_request: %s: %s\n", what, err);
  exit(1);
}

static void set(const char *section, const char *key, const char *value) {
  char err[VSPEC_ERRLEN];
  if (vs_config_set(&cfg, section, key, value, err, sizeof err)) die("config", err);
}

/* The models are in memory once loaded: the directory made for them can go. */
static void remove_tmp(void) {
  const char *names[] = {"self/vspec-model.json", "self/gpt.safetensors", "self/vq.safetensors",
                         "self", ""};
  for (int i = 0; i < 5; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, names[i]);
    if (remove(path)) die(path, strerror(errno));
  }
}

/* The micro model drafting for itself (as tests/support/daemon_harness.c serves it): a model
 * with a draft role, so that speculative methods pass submission. */
static void make_self_model(const char *micro) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/vspec-fuzz-XXXXXX");
  if (!mkdtemp(tmp_dir)) die("mkdtemp", strerror(errno));
  char path[1200];
  snprintf(path, sizeof path, "%s/self", tmp_dir);
  if (mkdir(path, 0755)) die(path, strerror(errno));
  snprintf(path, sizeof path, "%s/self/vspec-model.json", tmp_dir);
  /* Files are relative to the manifest's directory: the micro model's, by links. */
  const char *files[] = {"gpt.safetensors", "vq.safetensors"};
  FILE *f = fopen(path, "w");
  if (!f) die(path, strerror(errno));
  fputs("{\"name\": \"self\", \"target\": {\"backend\": \"llamagen\", \"gpt\": \"gpt.safetensors\", "
        "\"vq\": \"vq.safetensors\"}, \"draft\": {\"backend\": \"llamagen\", \"gpt\": "
        "\"gpt.safetensors\"}}\n", f);
  fclose(f);
  for (int i = 0; i < 2; i++) {
    char src[1200], dst[200];
    snprintf(src, sizeof src, "%s/%s", micro, files[i]);
    snprintf(dst, sizeof dst, "%s/self/%s", tmp_dir, files[i]);
    if (symlink(src, dst)) die(dst, strerror(errno));
  }
}

static void model(const char *name, const char *rel) {
  char abs[VS_CONF_PATH];
  if (!realpath(rel, abs)) die(rel, "not found (run from the repository root)");
  set("models", name, abs);
}

/* At the end of a run (libFuzzer exits through exit()): the registry removes its private
 * directory of plugin copies under /tmp. */
static void close_all(void) {
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(zctx);
  vs_model_table_close(models);
  vs_registry_close(reg);
}

static void open_sockets(void) {
  zctx = zmq_ctx_new();
  router = zmq_socket(zctx, ZMQ_ROUTER);
  dealer = zmq_socket(zctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
  if (!router || !dealer || zmq_bind(router, "inproc://fuzz-request") ||
      zmq_connect(dealer, "inproc://fuzz-request"))
    die("zmq", zmq_strerror(errno));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  char err[VSPEC_ERRLEN], build[1024], plugins[1100], micro[VS_CONF_PATH];
  vs_log_set_level(VSPEC_LOG_ERROR);
  verbose = getenv("VSPEC_FUZZ_VERBOSE") != NULL;
  vs_fuzz_build_dir(build, sizeof build);
  snprintf(plugins, sizeof plugins, "%s/plugins", build);
  vs_config_defaults(&cfg);
  set("plugins", "dir", plugins);
  set("models", "fmnist", "");
  model("micro", "tests/golden/micro_c2i");
  model("t2i", "tests/golden/micro_t2i");
  model("mar", "tests/golden/micro_mar");
  if (!realpath("tests/golden/micro_c2i", micro)) die("micro_c2i", "not found");
  make_self_model(micro);
  char self[128];
  snprintf(self, sizeof self, "%s/self", tmp_dir);
  set("models", "self", self);
  set("models", "default", "micro");
  /* Small limits: the size checks must be within reach of inputs of a few KB. A t2i caption
   * (120 x 16 floats) still fits in a blob frame. */
  set("limits", "max_request_bytes", "4096");
  set("limits", "max_message_bytes", "16384");
  set("limits", "unpack_budget_bytes", "8192");
  if (vs_config_check(&cfg, err, sizeof err)) die("config", err);

  vs_host_init(&host, vs_cpu_ops());
  if (vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err)) die("device", err);
  if (vs_registry_open(cfg.plugin_dir, &host, &reg, err, sizeof err)) die("plugins", err);
  if (vs_registry_scan(reg)) die("plugins", "some failed to load");
  if (vs_model_table_open(reg, &host, dev, &cfg, &models, err, sizeof err)) die("models", err);
  vs_model_status st[VS_CONF_MAX_MODELS];
  int n = vs_model_table_status(models, st, VS_CONF_MAX_MODELS);
  for (int i = 0; i < n; i++)
    if (!st[i].loaded) die(st[i].name, st[i].error);
  remove_tmp();
  ctx = (vs_submit_ctx){.cfg = &cfg, .models = models, .reg = reg, .host = &host};
  open_sockets();
  atexit(close_all);
  return 0;
}

/* Sends the input's frames from the DEALER; returns how many. */
static int send_frames(const uint8_t *data, size_t size) {
  const uint8_t *frame[MAX_FRAMES];
  size_t len[MAX_FRAMES];
  int n = 0;
  while (size && n < MAX_FRAMES) {
    size_t want = size >= 2 ? (size_t)(data[0] | data[1] << 8) : 0;
    size_t skip = size >= 2 ? 2 : size;
    data += skip, size -= skip;
    frame[n] = data;
    len[n] = want < size && n + 1 < MAX_FRAMES ? want : size;
    data += len[n], size -= len[n];
    n++;
  }
  for (int i = 0; i < n; i++)
    VS_FUZZ_REQUIRE(zmq_send(dealer, frame[i], len[i], (i + 1 < n ? ZMQ_SNDMORE : 0) |
                             ZMQ_DONTWAIT) == (int)len[i], "send: %s", zmq_strerror(errno));
  return n;
}

static void check_job(const vs_djob *j, const Vspec__Submit *s) {
  /* the job carries the method built at submission; its text (printed for logs and results)
   * says what it is: parsed, it gives the same method */
  vs_method me;
  char err[VSPEC_ERRLEN];
  const vs_method *jm = &j->method;
  VS_FUZZ_REQUIRE(vs_method_parse(jm->text, &me, err, sizeof err) == 0,
                  "the job's method '%s' does not parse again: %s", jm->text, err);
  VS_FUZZ_REQUIRE(me.kind == jm->kind && me.size == jm->size && !strcmp(me.rule, jm->rule) &&
                      !strcmp(me.rule_params, jm->rule_params) && !strcmp(me.sched, jm->sched) &&
                      !strcmp(me.sched_params, jm->sched_params) &&
                      !strcmp(me.drafter, jm->drafter) &&
                      !strcmp(me.drafter_params, jm->drafter_params),
                  "the job's method is not what its text '%s' says", jm->text);
  /* ... and the sets parsed at submission are what that text's parameters parse to */
  const vspec_params *built[] = {&jm->rule_set, &jm->sched_set, &jm->drafter_set},
                     *again[] = {&me.rule_set, &me.sched_set, &me.drafter_set};
  for (int i = 0; i < 3; i++) {
    char a[600], b[600];
    vs_params_format(built[i], a, sizeof a);
    vs_params_format(again[i], b, sizeof b);
    VS_FUZZ_REQUIRE(!strcmp(a, b), "the job's method '%s' holds '%s', its text parses to '%s'",
                    jm->text, a, b);
  }
  VS_FUZZ_REQUIRE(j->lp.credit >= 1 && j->lp.credit <= cfg.max_credit, "credit %d",
                  j->lp.credit);
  VS_FUZZ_REQUIRE(j->preview_kind >= 0 && j->preview_kind <= 3, "preview %d", j->preview_kind);
  VS_FUZZ_REQUIRE(s->has_seed || j->seed < (1ull << 53), "drawn seed %llu",
                  (unsigned long long)j->seed);
}

/* What req_handle in daemon/server_requests.c does with a received message, minus the server. */
static void handle(const vs_wire_msg *m) {
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, (size_t)cfg.unpack_budget_bytes);
  int code = 0;
  char err[VSPEC_ERRLEN] = "";
  Vspec__Request *r = vs_wire_unpack_request(m, &a, &code, err, sizeof err);
  if (!r) {
    say("unpack refused", err);
    VS_FUZZ_REQUIRE(code && err[0], "refused without a code (%d) or message", code);
    VS_FUZZ_REQUIRE(a.used == 0, "%zu bytes of a refused unpack not returned", a.used);
    return;
  }
  if (r->body_case == VSPEC__REQUEST__BODY_SUBMIT) {
    code = 0;
    err[0] = 0;
    vs_djob *j = vs_submit_build(&ctx, r, m, ++next_id, &code, err, sizeof err);
    say(j ? "submit accepted" : "submit refused", err);
    if (j) {
      check_job(j, r->submit);
      vs_djob_release(j);
    } else {
      VS_FUZZ_REQUIRE(code && err[0], "submit refused without a code (%d) or message", code);
    }
  } else if (r->body_case == VSPEC__REQUEST__BODY_RELOAD) {
    int kind;
    char name[64];
    err[0] = 0;
    int bad = vs_plugin_ref_parse(r->reload->name, &kind, name, err, sizeof err);
    say(bad ? "reload refused" : "reload parsed", err);
    if (bad)
      VS_FUZZ_REQUIRE(err[0], "reload name refused without a message");
    else
      VS_FUZZ_REQUIRE(name[0] && strlen(name) < 64 && kind >= -1 && kind <= VSPEC_PLUGIN_DRAFTER,
                      "reload '%s' -> kind %d, '%s'", r->reload->name, kind, name);
  } else {
    say("other request", "");
  }
  vs_wire_request_free(r, &a);
  VS_FUZZ_REQUIRE(a.used == 0, "%zu bytes of the budget not returned", a.used);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  vs_fuzz_rss_tick();
  if (!send_frames(data, size)) return 0;
  vs_wire_msg m;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_wire_recv_request(router, 1, &m, (size_t)cfg.max_request_bytes,
                                (size_t)cfg.max_message_bytes, err, sizeof err);
  /* inproc hands the message over within the send */
  VS_FUZZ_REQUIRE(rc != 0, "the message sent was not there to read");
  if (rc < 0) {
    say("malformed", err);
    VS_FUZZ_REQUIRE(rc == VSPEC_EFORMAT || rc == VSPEC_ERANGE, "socket error %d: %s", rc, err);
    VS_FUZZ_REQUIRE(err[0], "malformed message refused without a message");
    VS_FUZZ_REQUIRE(m.env.n >= 1, "the sender's routing id was lost");
  } else {
    handle(&m);
    vs_wire_msg_close(&m);
  }
  VS_FUZZ_REQUIRE(vs_wire_recv_request(router, 1, &m, 1, 1, err, sizeof err) == 0,
                  "a second message from one send");
  return 0;
}
