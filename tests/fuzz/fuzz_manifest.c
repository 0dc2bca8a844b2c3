/*
 * Fuzz target: a model directory's manifest, vspec-model.json (core/manifest.c), from the
 * JSON text to the settings vs_models_open loads from, without loading any weights.
 *
 * Checks beyond "no crash": a refusal names the manifest; an accepted manifest gives each
 * role a backend and parameters that the backend reads back unchanged (core/params.c parses
 * the text to as many keys, and formats them to the same text), and integer defaults that
 * came from JSON numbers within their ranges.
 */
#include "tests/fuzz/fuzz.h"

#include "core/manifest.h"
#include "core/params.h"
#include "vspec/types.h"

#define DIR "/models/fuzz"
#define PATH DIR "/" VS_MANIFEST_FILE

static void check_role(const vs_manifest_role *r, const char *role) {
  if (!r->present) return;
  VS_FUZZ_REQUIRE(r->backend[0], "%s: no backend", role);
  VS_FUZZ_REQUIRE(!strcmp(r->weights, "-") || !strncmp(r->weights, DIR "/", sizeof DIR),
                  "%s: weights '%s' outside the directory", role, r->weights);
  vspec_params *p = NULL;
  char err[VSPEC_ERRLEN];
  VS_FUZZ_REQUIRE(vs_params_parse(r->params, &p, err, sizeof err) == 0,
                  "%s: the backend cannot read its parameters '%s': %s", role, r->params, err);
  char again[sizeof r->params];
  vs_params_format(p, again, sizeof again);
  VS_FUZZ_REQUIRE(!strcmp(again, r->params), "%s: parameters '%s' read back as '%s'", role,
                  r->params, again);
  vs_params_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  vs_fuzz_rss_tick();
  const vs_sampling base = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 4.0f,
                            .cfg_interval = -1};
  static vs_manifest m; /* 18 KB: off the stack */
  char err[VSPEC_ERRLEN] = "";
  if (vs_manifest_parse((const char *)data, size, DIR, PATH, &base, VS_ROLE_ALL, &m, err,
                        sizeof err)) {
    VS_FUZZ_REQUIRE(strstr(err, PATH) || !strcmp(err, "out of memory"),
                    "the message does not name the manifest: '%s'", err);
    return 0;
  }
  VS_FUZZ_REQUIRE(m.target.present, "accepted without a target");
  check_role(&m.target, "target");
  check_role(&m.draft, "draft");
  check_role(&m.eagle, "eagle");
  VS_FUZZ_REQUIRE(m.defaults.top_k >= 0 && m.defaults.cfg_interval >= -1 &&
                  m.defaults.num_iter >= 0, "defaults out of range");
  for (int i = 0; i < m.n_class_names; i++)
    VS_FUZZ_REQUIRE(*m.class_names[i] && strlen(m.class_names[i]) < VS_CLASS_NAME_MAX,
                    "class name %d is empty or too long", i);
  vs_manifest_free(&m);
  return 0;
}
