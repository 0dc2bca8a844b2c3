/*
 * tests/test_http.c - vspecd's HTTP endpoint ([http]; DESIGN.md "HTTP endpoint"), driven
 * with curl as its users would: /health, /metrics (the exposition's shape, and a completed
 * job counted), POST /v1/images/generations (a PNG of the model's size, as base64 JSON and
 * raw; the daemon's own error messages as 400s; 404, 405, 413), prompts matched to a class
 * (revised_prompt), GET /v1/models, n images with consecutive seeds, sizes served by
 * enlarging, a full queue's 429, every error in OpenAI's shape, the jobs of an HTTP client
 * that disconnects being cancelled, and 503s while the daemon drains. tests/python/
 * test_openai.py drives the same endpoint with OpenAI's own Python SDK.
 *
 * One daemon for the whole file, on 127.0.0.1 port 0 (the port is read from its log). The
 * plain build generates with the shipped models/fmnist; under the sanitizers, where its
 * load is slow, with the micro test model.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "tests/support/daemon_harness.h"
#include "tests/support/raw_http.h"

static vs_fixture fx;
static vs_daemon dm;
static int g_port;
static const char *g_model; /* served and used for generations */

#ifdef VSPEC_SANITIZED
#define FULL 0
#else
#define FULL 1
#endif

/* ---- curl ---------------------------------------------------------------------------------- */

typedef struct reply {
  int code;
  char *body; /* NUL-terminated (binary bodies too: len says how long) */
  size_t len;
} reply;

