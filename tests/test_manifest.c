/* The model manifest (core/manifest.c): what vs_models_open loads, read from the text alone,
 * and the refusals the fuzzer's regression inputs stand for (tests/fuzz/regressions/manifest). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "core/manifest.h"

static const vs_sampling base = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 4.0f,
                                 .cfg_interval = -1};

static int parse(const char *text, vs_manifest *m, char *err, size_t errlen) {
  return vs_manifest_parse(text, strlen(text), "/m", "/m/vspec-model.json", &base, VS_ROLE_ALL,
                           m, err, errlen);
}

static void test_fmnist(void **state) {
  (void)state;
  static vs_manifest m;
  char err[512];
  if (vs_manifest_read("models/fmnist", &base, VS_ROLE_ALL, &m, err, sizeof err))
    fail_msg("%s", err);
  assert_string_equal(m.name, "fmnist");
  assert_string_equal(m.target.backend, "llamagen");
  assert_string_equal(m.target.weights, "models/fmnist/target.safetensors");
  assert_string_equal(m.target.params, "vq=models/fmnist/vq.safetensors");
  assert_true(m.draft.present && m.eagle.present);
  assert_string_equal(m.eagle.params, "target=models/fmnist/target.safetensors");
  assert_float_equal(m.defaults.cfg_scale, 1.5, 1e-6);
  assert_int_equal(m.defaults.cfg_interval, -1);
  vs_manifest_free(&m);
  /* roles not asked for are not read */
  if (vs_manifest_read("models/fmnist", &base, VS_ROLE_TARGET, &m, err, sizeof err))
    fail_msg("%s", err);
  assert_false(m.draft.present || m.eagle.present);
  vs_manifest_free(&m);
  assert_int_equal(vs_manifest_read("tests/golden/micro_c2i", &base, VS_ROLE_ALL, &m, err,
                                    sizeof err), VSPEC_ENOENT);
}

static void test_values(void **state) {
  (void)state;
  static vs_manifest m;
  char err[512];
  assert_int_equal(parse("{\"target\": {\"backend\": \"mar\", \"weights\": \"t.safetensors\", "
                         "\"depth\": 3, \"scale\": 0.5}, \"defaults\": {\"top_k\": 7.0, "
                         "\"num_iter\": 8, \"cfg_schedule\": \"constant\"}}", &m, err, sizeof err),
                   0);
  assert_string_equal(m.target.weights, "/m/t.safetensors");
  assert_string_equal(m.target.params, "depth=3,scale=0.5");
  assert_int_equal(m.defaults.top_k, 7);
  assert_int_equal(m.defaults.num_iter, 8);
  assert_int_equal(m.defaults.cfg_schedule, VS_CFG_CONSTANT);
  assert_float_equal(m.defaults.cfg_scale, 4.0, 0); /* from base */
  assert_string_equal(m.name, "");
}

/* Each refusal names the manifest and the key. Before core/manifest.c: a huge integer was
 * converted to int (undefined behaviour; UBSan stopped the fuzzer), a value with ',' or '='
 * turned into other backend parameters, two weights or a long name were silently dropped. */
static void test_refusals(void **state) {
  (void)state;
  static vs_manifest m;
  char err[512];
  static const char *const bad[][2] = {
      {"{\"target\": {\"backend\": \"b\"}, \"defaults\": {\"top_k\": 1e30}}", "defaults.top_k"},
      {"{\"target\": {\"backend\": \"b\"}, \"defaults\": {\"top_k\": 2.5}}", "defaults.top_k"},
      {"{\"target\": {\"backend\": \"b\"}, \"defaults\": {\"cfg_interval\": -2}}", "cfg_interval"},
      {"{\"target\": {\"backend\": \"b\"}, \"defaults\": {\"temperature\": 1e300}}",
       "defaults.temperature"},
      {"{\"target\": {\"backend\": \"b\"}, \"defaults\": [1]}", "\"defaults\""},
      {"{\"target\": {\"backend\": \"b\", \"vq\": \"vq.safe=tensors\"}}", "target.vq"},
      {"{\"target\": {\"backend\": \"b\", \"mode\": \"lin,ear\"}}", "target.mode"},
      {"{\"target\": {\"backend\": \"b\", \"mode\": \" x\"}}", "target.mode"},
      {"{\"target\": {\"backend\": \"b\", \"a b\": \"x\"}}", "not valid"},
      {"{\"target\": {\"backend\": \"b\", \"gpt\": \"a\", \"weights\": \"b\"}}", "twice"},
      {"{\"target\": {\"backend\": \"b\", \"mode\": [1]}}", "target.mode"},
      {"{\"target\": {\"gpt\": \"a\"}}", "\"backend\""},
      {"{\"target\": 3}", "\"target\" must be an object"},
      {"{\"draft\": {\"backend\": \"b\"}}", "no \"target\""},
      {"{\"name\": 3, \"target\": {\"backend\": \"b\"}}", "\"name\""},
      {"{\"name\": \"0123456789012345678901234567890123456789012345678901234567890123\", "
       "\"target\": {\"backend\": \"b\"}}", "\"name\""},
      {"[1]", "not a JSON object"},
      {"{\"target\": 1, \"target\": 2}", "duplicate"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    if (parse(bad[i][0], &m, err, sizeof err) == 0) fail_msg("case %zu accepted", i);
    if (!strstr(err, bad[i][1]) || !strstr(err, "/m/vspec-model.json"))
      fail_msg("case %zu: '%s' lacks '%s' or the path", i, err, bad[i][1]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fmnist),
      cmocka_unit_test(test_values),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
