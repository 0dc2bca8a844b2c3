/*
 * vspec-bench on a continuous-token (MAR) model, run as a user runs it ($VSPEC_BUILD/
 * vspec-bench on tests/golden/micro_mar: 4x4 tokens of 16 values, 16x16 pixels, 8 generation
 * steps by default): eval's JSON and markdown carry the forwards and residual counters with
 * values that follow from the method (AR: one target pass per step and no draft; depth=2:
 * one target pass per two drafted steps), --num-iter / --cfg-schedule reach the jobs,
 * generate and demo write PNGs of the right size, and the measurements that have no meaning
 * for such a model (costcurve, size=auto, discrete rules) are refused with a clear message,
 * as are the MAR options on a discrete model. The discrete JSON keeps its fields.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAR "tests/golden/micro_mar"
#define C2I "tests/golden/micro_c2i"
#define SD2 "sd:continuous@standard:shape=chain,depth=2"
#define MAR_GRID 16
#define MAR_STEPS 8 /* micro_mar's defaults.num_iter */

static char g_dir[128];

/* ---- helpers ------------------------------------------------------------------------- */

static void path_in(char *buf, size_t len, const char *name) {
  snprintf(buf, len, "%s/%s", g_dir, name);
}

static void slurp(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  fclose(f);
}

/* Runs vspec-bench with args (NULL-terminated), stdout and stderr into out / errout; returns
 * its exit status (-1 when a signal ended it). Without a shell: methods hold ';' and '@'. */
static int run_bench(const char *const *args, char *out, size_t outlen, char *errout,
                     size_t errlen) {
  const char *b = getenv("VSPEC_BUILD");
  char exe[512], out_path[256], err_path[256];
  snprintf(exe, sizeof exe, "%s/vspec-bench", b && *b ? b : "build");
  path_in(out_path, sizeof out_path, "stdout.txt");
  path_in(err_path, sizeof err_path, "stderr.txt");
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    const char *argv[48];
    int n = 0;
    argv[n++] = exe;
    for (int i = 0; args[i] && n < 47; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  slurp(out_path, out, outlen);
  slurp(err_path, errout, errlen);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  print_message("  vspec-bench %s ... -> %d\n", args[0], rc);
  if (*errout) print_message("%s", errout);
  return rc;
}

static json_t *load_json_file(const char *path) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) fail_msg("%s: %s (line %d)", path, je.text, je.line);
  return j;
}

static long long jint(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) fail_msg("field '%s' is missing or not an integer", key);
  return json_integer_value(v);
}

static double jnum(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v)) fail_msg("field '%s' is missing or not a number", key);
  return json_number_value(v);
}

static const char *jstr(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) fail_msg("field '%s' is missing or not a string", key);
  return json_string_value(v);
}

/* The method object named `spec` in an eval JSON. */
static const json_t *method_of(const json_t *root, const char *spec) {
  const json_t *ms = json_object_get(root, "methods");
  assert_true(json_is_array(ms));
  for (size_t i = 0; i < json_array_size(ms); i++) {
    const json_t *m = json_array_get(ms, i);
    if (strcmp(jstr(m, "method"), spec) == 0) return m;
  }
  fail_msg("no method '%s' in the JSON", spec);
  return NULL;
}

static void expect_png(const char *path, int w, int h) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path)) fail_msg("%s: %s", path, img.message);
  img.format = PNG_FORMAT_RGB;
  uint8_t *px = malloc(PNG_IMAGE_SIZE(img));
  assert_non_null(px);
  assert_true(png_image_finish_read(&img, NULL, px, 0, NULL));
  assert_int_equal((int)img.width, w);
  assert_int_equal((int)img.height, h);
  free(px);
}

/* ---- eval ---------------------------------------------------------------------------- */