static void reply_free(reply *r) {
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* Runs curl with the arguments (NULL-terminated) plus the body and status options and the
 * URL of `path`; bounded by max_s. The status is 0 when curl got no answer. */
static reply curl_run(const char *path, double max_s, const char *const *args) {
  char url[256], out[300], code[300], maxt[32];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", g_port, path);
  snprintf(out, sizeof out, "%s/curl.body", fx.dir);
  snprintf(code, sizeof code, "%s/curl.code", fx.dir);
  snprintf(maxt, sizeof maxt, "%g", max_s);
  unlink(out);
  const char *argv[40] = {"curl", "-s", "--max-time", maxt, "-o", out, "-w", "%{http_code}"};
  int n = 8;
  for (int i = 0; args && args[i] && n < 37; i++) argv[n++] = args[i];
  argv[n++] = url;
  argv[n] = NULL;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    FILE *f = freopen(code, "w", stdout);
    (void)f;
    execvp("curl", (char *const *)argv);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  reply r = {0};
  FILE *f = fopen(code, "r");
  if (f) {
    if (fscanf(f, "%d", &r.code) != 1) r.code = 0;
    fclose(f);
  }
  f = fopen(out, "rb");
  if (f) {
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    r.body = calloc(1, (size_t)(len > 0 ? len : 0) + 1);
    r.len = fread(r.body, 1, (size_t)(len > 0 ? len : 0), f);
    fclose(f);
  } else {
    r.body = calloc(1, 1);
  }
  return r;
}

static reply curl_get(const char *path) { return curl_run(path, 10, NULL); }

static reply curl_post(const char *path, const char *json) {
  const char *args[] = {"-X", "POST", "-H", "Content-Type: application/json", "--data-binary",
                        json, NULL};
  return curl_run(path, 30, args);
}

/* ---- helpers ------------------------------------------------------------------------------- */

/* The value of one sample line of /metrics ("name{labels}" exactly), or -1. */
static double metric(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

static double metric_now(const char *series) {
  reply r = curl_get("/metrics");
  assert_int_equal(r.code, 200);
  double v = metric(r.body, series);
  reply_free(&r);
  return v;
}

/* Width and height from a PNG's IHDR, after checking its signature. */
static void png_size(const unsigned char *p, size_t len, int *w, int *h) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  assert_true(len > 24);
  assert_memory_equal(p, sig, 8);
  assert_memory_equal(p + 12, "IHDR", 4);
  *w = (p[16] << 24) | (p[17] << 16) | (p[18] << 8) | p[19];
  *h = (p[20] << 24) | (p[21] << 16) | (p[22] << 8) | p[23];
}

static const char *g_code; /* the next expect_error's error.code (NULL: any word) */

/* An OpenAI-style error with this status whose message contains `needle` and whose param is
 * `param` (NULL: not checked). */
static void expect_error(reply *r, int code, const char *needle, const char *param) {
  const char *want_code = g_code;
  g_code = NULL; /* for this call only, also when it fails */
  if (r->code != code) fail_msg("status %d, expected %d: %s", r->code, code, r->body);
  json_error_t je;
  json_t *j = json_loads(r->body, 0, &je);
  assert_non_null(j);
  json_t *e = json_object_get(j, "error");
  assert_non_null(e);
  const char *msg = json_string_value(json_object_get(e, "message"));
  assert_non_null(msg);
  if (!strstr(msg, needle)) fail_msg("message '%s' does not name '%s'", msg, needle);
  assert_non_null(json_string_value(json_object_get(e, "type")));
  const char *c = json_string_value(json_object_get(e, "code"));
  assert_non_null(c);
  if (want_code) assert_string_equal(c, want_code);
  if (param) assert_string_equal(json_string_value(json_object_get(e, "param")), param);
  json_decref(j);
  reply_free(r);
}

static int read_port(const char *log) {
  for (int i = 0; i < 100; i++) {
    FILE *f = fopen(log, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
      const char *p = strstr(line, "[http] listening on http://127.0.0.1:");
      if (p) {
        fclose(f);
        return atoi(p + strlen("[http] listening on http://127.0.0.1:"));
      }
    }
    if (f) fclose(f);
    vs_harness_sleep_ms(50);
  }
  return 0;
}

static int setup(void **state) {
  vs_fixture_make(&fx);
  static char fm[1200], cache[1200];
  if (FULL) {
    /* models/fmnist's preview colour table takes seconds to build: it is kept between runs
     * in the build tree, keyed (core/disk_cache.h) by the model's files, never stale. */
    char cwd[1000];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(cache, sizeof cache, "%s/%s/tests/http-cache", cwd, vs_harness_build());
    setenv("VSPEC_CACHE_DIR", cache, 1);
    snprintf(fm, sizeof fm, "models.fmnist=%s/models/fmnist", cwd);
  }
  /* a short queue, for test_queue_full's 429 */
  const char *extra[] = {"--set", "http.listen=127.0.0.1:0", "--set", "queue.size=4", "--set",
                         FULL ? fm : "http.timeout_ms=30000", NULL};
  vs_daemon_start(&dm, &fx, "http", extra);
  g_port = read_port(dm.log);
  if (!g_port) {
    vs_daemon_dump_log(&dm);
    fail_msg("no HTTP port in the log");
  }
  g_model = FULL ? "fmnist" : "micro";
  return 0;
}

static int teardown(void **state) {
  int rc = vs_daemon_stop(&dm, 15, 10000);
  if (rc != 0) vs_daemon_dump_log(&dm);
  vs_fixture_remove(&fx);
  assert_int_equal(rc, 0);
  return 0;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_health(void **state) {
  reply r = curl_get("/health");
  assert_int_equal(r.code, 200);
  assert_non_null(strstr(r.body, "\"status\":\"ok\""));
  reply_free(&r);
}

/* Every sample belongs to a family announced with HELP and TYPE; counters end in _total. */
static void test_metrics_format(void **state) {
  reply r = curl_get("/metrics");
  assert_int_equal(r.code, 200);
  char fam[128] = "", type[32] = "";
  int samples = 0;
  for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
    if (!strncmp(line, "# HELP ", 7)) continue;
    if (!strncmp(line, "# TYPE ", 7)) {
      assert_int_equal(sscanf(line + 7, "%127s %31s", fam, type), 2);
      if (!strcmp(type, "counter")) assert_non_null(strstr(fam, "_total"));
      continue;
    }
    size_t n = strlen(fam);
    if (strncmp(line, fam, n) || (line[n] != ' ' && line[n] != '{'))
      fail_msg("sample '%s' outside its family %s", line, fam);
    char *sp = strrchr(line, ' ');
    assert_non_null(sp);
    char *end;
    strtod(sp + 1, &end);
    if (*end) fail_msg("sample '%s' has no number", line);
    samples++;
  }
  assert_true(samples > 20);
  reply_free(&r);
  r = curl_get("/metrics");
  assert_true(metric(r.body, "vspec_jobs_total{state=\"submitted\"}") >= 0);
  assert_true(metric(r.body, "vspec_jobs_total{state=\"rejected\"}") >= 0);
  assert_true(metric(r.body, "vspec_queue_capacity") > 0);
  assert_non_null(strstr(r.body, "vspec_plugin_generation{kind=\"accept\",name=\"exact\"} 1"));
  reply_free(&r);
}

static void test_generate(void **state) {
  double before = metric_now("vspec_jobs_total{state=\"completed\"}");
  assert_true(before >= 0);
  char body[200];
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"class\":3,\"method\":\"ar\",\"seed\":7}",
           g_model);
  reply r = curl_post("/v1/images/generations", body);
  if (r.code != 200) fail_msg("status %d: %s", r.code, r.body);
  json_error_t je;
  json_t *j = json_loads(r.body, 0, &je);
  assert_non_null(j);
  assert_true(json_is_integer(json_object_get(j, "created")));
  json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
  const char *b64 = json_string_value(json_object_get(d0, "b64_json"));
  assert_non_null(b64);
  /* the class taken: its name where the model names its classes */
  assert_string_equal(json_string_value(json_object_get(d0, "revised_prompt")),
                      FULL ? "Dress" : "class 3");
  json_t *vs = json_object_get(j, "vspec");
  assert_string_equal(json_string_value(json_object_get(vs, "method")), "ar");
  assert_string_equal(json_string_value(json_object_get(vs, "seed")), "7");
  assert_string_equal(json_string_value(json_object_get(vs, "model")), g_model);
  assert_true(json_real_value(json_object_get(vs, "tpf")) > 0.99); /* AR: one per forward */
  size_t cap = strlen(b64), len = 0;
  unsigned char *png = malloc(cap);
  assert_int_equal(sodium_base642bin(png, cap, b64, strlen(b64), NULL, &len, NULL,
                                     sodium_base64_VARIANT_ORIGINAL), 0);
  int w, h;
  png_size(png, len, &w, &h);
  assert_int_equal(w, json_integer_value(json_object_get(vs, "width")));
  assert_int_equal(h, json_integer_value(json_object_get(vs, "height")));
  if (FULL) {
    assert_int_equal(w, 32);
    assert_int_equal(h, 32);
  }
  json_decref(j);
  reply_free(&r);
  /* The same request as a raw PNG: the same seed draws the same bytes. */
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"class\":3,\"method\":\"ar\",\"seed\":7,"
           "\"response_format\":\"png\"}", g_model);
  r = curl_post("/v1/images/generations", body);
  assert_int_equal(r.code, 200);
  int w2, h2;
  png_size((unsigned char *)r.body, r.len, &w2, &h2);
  assert_int_equal(w2, w);
  assert_int_equal(r.len, len);
  assert_memory_equal(r.body, png, len);
  free(png);
  reply_free(&r);
  assert_true(metric_now("vspec_jobs_total{state=\"completed\"}") == before + 2);
  assert_true(metric_now("vspec_method_completed_jobs_total{method=\"ar\"}") >= 2);

  /* What the daemon tells a job's client about how it ran comes back in vspec.notes: a
   * size=auto method on the harness's self-drafting micro model (tuned in under a second)
   * reports its choice; an AR job has nothing to say. */
  r = curl_post("/v1/images/generations",
                "{\"model\":\"self\",\"method\":\"sd:coolsd:delta=2@standard:shape=chain,"
                "size=auto\",\"seed\":3}");
  if (r.code != 200) fail_msg("status %d: %s", r.code, r.body);
  j = json_loads(r.body, 0, &je);
  assert_non_null(j);
  json_t *notes = json_object_get(json_object_get(j, "vspec"), "notes");
  assert_int_equal(json_array_size(notes), 1);
  assert_non_null(strstr(json_string_value(json_array_get(notes, 0)), "size=auto: chose "));
  json_decref(j);
  reply_free(&r);
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"class\":3,\"method\":\"ar\",\"seed\":7}",
           g_model);
  r = curl_post("/v1/images/generations", body);
  j = json_loads(r.body, 0, &je);
  assert_non_null(j);
  assert_int_equal(json_array_size(json_object_get(json_object_get(j, "vspec"), "notes")), 0);
  json_decref(j);
  reply_free(&r);
}

