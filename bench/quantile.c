#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

static int quan_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double vs_bench_quantile(const double *v, int n, double q) {
  if (n <= 0) return 0;
  double *c = malloc((size_t)n * sizeof *c);
  if (!c) return 0;
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, quan_cmp_double);
  int i = (int)(q * (n - 1) + 0.5);
  double x = c[i < 0 ? 0 : i >= n ? n - 1 : i];
  free(c);
  return x;
}
