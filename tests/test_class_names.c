/*
 * Class names (vspec-model.json "class_names"): parsed and checked by core/manifest.c, one per
 * class label of the target (checked at load), sent in ModelInfo and shown by `vspec status`,
 * listed by `vspec-bench generate --help` and taken by its --class, and drawn as labels on
 * `vspec-bench demo`'s grid, and taken by `vspec generate --prompt` (core/class_prompt.c has its
 * own test). Before, a class number was named only in
 * models/fmnist/MODEL_CARD.md (7 is Sneaker).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bitmap_font.h"
#include "core/class_prompt.h"
#include "core/host.h"
#include "core/manifest.h"
#include "core/models.h"
#include "core/png_read.h"
#include "kernels/vs_kernels.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"

static const vs_sampling base = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 4.0f,
                                 .cfg_interval = -1};
static const char *const fmnist[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

static int parse(const char *names, vs_manifest *m, char *err, size_t errlen) {
  char text[1024];
  snprintf(text, sizeof text, "{\"target\": {\"backend\": \"b\"}, \"class_names\": %s}", names);
  return vs_manifest_parse(text, strlen(text), "/m", "/m/vspec-model.json", &base, VS_ROLE_ALL,
                           m, err, errlen);
}

static void test_manifest(void **state) {
  (void)state;
  static vs_manifest m;
  char err[512];
  assert_int_equal(parse("[\"Bag\", \"T-shirt/top\", \"Größe 7\"]", &m, err, sizeof err), 0);
  assert_int_equal(m.n_class_names, 3);
  assert_string_equal(m.class_names[1], "T-shirt/top");
  assert_string_equal(m.class_names[2], "Größe 7");
  vs_manifest_free(&m);
  assert_null(m.class_names);
  static const char *const bad[][2] = {
      {"\"Bag\"", "non-empty array"},
      {"[]", "non-empty array"},
      {"[\"a\", 3]", "class_names[1] is not a string"},
      {"[\"\"]", "class_names[0] must be 1-63 bytes"},
      {"[\"0123456789012345678901234567890123456789012345678901234567890123\"]", "1-63 bytes"},
      {"[\"a\\u0007b\"]", "without control characters"},
      {"[\" Bag\"]", "starts or ends with a blank"},
      {"[\"Bag\", \"7\"]", "class_names[1] is a number"},
      {"[\"Bag\", \"Coat\", \"bag\"]", "twice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i][0], &m, err, sizeof err), VSPEC_EFORMAT);
    printf("  %s -> %s\n", bad[i][0], err);
    if (!strstr(err, bad[i][1]) || !strstr(err, "/m/vspec-model.json"))
      fail_msg("'%s' lacks '%s'", err, bad[i][1]);
    assert_null(m.class_names); /* nothing left behind */
  }
  /* the shipped models name Fashion-MNIST's classes */
  const char *dirs[] = {"models/fmnist", "models/fmnist-mar"};
  for (int d = 0; d < 2; d++) {
    if (vs_manifest_read(dirs[d], &base, VS_ROLE_TARGET, &m, err, sizeof err))
      fail_msg("%s", err);
    assert_int_equal(m.n_class_names, 10);
    for (int i = 0; i < 10; i++) assert_string_equal(m.class_names[i], fmnist[i]);
    vs_manifest_free(&m);
  }
}

/* DIR/FILE: a safetensors file of no tensors whose header holds `meta` (a JSON object), as
 * tools/make_manifest.py reads it. */
static void header_only(const char *dir, const char *file, const char *meta) {
  char path[400], header[512];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  uint64_t n = (uint64_t)snprintf(header, sizeof header, "{\"__metadata__\": %s}", meta);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(&n, 8, 1, f), 1); /* little-endian, as x86 and arm64 are */
  assert_int_equal(fwrite(header, 1, n, f), n);
  fclose(f);
}