static void test_bad_requests(void **state) {
  const char *gen = "/v1/images/generations";
  reply r = curl_post(gen, "{\"class\": 1,");
  expect_error(&r, 400, "not valid JSON", NULL);
  r = curl_post(gen, "{\"class\":1,\"method\":\"bogus\"}");
  expect_error(&r, 400, "'bogus'", "method");
  char body[120];
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"class\":99}", g_model);
  r = curl_post(gen, body);
  expect_error(&r, 400, "99", "class");
  r = curl_post(gen, "{\"n\":11}");
  expect_error(&r, 400, "n: expected an integer 1..10", "n");
  g_code = "unknown_parameter";
  r = curl_post(gen, "{\"colour\":\"red\"}");
  expect_error(&r, 400, "unknown field 'colour'", "colour");
  r = curl_post(gen, "{\"response_format\":\"url\"}");
  expect_error(&r, 400, "keeps no images", "response_format");
  r = curl_post(gen, "{\"output_format\":\"jpeg\"}");
  expect_error(&r, 400, "PNG", "output_format");
  r = curl_post(gen, "{\"background\":\"transparent\"}");
  expect_error(&r, 400, "opaque", "background");
  r = curl_post(gen, "{\"class\":1,\"n\":2,\"response_format\":\"png\"}");
  expect_error(&r, 400, "one raw image", "response_format");
  g_code = "invalid_json";
  r = curl_post(gen, "[1,2]");
  expect_error(&r, 400, "JSON object", NULL);
  r = curl_get(gen);
  expect_error(&r, 405, "POST", NULL);
  g_code = "not_found";
  r = curl_get("/v2/nothing");
  expect_error(&r, 404, "/v2/nothing", NULL);
  /* 70 kB, over the default 64 KiB */
  char path[300];
  snprintf(path, sizeof path, "%s/big.json", fx.dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"user\":\"", f);
  for (int i = 0; i < 70000; i++) fputc('a', f);
  fputs("\"}", f);
  fclose(f);
  char at[310];
  snprintf(at, sizeof at, "@%s", path);
  const char *args[] = {"-X", "POST", "--data-binary", at, NULL};
  r = curl_run(gen, 10, args);
  expect_error(&r, 413, "max_body_bytes", NULL);
  /* and the daemon still serves */
  r = curl_get("/health");
  assert_int_equal(r.code, 200);
  reply_free(&r);
}

