/*
 * kernels/cpu/cpu_weights.c - allocation table and bf16 weight copies (see cpu_weights.h).
 *
 * An open-addressing hash table keyed by the allocation's address (linear probing, deletion
 * by backward shift, grown at half full), under one mutex. Allocations are rare (model loads,
 * session opens; never in the round loop), and a lookup per linear layer costs far less than
 * the layer. A copy is converted under the mutex, so two threads that meet the same weight
 * first do not both convert it; conversions happen once per weight, at its first forward.
 */
#include <pthread.h>
#include <stdlib.h>

#include "vspec/types.h"
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_weights.h"
#include "kernels/vs_kernels.h"

typedef struct weight_entry {
  const void *ptr; /* NULL: empty slot */
  size_t bytes;
  uint16_t *amx;  /* packed copy (AMX tile order), or NULL */
  uint16_t *rows; /* row-major bf16 copy (CPUs without AMX), or NULL */
  int n, k;       /* shape the copy was made for */
  void *int8;     /* packed int8 copy (cpu_linear_amx8.h), or NULL */
  int int8_n, int8_k;
  int int8_requests; /* weight_format requests standing (asked minus withdrawn) */
  int int8_failed;   /* the weight could not be packed (not finite, no memory): stays bf16 */
} weight_entry;

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static weight_entry *table;
static size_t table_cap, table_used, copy_bytes;
/* Set once a weight was ever asked for in int8: until then vs_cpu_weights_amx8 returns at
 * once, without the mutex (most processes never ask). */
static volatile int any_int8_request;

static size_t slot_of(const void *p, size_t cap) {
  uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull; /* Fibonacci hashing */
  return (size_t)(h >> 20) & (cap - 1);
}

static weight_entry *find(const void *p) {
  if (!table_cap) return NULL;
  for (size_t i = slot_of(p, table_cap);; i = (i + 1) & (table_cap - 1)) {
    if (table[i].ptr == p) return &table[i];
    if (!table[i].ptr) return NULL;
  }
}

static void insert(weight_entry e) {
  size_t i = slot_of(e.ptr, table_cap);
  while (table[i].ptr) i = (i + 1) & (table_cap - 1);
  table[i] = e;
}

static int grow(void) {
  size_t cap = table_cap ? 2 * table_cap : 256;
  weight_entry *old = table, *fresh = calloc(cap, sizeof *fresh);
  if (!fresh) return VSPEC_ENOMEM;
  size_t old_cap = table_cap;
  table = fresh;
  table_cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].ptr) insert(old[i]);
  free(old);
  return VSPEC_OK;
}

int vs_cpu_weights_track(void *p, size_t bytes) {
  pthread_mutex_lock(&table_mu);
  int rc = VSPEC_OK;
  weight_entry *known = find(p);
  if (known) { /* lent again (a tensor asked for twice): keep one entry */
    if (bytes > known->bytes) known->bytes = bytes;
    pthread_mutex_unlock(&table_mu);
    return rc;
  }
  if (2 * (table_used + 1) > table_cap) rc = grow();
  if (rc == VSPEC_OK) {
    insert((weight_entry){.ptr = p, .bytes = bytes});
    table_used++;
  }
  pthread_mutex_unlock(&table_mu);
  return rc;
}

/* Removes slot i and shifts later members of its probe run back (no tombstones). */
static void remove_at(size_t i) {
  table[i] = (weight_entry){0};
  for (size_t j = (i + 1) & (table_cap - 1); table[j].ptr; j = (j + 1) & (table_cap - 1)) {
    size_t home = slot_of(table[j].ptr, table_cap);
    /* j's entry may move to i when i lies cyclically in [home, j) */
    int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      table[i] = table[j];
      table[j] = (weight_entry){0};
      i = j;
    }
  }
}

/* The bf16 copies (CPUs without AMX) are carved from arenas on huge pages: most copies are
 * 1-4 MiB, so a block of their own would start a huge page at best once and leave the rest of
 * the copy on 4 KiB pages, and decoding streams the copies once per token: on the Zen 4
 * development machine a GPT-B bf16 forward took 10.2 ms with the copies in their own blocks
 * and 7.6 ms on huge pages throughout (docs/BENCHMARKS.md, issue 33 item 4). An arena is
 * freed with the last copy carved from it; a copy above half an arena gets its own block
 * (vs_cpu_weight_alloc, which puts it on huge pages but for its ends). Under table_mu. */
#define VS_COPY_ARENA ((size_t)32 << 20)

typedef struct copy_arena {
  struct copy_arena *next;
  char *base;
  size_t used;
  int live; /* copies carved from it and not freed */
} copy_arena;

static copy_arena *arenas; /* the newest first: the one carved from */

static void *copy_alloc(size_t bytes) {
  bytes = (bytes + 63) & ~(size_t)63; /* each copy on a cache line of its own */
#ifdef VSPEC_SANITIZED
  /* blocks of their own, so that the sanitizer sees a read past the end of a copy */
  return vs_cpu_weight_alloc(bytes);
#endif
  if (bytes > VS_COPY_ARENA / 2) return vs_cpu_weight_alloc(bytes);
  copy_arena *a = arenas;
  if (!a || VS_COPY_ARENA - a->used < bytes) {
    a = calloc(1, sizeof *a);
    if (!a || !(a->base = vs_cpu_weight_alloc(VS_COPY_ARENA))) {
      free(a);
      return NULL;
    }
    a->next = arenas;
    arenas = a;
  }
  void *p = a->base + a->used;
  a->used += bytes;
  a->live++;
  return p;
}

/* Releases a copy carved from an arena (the arena with its last copy) and returns 1; 0 for a
 * copy in a block of its own (the caller frees it). */