/* /usr/bin/python3 tools/make_manifest.py DIR ARGS; its exit status. */
static int make_manifest(const char *dir, const char *args) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 tools/make_manifest.py '%s' %s", dir, args);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* The class a prompt picks among the ImageNet names, or -1 (refused; the message in err). */
static int imagenet_pick(const vs_manifest *m, const char *prompt, char *err, size_t errlen) {
  vs_class_pick p;
  int rc = vs_class_prompt_match(prompt, "imagenet", (const char *const *)m->class_names,
                                 m->n_class_names, 1000, &p, err, errlen);
  return rc ? -1 : p.label;
}

/* tools/imagenet_classes.txt: ImageNet-1k's names, which tools/make_manifest.py puts in the
 * manifest of a converted 1000-class LlamaGen c2i GPT. The manifest it writes parses (the
 * names pass core/manifest.c's checks: one name for one class, letter case ignored), holds
 * the file's 1000 names in label order, and prompts find their classes. */
static void test_imagenet(void **state) {
  (void)state;
  char dir[] = "/tmp/vspec-imagenet.XXXXXX", err[8192], cmd[300];
  assert_non_null(mkdtemp(dir));
  header_only(dir, "gpt.safetensors", "{\"vspec.kind\": \"llamagen-gpt\", \"model_type\": "
              "\"c2i\", \"num_classes\": \"1000\"}");
  header_only(dir, "vq.safetensors", "{\"vspec.kind\": \"llamagen-vq\"}");
  assert_int_equal(make_manifest(dir, "--name imagenet"), 0);
  static vs_manifest m;
  if (vs_manifest_read(dir, &base, VS_ROLE_ALL, &m, err, sizeof err)) fail_msg("%s", err);
  assert_string_equal(m.name, "imagenet");
  assert_string_equal(m.target.backend, "llamagen");
  char want[400];
  snprintf(want, sizeof want, "%s/gpt.safetensors", dir);
  assert_string_equal(m.target.weights, want);
  snprintf(want, sizeof want, "vq=%s/vq.safetensors", dir);
  assert_non_null(strstr(m.target.params, want));
  assert_int_equal(m.n_class_names, 1000);
  /* the file's lines, comments aside, in order */
  FILE *f = fopen("tools/imagenet_classes.txt", "r");
  assert_non_null(f);
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (!line[0] || line[0] == '#') continue;
    assert_true(n < 1000);
    assert_string_equal(m.class_names[n], line);
    n++;
  }
  fclose(f);
  assert_int_equal(n, 1000);
  static const struct {
    int label;
    const char *name;
  } known[] = {{0, "tench"}, {1, "goldfish"}, {2, "great white shark"}, {134, "crane (bird)"},
               {207, "golden retriever"}, {264, "Cardigan Welsh corgi"}, {279, "Arctic fox"},
               {280, "grey fox"}, {474, "cardigan"}, {517, "crane (machine)"},
               {638, "maillot"}, {639, "tank suit"}, {999, "toilet tissue"}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    assert_string_equal(m.class_names[known[i].label], known[i].name);
  static const struct {
    const char *prompt;
    int label;
  } prompts[] = {{"a photo of a golden retriever", 207}, {"crane (bird)", 134}, {"tench", 0},
                 {"Crane (Machine)", 517}, {"a photo of a tench", 0},
                 {"two golden retrievers", 207}, {"cardigan", 474},
                 {"a Cardigan Welsh corgi", 264}, {"maillot", 638}, {"a tank suit", 639},
                 {"an Arctic fox in the snow", 279}, {"grey fox", 280}, {"207", 207}};
  for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
    int got = imagenet_pick(&m, prompts[i].prompt, err, sizeof err);
    if (got != prompts[i].label)
      fail_msg("'%s' -> %d, not %d: %s", prompts[i].prompt, got, prompts[i].label, err);
  }
  /* "crane" alone names both cranes: refused, in a message of vspecd's size that names them
   * and lists what fits of the 1000 classes */
  char msg[VSPEC_ERRLEN];
  assert_int_equal(imagenet_pick(&m, "a photo of a crane", msg, sizeof msg), -1);
  printf("  a photo of a crane -> %s\n", msg);
  assert_non_null(strstr(msg, "prompt: 'a photo of a crane' names more than one class of model "
                              "'imagenet' (crane (bird), crane (machine)): name one (classes: "
                              "0 tench, 1 goldfish, "));
  assert_non_null(strstr(msg, " more)"));
  assert_true(strlen(msg) < sizeof msg - 1); /* not cut */
  assert_int_equal(imagenet_pick(&m, "crane", msg, sizeof msg), -1);
  assert_non_null(strstr(msg, "(crane (bird), crane (machine)): name one"));
  /* a slip: the list is cut to leave room for the likely name */
  assert_int_equal(imagenet_pick(&m, "golden retreiver", msg, sizeof msg), -1);
  printf("  golden retreiver -> ...%s\n", strrchr(msg, ')'));
  assert_non_null(strstr(msg, " more); did you mean 'golden retriever'?"));
  vs_manifest_free(&m);

  /* a GPT of another class count gets no names unless given; given, one per class */
  header_only(dir, "gpt.safetensors", "{\"vspec.kind\": \"llamagen-gpt\", \"model_type\": "
              "\"c2i\", \"num_classes\": \"3\"}");
  assert_int_not_equal(make_manifest(dir, ""), 0); /* no --force: the manifest is kept */
  assert_int_equal(make_manifest(dir, "--force"), 0);
  if (vs_manifest_read(dir, &base, VS_ROLE_ALL, &m, err, sizeof err)) fail_msg("%s", err);
  assert_null(m.class_names);
  char names[400];
  snprintf(names, sizeof names, "%s/names.txt", dir);
  f = fopen(names, "w");
  assert_non_null(f);
  fputs("# three\nBag\n\nCoat\nbag\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "--force --class-names '%s' 2>/dev/null", names);
  assert_int_not_equal(make_manifest(dir, cmd), 0); /* Bag and bag */
  f = fopen(names, "w");
  assert_non_null(f);
  fputs("# three\nBag\n\nCoat\nSandal\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "--force --class-names '%s'", names);
  assert_int_equal(make_manifest(dir, cmd), 0);
  if (vs_manifest_read(dir, &base, VS_ROLE_ALL, &m, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(m.n_class_names, 3);
  assert_string_equal(m.class_names[2], "Sandal");
  vs_manifest_free(&m);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* DIR/NAME: the micro test model (10 classes) with `n` of Fashion-MNIST's class names. */
static void named_model(const vs_fixture *fx, const char *name, int n, char *dir, size_t cap) {
  snprintf(dir, cap, "%s/%s", fx->dir, name);
  assert_int_equal(mkdir(dir, 0755), 0);
  const char *files[] = {"gpt.safetensors", "vq.safetensors"};
  for (int i = 0; i < 2; i++) {
    char src[1300], dst[400];
    snprintf(src, sizeof src, "%s/%s", fx->micro_model, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    assert_int_equal(symlink(src, dst), 0);
  }
  char path[400], names[400] = "";
  for (int i = 0; i < n; i++)
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s\"%s\"", i ? ", " : "",
             fmnist[i]);
  snprintf(path, sizeof path, "%s/vspec-model.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"name\": \"%s\", \"target\": {\"backend\": \"llamagen\", \"gpt\": "
          "\"gpt.safetensors\", \"vq\": \"vq.safetensors\"}, \"class_names\": [%s]}\n", name,
          names);
  fclose(f);
}

/* At load: one name per class label, and --class's names and numbers. */
static void test_models(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  static vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  vs_registry *reg;
  vspec_dev *dev;
  char err[VSPEC_ERRLEN], dir[300];
  assert_int_equal(vs_registry_open(fx.plugins, &host, &reg, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  vs_models *m = NULL;
  named_model(&fx, "three", 3, dir, sizeof dir);
  assert_int_equal(vs_models_open(reg, &host, dev, dir, VS_ROLE_ALL, &m, err, sizeof err),
                   VSPEC_EFORMAT);
  printf("  %s\n", err);
  assert_non_null(strstr(err, "class_names has 3 name(s), the target has 10 class label(s)"));
  named_model(&fx, "ten", 10, dir, sizeof dir);
  if (vs_models_open(reg, &host, dev, dir, VS_ROLE_ALL, &m, err, sizeof err))
    fail_msg("%s", err);
  assert_string_equal(vs_models_class_name(m, 7), "Sneaker");
  assert_null(vs_models_class_name(m, 10));
  int label = -1;
  assert_int_equal(vs_models_class_label(m, "sneaker", &label, err, sizeof err), 0);
  assert_int_equal(label, 7);
  assert_int_equal(vs_models_class_label(m, "9", &label, err, sizeof err), 0);
  assert_int_equal(label, 9);
  assert_int_equal(vs_models_class_label(m, "10", &label, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_models_class_label(m, "Snekaer", &label, err, sizeof err), VSPEC_EINVAL);
  printf("  %s\n", err);
  assert_non_null(strstr(err, "7 Sneaker"));
  assert_non_null(strstr(err, "did you mean 'Sneaker'?"));
  vs_models_close(m);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
  vs_fixture_remove(&fx);
}

/* `vspec status` shows them (and JSON carries them); vspec generate --help points there. */
static void test_status(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char dir[300], arg[400], out[16384];
  named_model(&fx, "named", 10, dir, sizeof dir);
  snprintf(arg, sizeof arg, "named=%s", dir);
  const char *extra[] = {"--model", arg, NULL};
  vs_daemon d;
  vs_daemon_start(&d, &fx, "classes", extra);
  const char *st[] = {"status", "--admin", d.admin_ep, NULL};
  assert_int_equal(vs_run_tool_all("vspec", st, 30, out, sizeof out), 0);
  printf("%s", out);
  const char *named = strstr(out, "  named ");
  assert_non_null(named);
  assert_non_null(strstr(named, "classes 0 T-shirt/top, 1 Trouser,"));
  assert_non_null(strstr(named, "7 Sneaker, 8 Bag, 9 Ankle boot\n"));
  const char *js[] = {"status", "--json", "--admin", d.admin_ep, NULL};
  assert_int_equal(vs_run_tool_all("vspec", js, 30, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"class_names\": [\"T-shirt/top\", \"Trouser\","));
  assert_non_null(strstr(out, "\"class_names\": []")); /* micro names none */
  /* vspec generate --prompt: the daemon matches the words (core/class_prompt.c) and says
   * which class it took */
  char png[400];
  snprintf(png, sizeof png, "%s/p.png", fx.dir);
  const char *gen[] = {"generate", "--server", d.job_ep, "--model", "named", "--method", "ar",
                       "--prompt", "a photo of an ankle boot", "--out", png, NULL};
  assert_int_equal(vs_run_tool_all("vspec", gen, 60, out, sizeof out), 0);
  assert_non_null(strstr(out, "class 9 (Ankle boot)"));
  const char *typo[] = {"generate", "--server", d.job_ep, "--model", "named", "--prompt",
                        "snekaer", "--out", png, NULL};
  assert_int_not_equal(vs_run_tool_all("vspec", typo, 60, out, sizeof out), 0);
  assert_non_null(strstr(out, "did you mean 'Sneaker'?"));
  const char *both[] = {"generate", "--server", d.job_ep, "--class", "1", "--prompt", "bag",
                        NULL};
  assert_int_equal(vs_run_tool_all("vspec", both, 60, out, sizeof out), 2);
  assert_int_equal(vs_daemon_stop(&d, SIGTERM, 30000), 0);
  const char *help[] = {"generate", "--help", NULL};
  assert_int_equal(vs_run_tool_all("vspec", help, 30, out, sizeof out), 0);
  assert_non_null(strstr(out, "`vspec status` names each"));
  vs_fixture_remove(&fx);
}

/* vspec-bench: --help lists the model directory's names, --class takes one. */
static void test_bench_generate(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char dir[300], png[400], out[8192];
  named_model(&fx, "named", 10, dir, sizeof dir);
  snprintf(png, sizeof png, "%s/x.png", fx.dir);
  const char *help[] = {"generate", "--help", NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", help, 30, out, sizeof out), 0);
  assert_non_null(strstr(out, "classes of models/fmnist: 0 T-shirt/top, 1 Trouser,"));
  assert_non_null(strstr(out, "7 Sneaker"));
  const char *named_help[] = {"generate", "--model", dir, "--help", NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", named_help, 30, out, sizeof out), 0);
  assert_non_null(strstr(out, "classes of "));
  assert_non_null(strstr(out, "/named: 0 T-shirt/top"));
  const char *gen[] = {"generate", "--model", dir, "--plugins", fx.plugins, "--class", "bag",
                       "--out", png, NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", gen, 60, out, sizeof out), 0);
  assert_non_null(strstr(out, "class=8"));
  const char *typo[] = {"generate", "--model", dir, "--plugins", fx.plugins, "--class", "Bga",
                        "--out", png, NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", typo, 60, out, sizeof out), 2);
  assert_non_null(strstr(out, "did you mean 'Bag'?"));
  vs_fixture_remove(&fx);
}

/* Dark pixels in the rectangle [x0, x1) x [y0, y1) of an RGB image `w` wide. */
static int dark(const uint8_t *rgb, int w, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = y0; y < y1; y++)
    for (int x = x0; x < x1; x++) n += rgb[((size_t)y * w + x) * 3] < 128;
  return n;
}

/* The demo grid labels each image "N Name" in a band above it. micro's 8x8 images at
 * --upscale 8: 64-pixel cells, 16 pixels apart, a band of 9-pixel text (scale 1) + 1. */
static void test_demo_labels(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char dir[300], png[400], out[8192];
  named_model(&fx, "named", 10, dir, sizeof dir);
  snprintf(png, sizeof png, "%s/demo.png", fx.dir);
  const char *demo[] = {"demo", "--model", dir, "--plugins", fx.plugins, "--upscale", "8",
                        "--out", png, NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", demo, 120, out, sizeof out), 0);
  FILE *f = fopen(png, "rb");
  assert_non_null(f);
  static uint8_t bytes[1 << 20];
  size_t len = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  uint8_t *rgb;
  int w, h;
  char err[256];
  assert_int_equal(vs_png_decode_rgb(bytes, len, &rgb, &w, &h, err, sizeof err), 0);
  const int cell = 64, gap = 16, band = vs_text_height(1) + 1;
  assert_int_equal(w, 5 * cell + 6 * gap);
  assert_int_equal(h, 2 * cell + 3 * gap + 2 * band);
  /* image 7 (second row, third column): "7 Sneaker" above it, 53 pixels wide */
  int x = gap + 2 * (cell + gap), y = gap + (cell + gap) + 2 * band;
  int number = dark(rgb, w, x, y - band, x + VS_FONT_CELL_W, y);
  int name = dark(rgb, w, x + 2 * VS_FONT_CELL_W, y - band, x + vs_text_width("7 Sneaker", 1), y);
  int after = dark(rgb, w, x + vs_text_width("7 Sneaker", 1) + 1, y - band, x + cell, y);
  printf("  label of image 7: %d dark pixels in the number, %d in the name, %d after\n", number,
         name, after);
  assert_true(number > 5 && name > 30);
  assert_int_equal(after, 0);
  free(rgb);
  vs_fixture_remove(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_manifest), cmocka_unit_test(test_imagenet),
      cmocka_unit_test(test_models),
      cmocka_unit_test(test_status), cmocka_unit_test(test_bench_generate),
      cmocka_unit_test(test_demo_labels)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
