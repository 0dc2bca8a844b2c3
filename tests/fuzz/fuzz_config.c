/*
 * Fuzz target: vspecd's config file (daemon/config.c), the INI text of etc/vspecd.conf and the
 * --set section.key=value arguments, which go through the same key parser.
 *
 * Checks beyond "no crash": a refused file gets a message naming it; an accepted one leaves
 * every string of the config terminated inside its field and the model table within bounds,
 * and the cross-key checks (vs_config_check, and those of [fleet] and [http] that vspecd makes
 * after it) either pass or say why.
 */
#include "tests/fuzz/fuzz.h"

#include "daemon/config.h"
#include "fleet/fleet_config.h"
#include "http/http_addr.h"
#include "vspec/types.h"

#define NAME "fuzz.conf"

static void check_strings(const vs_daemon_config *c) {
  VS_FUZZ_REQUIRE(memchr(c->node, 0, sizeof c->node), "node not terminated");
  VS_FUZZ_REQUIRE(memchr(c->endpoint, 0, sizeof c->endpoint), "endpoint not terminated");
  VS_FUZZ_REQUIRE(memchr(c->admin_endpoint, 0, sizeof c->admin_endpoint), "admin endpoint");
  VS_FUZZ_REQUIRE(memchr(c->plugin_dir, 0, sizeof c->plugin_dir), "plugin dir");
  VS_FUZZ_REQUIRE(memchr(c->default_model, 0, sizeof c->default_model), "default model");
  VS_FUZZ_REQUIRE(memchr(c->method, 0, sizeof c->method), "method");
  VS_FUZZ_REQUIRE(c->n_models >= 0 && c->n_models <= VS_CONF_MAX_MODELS, "%d models",
                  c->n_models);
  for (int i = 0; i < c->n_models; i++) {
    VS_FUZZ_REQUIRE(memchr(c->models[i].name, 0, sizeof c->models[i].name), "model name");
    VS_FUZZ_REQUIRE(memchr(c->models[i].dir, 0, sizeof c->models[i].dir), "model dir");
    VS_FUZZ_REQUIRE(*c->models[i].name && *c->models[i].dir, "model %d has an empty name or "
                    "directory", i);
  }
}

/* Each line once more as a --set argument. */
static void set_lines(char *text) {
  vs_daemon_config c;
  vs_config_defaults(&c);
  char err[VSPEC_ERRLEN];
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    err[0] = 0;
    if (vs_config_set_arg(&c, line, err, sizeof err))
      VS_FUZZ_REQUIRE(err[0], "--set '%s' refused without a message", line);
  }
  check_strings(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  vs_fuzz_rss_tick();
  char *text = vs_fuzz_text(data, size);
  vs_daemon_config c;
  vs_config_defaults(&c);
  char err[VSPEC_ERRLEN] = "";
  if (vs_config_load_text(&c, text, NAME, err, sizeof err)) {
    VS_FUZZ_REQUIRE(strstr(err, NAME), "the message does not name the file: '%s'", err);
  } else {
    check_strings(&c);
    err[0] = 0;
    if (vs_config_check(&c, err, sizeof err))
      VS_FUZZ_REQUIRE(err[0], "vs_config_check refused without a message");
    err[0] = 0;
    if (vs_fleet_config_check(&c, err, sizeof err))
      VS_FUZZ_REQUIRE(err[0], "vs_fleet_config_check refused without a message");
    err[0] = 0;
    if (vs_http_config_check(&c, err, sizeof err))
      VS_FUZZ_REQUIRE(err[0], "vs_http_config_check refused without a message");
  }
  set_lines(text);
  free(text);
  return 0;
}
