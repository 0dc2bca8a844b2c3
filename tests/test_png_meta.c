/*
 * tests/test_png_meta.c - the PNG text chunks others read (core/png_meta.h).
 *
 * Every PNG of a job carries, besides vspec's own `vspec` chunk, a `parameters` chunk in the
 * form AUTOMATIC1111 and stable-diffusion.cpp write, so that image browsers show the seed and
 * the method: the text itself (prompt line, keys, A1111's quoting, the model hash against
 * sha256sum), what vspec-bench generate writes (also read back with Python's PIL and A1111's
 * own parsing expression), and vspecd's result and previews through the CLI.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/png_meta.h"
#include "core/png_read.h"
#include "tests/support/daemon_harness.h"
#include "core/version.h"
#include "tests/support/method_of.h"

/* A model set as png_meta sees it: no weights loaded. */
static vs_models fake_models(const char *dir, const char *name, int continuous) {
  vs_models m;
  memset(&m, 0, sizeof m);
  snprintf(m.dir, sizeof m.dir, "%s", dir);
  snprintf(m.name, sizeof m.name, "%s", name);
  m.target.info.grid_h = m.target.info.grid_w = 8;
  m.target.info.image_h = m.target.info.image_w = 32;
  m.target.info.token_kind = continuous ? VSPEC_TOKENS_CONTINUOUS : VSPEC_TOKENS_DISCRETE;
  return m;
}

/* The first 10 hex digits of sha256sum's answer for a file. */
static void sha256sum10(const char *path, char out[11]) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  assert_non_null(fgets(out, 11, p));
  pclose(p);
  assert_int_equal(strlen(out), 10);
}