/* AR against CSpD with depth 2 on 4 images: the counters follow from the method. */
static void test_eval_json(void **state) {
  (void)state;
  char json[256], md[256], out[16384], err[8192];
  path_in(json, sizeof json, "eval.json");
  path_in(md, sizeof md, "eval.md");
  const int images = 4;
  const char *args[] = {"eval", "--model", MAR, "--methods", "ar;" SD2, "--images", "4",
                        "--no-quality", "--threads", "1", "--json", json, "--markdown", md,
                        NULL};
  assert_int_equal(run_bench(args, out, sizeof out, err, sizeof err), 0);
  json_t *root = load_json_file(json);
  assert_string_equal(jstr(root, "token_kind"), "continuous");
  assert_int_equal(jint(root, "num_iter"), MAR_STEPS);
  assert_string_equal(jstr(root, "cfg_schedule"), "linear");
  assert_int_equal(jint(root, "images"), images);

  const json_t *ar = method_of(root, "ar"), *sd = method_of(root, SD2);
  for (int k = 0; k < 2; k++) {
    const json_t *m = k ? sd : ar;
    assert_int_equal(jint(m, "tokens"), images * MAR_GRID);
    assert_true(jint(m, "target_forwards") > 0);
    assert_true(jint(m, "residual_fallbacks") >= 0);
    assert_true(jint(m, "residual_fallbacks") <= jint(m, "residual_rounds"));
    double a = jnum(m, "accept_rate"), s = jnum(m, "speedup_vs_ar");
    assert_true(a >= 0.0 && a <= 1.0);
    assert_true(isfinite(s) && s > 0.0);
    assert_true(json_is_null(json_object_get(m, "fid"))); /* --no-quality */
    /* no acceptance by depth: each drafted token is judged on its own */
    assert_int_equal(json_array_size(json_object_get(m, "accept_by_depth")), 0);
  }
  /* AR: MAR's own sampler, one target pass per step, nothing drafted */
  assert_int_equal(jint(ar, "target_forwards"), images * MAR_STEPS);
  assert_int_equal(jint(ar, "rounds"), images * MAR_STEPS);
  assert_int_equal(jint(ar, "draft_forwards"), 0);
  assert_int_equal(jint(ar, "residual_rounds"), 0);
  assert_true(jnum(ar, "accept_rate") == 0.0);
  assert_true(jnum(ar, "speedup_vs_ar") == 1.0);
  /* depth=2: the draft runs every step, the target verifies two steps per pass; each
   * rejected token takes at least one residual proposal */
  assert_int_equal(jint(sd, "draft_forwards"), images * MAR_STEPS);
  assert_int_equal(jint(sd, "target_forwards"), images * MAR_STEPS / 2);
  long long rejected = llround(images * MAR_GRID * (1.0 - jnum(sd, "accept_rate")));
  assert_true(jint(sd, "residual_rounds") >= rejected);
  json_decref(root);

  /* the markdown (stdout and --markdown alike) has the MAR columns and settings */
  char table[16384];
  slurp(md, table, sizeof table);
  assert_non_null(strstr(out, "| draft forwards | target forwards | residual rounds | "
                              "residual fallbacks |"));
  assert_non_null(strstr(table, "residual fallbacks"));
  assert_non_null(strstr(table, "8 generation steps per image, linear CFG schedule"));
  assert_null(strstr(table, "accept by depth"));
}

/* --num-iter and --cfg-schedule reach every job and the report. */
static void test_eval_mar_options(void **state) {
  (void)state;
  char json[256], out[16384], err[8192];
  path_in(json, sizeof json, "eval_opts.json");
  const char *args[] = {"eval", "--model", MAR, "--methods", "ar;" SD2, "--images", "1",
                        "--no-quality", "--threads", "1", "--num-iter", "4",
                        "--cfg-schedule", "constant", "--json", json, NULL};
  assert_int_equal(run_bench(args, out, sizeof out, err, sizeof err), 0);
  json_t *root = load_json_file(json);
  assert_int_equal(jint(root, "num_iter"), 4);
  assert_string_equal(jstr(root, "cfg_schedule"), "constant");
  assert_int_equal(jint(method_of(root, "ar"), "target_forwards"), 4);
  assert_int_equal(jint(method_of(root, SD2), "target_forwards"), 2);
  assert_int_equal(jint(method_of(root, SD2), "draft_forwards"), 4);
  json_decref(root);
  assert_non_null(strstr(out, "4 generation steps per image, constant CFG schedule"));
}

/* A discrete model's JSON: the same fields as before plus the additive ones. */
static void test_eval_discrete_unchanged(void **state) {
  (void)state;
  char json[256], out[16384], err[8192];
  path_in(json, sizeof json, "eval_c2i.json");
  const char *args[] = {"eval", "--model", C2I, "--methods", "ar", "--images", "2",
                        "--no-quality", "--threads", "1", "--json", json, NULL};
  assert_int_equal(run_bench(args, out, sizeof out, err, sizeof err), 0);
  json_t *root = load_json_file(json);
  assert_string_equal(jstr(root, "token_kind"), "discrete");
  assert_true(json_is_null(json_object_get(root, "num_iter")));
  assert_true(json_is_null(json_object_get(root, "cfg_schedule")));
  const json_t *ar = method_of(root, "ar");
  assert_true(jint(ar, "target_forwards") > 0);
  assert_int_equal(jint(ar, "draft_forwards"), 0);
  assert_int_equal(jint(ar, "residual_rounds"), 0);
  assert_int_equal(jint(ar, "residual_fallbacks"), 0);
  json_decref(root);
  assert_non_null(strstr(out, "| accept by depth 1/2/3/4 |"));
  assert_null(strstr(out, "residual rounds"));
}

/* ---- generate, demo ------------------------------------------------------------------- */