/* POSTs a generation that must succeed; its JSON answer. */
static json_t *generate_ok(const char *body) {
  reply r = curl_post("/v1/images/generations", body);
  if (r.code != 200) fail_msg("status %d for %s: %s", r.code, body, r.body);
  json_error_t je;
  json_t *j = json_loads(r.body, 0, &je);
  assert_non_null(j);
  reply_free(&r);
  return j;
}

static const char *revised(json_t *j, size_t i) {
  return json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), i),
                                           "revised_prompt"));
}

/* A prompt is matched to a class by the daemon (core/class_prompt.h): a name, a number, a
 * name in a sentence; an unknown one is a 400 that lists the classes. The micro model of the
 * sanitizer build names no classes: numbers only. */
static void test_prompt(void **state) {
  char body[300];
  const struct {
    const char *prompt, *want;
  } ok[] = {{"sneaker", "Sneaker"}, {"7", "Sneaker"}, {"a photo of an ankle boot", "Ankle boot"},
            {"two pairs of Trousers", "Trouser"}};
  for (size_t i = 0; FULL && i < sizeof ok / sizeof ok[0]; i++) {
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"model\":\"fmnist\",\"seed\":1}",
             ok[i].prompt);
    json_t *j = generate_ok(body);
    assert_string_equal(revised(j, 0), ok[i].want);
    json_decref(j);
  }
  snprintf(body, sizeof body, "{\"prompt\":\"2\",\"model\":\"%s\",\"seed\":1}", g_model);
  json_t *j = generate_ok(body);
  assert_string_equal(revised(j, 0), FULL ? "Pullover" : "class 2");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "vspec"), "class")), 2);
  json_decref(j);
  /* "class" wins over a prompt (OpenAI's clients must send one) */
  snprintf(body, sizeof body, "{\"prompt\":\"x\",\"class\":1,\"model\":\"%s\"}", g_model);
  j = generate_ok(body);
  assert_string_equal(revised(j, 0), FULL ? "Trouser" : "class 1");
  json_decref(j);
  snprintf(body, sizeof body, "{\"prompt\":\"a red car\",\"model\":\"%s\"}", g_model);
  reply r = curl_post("/v1/images/generations", body);
  g_code = "unknown_class";
  expect_error(&r, 400, FULL ? "(classes: 0 T-shirt/top, 1 Trouser" : "this model names none",
               "prompt");
  if (FULL) {
    r = curl_post("/v1/images/generations", "{\"prompt\":\"a snekaer\",\"model\":\"fmnist\"}");
    expect_error(&r, 400, "did you mean 'Sneaker'?", "prompt");
    r = curl_post("/v1/images/generations", "{\"prompt\":\"a bag and a coat\",\"model\":\"fmnist\"}");
    expect_error(&r, 400, "names more than one class of model 'fmnist' (Bag, Coat)", "prompt");
  }
}

