/*
 * The CURVE allow-list (daemon/allow_list.h) takes what `vspec keygen` hands out: the
 * NAME.pub file appended as it is (a comment line and `public = KEY`), or the bare key it
 * prints, optionally with a name; '#' starts a comment. A secret key line and anything else
 * are refused with FILE:LINE, and
 * `vspecd --check` reads the list with the same parser: a list the daemon would refuse fails
 * the check (it used to say "configuration OK").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "daemon/allow_list.h"
#include "proto/curve_keys.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"
#include "vspec/types.h"

static void write_text(const char *path, const char *mode, const char *text) {
  FILE *f = fopen(path, mode);
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Appends the file at `src` to `dst` byte for byte: `cat src >> dst`. */
static void append_file(const char *dst, const char *src) {
  char text[1024] = "";
  FILE *f = fopen(src, "r");
  assert_non_null(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  write_text(dst, "a", text);
}

static int has_key(const vs_allow_entry *list, int n, const char *z85) {
  uint8_t key[32];
  assert_non_null(zmq_z85_decode(key, z85));
  for (int i = 0; i < n; i++)
    if (!memcmp(list[i].key, key, 32)) return 1;
  return 0;
}

static void test_pub_file_and_bare_keys(void **state) {
  (void)state;
  char dir[] = "/tmp/vspec-allow-XXXXXX", prefix[64], pub_path[80], list_path[80], err[1024];
  assert_non_null(mkdtemp(dir));
  snprintf(prefix, sizeof prefix, "%s/alice", dir);
  snprintf(pub_path, sizeof pub_path, "%s.pub", prefix);
  snprintf(list_path, sizeof list_path, "%s/clients.allow", dir);
  char alice[41], bob[41], sec[41], line[128];
  assert_int_equal(vs_curve_keygen(prefix, alice, err, sizeof err), 0);
  assert_int_equal(zmq_curve_keypair(bob, sec), 0);
  snprintf(line, sizeof line, "  %s bob # the build machine\n", bob);
  write_text(list_path, "w", "# who may submit jobs\n\n");
  append_file(list_path, pub_path);
  write_text(list_path, "a", line);
  vs_allow_entry *list = NULL;
  int n = -1;
  if (vs_allow_list_read(list_path, &list, &n, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(n, 2);
  assert_true(has_key(list, n, alice));
  assert_true(has_key(list, n, bob));
  assert_memory_equal(list[0].name, alice, 8); /* no name: the key's first 8 characters */
  assert_string_equal(list[1].name, "bob");
  free(list);
  /* a named public line may carry a name too */
  snprintf(line, sizeof line, "public=%s carol\n", bob);
  write_text(list_path, "w", line);
  assert_int_equal(vs_allow_list_read(list_path, &list, &n, err, sizeof err), 0);
  assert_int_equal(n, 1);
  assert_string_equal(list[0].name, "carol");
  free(list);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* '#' starts a comment (no Z85 key starts with it): a key commented out is not allowed. */
static void test_key_commented_out(void **state) {
  (void)state;
  char pub[41], sec[41], other[41], err[1024], text[400];
  assert_int_equal(zmq_curve_keypair(pub, sec), 0);
  assert_int_equal(zmq_curve_keypair(other, sec), 0);
  char path[] = "/tmp/vspec-allow-hash-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  snprintf(text, sizeof text, "#%s gone\n  # public = %s\n%s # the other\n", pub, pub, other);
  write_text(path, "w", text);
  vs_allow_entry *list = NULL;
  int n = -1;
  if (vs_allow_list_read(path, &list, &n, err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(n, 1);
  assert_false(has_key(list, n, pub));
  assert_true(has_key(list, n, other));
  free(list);
  unlink(path);
}

static void test_bad_lines_name_their_line(void **state) {
  (void)state;
  char pub[41], sec[41], err[1024], text[400];
  assert_int_equal(zmq_curve_keypair(pub, sec), 0);
  char path[] = "/tmp/vspec-allow-bad-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  vs_allow_entry *list = NULL;
  int n = -1;
  const char *bad[] = {"%s\nsecret = %s\n", "%s\n%.39s\n", "%s\npublic = \n",
                       "%s\nkey: %s\n"};
  const char *want[] = {"secret key", "(39 characters) is not a key", "is not a key",
                        "'key:' (4 characters)"};
  for (int i = 0; i < 4; i++) {
    snprintf(text, sizeof text, bad[i], pub, sec);
    write_text(path, "w", text);
    assert_int_equal(vs_allow_list_read(path, &list, &n, err, sizeof err), VSPEC_EFORMAT);
    printf("  %s\n", err);
    assert_null(list);
    char where[80];
    snprintf(where, sizeof where, "%s:2: ", path);
    assert_non_null(strstr(err, where));
    assert_non_null(strstr(err, want[i]));
    if (i) assert_non_null(strstr(err, "public = KEY"));
    assert_null(strstr(err, sec)); /* a secret key is never echoed */
  }
  unlink(path);
}

/* End to end: `vspec keygen alice`, alice.pub appended as it is, vspecd lets alice in, and
 * --check passes that list and fails the same list with a bad line, naming it. */
static void test_daemon_and_check(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char server[300], alice[300], list[300], out[4096];
  snprintf(server, sizeof server, "%s/server", fx.dir);
  snprintf(alice, sizeof alice, "%s/alice", fx.dir);
  snprintf(list, sizeof list, "%s/clients.allow", fx.dir);
  const char *k1[] = {"keygen", server, NULL}, *k2[] = {"keygen", alice, NULL};
  assert_int_equal(vs_run_tool("vspec", k1, out, sizeof out), 0);
  assert_int_equal(vs_run_tool("vspec", k2, out, sizeof out), 0);
  char skey[320], spub[320], apub[320], akey[320], sarg[400], larg[400];
  snprintf(skey, sizeof skey, "%s.key", server);
  snprintf(spub, sizeof spub, "%s.pub", server);
  snprintf(apub, sizeof apub, "%s.pub", alice);
  snprintf(akey, sizeof akey, "%s.key", alice);
  write_text(list, "w", "# clients of this daemon\n");
  append_file(list, apub);
  snprintf(sarg, sizeof sarg, "curve.secret_key_file=%s", skey);
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s", list);
  const char *check[] = {"--set", "curve.enabled=true", "--set", sarg, "--set", larg,
                         "--model", "micro=tests/golden/micro_c2i", "--set", "models.fmnist=",
                         "--default-model", "micro", "--check", NULL};
  assert_int_equal(vs_run_tool_all("vspecd", check, 60, out, sizeof out), 0);
  printf("  %s", out);
  assert_non_null(strstr(out, "CURVE with 1 allowed client key(s)"));

  vs_daemon d;
  const char *extra[] = {"--set", "curve.enabled=true", "--set", sarg, "--set", larg, NULL};
  vs_daemon_start(&d, &fx, "curve", extra);
  const char *ping[] = {"ping", "--server", d.job_ep, "--curve-server-key", spub, "--curve-key",
                        akey, "--timeout", "10", NULL};
  int rc = vs_run_tool_all("vspec", ping, 30, out, sizeof out);
  printf("  ping: %s", out);
  assert_int_equal(rc, 0);
  assert_int_equal(vs_daemon_stop(&d, SIGTERM, 30000), 0);

  write_text(list, "a", "not-a-key alice2\n");
  rc = vs_run_tool_all("vspecd", check, 60, out, sizeof out);
  printf("  --check: %s", out);
  assert_int_equal(rc, 2);
  char where[400];
  snprintf(where, sizeof where, "[curve] allowed_clients: %s:4: 'not-a-key'", list);
  assert_non_null(strstr(out, where));
  assert_null(strstr(out, "configuration OK"));
  /* a list that is not there fails the check too */
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s/none.allow", fx.dir);
  assert_int_equal(vs_run_tool_all("vspecd", check, 60, out, sizeof out), 2);
  assert_non_null(strstr(out, "cannot open allow-list"));
  vs_fixture_remove(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_pub_file_and_bare_keys),
                                     cmocka_unit_test(test_key_commented_out),
                                     cmocka_unit_test(test_bad_lines_name_their_line),
                                     cmocka_unit_test(test_daemon_and_check)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
