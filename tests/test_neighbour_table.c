/*
 * The codebook neighbour table is made on demand (core/neighbour_table.c): opening a model
 * and running plain AR or exact-SD jobs never builds it; the first LANTERN job builds it
 * once, equal to vs_neighbours_build's table; concurrent askers share one build; a second
 * open of the same files reads it back from the disk cache, equal again; a corrupt cache
 * file is rebuilt, not trusted.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/neighbours.h"
#include "support/table_model.h"
#include "tests/support/method_of.h"

static char cache[256];

static void run_job(vs_table_world *w, const char *method) {
  char err[VSPEC_ERRLEN];
  int32_t tokens[8];
  vs_metrics mt;
  vs_job job = {.method = vs_method_of(method), .seed = 5, .sampling = w->s};
  if (vs_generate(w->models, w->dev, &job, tokens, &mt, err, sizeof err)) fail_msg("%s", err);
}

static void assert_table_is_exact(vs_models *m) {
  const vspec_model_info *in = &m->target.info;
  int k = 0;
  int32_t *want = vs_neighbours_build(in->codebook, in->vocab, in->token_dim, VS_NEIGHBOURS_K, &k);
  assert_non_null(want);
  assert_non_null(m->neighbours);
  assert_int_equal(m->neighbours_k, k);
  assert_memory_equal(m->neighbours, want, (size_t)in->vocab * k * sizeof *want);
  free(want);
}

static void world(vs_table_world *w) {
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1};
  vs_table_world_open(w, 6, 3, 11, 1.0, 0.5, &s);
}

static void test_lazy_once_and_cached(void **state) {
  (void)state;
  vs_table_world w;
  world(&w);
  assert_non_null(w.models->target.info.codebook);
  assert_null(w.models->neighbours); /* not at open */
  run_job(&w, "ar");
  run_job(&w, "sd:exact@standard:shape=chain,depth=2");
  assert_null(w.models->neighbours);
  assert_int_equal(w.models->neighbours_builds, 0);
  run_job(&w, "sd:lantern:k=2,delta=0.2@standard:shape=chain,depth=2");
  assert_int_equal(w.models->neighbours_builds, 1);
  const int32_t *first = w.models->neighbours;
  run_job(&w, "sd:lanternpp:k=2@standard:shape=chain,depth=2");
  assert_int_equal(w.models->neighbours_builds, 1);
  assert_ptr_equal(w.models->neighbours, first);
  assert_table_is_exact(w.models);

  /* The same files opened again: the table comes from the cache, not from a build. */
  char err[VSPEC_ERRLEN];
  vs_models *again;
  if (vs_models_open(w.reg, &w.host, w.dev, w.model_dir, VS_ROLE_ALL, &again, err, sizeof err))
    fail_msg("%s", err);
  const int32_t *t;
  int k;
  assert_int_equal(vs_models_neighbours(again, &t, &k, err, sizeof err), 0);
  assert_int_equal(again->neighbours_builds, 0);
  assert_table_is_exact(again);
  vs_models_close(again);

  /* A cache file cut short is not trusted: the next open builds the table again. */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "for f in '%s'/nbr-*.bin; do truncate -s -4 \"$f\"; done", cache);
  assert_int_equal(system(cmd), 0);
  if (vs_models_open(w.reg, &w.host, w.dev, w.model_dir, VS_ROLE_ALL, &again, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(vs_models_neighbours(again, &t, &k, err, sizeof err), 0);
  assert_int_equal(again->neighbours_builds, 1);
  assert_table_is_exact(again);
  vs_models_close(again);
  vs_table_world_close(&w);
}

typedef struct asker {
  vs_models *m;
  const int32_t *t;
  int k, rc;
} asker;

static void *ask(void *p) {
  asker *a = p;
  char err[VSPEC_ERRLEN];
  a->rc = vs_models_neighbours(a->m, &a->t, &a->k, err, sizeof err);
  return NULL;
}

static void test_concurrent_askers_share_one_build(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -f '%s'/nbr-*.bin", cache);
  assert_int_equal(system(cmd), 0);
  vs_table_world w;
  world(&w);
  asker a[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (asker){.m = w.models};
    assert_int_equal(pthread_create(&th[i], NULL, ask, &a[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(a[i].rc, 0);
    assert_ptr_equal(a[i].t, w.models->neighbours);
    assert_int_equal(a[i].k, w.models->neighbours_k);
  }
  assert_int_equal(w.models->neighbours_builds, 1);
  assert_table_is_exact(w.models);
  vs_table_world_close(&w);
}

static int setup(void **state) {
  (void)state;
  snprintf(cache, sizeof cache, "/tmp/vspec-nbr-test-XXXXXX");
  if (!mkdtemp(cache)) return -1;
  setenv("VSPEC_CACHE_DIR", cache, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  return system(cmd) ? -1 : 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lazy_once_and_cached),
      cmocka_unit_test(test_concurrent_askers_share_one_build),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
