/*
 * `gsd`: grouped acceptance (Grouped Speculative Decoding, So et al., ICCV 2025,
 * arXiv 2508.07747; code: junhyukso/GSD scheduler/jacobi_iteration_lumina_mgpt.py,
 * SpeculativeSampler.__call__). Lossy, like LANTERN: the emitted tokens no longer follow the
 * target exactly.
 *
 * Rank the vocabulary by the target q at the node, ascending (ties by code index, as a
 * stable sort: upstream's torch.sort promises no order for equal logits, e.g. the -inf tail
 * that top-k leaves). With r the rank of the draft x, the slice holds ranks [r - w, r + w):
 * the w tokens just below x, x and the w - 1 just above (upstream: w = 7, at most 14
 * tokens). The group G(x) is the slice filtered by
 *   |q(j) - q(x)| < p_thr            (upstream's probability filter, p_thr = 0.15), and
 *   j is among x's k nearest codebook neighbours (latent=knn; see "Deviation" below).
 * x is always a member (it passes both filters whenever p_thr > 0). Accept x with
 *   min(1, q(G) / p(G)),
 * p the distribution x was drawn from (one-hot at x for deterministic drafts, so p(G) = 1).
 * When the slice is empty, i.e. r < w (upstream's negative slice start selects nothing for
 * any vocabulary of at least 2w codes, the group sum fails and the code falls back), or
 * w = 0, the rule is exact SD's min(1, q(x) / p(x)). After a rejection the residual is
 * exact SD's norm(max(0, q - p)) (q without x for one-hot drafts), as upstream's
 * reject_sampling_single_token: the group only widens acceptance.
 *
 * Deviation from upstream: the second filter there is the squared L2 distance of the
 * language model's *input token embeddings* (model.embed_tokens.weight, distance < 0.5,
 * applied when every group member is below code 10000). The accept-rule ABI carries no
 * embeddings, only the codebook neighbour table (VSPEC_PLUGIN_USES_NEIGHBOURS: L2 nearest
 * rows of the VQ codebook, closest first), so `latent=knn` keeps j when it is one of x's k
 * nearest codes: a proximity in the tokenizer's latent space instead of the GPT's input
 * space, and a neighbour count instead of a distance threshold. k = 1000 is LANTERN's
 * default neighbourhood (plugins/accept/lantern.c), the project's existing notion of latent
 * proximity; on a 1024-code codebook it keeps almost every code. `latent=off` drops the
 * filter (as upstream does when the group reaches beyond its embedding table); so does a
 * model without a codebook (no table).
 *
 * Greedy decoding (no upstream counterpart: upstream always samples): x is accepted when
 * the target's argmax (first maximum of the engine's temperature-1 softmax) is x or is in
 * G(x), i.e. the group is treated as interchangeable with x, as the sampled rule does.
 *
 * Parameters
 *   window=7        w: the slice is ranks [r - w, r + w); 0 = exact SD; at most 64
 *   p_thr=0.15      probability filter |q(j) - q(x)| < p_thr, [0, 1]; 0 = exact SD
 *   latent=knn      knn: j must be among x's k nearest codebook neighbours; off: no filter
 *   k=1000          neighbours for latent=knn (clamped to the engine's neighbour table)
 */
#include <math.h>
#include <stdio.h>

#include "omega.h"
#include "vspec/plugin.h"

#define GSD_MAX_WINDOW 64

enum { GSD_KNN = 0, GSD_OFF = 1 };

struct vspec_rule {
  const vspec_host *host;
  int window, latent, k;
  double p_thr;
};

static int gsd_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                      char *err, size_t errlen) {
  static const char *const known[] = {"window", "p_thr", "latent", "k", NULL};
  static const char *const latent[] = {"knn", "off", NULL};
  long window, k;
  double p_thr;
  int lat, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_int(params, "window", 7, 0, GSD_MAX_WINDOW, &window, err, errlen)) ||
      (rc = host->param_double(params, "p_thr", 0.15, 0.0, 1.0, &p_thr, err, errlen)) ||
      (rc = host->param_choice(params, "latent", latent, GSD_KNN, &lat, err, errlen)) ||
      (rc = host->param_int(params, "k", 1000, 1, 1 << 20, &k, err, errlen)))
    return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *r = (vspec_rule){.host = host, .window = (int)window, .latent = lat, .k = (int)k,
                    .p_thr = p_thr};
  *out = r;
  return VSPEC_OK;
}

static void gsd_destroy(vspec_rule *r) { r->host->free(r); }

/* The ascending order of the ranking: by target probability, ties by code index. */
static int gsd_less(const float *q, int32_t a, int32_t b) {
  return q[a] < q[b] || (q[a] == q[b] && a < b);
}

