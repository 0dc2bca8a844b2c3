/*
 * Text that leaves the process (core/text.c) and the names clients may send (core/names.c):
 * what is kept, what is escaped and how, where output is cut, and, over random bytes, that
 * the output is always strict UTF-8 without control characters, fits its buffer, and (quoted)
 * gives the input back when unescaped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <stdlib.h>
#include <unistd.h>

#include "core/log.h"
#include "tests/support/strict_utf8.h"
#include "core/names.h"
#include "core/text.h"
#include "vspec/types.h"

/* Strict UTF-8 without control characters (C0, DEL, C1, U+2028/9, bidi controls), judged
 * apart from core/text.c: -1 when s[0..n) is clean, else the offset. */
static long bad_at(const char *str, size_t n) { return vt_utf8_bad_at(str, n, 1); }

static const char *clean(const char *s, size_t n, unsigned flags) {
  static char out[1024];
  size_t len = vs_text_clean(out, sizeof out, s, n, flags);
  assert_int_equal(len, strlen(out));
  return out;
}

#define CLEAN0(lit) clean(lit, sizeof lit - 1, 0)

static void test_valid_text_kept(void **state) {
  (void)state;
  assert_string_equal(CLEAN0("plain ascii, with punctuation: []{}~"), "plain ascii, with punctuation: []{}~");
  assert_string_equal(CLEAN0("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"),
                      "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80");
  assert_string_equal(CLEAN0("a\\x1b"), "a\\x1b"); /* flags 0: a backslash stays */
  /* the largest code point and the ones right around the surrogates */
  assert_string_equal(CLEAN0("\xf4\x8f\xbf\xbf\xed\x9f\xbf\xee\x80\x80"),
                      "\xf4\x8f\xbf\xbf\xed\x9f\xbf\xee\x80\x80");
  assert_string_equal(CLEAN0(""), "");
}