static void test_parameters_text(void **state) {
  (void)state;
  vs_models m = fake_models("models/fmnist", "fmnist", 0);
  static char *names[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                          "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  m.class_names = names; /* the prompt names the class when the manifest does */
  m.n_class_names = 10;
  vs_job job = {.method = NULL, .class_label = 7, .seed = 1,
                .sampling = {.temperature = 1, .top_p = 1, .cfg_scale = 1.5f, .cfg_interval = -1}};
  char hash[11], got[1024], want[1024];
  sha256sum10("models/fmnist/target.safetensors", hash);
  vs_png_parameters(&job, &m, got, sizeof got);
  snprintf(want, sizeof want,
           "class 7 (Sneaker)\nSteps: 64, Sampler: ar, CFG scale: 1.5, Seed: 1, Size: 32x32, Model hash: %s, "
           "Model: fmnist, Temperature: 1, Version: vspec %s", hash, VSPEC_VERSION);
  assert_string_equal(got, want);

  /* a method with ',' and ':' in JSON quotes; filters that are on; no manifest, no hash */
  vs_models bare = fake_models("tests/golden/micro_c2i", "micro,c2i", 0);
  job = (vs_job){.method = vs_method_of("sd:exact@standard:shape=chain,depth=3"), .class_label = 2,
                 .seed = 18446744073709551615ull,
                 .sampling = {.temperature = 0.5f, .top_k = 5, .top_p = 0.9f, .cfg_scale = 4,
                              .cfg_interval = 10}};
  vs_png_parameters(&job, &bare, got, sizeof got);
  assert_string_equal(got,
                      "class 2\nSteps: 64, Sampler: \"sd:exact@standard:shape=chain,depth=3\", "
                      "CFG scale: 4, Seed: 18446744073709551615, Size: 32x32, Model: microc2i, "
                      "Temperature: 0.5, Top k: 5, Top p: 0.9, CFG interval: 10, Version: "
                      "vspec " VSPEC_VERSION);

  /* continuous tokens: the generation steps (the job's, else the model's) and the schedule */
  vs_models mar = fake_models("tests/golden/micro_mar", "micro_mar", 1);
  mar.target.info.num_iter = 16;
  job = (vs_job){.method = NULL, .class_label = 1, .seed = 3,
                 .sampling = {.temperature = 1, .cfg_scale = 3, .cfg_schedule = VS_CFG_LINEAR}};
  vs_png_parameters(&job, &mar, got, sizeof got);
  assert_non_null(strstr(got, "\nSteps: 16, Sampler: ar, CFG scale: 3, Seed: 3,"));
  assert_non_null(strstr(got, ", CFG schedule: linear, Version: "));
  job.sampling.num_iter = 8;
  vs_png_parameters(&job, &mar, got, sizeof got);
  assert_non_null(strstr(got, "\nSteps: 8, "));
}

static void read_file(const char *path, uint8_t **buf, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("%s: not written", path);
  *buf = malloc(1 << 20);
  assert_non_null(*buf);
  *len = fread(*buf, 1, 1 << 20, f);
  fclose(f);
}

/* The parameters chunk of a PNG file; the vspec chunk is there too. */
static void chunks_of(const char *path, char *params, size_t cap) {
  uint8_t *png;
  size_t len;
  char vspec[1024], err[256];
  read_file(path, &png, &len);
  if (vs_png_text_get(png, len, "parameters", params, cap, err, sizeof err) != 1)
    fail_msg("%s: no parameters chunk (%s)", path, err);
  assert_int_equal(vs_png_text_get(png, len, "vspec", vspec, sizeof vspec, err, sizeof err), 1);
  assert_int_equal(vs_png_text_get(png, len, "nothing", vspec, sizeof vspec, err, sizeof err), 0);
  free(png);
}

static void test_encode_round_trip(void **state) {
  (void)state;
  vs_models m = fake_models("models/fmnist", "fmnist", 0);
  vs_job job = {.method = vs_method_of("sd:lantern:delta=0.2"), .class_label = 4, .seed = 9,
                .sampling = {.temperature = 1, .top_p = 1, .cfg_scale = 1.5f, .cfg_interval = -1}};
  uint8_t rgb[32 * 32 * 3] = {0}, *png = NULL;
  size_t len = 0;
  char err[256], got[1024], want[1024];
  assert_int_equal(vs_png_encode_job(rgb, &job, &m, "test", &png, &len, err, sizeof err), 0);
  assert_int_equal(vs_png_text_get(png, len, "parameters", got, sizeof got, err, sizeof err), 1);
  vs_png_parameters(&job, &m, want, sizeof want);
  assert_string_equal(got, want);
  assert_int_equal(vs_png_text_get(png, len, "vspec", got, sizeof got, err, sizeof err), 1);
  /* the method's canonical spelling (what the job was parsed into), not the words typed */
  assert_non_null(strstr(got, "method=sd:lantern:delta=0.2@standard class=4 seed=9"));
  assert_int_equal(vs_png_text_get(png, len, "Software", got, sizeof got, err, sizeof err), 1);
  assert_string_equal(got, "test");
  free(png);
  assert_true(vs_png_text_get("not a png", 9, "x", got, sizeof got, err, sizeof err) < 0);
}

/* vspec-bench generate's file, read by Python's PIL and split with the expression A1111's
 * infotext parser uses (modules/infotext_utils.py, re_param_code), quotes undone as it does:
 * the method, quoted for its ',' and ':', comes back whole. */
static void test_bench_generate(void **state) {
  (void)state;
  char dir[] = "/tmp/vspec-pngmeta.XXXXXX", out[128], params[1024], hash[11];
  assert_non_null(mkdtemp(dir));
  snprintf(out, sizeof out, "%s/img.png", dir);
  const char *args[] = {"generate", "--model", "models/fmnist", "--class", "7", "--seed", "1",
                        "--method", "sd:exact@standard:shape=chain,depth=2", "--threads", "1",
                        "--out", out, NULL};
  assert_int_equal(vs_run_tool("vspec-bench", args, NULL, 0), 0);
  chunks_of(out, params, sizeof params);
  sha256sum10("models/fmnist/target.safetensors", hash);
  const char *head = "class 7 (Sneaker)\nSteps: 64, Sampler: \"sd:exact@standard:shape=chain,depth=2\", "
                     "CFG scale: 1.5, Seed: 1, ";
  if (strncmp(params, head, strlen(head)) != 0) fail_msg("'%s'", params);
  assert_non_null(strstr(params, ", Size: 32x32, "));
  char model[64];
  snprintf(model, sizeof model, ", Model hash: %s, Model: fmnist, ", hash);
  assert_non_null(strstr(params, model));

  char cmd[2048], line[512] = "";
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 - '%s' <<'EOF'\n"
           "import json, re, sys\n"
           "from PIL import Image\n"
           "text = Image.open(sys.argv[1]).text['parameters']\n"
           "prompt, _, last = text.rpartition('\\n')\n"
           "re_param = re.compile(\n"
           "    r'\\s*(\\w[\\w \\-/]+):\\s*(\"(?:\\\\.|[^\\\\\"])+\"|[^,]*)(?:,|$)')\n"
           "p = {k: json.loads(v) if v.startswith('\"') else v\n"
           "     for k, v in re_param.findall(last)}\n"
           "print(prompt, p['Steps'], p['Sampler'], p['CFG scale'], p['Seed'], p['Size'],\n"
           "      p['Model'])\n"
           "EOF",
           out);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  if (!fgets(line, sizeof line, p)) line[0] = '\0';
  assert_int_equal(pclose(p), 0);
  assert_string_equal(line,
                      "class 7 (Sneaker) 64 sd:exact@standard:shape=chain,depth=2 1.5 1 32x32 fmnist\n");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

typedef struct daemon_env {
  vs_fixture fx;
  vs_daemon d;
} daemon_env;

/* The daemon is stopped by the teardown, which cmocka runs when the test fails too. */
static int daemon_setup(void **state) {
  daemon_env *e = calloc(1, sizeof *e);
  if (!e) return -1;
  vs_fixture_make(&e->fx);
  vs_daemon_start(&e->d, &e->fx, "pngmeta", NULL);
  *state = e;
  return 0;
}

static int daemon_teardown(void **state) {
  daemon_env *e = *state;
  int rc = vs_daemon_stop(&e->d, 15, 20000);
  if (rc != 0) vs_daemon_dump_log(&e->d);
  vs_fixture_remove(&e->fx);
  free(e);
  return rc == 0 ? 0 : -1;
}

/* vspecd's result and its previews, through the CLI: the daemon writes both chunks. */
static void test_daemon_result_and_previews(void **state) {
  daemon_env *e = *state;
  const vs_fixture *fx = &e->fx;
  const vs_daemon *d = &e->d;
  char out[300], prev[300], params[1024], path[400];
  snprintf(out, sizeof out, "%s/img.png", fx->dir);
  snprintf(prev, sizeof prev, "%s/previews", fx->dir);
  const char *args[] = {"generate", "--server", d->job_ep, "--model", "self", "--class", "2",
                        "--seed", "5", "--method", "sd:exact@standard:shape=chain,depth=2",
                        "--previews", prev, "--preview-every", "4", "--out", out, NULL};
  int rc = vs_run_tool("vspec", args, NULL, 0);
  if (rc != 0) vs_daemon_dump_log(d);
  assert_int_equal(rc, 0);
  const char *want = "class 2\nSteps: 16, Sampler: \"sd:exact@standard:shape=chain,depth=2\", ";
  chunks_of(out, params, sizeof params);
  if (strncmp(params, want, strlen(want)) != 0) fail_msg("result: '%s'", params);
  assert_non_null(strstr(params, ", Seed: 5, "));
  assert_non_null(strstr(params, ", Model hash: "));
  snprintf(path, sizeof path, "%s/preview-000.png", prev); /* the first: how many follow varies */
  chunks_of(path, params, sizeof params);
  if (strncmp(params, want, strlen(want)) != 0) fail_msg("preview: '%s'", params);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parameters_text),
      cmocka_unit_test(test_encode_round_trip),
      cmocka_unit_test(test_bench_generate),
      cmocka_unit_test_setup_teardown(test_daemon_result_and_previews, daemon_setup,
                                      daemon_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
