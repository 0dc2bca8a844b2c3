/*
 * The CLI says at once why it cannot talk to the daemon (client/conn_check.c,
 * proto/endpoint_probe.c): against a CURVE vspecd, an unknown client key, a plaintext client,
 * a wrong server key, and a CURVE client at the plaintext admin endpoint each get their own
 * message within a few seconds although --timeout is 30; so do nothing listening (ipc and
 * tcp) and a socket file this user may not open. And `vspec generate --upscale K` writes the
 * daemon's image enlarged K times, nearest neighbour.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/png_read.h"
#include "proto/endpoint_probe.h"
#include "tests/support/daemon_harness.h"

/* Every failure must come this fast, far below the 30 s --timeout the commands are given. */
#define FAST_S 4.0

typedef struct fixture {
  vs_fixture fx;
  vs_daemon d;
  char spub[300], ckey[300], mkey[300], opub[300];
} fixture;

/* Runs vspec with args; its stderr into err; returns the exit status, *secs the time taken. */
static int run_err(const char *const *args, char *err, size_t errlen, double *secs) {
  char path[600];
  snprintf(path, sizeof path, "%s/vspec", vs_harness_build());
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  double t0 = vs_harness_now();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    const char *argv[40] = {path};
    for (int i = 0; args[i] && i < 38; i++) argv[i + 1] = args[i];
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  size_t used = 0;
  ssize_t r;
  char buf[1024];
  while ((r = read(p[0], buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r && used + 1 < errlen; i++) err[used++] = buf[i];
  err[used] = 0;
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  *secs = vs_harness_now() - t0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Writes DIR/NAME.key and .pub; the public key (printed first) into pub[41]. */
static void keygen(const fixture *f, const char *name, char *pub) {
  char prefix[300], out[512];
  snprintf(prefix, sizeof prefix, "%s/%s", f->fx.dir, name);
  const char *k[] = {"keygen", prefix, NULL};
  assert_int_equal(vs_run_tool("vspec", k, out, sizeof out), 0);
  snprintf(pub, 41, "%.40s", out);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  *state = f;
  vs_fixture_make(&f->fx);
  char pub[41], alice[41], list[300], skey[300], sarg[400], larg[400];
  keygen(f, "server", pub);
  keygen(f, "alice", alice);
  keygen(f, "mallory", pub);
  keygen(f, "other", pub);
  snprintf(list, sizeof list, "%s/clients.allow", f->fx.dir);
  FILE *l = fopen(list, "w");
  assert_non_null(l);
  fprintf(l, "%s alice\n", alice);
  fclose(l);
  snprintf(f->spub, sizeof f->spub, "%s/server.pub", f->fx.dir);
  snprintf(f->ckey, sizeof f->ckey, "%s/alice.key", f->fx.dir);
  snprintf(f->mkey, sizeof f->mkey, "%s/mallory.key", f->fx.dir);
  snprintf(f->opub, sizeof f->opub, "%s/other.pub", f->fx.dir);
  snprintf(skey, sizeof skey, "%s/server.key", f->fx.dir);
  snprintf(sarg, sizeof sarg, "curve.secret_key_file=%s", skey);
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s", list);
  const char *extra[] = {"--set", "curve.enabled=true", "--set", sarg, "--set", larg, NULL};
  vs_daemon_start(&f->d, &f->fx, "curve", extra);
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  vs_daemon_finish(&f->d, &f->fx);
  free(f);
  return 0;
}

/* Fails unless the command exits 3 within FAST_S with `want` in its message. */
static void expect_fast(const char *what, const char *const *args, const char *want) {
  char err[2048];
  double secs;
  int rc = run_err(args, err, sizeof err, &secs);
  printf("  %s: exit %d in %.2f s: %s", what, rc, secs, err);
  if (rc != 3 || !strstr(err, want) || secs > FAST_S)
    fail_msg("%s: want exit 3 within %.0f s saying '%s'", what, FAST_S, want);
}

/* The mechanism a peer announces in its greeting (what the CLI reads when libzmq's events
 * say nothing): the CURVE job endpoint, the plaintext admin endpoint, nobody. */
static void test_peer_mechanism(void **state) {
  fixture *f = *state;
  char mech[21], nobody[400];
  assert_int_equal(vs_endpoint_mechanism(f->d.job_ep, 2000, mech), 1);
  assert_string_equal(mech, "CURVE");
  assert_int_equal(vs_endpoint_mechanism(f->d.admin_ep, 2000, mech), 1);
  assert_string_equal(mech, "NULL");
  snprintf(nobody, sizeof nobody, "ipc://%s/nobody.sock", f->fx.dir);
  assert_int_equal(vs_endpoint_mechanism(nobody, 200, mech), 0);
}

static void test_curve_verdicts(void **state) {
  fixture *f = *state;
  const char *ep = f->d.job_ep;
  char out[512];
  const char *ok[] = {"ping", "--server", ep, "--curve-server-key", f->spub, "--curve-key",
                      f->ckey, "--timeout", "10", NULL};
  assert_int_equal(vs_run_tool("vspec", ok, out, sizeof out), 0);
  assert_non_null(strstr(out, "pong from curve"));
  const char *unknown[] = {"ping", "--server", ep, "--curve-server-key", f->spub, "--curve-key",
                           f->mkey, "--timeout", "30", NULL};
  expect_fast("unknown key", unknown, "not in the daemon's allowed clients");
  const char *plain[] = {"ping", "--server", ep, "--timeout", "30", NULL};
  expect_fast("plaintext client", plain, "requires CURVE encryption");
  const char *wrong[] = {"ping", "--server", ep, "--curve-server-key", f->opub, "--curve-key",
                         f->ckey, "--timeout", "30", NULL};
  expect_fast("wrong server key", wrong, "is not the daemon's");
  /* the admin endpoint is plaintext: a CURVE client there */
  const char *at_plain[] = {"ping", "--server", f->d.admin_ep, "--curve-server-key", f->spub,
                            "--curve-key", f->ckey, "--timeout", "30", NULL};
  expect_fast("CURVE client, plaintext endpoint", at_plain, "does not use CURVE");
}

static void test_nothing_listening(void **state) {
  fixture *f = *state;
  char nowhere[300];
  snprintf(nowhere, sizeof nowhere, "ipc://%s/nobody.sock", f->fx.dir);
  const char *ipc[] = {"ping", "--server", nowhere, "--timeout", "30", NULL};
  expect_fast("no ipc socket", ipc, "no socket file");
  /* a tcp port just freed: nothing listens there */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
  close(s);
  char tcp[64];
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
  const char *t[] = {"ping", "--server", tcp, "--timeout", "30", NULL};
  expect_fast("no tcp listener", t, "nothing listening");
  /* an abstract ipc name has no file to probe: the socket monitor sees the refusals */
  char abstract[64];
  snprintf(abstract, sizeof abstract, "ipc://@vspec-nobody-%ld", (long)getpid());
  const char *ab[] = {"ping", "--server", abstract, "--timeout", "30", NULL};
  expect_fast("no abstract ipc listener", ab, "connection attempts refused");
  /* something listens that never speaks ZeroMQ (the kernel completes the connect) */
  s = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = 0;
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s, 4), 0);
  al = sizeof a;
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &al), 0);
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
  const char *mute[] = {"ping", "--server", tcp, "--timeout", "1", NULL};
  expect_fast("a listener that is not ZeroMQ", mute, "but no ZeroMQ handshake");
  close(s);
}