static void test_bad_bytes_escaped(void **state) {
  (void)state;
  assert_string_equal(CLEAN0("a\xff" "b\x80" "c"), "a\\xffb\\x80c");
  assert_string_equal(CLEAN0("\xc0\xaf"), "\\xc0\\xaf");             /* overlong '/' */
  assert_string_equal(CLEAN0("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");    /* overlong, 3 bytes */
  assert_string_equal(CLEAN0("\xed\xa0\x80"), "\\xed\\xa0\\x80");    /* a surrogate */
  assert_string_equal(CLEAN0("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80"); /* past U+10FFFF */
  assert_string_equal(CLEAN0("\xf5\x80\x80\x80"), "\\xf5\\x80\\x80\\x80");
  assert_string_equal(CLEAN0("a\xe2\x82"), "a\\xe2\\x82"); /* cut short at the end */
  /* a broken sequence does not swallow the valid character after it */
  assert_string_equal(CLEAN0("\xe2\x82\xe2\x82\xac"), "\\xe2\\x82\xe2\x82\xac");
  /* control characters: C0, DEL, C1 (CSI as U+009B), separators, bidi controls */
  assert_string_equal(CLEAN0("a\x1b[2Jb\r\nc\td\x7f"), "a\\x1b[2Jb\\x0d\\x0ac\\x09d\\x7f");
  assert_string_equal(CLEAN0("x\0y"), "x\\x00y"); /* a NUL inside the given length */
  assert_string_equal(CLEAN0("\xc2\x9b" "2J"), "\\xc2\\x9b2J");
  assert_string_equal(CLEAN0("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
  assert_string_equal(CLEAN0("abc\xe2\x80\xae" "gnp.exe"), "abc\\xe2\\x80\\xaegnp.exe");
}

static void test_flags(void **state) {
  (void)state;
  const char s[] = "caf\xc3\xa9 a\\b\x1b";
  assert_string_equal(clean(s, sizeof s - 1, VS_TEXT_ASCII), "caf\\xc3\\xa9 a\\b\\x1b");
  assert_string_equal(clean(s, sizeof s - 1, VS_TEXT_BACKSLASH), "caf\xc3\xa9 a\\\\b\\x1b");
  assert_string_equal(clean(s, sizeof s - 1, VS_TEXT_ASCII | VS_TEXT_BACKSLASH),
                      "caf\\xc3\\xa9 a\\\\b\\x1b");
  char q[64];
  assert_string_equal(vs_text_quote(q, sizeof q, "mi\x1b" "cro\0x", 8), "'mi\\x1bcro\\x00x'");
  assert_string_equal(vs_text_quote(q, sizeof q, "", 0), "''");
  assert_string_equal(vs_text_quote(q, 8, "abcdefgh", 8), "'ab...'");
  assert_string_equal(vs_text_quote(q, 2, "abc", 3), "");
}

/* Output is cut between characters or escapes, never inside one, and says so. */
static void test_bounds(void **state) {
  (void)state;
  char out[16];
  memset(out, 'z', sizeof out);
  assert_int_equal(vs_text_clean(out, 0, "abc", 3, 0), 0);
  assert_int_equal(out[0], 'z'); /* cap 0: nothing written */
  assert_int_equal(vs_text_clean(out, 1, "abc", 3, 0), 0);
  assert_string_equal(out, "");
  assert_int_equal(vs_text_clean(out, 6, "abcde", 5, 0), 5); /* fits exactly */
  assert_string_equal(out, "abcde");
  assert_int_equal(vs_text_clean(out, 6, "abcdef", 6, 0), 5);
  assert_string_equal(out, "ab...");
  assert_int_equal(vs_text_clean(out, 8, "\x1b\x1b\x1b", 3, 0), 7);
  assert_string_equal(out, "\\x1b...");
  assert_int_equal(vs_text_clean(out, 6, "\xc3\xa9\xc3\xa9\xc3\xa9", 6, 0), 5);
  assert_string_equal(out, "\xc3\xa9...");
  assert_int_equal(vs_text_clean(out, 3, "abc", 3, 0), 2); /* no room for the mark */
  assert_string_equal(out, "ab");
  assert_int_equal(vs_text_clean(out, 4, "\xf0\x9f\x98\x80", 4, 0), 3);
  assert_string_equal(out, "...");
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
  uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Undoes VS_TEXT_ASCII | VS_TEXT_BACKSLASH; returns the length. */
static size_t unescape(const char *s, char *out) {
  size_t o = 0;
  while (*s) {
    if (s[0] == '\\' && s[1] == '\\') {
      out[o++] = '\\';
      s += 2;
    } else if (s[0] == '\\' && s[1] == 'x') {
      unsigned v;
      assert_int_equal(sscanf(s + 2, "%2x", &v), 1);
      out[o++] = (char)v;
      s += 4;
    } else {
      out[o++] = *s++;
    }
  }
  return o;
}

/* Random bytes, biased towards the interesting ones: every output is clean, fits, and with
 * room enough and ASCII | BACKSLASH unescapes to the input; flags 0 is idempotent. */
static void test_random_bytes(void **state) {
  (void)state;
  static const unsigned char pick[] = {0x00, 0x0a, 0x1b, 0x5c, 0x7f, 0x80, 0x9b, 0xbf, 0xc0,
                                       0xc2, 0xc3, 0xe0, 0xe2, 0xed, 0xef, 0xf0, 0xf4, 0xf5,
                                       0xff, 'a', 'x', '.'};
  char in[80], out[400], again[400], back[400];
  for (int k = 0; k < 50000; k++) {
    size_t n = rnd() % sizeof in;
    for (size_t i = 0; i < n; i++)
      in[i] = (char)(rnd() % 3 ? pick[rnd() % sizeof pick] : (unsigned char)rnd());
    unsigned flags = (unsigned)(rnd() % 4);
    size_t cap = rnd() % 2 ? sizeof out : 1 + rnd() % sizeof out;
    size_t len = vs_text_clean(out, cap, in, n, flags);
    assert_true(len < cap);
    assert_int_equal(len, strlen(out));
    if (bad_at(out, len) >= 0) fail_msg("iteration %d: output not clean at %ld", k, bad_at(out, len));
    for (size_t i = 0; (flags & VS_TEXT_ASCII) && i < len; i++)
      assert_true((unsigned char)out[i] < 0x80);
    if (cap == sizeof out) { /* 4 bytes per input byte at most: never cut */
      if (flags == (VS_TEXT_ASCII | VS_TEXT_BACKSLASH)) {
        assert_int_equal(unescape(out, back), n);
        assert_memory_equal(back, in, n);
      }
      if (flags == 0) {
        vs_text_clean(again, sizeof again, out, len, 0);
        assert_string_equal(again, out);
      }
    }
    assert_int_equal(vs_text_clean_prefix(in, n) == n, bad_at(in, n) < 0);
  }
}

static void test_prefixes(void **state) {
  (void)state;
  assert_int_equal(vs_text_utf8_prefix("ab\xc3\xa9\xff" "c", 6), 4);
  assert_int_equal(vs_text_utf8_prefix("a\0b\x1b", 4), 4); /* NUL and ESC are UTF-8 */
  assert_int_equal(vs_text_clean_prefix("a\0b", 3), 1);
  assert_int_equal(vs_text_clean_prefix("ab\xc2\x9b", 4), 2);
  assert_int_equal(vs_text_utf8_prefix("\xe2\x82", 2), 0);
  uint32_t cp;
  assert_int_equal(vs_text_utf8_char("\xf0\x9f\x98\x80", 4, &cp), 4);
  assert_int_equal(cp, 0x1f600);
  assert_int_equal(vs_text_utf8_char("\xf0\x9f\x98\x80", 3, &cp), 0); /* cut by n */
  assert_int_equal(vs_text_utf8_char("", 0, &cp), 0);
}

static void name_ok(const vs_name_kind *k, const char *s) {
  char err[VSPEC_ERRLEN];
  if (vs_name_check(k, "f", s, err, sizeof err)) fail_msg("'%s' refused: %s", s, err);
}

static void name_bad(const vs_name_kind *k, const char *s, const char *want) {
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_name_check(k, "field", s, err, sizeof err), VSPEC_EINVAL);
  if (!strstr(err, want)) fail_msg("message \"%s\" lacks \"%s\"", err, want);
  assert_true(bad_at(err, strlen(err)) < 0);
}

static void test_names(void **state) {
  (void)state;
  name_ok(&vs_name_model, "fmnist-mar");
  name_ok(&vs_name_model, "Micro_2.1");
  name_bad(&vs_name_model, "mi\x1b" "cro",
           "field: 'mi\\x1bcro' has \\x1b at offset 2; a model name is 1-63 bytes of "
           "[A-Za-z0-9._-]");
  name_bad(&vs_name_model, "", "field: an empty value of 0 bytes; a model name is 1-63");
  char long_name[80];
  memset(long_name, 'a', 64);
  long_name[64] = 0;
  name_bad(&vs_name_model, long_name, "field: a value of 64 bytes");
  name_bad(&vs_name_model, "micr\xc3\xb6", "has \\xc3 at offset 4");
  name_bad(&vs_name_model, "a/b", "has / at offset 1");
  name_ok(&vs_name_plugin, "uniform_rsd");
  name_bad(&vs_name_plugin, "Exact", "has E at offset 0; a plugin name is 1-63 bytes of [a-z0-9_]");
  name_bad(&vs_name_plugin, "../x", "has . at offset 0");
  name_ok(&vs_name_method, "sd:lantern:k=100,delta=0.2@standard:shape=static,drafter=head");
  name_ok(&vs_name_method, "sd:exact@standard:shape=static,tree=0/1/0.0");
  name_ok(&vs_name_method, "sd:coolsd:delta=1e+1,schedule=linear @ vvs:skip=uniform");
  name_ok(&vs_name_method, " ar ");
  name_bad(&vs_name_method, "sd:exact;ar", "has ; at offset 8");
  name_bad(&vs_name_method, "sd:exact:k=1\r\nforged@standard", "has \\x0d at offset 12");
  name_ok(&vs_name_params, "k=100,delta=0.2");
  name_ok(&vs_name_params, "");
  name_bad(&vs_name_params, "a:b", "has : at offset 1");
  name_ok(&vs_name_tag, "caf\xc3\xa9 run #3 (a/b)");
  name_bad(&vs_name_tag, "a\nb", "has \\x0a at offset 1; a tag is 0-63 bytes of UTF-8 text");
  name_bad(&vs_name_tag, "x\xc2\x9b", "has \\xc2\\x9b at offset 1");
  name_bad(&vs_name_tag, "x\xff", "has \\xff at offset 1");
  name_ok(&vs_name_word, "linear");
  name_bad(&vs_name_word, "Linear", "has L at offset 0");
  name_ok(&vs_name_reload, "accept/exact");
  name_ok(&vs_name_reload, "sched_vvs");
  name_bad(&vs_name_reload, "accept/ex\x1b", "has \\x1b at offset 9");
}

/* The log goes through the same function: one call is one clean line, whatever the bytes
 * (C1 and bidirectional controls passed through before, being valid UTF-8). */
static void test_log_line(void **state) {
  (void)state;
  char path[] = "/tmp/vspec-log-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  vs_log(VSPEC_LOG_ERROR, "test", "tag %s end", "a\xc2\x9b" "b\nforged\xe2\x80\xae\xff\\x");
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  char buf[512] = "";
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  close(fd);
  unlink(path);
  buf[n] = 0;
  assert_non_null(strstr(buf, "[test] tag a\\xc2\\x9bb\\x0aforged\\xe2\\x80\\xae\\xff\\x end\n"));
  assert_int_equal(strchr(buf, '\n') - buf, (long)n - 1); /* one line */
  assert_true(bad_at(buf, n - 1) < 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_text_kept), cmocka_unit_test(test_bad_bytes_escaped),
      cmocka_unit_test(test_flags),           cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_random_bytes),    cmocka_unit_test(test_prefixes),
      cmocka_unit_test(test_names),           cmocka_unit_test(test_log_line),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