/* Inserts y into the ascending buffer buf[0..*n) of capacity cap, keeping the cap largest
 * (keep_high) or smallest entries. */
static void gsd_keep(const float *q, int32_t *buf, int *n, int cap, int32_t y, int keep_high) {
  if (cap <= 0) return;
  if (*n == cap) {
    if (keep_high) {
      if (!gsd_less(q, buf[0], y)) return;
      for (int i = 1; i < *n; i++) buf[i - 1] = buf[i]; /* drop the smallest */
    } else if (!gsd_less(q, y, buf[*n - 1])) {
      return;
    }
    (*n)--;
  }
  int i = *n;
  while (i > 0 && gsd_less(q, y, buf[i - 1])) {
    buf[i] = buf[i - 1];
    i--;
  }
  buf[i] = y;
  (*n)++;
}

/* x's k nearest codebook neighbours, or no filter (latent=off, or no table). */
static int gsd_near(const vspec_rule *r, const vspec_accept_input *in, int32_t j) {
  if (r->latent == GSD_OFF || !in->neighbours || in->n_neighbours <= 0 || j == in->token)
    return 1;
  int kk = r->k < in->n_neighbours ? r->k : in->n_neighbours;
  for (int i = 0; i < kk; i++)
    if (in->neighbours[i] == j) return 1;
  return 0;
}

/* G(x) into g (x first); returns its size, 0 when the slice is empty (the fallback). One
 * pass over the vocabulary: x's rank and the w codes just below and w - 1 just above it,
 * without sorting the whole vocabulary per candidate. */
static int gsd_group(const vspec_rule *r, const vspec_accept_input *in,
                     int32_t g[2 * GSD_MAX_WINDOW]) {
  const float *q = in->q;
  int32_t x = in->token, below[GSD_MAX_WINDOW], above[GSD_MAX_WINDOW];
  int w = r->window, rank = 0, nb = 0, na = 0;
  if (w <= 0) return 0;
  for (int32_t y = 0; y < in->vocab; y++) {
    if (y == x) continue;
    if (gsd_less(q, y, x)) {
      rank++;
      gsd_keep(q, below, &nb, w, y, 1);
    } else {
      gsd_keep(q, above, &na, w - 1, y, 0);
    }
  }
  if (rank < w) return 0;
  int n = 0;
  g[n++] = x;
  for (int pass = 0; pass < 2; pass++) {
    const int32_t *s = pass ? above : below;
    for (int i = 0; i < (pass ? na : nb); i++) {
      int32_t j = s[i];
      /* the same float difference upstream takes, compared in double */
      if (fabs((double)q[j] - (double)q[x]) < r->p_thr && gsd_near(r, in, j)) g[n++] = j;
    }
  }
  return n;
}

static double gsd_accept(vspec_rule *r, const vspec_accept_input *in) {
  int32_t g[2 * GSD_MAX_WINDOW];
  int n = gsd_group(r, in, g);
  double num = in->q[in->token], den = in->p_x;
  if (n > 0) {
    num = 0.0;
    den = in->p ? 0.0 : 1.0; /* one-hot draft: only x, always a member, has mass */
    for (int i = 0; i < n; i++) {
      num += in->q[g[i]];
      if (in->p) den += in->p[g[i]];
    }
    if (!(den > 0.0)) { /* cannot happen for a drafted x (p(x) > 0); stay exact */
      num = in->q[in->token];
      den = in->p_x;
    }
  }
  double a = num / den;
  return a < 1.0 ? a : 1.0;
}

/* The ordinary residual norm(max(0, q - p)), q without x for a one-hot draft: omega.h's at
 * omega = 1 (exact SD's). */
static int gsd_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  (void)r;
  vs_omega_residual(in, 1.0, VS_OMEGA_RULE, q_out);
  return VSPEC_OK;
}

static int gsd_greedy(vspec_rule *r, const vspec_accept_input *in) {
  int32_t top = 0, g[2 * GSD_MAX_WINDOW];
  for (int32_t y = 1; y < in->vocab; y++)
    if (in->q[y] > in->q[top]) top = y;
  if (top == in->token) return 1;
  int n = gsd_group(r, in, g);
  for (int i = 0; i < n; i++)
    if (g[i] == top) return 1;
  return 0;
}

static const vspec_accept_vtable gsd_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = gsd_create,
    .destroy = gsd_destroy,
    .accept_prob = gsd_accept,
    .residual = gsd_residual,
    .greedy_accept = gsd_greedy,
};

static const vspec_plugin_desc gsd_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "gsd", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD |
                          VSPEC_PLUGIN_USES_NEIGHBOURS),
    .description = "GSD: accept with the target/draft mass ratio of x's group of rank- and "
                   "probability-close codebook neighbours",
    .vtable = &gsd_vtable,
};

VSPEC_PLUGIN_DEFINE(gsd_desc)