/* A socket file of another user, mode 0600: connect is refused with EACCES, and the probe
 * names the owner. As root (who may open anything) the probe runs in a child as nobody. */
static void test_socket_of_another_user(void **state) {
  (void)state;
  char dir[] = "/tmp/vspec-denied-XXXXXX";
  assert_non_null(mkdtemp(dir));
  assert_int_equal(chmod(dir, 0755), 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s/admin.sock", dir);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(s, 4), 0);
  assert_int_equal(chmod(a.sun_path, geteuid() == 0 ? 0600 : 0), 0);
  char ep[200];
  snprintf(ep, sizeof ep, "ipc://%s", a.sun_path);
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) || setuid(65534))) _exit(99);
    char err[1024] = "";
    int rc = vs_endpoint_probe(ep, 1000, err, sizeof err);
    dprintf(p[1], "%d %s", rc, err);
    _exit(0);
  }
  close(p[1]);
  char msg[1200] = "";
  ssize_t n = read(p[0], msg, sizeof msg - 1);
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  close(s);
  unlink(a.sun_path);
  rmdir(dir);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_true(n > 0);
  printf("  %s\n", msg);
  assert_int_equal(atoi(msg), VS_PROBE_DENIED);
  assert_non_null(strstr(msg, "permission denied on"));
  assert_non_null(strstr(msg, "belongs to user"));
}

