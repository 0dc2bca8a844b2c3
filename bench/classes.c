#include "bench/classes.h"

#include <string.h>

#include "core/manifest.h"

void vs_bench_print_classes(FILE *f, const char *model_dir, const char *indent) {
  static vs_manifest mf; /* 18 KB: off the stack */
  const vs_sampling base = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 1.0f,
                            .cfg_interval = -1};
  char err[VSPEC_ERRLEN];
  if (vs_manifest_read(model_dir, &base, VS_ROLE_TARGET, &mf, err, sizeof err) ||
      !mf.n_class_names) {
    vs_manifest_free(&mf);
    return;
  }
  int col = fprintf(f, "%sclasses of %s:", indent, model_dir);
  for (int c = 0; c < mf.n_class_names; c++) {
    char item[96];
    int n = snprintf(item, sizeof item, " %d %s%s", c, mf.class_names[c],
                     c + 1 < mf.n_class_names ? "," : "");
    if (col + n > 80) col = fprintf(f, "\n%s ", indent) - 1;
    col += fprintf(f, "%s", item);
  }
  fprintf(f, "\n");
  vs_manifest_free(&mf);
}

int vs_bench_class_arg(const char *cmd, const vs_models *m, const char *text, int *label) {
  char err[VSPEC_ERRLEN];
  if (!vs_models_class_label(m, text, label, err, sizeof err)) return 1;
  fprintf(stderr, "vspec-bench %s: %s\n", cmd, err);
  return 0;
}