/* GET /v1/models: OpenAI's list, each model's classes, size and default method in "vspec". */
static void test_models(void **state) {
  reply r = curl_get("/v1/models");
  assert_int_equal(r.code, 200);
  json_error_t je;
  json_t *j = json_loads(r.body, 0, &je);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
  json_t *data = json_object_get(j, "data"), *m = NULL;
  assert_true(json_array_size(data) >= 2); /* micro, self (and fmnist) */
  for (size_t i = 0; i < json_array_size(data); i++)
    if (!strcmp(json_string_value(json_object_get(json_array_get(data, i), "id")), g_model))
      m = json_array_get(data, i);
  assert_non_null(m);
  assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
  assert_string_equal(json_string_value(json_object_get(m, "owned_by")), "vspec");
  assert_true(json_integer_value(json_object_get(m, "created")) > 1600000000);
  json_t *v = json_object_get(m, "vspec");
  assert_non_null(json_string_value(json_object_get(v, "default_method")));
  assert_true(json_integer_value(json_object_get(v, "width")) > 0);
  json_t *classes = json_object_get(v, "classes");
  assert_true(json_array_size(classes) > 0);
  if (FULL)
    assert_string_equal(json_string_value(json_object_get(json_array_get(classes, 7), "name")),
                        "Sneaker");
  json_decref(j);
  reply_free(&r);
  char path[100];
  snprintf(path, sizeof path, "/v1/models/%s", g_model);
  r = curl_get(path);
  assert_int_equal(r.code, 200);
  assert_non_null(strstr(r.body, "\"object\":\"model\""));
  reply_free(&r);
  r = curl_get("/v1/models/dall-e-3");
  g_code = "model_not_found";
  expect_error(&r, 404, "'dall-e-3' is not served here", "model");
}

/* n images: n jobs with consecutive seeds, in one answer; a size that is a multiple of the
 * model's is served enlarged, another is a 400 naming the allowed ones. */