static void read_png(const char *path, uint8_t **rgb, int *w, int *h) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static uint8_t buf[1 << 22];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char err[256];
  if (vs_png_decode_rgb(buf, n, rgb, w, h, err, sizeof err)) fail_msg("%s: %s", path, err);
}

static void test_upscale(void **state) {
  fixture *f = *state;
  char one[300], three[300], err[1024];
  snprintf(one, sizeof one, "%s/one.png", f->fx.dir);
  snprintf(three, sizeof three, "%s/three.png", f->fx.dir);
  const char *g1[] = {"generate", "--server", f->d.job_ep, "--curve-server-key", f->spub,
                      "--curve-key", f->ckey, "--model", "micro", "--seed", "4", "--out", one,
                      "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", g1, NULL, 0), 0);
  const char *g3[] = {"generate", "--server", f->d.job_ep, "--curve-server-key", f->spub,
                      "--curve-key", f->ckey, "--model", "micro", "--seed", "4", "--out", three,
                      "--upscale", "3", "--json", NULL};
  char out[1 << 16];
  assert_int_equal(vs_run_tool("vspec", g3, out, sizeof out), 0);
  uint8_t *a, *b;
  int w, h, W, H;
  read_png(one, &a, &w, &h);
  read_png(three, &b, &W, &H);
  printf("  %dx%d -> --upscale 3 -> %dx%d\n", w, h, W, H);
  assert_int_equal(W, 3 * w);
  assert_int_equal(H, 3 * h);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      if (memcmp(b + ((size_t)y * W + x) * 3, a + ((size_t)(y / 3) * w + x / 3) * 3, 3))
        fail_msg("pixel (%d,%d) is not pixel (%d,%d) of the image", x, y, x / 3, y / 3);
  char dims[64];
  snprintf(dims, sizeof dims, "\"width\": %d, \"height\": %d, \"upscale\": 3", W, H);
  assert_non_null(strstr(out, dims));
  free(a);
  free(b);
  /* the enlarged file keeps the daemon's text chunks, image browsers' `parameters` too */
  static const char *const keys[] = {"vspec", "parameters"};
  for (int k = 0; k < 2; k++) {
    char t1[2048], t3[2048], e[256];
    static uint8_t f1[1 << 16], f3[1 << 18];
    FILE *p1 = fopen(one, "rb"), *p3 = fopen(three, "rb");
    assert_true(p1 && p3);
    size_t n1 = fread(f1, 1, sizeof f1, p1), n3 = fread(f3, 1, sizeof f3, p3);
    fclose(p1);
    fclose(p3);
    assert_int_equal(vs_png_text_get(f1, n1, keys[k], t1, sizeof t1, e, sizeof e), 1);
    assert_int_equal(vs_png_text_get(f3, n3, keys[k], t3, sizeof t3, e, sizeof e), 1);
    assert_string_equal(t1, t3);
  }
  const char *bad[] = {"generate", "--upscale", "65", "--out", three, NULL};
  double secs;
  assert_int_equal(run_err(bad, err, sizeof err, &secs), 2);
  assert_non_null(strstr(err, "--upscale"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_curve_verdicts), cmocka_unit_test(test_peer_mechanism),
      cmocka_unit_test(test_nothing_listening),
      cmocka_unit_test(test_socket_of_another_user), cmocka_unit_test(test_upscale)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
