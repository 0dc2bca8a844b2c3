#include "core/neighbours.h"

#include <stdlib.h>

typedef struct nb_cand {
  float d;
  int32_t id;
} nb_cand;

static int nb_cand_cmp(const void *a, const void *b) {
  const nb_cand *x = a, *y = b;
  if (x->d < y->d) return -1;
  if (x->d > y->d) return 1;
  return (x->id > y->id) - (x->id < y->id);
}

static int nb_less(const nb_cand *a, const nb_cand *b) { return nb_cand_cmp(a, b) < 0; }

/* Moves the k smallest candidates (by distance, then id) to c[0..k), in any order:
 * a real codebook (16384 codes) would make a full sort per row too slow. */
static void nb_select(nb_cand *c, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    nb_cand pivot = c[lo + (hi - lo) / 2];
    int i = lo, j = hi;
    while (i <= j) {
      while (nb_less(&c[i], &pivot)) i++;
      while (nb_less(&pivot, &c[j])) j--;
      if (i <= j) {
        nb_cand t = c[i];
        c[i] = c[j];
        c[j] = t;
        i++;
        j--;
      }
    }
    if (k - 1 <= j)
      hi = j;
    else if (k - 1 >= i)
      lo = i;
    else
      break;
  }
}

int32_t *vs_neighbours_build(const float *codebook, int vocab, int dim, int k, int *k_out) {
  if (vocab < 2 || dim < 1 || k < 1) return NULL;
  if (k > vocab - 1) k = vocab - 1;
  int32_t *table = malloc((size_t)vocab * k * sizeof *table);
  nb_cand *c = malloc((size_t)(vocab - 1) * sizeof *c);
  if (!table || !c) {
    free(table);
    free(c);
    return NULL;
  }
  for (int y = 0; y < vocab; y++) {
    const float *ey = codebook + (size_t)y * dim;
    int n = 0;
    for (int z = 0; z < vocab; z++) {
      if (z == y) continue;
      const float *ez = codebook + (size_t)z * dim;
      double s = 0.0;
      for (int j = 0; j < dim; j++) {
        double d = (double)ey[j] - ez[j];
        s += d * d;
      }
      c[n].d = (float)s;
      c[n].id = z;
      n++;
    }
    nb_select(c, n, k);
    qsort(c, (size_t)k, sizeof *c, nb_cand_cmp);
    for (int i = 0; i < k; i++) table[(size_t)y * k + i] = c[i].id;
  }
  free(c);
  *k_out = k;
  return table;
}