static void test_n_and_size(void **state) {
  char body[300];
  snprintf(body, sizeof body, "{\"prompt\":\"1\",\"model\":\"%s\",\"n\":3,\"seed\":100}",
           g_model);
  json_t *j = generate_ok(body);
  json_t *data = json_object_get(j, "data");
  assert_int_equal(json_array_size(data), 3);
  for (size_t i = 0; i < 3; i++) {
    char want[8];
    snprintf(want, sizeof want, "%zu", 100 + i);
    json_t *v = json_object_get(json_array_get(data, i), "vspec");
    assert_string_equal(json_string_value(json_object_get(v, "seed")), want);
    assert_string_equal(json_string_value(json_array_get(
                            json_object_get(json_object_get(j, "vspec"), "seeds"), i)), want);
  }
  int w = (int)json_integer_value(json_object_get(json_object_get(j, "vspec"), "width"));
  int h = (int)json_integer_value(json_object_get(json_object_get(j, "vspec"), "height"));
  assert_true(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) >
              0);
  json_decref(j);
  snprintf(body, sizeof body, "{\"class\":1,\"model\":\"%s\",\"size\":\"%dx%d\","
           "\"response_format\":\"png\"}", g_model, 3 * w, 3 * h);
  reply r = curl_post("/v1/images/generations", body);
  assert_int_equal(r.code, 200);
  int pw, ph;
  png_size((unsigned char *)r.body, r.len, &pw, &ph);
  assert_int_equal(pw, 3 * w);
  assert_int_equal(ph, 3 * h);
  reply_free(&r);
  snprintf(body, sizeof body, "{\"class\":1,\"model\":\"%s\",\"size\":\"%dx%d\"}", g_model,
           w + 1, h + 1);
  r = curl_post("/v1/images/generations", body);
  char allowed[100];
  snprintf(allowed, sizeof allowed, "(allowed: auto, %dx%d, %dx%d", w, h, 2 * w, 2 * h);
  g_code = "unsupported_size";
  expect_error(&r, 400, allowed, "size");
}

/* "stream": true is OpenAI's server-sent events: here one completed image per job, in order
 * (the partial images are tests/python/test_openai.py's, with the SDK). */
static void test_stream(void **state) {
  char body[200];
  snprintf(body, sizeof body, "{\"prompt\":\"1\",\"model\":\"%s\",\"n\":2,\"stream\":true}",
           g_model);
  const char *args[] = {"-N", "-X", "POST", "--data-binary", body, NULL};
  reply r = curl_run("/v1/images/generations", 30, args);
  assert_int_equal(r.code, 200);
  const char *a = strstr(r.body, "event: image_generation.completed\ndata: {\"type\":"
                                 "\"image_generation.completed\",\"b64_json\":\"iVBOR");
  assert_non_null(a);
  assert_non_null(strstr(a + 1, "event: image_generation.completed\n"));
  assert_null(strstr(r.body, "event: error"));
  reply_free(&r);
}

/* More images than the queue holds: a 429 with Retry-After (OpenAI's clients retry it), and
 * the jobs already queued are cancelled rather than left to run. */
static void test_queue_full(void **state) {
  double before = metric_now("vspec_jobs_total{state=\"cancelled\"}");
  char hdr[300];
  snprintf(hdr, sizeof hdr, "%s/curl.headers", fx.dir);
  const char *args[] = {"-X", "POST", "-D", hdr, "--data-binary",
                        "{\"model\":\"self\",\"class\":1,\"n\":10,"
                        "\"method\":\"sd:exact@slow:ms=300,depth=1\"}", NULL};
  reply r = curl_run("/v1/images/generations", 10, args);
  g_code = "queue_full";
  expect_error(&r, 429, "", NULL);
  FILE *f = fopen(hdr, "r");
  assert_non_null(f);
  char line[256];
  int retry = 0;
  while (fgets(line, sizeof line, f)) retry |= !strncasecmp(line, "Retry-After: ", 13);
  fclose(f);
  assert_true(retry);
  /* the 4 queued (and the 1 running, if a worker took it before the others came) are
   * cancelled: the daemon is soon idle */
  double end = vs_harness_now() + 10, now = before;
  int idle = 0;
  while (vs_harness_now() < end && !idle) {
    reply h = curl_get("/health");
    idle = strstr(h.body, "\"queued\":0,\"running\":0") != NULL;
    reply_free(&h);
    if (!idle) vs_harness_sleep_ms(100);
  }
  now = metric_now("vspec_jobs_total{state=\"cancelled\"}");
  if (!idle || now < before + 4 || now > before + 5)
    fail_msg("idle %d, cancelled jobs %g -> %g", idle, before, now);
}

