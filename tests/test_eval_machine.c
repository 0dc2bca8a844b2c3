/* tests/test_eval_machine.c - every eval table names its machine (bench/machine.h, issue 33
 * item 3): the CPU model read from a cpuinfo file, and `vspec-bench eval`'s JSON and
 * markdown carrying CPU, instruction set, precision, threads and GPU (null on the CPU).
 * Runs $VSPEC_BUILD/vspec-bench on models/fmnist without quality metrics: about a second. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/machine.h"

static char g_dir[256];

static void path_in(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s/%s", g_dir, name);
}

static void slurp(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return;
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  fclose(f);
}

static void test_cpu_model(void **state) {
  (void)state;
  char path[300], model[256];
  path_in(path, sizeof path, "cpuinfo");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) "
        "Platinum 8480+\nflags\t\t: fpu avx2\n\nprocessor\t: 1\nmodel name\t: other\n",
        f);
  fclose(f);
  vs_bench_machine_cpu_model(path, model, sizeof model);
  assert_string_equal(model, "Intel(R) Xeon(R) Platinum 8480+");
  vs_bench_machine_cpu_model("/nonexistent/cpuinfo", model, sizeof model);
  assert_string_equal(model, "unknown");
  vs_bench_machine m = {.threads = 2};
  snprintf(m.cpu, sizeof m.cpu, "X");
  snprintf(m.isa, sizeof m.isa, "AMX");
  snprintf(m.precision, sizeof m.precision, "bf16");
  snprintf(m.gpu, sizeof m.gpu, "NVIDIA H100");
  char line[300];
  vs_bench_machine_describe(&m, line, sizeof line);
  assert_string_equal(line, "CPU X, AMX, bf16 weights, 2 threads, GPU NVIDIA H100");
}

static const char *jstr(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_string(v)) fail_msg("field '%s' is missing or not a string", key);
  return json_string_value(v);
}

static void test_eval_names_machine(void **state) {
  (void)state;
  const char *b = getenv("VSPEC_BUILD");
  char exe[512], json_path[300], md_path[300], out_path[300], cmd[2000];
  snprintf(exe, sizeof exe, "%s/vspec-bench", b && *b ? b : "build");
  path_in(json_path, sizeof json_path, "eval.json");
  path_in(md_path, sizeof md_path, "eval.md");
  path_in(out_path, sizeof out_path, "stderr.txt");
  snprintf(cmd, sizeof cmd,
           "'%s' eval --model models/fmnist --methods ar --images 2 --no-quality --threads 1 "
           "--json '%s' --markdown '%s' >/dev/null 2>'%s'",
           exe, json_path, md_path, out_path);
  int rc = system(cmd);
  if (rc != 0) {
    char errs[4096];
    slurp(out_path, errs, sizeof errs);
    fail_msg("eval failed (%d): %s", rc, errs);
  }
  json_error_t je;
  json_t *root = json_load_file(json_path, 0, &je);
  if (!root) fail_msg("%s: %s", json_path, je.text);
  const json_t *m = json_object_get(root, "machine");
  assert_true(json_is_object(m));
  char cpu[256];
  vs_bench_machine_cpu_model("/proc/cpuinfo", cpu, sizeof cpu);
  assert_string_equal(jstr(m, "cpu"), cpu);
  const char *isa = jstr(m, "isa");
  assert_true(strcmp(isa, "AVX-512") == 0 || strcmp(isa, "AVX2") == 0 ||
              strcmp(isa, "AMX") == 0 || strcmp(isa, "scalar") == 0);
  assert_string_equal(jstr(m, "precision"), "fp32");
  assert_true(json_is_integer(json_object_get(m, "threads")));
  assert_int_equal(json_integer_value(json_object_get(m, "threads")), 1);
  assert_true(json_is_null(json_object_get(m, "gpu"))); /* generated on the CPU */
  char md[16384], want[600];
  slurp(md_path, md, sizeof md);
  snprintf(want, sizeof want, "Machine: CPU %s, %s, fp32 weights, 1 thread.", cpu, isa);
  if (!strstr(md, want)) fail_msg("markdown lacks '%s':\n%s", want, md);
  json_decref(root);
}

static int setup(void **state) {
  (void)state;
  const char *td = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/vspec_eval_machine_XXXXXX", td && *td ? td : "/tmp");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_model),
      cmocka_unit_test(test_eval_names_machine),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