static void test_generate_png(void **state) {
  (void)state;
  char png[256], out[4096], err[8192];
  path_in(png, sizeof png, "gen.png");
  const char *ar[] = {"generate", "--model", MAR, "--class", "3", "--upscale", "2",
                      "--threads", "1", "--out", png, "--json", NULL};
  assert_int_equal(run_bench(ar, out, sizeof out, err, sizeof err), 0);
  expect_png(png, 32, 32);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  if (!j) fail_msg("generate --json printed no JSON (%s): %s", je.text, out);
  assert_string_equal(jstr(j, "token_kind"), "continuous");
  assert_int_equal(jint(j, "tokens"), MAR_GRID);
  assert_int_equal(jint(j, "target_forwards"), MAR_STEPS);
  assert_int_equal(jint(j, "draft_forwards"), 0);
  json_decref(j);

  unlink(png);
  const char *sd[] = {"generate", "--model", MAR, "--method", SD2, "--num-iter", "6",
                      "--cfg-schedule", "constant", "--threads", "1", "--out", png, "--json",
                      NULL};
  assert_int_equal(run_bench(sd, out, sizeof out, err, sizeof err), 0);
  expect_png(png, 16, 16);
  j = json_loads(out, 0, &je);
  if (!j) fail_msg("generate --json printed no JSON (%s): %s", je.text, out);
  assert_int_equal(jint(j, "draft_forwards"), 6);
  assert_int_equal(jint(j, "target_forwards"), 3);
  assert_true(jint(j, "residual_rounds") >= 0);
  json_decref(j);
}

static void test_demo_png(void **state) {
  (void)state;
  char png[256], out[4096], err[8192];
  path_in(png, sizeof png, "demo.png");
  const char *args[] = {"demo", "--model", MAR, "--upscale", "2", "--out", png, NULL};
  assert_int_equal(run_bench(args, out, sizeof out, err, sizeof err), 0);
  /* 10 classes: 5 columns x 2 rows of 16x16 images with 2-pixel gaps, enlarged twice, and
   * above each row a band of labels (9-pixel text at scale 1 and 1 pixel) */
  expect_png(png, 2 * (5 * 16 + 6 * 2), 2 * (2 * 16 + 3 * 2) + 2 * 10);
  /* --per-class 2: one column per class, two rows, labels above the first */
  const char *per[] = {"demo", "--model", MAR, "--upscale", "1", "--per-class", "2", "--out",
                       png, NULL};
  assert_int_equal(run_bench(per, out, sizeof out, err, sizeof err), 0);
  expect_png(png, 10 * 16 + 11 * 2, 2 * 16 + 3 * 2 + 10);
}

/* ---- refusals ------------------------------------------------------------------------- */

static void expect_refusal(const char *const *args, int code, const char *message) {
  char out[16384], err[8192];
  assert_int_equal(run_bench(args, out, sizeof out, err, sizeof err), code);
  if (!strstr(err, message)) fail_msg("expected '%s' in: %s", message, err);
}

static void test_refusals(void **state) {
  (void)state;
  const char *cost[] = {"costcurve", "--model", MAR, "--sizes", "1", NULL};
  expect_refusal(cost, 1, "not supported for continuous-token (MAR) models");
  const char *autosize[] = {"eval", "--model", MAR, "--methods",
                            "sd:continuous@standard:shape=chain,size=auto", "--images", "1",
                            "--no-quality", NULL};
  expect_refusal(autosize, 1, "size=auto is not supported for continuous-token (MAR) models "
                              "(model 'micro_mar'); use depth=L explicitly");
  /* micro_mar's 16x16 images against the 32x32 classifier: refused, not read past the end */
  const char *quality[] = {"eval", "--model", MAR, "--images", "1", NULL};
  expect_refusal(quality, 1, "the quality metrics need 32x32 images");
  const char *discrete_rule[] = {"generate", "--model", MAR, "--method",
                                 "sd:exact@standard:shape=chain,depth=2", "--out",
                                 "/dev/null", NULL};
  expect_refusal(discrete_rule, 1, "is for discrete tokens");
  const char *steps[] = {"generate", "--model", MAR, "--num-iter", "17", "--out", "/dev/null",
                         NULL};
  expect_refusal(steps, 2, "--num-iter 17 is out of range");
  const char *sched[] = {"demo", "--model", MAR, "--cfg-schedule", "cosine", NULL};
  expect_refusal(sched, 2, "not a CFG schedule");
  /* the MAR options on a discrete model: an error, not silently ignored */
  const char *on_c2i[] = {"eval", "--model", C2I, "--num-iter", "4", "--no-quality",
                          "--images", "1", NULL};
  expect_refusal(on_c2i, 2, "--num-iter applies only to continuous-token (MAR) models");
  const char *on_c2i_gen[] = {"generate", "--model", C2I, "--cfg-schedule", "constant",
                              "--out", "/dev/null", NULL};
  expect_refusal(on_c2i_gen, 2, "--cfg-schedule applies only to continuous-token");
}

static int setup(void **state) {
  (void)state;
  const char *td = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/vspec_bench_mar_XXXXXX", td && *td ? td : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eval_json),
      cmocka_unit_test(test_eval_mar_options),
      cmocka_unit_test(test_eval_discrete_unchanged),
      cmocka_unit_test(test_generate_png),
      cmocka_unit_test(test_demo_png),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