/* A client that gives up (curl's --max-time) has its jobs cancelled, all n of them, not run
 * to the end. */
static void test_disconnect_cancels(void **state) {
  double before = metric_now("vspec_jobs_total{state=\"cancelled\"}");
  const char *args[] = {"-X", "POST", "--data-binary",
                        "{\"model\":\"self\",\"class\":1,\"n\":3,"
                        "\"method\":\"sd:exact@slow:ms=300,depth=1\"}", NULL};
  reply r = curl_run("/v1/images/generations", 0.5, args);
  assert_int_equal(r.code, 0); /* no answer: curl gave up */
  reply_free(&r);
  double end = vs_harness_now() + 10, now = before;
  while (vs_harness_now() < end && (now = metric_now("vspec_jobs_total{state=\"cancelled\"}")) <
                                       before + 3)
    vs_harness_sleep_ms(100);
  if (now != before + 3) {
    vs_daemon_dump_log(&dm);
    fail_msg("cancelled jobs %g -> %g", before, now);
  }
}

/* Requests a proxy in front may frame or read otherwise than libmicrohttpd (smuggling; issue
 * 32, finding 3), sent as raw bytes: each is refused, whether MHD refuses it itself or the
 * endpoint does (http_headers.c, and "class" as a JSON integer in http_generate.c). */