static int copy_release(const void *p) {
  for (copy_arena **pp = &arenas; *pp; pp = &(*pp)->next) {
    copy_arena *a = *pp;
    if ((const char *)p < a->base || (const char *)p >= a->base + VS_COPY_ARENA) continue;
    if (--a->live == 0) {
      *pp = a->next;
      free(a->base);
      free(a);
    }
    return 1;
  }
  return 0;
}

void vs_cpu_weights_untrack(void *p) {
  uint16_t *amx = NULL, *rows = NULL;
  void *int8 = NULL;
  pthread_mutex_lock(&table_mu);
  weight_entry *e = find(p);
  if (e) {
    amx = e->amx;
    rows = e->rows;
    int8 = e->int8;
    if (amx) copy_bytes -= vs_amx_packed_bytes(e->n, e->k);
    if (rows) copy_bytes -= (size_t)e->n * e->k * sizeof(uint16_t);
    if (rows && copy_release(rows)) rows = NULL;
    if (int8) copy_bytes -= vs_amx8_packed_bytes(e->int8_n, e->int8_k);
    remove_at((size_t)(e - table));
    table_used--;
  }
  pthread_mutex_unlock(&table_mu);
  free(amx);
  free(rows);
  free(int8);
}

int vs_cpu_weights_request_int8(const float *w, int n, int k, int delta) {
  if (n <= 0 || k <= 0 || (delta != 1 && delta != -1)) return VSPEC_EINVAL;
  pthread_mutex_lock(&table_mu);
  weight_entry *e = find(w);
  int rc = e && e->bytes >= (size_t)n * k * sizeof(float) ? VSPEC_OK : VSPEC_EINVAL;
  if (rc == VSPEC_OK && delta > 0) {
    e->int8_requests++;
    any_int8_request = 1;
  } else if (rc == VSPEC_OK && e->int8_requests > 0) {
    e->int8_requests--; /* the copy stays until the weight goes: a forward may be using it */
  }
  pthread_mutex_unlock(&table_mu);
  return rc;
}

const void *vs_cpu_weights_amx8(const float *w, int n, int k) {
  if (n <= 0 || k <= 0 || !any_int8_request) return NULL;
  pthread_mutex_lock(&table_mu);
  const void *out = NULL;
  weight_entry *e = find(w);
  if (e && e->int8_requests > 0 && !e->int8_failed && e->bytes >= (size_t)n * k * sizeof(float)) {
    if (e->int8) {
      if (e->int8_n == n && e->int8_k == k) out = e->int8;
    } else {
      size_t bytes = vs_amx8_packed_bytes(n, k);
      void *copy = aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (copy && vs_amx8_pack(w, n, k, copy) == 0) {
        e->int8 = copy, e->int8_n = n, e->int8_k = k;
        copy_bytes += bytes;
        out = copy;
      } else { /* no memory, or a weight that is not finite: it stays in bf16 */
        free(copy);
        e->int8_failed = 1;
      }
    }
  }
  pthread_mutex_unlock(&table_mu);
  return out;
}

const uint16_t *vs_cpu_weights_amx(const float *w, int n, int k) {
  if (n <= 0 || k <= 0) return NULL;
  pthread_mutex_lock(&table_mu);
  const uint16_t *out = NULL;
  weight_entry *e = find(w);
  if (e && e->bytes >= (size_t)n * k * sizeof(float) && !e->rows) {
    if (e->amx) {
      if (e->n == n && e->k == k) out = e->amx;
    } else {
      size_t bytes = vs_amx_packed_bytes(n, k);
      uint16_t *copy = aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (copy) {
        vs_amx_pack(w, n, k, copy);
        e->amx = copy, e->n = n, e->k = k;
        copy_bytes += bytes;
        out = copy;
      }
    }
  }
  pthread_mutex_unlock(&table_mu);
  return out;
}

const uint16_t *vs_cpu_weights_bf16_rows(const float *w, int n, int k) {
  if (n <= 0 || k <= 0) return NULL;
  pthread_mutex_lock(&table_mu);
  const uint16_t *out = NULL;
  weight_entry *e = find(w);
  if (e && e->bytes >= (size_t)n * k * sizeof(float) && !e->amx) {
    if (e->rows) {
      if (e->n == n && e->k == k) out = e->rows;
    } else {
      size_t count = (size_t)n * k;
      uint16_t *copy = copy_alloc(count * sizeof(uint16_t));
      if (copy) {
        vs_bf16_pack(w, n, k, copy);
        e->rows = copy, e->n = n, e->k = k;
        copy_bytes += count * sizeof(uint16_t);
        out = copy;
      }
    }
  }
  pthread_mutex_unlock(&table_mu);
  return out;
}

void vs_cpu_memory_lend(const void *p, size_t bytes) {
  /* Out of memory here only means no bf16 copy for this tensor: fp32 serves it. */
  if (p) (void)vs_cpu_weights_track((void *)p, bytes);
}

void vs_cpu_memory_release(const void *p, size_t bytes) {
  if (!p) return;
  const char *lo = p, *hi = lo + bytes;
  for (;;) { /* one at a time: removal moves the entries behind it */
    void *victim = NULL;
    pthread_mutex_lock(&table_mu);
    for (size_t i = 0; i < table_cap && !victim; i++) {
      const char *q = table[i].ptr;
      if (q && q >= lo && q < hi) victim = (void *)q;
    }
    pthread_mutex_unlock(&table_mu);
    if (!victim) return;
    vs_cpu_weights_untrack(victim);
  }
}

void vs_cpu_weights_stats(size_t *allocations, size_t *bytes) {
  pthread_mutex_lock(&table_mu);
  if (allocations) *allocations = table_used;
  if (bytes) *bytes = copy_bytes;
  pthread_mutex_unlock(&table_mu);
}