static void test_strict_requests(void **state) {
  static const char body[] = "{\"class\":1,\"method\":\"ar\",\"response_format\":\"png\"}";
  char ok_body[160];
  snprintf(ok_body, sizeof ok_body, "{\"class\":1,\"model\":\"%s\",\"method\":\"ar\"}", g_model);
  const struct {
    const char *what, *headers; /* extra header lines, each ending in \r\n */
    int content_length;         /* send Content-Length of the body */
    const char *body;           /* NULL: body above */
    int status;
  } cases[] = {
      {"the control", "", 1, ok_body, 200},
      {"two different Content-Lengths", "Content-Length: 5\r\n", 1, NULL, 400},
      {"the same Content-Length twice", "Content-Length: 48\r\n", 1, NULL, 400},
      {"Content-Length as a list (MHD)", "Content-Length: 48, 48\r\n", 0, NULL, 400},
      {"Transfer-Encoding with Content-Length", "Transfer-Encoding: chunked\r\n", 1, NULL, 400},
      {"Transfer-Encoding gzip", "Transfer-Encoding: gzip\r\n", 1, NULL, 501},
      {"a control character in a value", "X-A: a\001b\r\n", 1, NULL, 400},
      {"DEL in a value", "X-A: a\177b\r\n", 1, NULL, 400},
      {"a bare CR in a value", "X-A: a\rb\r\n", 1, NULL, 400},
      {"a space before the colon", "X-A : b\r\n", 1, NULL, 400},
      {"Expect: 999-nonsense", "Expect: 999-nonsense\r\n", 1, NULL, 417},
      {"class as a string with a space", "", 1, "{\"class\":\" 1\"}", 400},
      {"class as a string of digits", "", 1, "{\"class\":\"1\"}", 400},
      {"class as 1.0", "", 1, "{\"class\":1.0}", 400},
      {"n as a string", "", 1, "{\"class\":1,\"n\":\"2\"}", 400},
  };
  char req[1024];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *b = cases[i].body ? cases[i].body : body;
    int n = snprintf(req, sizeof req, "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                     "Connection: close\r\nContent-Type: application/json\r\n");
    if (cases[i].content_length)
      n += snprintf(req + n, sizeof req - (size_t)n, "Content-Length: %zu\r\n", strlen(b));
    n += snprintf(req + n, sizeof req - (size_t)n, "%s\r\n%s", cases[i].headers, b);
    int st = raw_request(g_port, req, (size_t)n, 20, NULL);
    if (st != cases[i].status)
      fail_msg("%s: status %d, expected %d", cases[i].what, st, cases[i].status);
  }
  /* a NUL in a header name is MHD's 400; a NUL in a value MHD cuts the value at, unseen by
   * the handler (docs/RELIABILITY.md) */
  static const char nul_name[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                 "X-\0A: b\r\n\r\n";
  assert_int_equal(raw_request(g_port, nul_name, sizeof nul_name - 1, 10, NULL), 400);
}

/* A client that shuts its write side after a complete request (issue 32, finding 4) still
 * gets its answer, after an interim 100 (how a gone client is told from it); one that
 * closes entirely has its job cancelled (as test_disconnect_cancels with curl). */
static void test_half_close(void **state) {
  char body[200], req[600];
  snprintf(body, sizeof body, "{\"model\":\"self\",\"class\":1,\"seed\":5,"
           "\"method\":\"sd:exact@slow:ms=60,depth=1\"}");
  int n = snprintf(req, sizeof req, "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                   strlen(body), body);
  int fd = raw_connect(g_port);
  assert_int_equal(raw_send(fd, req, (size_t)n), 0);
  assert_int_equal(shutdown(fd, SHUT_WR), 0);
  char *r = raw_read_all(fd, 30, NULL);
  close(fd);
  if (raw_final_status(r) != 200) fail_msg("half-closed: %.300s", r);
  assert_non_null(strstr(r, "\"b64_json\":\"iVBOR"));
  free(r);
  double before = metric_now("vspec_jobs_total{state=\"cancelled\"}");
  fd = raw_connect(g_port);
  assert_int_equal(raw_send(fd, req, (size_t)n), 0);
  vs_harness_sleep_ms(100);
  close(fd);
  double end = vs_harness_now() + 10, now = before;
  while (vs_harness_now() < end &&
         (now = metric_now("vspec_jobs_total{state=\"cancelled\"}")) < before + 1)
    vs_harness_sleep_ms(50);
  if (now != before + 1) fail_msg("closed: cancelled jobs %g -> %g", before, now);
}

/* Last: while the daemon drains, /health is 503 and a generation is refused with 503 and a
 * Retry-After (the daemon's shutting_down), not queued. */
static void test_draining(void **state) {
  vs_conn c;
  vs_client_open(&c, dm.job_ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.method = "sd:exact@slow:ms=300,depth=1";
  s.has_progress = 1;
  s.progress = 0;
  vs_client_submit(&c, &s);
  vs_conn_event e;
  vs_client_next(&c, 5000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ACCEPTED);
  vs_conn_event_free(&e);
  kill(dm.pid, SIGTERM); /* the slow job holds the drain open */
  reply r = {0};
  double end = vs_harness_now() + 5;
  do {
    reply_free(&r);
    r = curl_get("/health");
  } while (r.code == 200 && vs_harness_now() < end);
  assert_int_equal(r.code, 503);
  assert_non_null(strstr(r.body, "\"status\":\"draining\""));
  reply_free(&r);
  char hdr[300];
  snprintf(hdr, sizeof hdr, "%s/curl.headers", fx.dir);
  const char *args[] = {"-X", "POST", "-D", hdr, "--data-binary", "{\"class\":1}", NULL};
  r = curl_run("/v1/images/generations", 10, args);
  expect_error(&r, 503, "shutting down", NULL);
  FILE *f = fopen(hdr, "r");
  assert_non_null(f);
  char line[256];
  int retry = 0;
  while (fgets(line, sizeof line, f)) retry |= !strncasecmp(line, "Retry-After: ", 13);
  fclose(f);
  assert_true(retry);
  vs_conn_close(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_health),         cmocka_unit_test(test_metrics_format),
      cmocka_unit_test(test_generate),       cmocka_unit_test(test_bad_requests),
      cmocka_unit_test(test_prompt),         cmocka_unit_test(test_models),
      cmocka_unit_test(test_n_and_size),     cmocka_unit_test(test_queue_full),
      cmocka_unit_test(test_stream),
      cmocka_unit_test(test_disconnect_cancels), cmocka_unit_test(test_strict_requests),
      cmocka_unit_test(test_half_close),         cmocka_unit_test(test_draining),
  };
  if (sodium_init() < 0) return 1;
  return cmocka_run_group_tests(tests, setup, teardown);
}
