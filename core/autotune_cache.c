/*
 * size=auto's stored results (core/autotune.h): the keys, the files and the resolve that reads
 * the cache before tuning.
 *
 * One small text file per (model files, method without its size, CFG rows, machine), named
 * autotune-<key>.txt in the cache directory (core/disk_cache.h):
 *   vspec-autotune 2
 *   method sd:exact@standard
 *   machine cpu (avx2, 2 threads) fp32 / Intel(R) Xeon(R) ...
 *   tuned 1795467600
 *   choice drafter=model,shape=chain,depth=3          (or "ar")
 *   ar 1.4840                                          (AR, ms per token)
 *   candidate drafter=model,shape=chain,depth=1 1 1.7400 2.0990 0.4690 802.0
 *   ...                       (images, tokens/round, target ms, draft ms, tokens/s)
 *   best 2
 * and one per (model files, CFG rows, machine) for the target's cost curve that every method
 * shares, autotune-curve-<key>.txt ("ms" and the forward latency at 1, 2, 4 ... 64 nodes).
 * Text, so that a user can read what was chosen. A reader checks every line: a file of
 * another version, another method or machine (a hash collision, a copied cache), a choice
 * that is not one of the method's candidates, or anything malformed is ignored and the method
 * tuned again, as if there were no file.
 */
#include "core/autotune.h"

#include <dirent.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/disk_cache.h"
#include "core/forward_timing.h"
#include "core/metrics.h"
#include "core/params.h"
#include "kernels/vs_kernels.h"

#define AT_MAGIC "vspec-autotune"
#define AT_CURVE_MAGIC "vspec-autotune-curve"
#define AT_CURVE_MIN_TIME 0.1 /* seconds per cost-curve point */
#define AT_FILE_MAX 8192

/* Tunings run one at a time in a process: jobs asking for the same method together tune it
 * once (the second finds the first's choice in the cache), and two tunings would time each
 * other's load. */
static pthread_mutex_t at_lock = PTHREAD_MUTEX_INITIALIZER;

/* The CPU's model name (/proc/cpuinfo), "" when the kernel does not say. */
static void at_cpu_name(char *out, size_t cap) {
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!colon || strncmp(line, "model name", 10) != 0) continue;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    v[strcspn(v, "\n")] = 0;
    snprintf(out, cap, "%s", v);
    break;
  }
  fclose(f);
}

/* Where timings are taken: the device as it describes itself (for a CPU: its kernels' ISA
 * and thread count; for a GPU: its name), the precision and, for a CPU, the processor. */
static void at_machine(vspec_dev *dev, char *out, size_t cap) {
  vs_device_info info;
  memset(&info, 0, sizeof info);
  if (vs_dev_info(dev, &info)) snprintf(info.name, sizeof info.name, "unknown device");
  char cpu[256] = "";
  if (info.kind == VSPEC_DEVICE_CPU) at_cpu_name(cpu, sizeof cpu);
  snprintf(out, cap, "%s %s%s%s", info.name, info.precision == VS_PRECISION_BF16 ? "bf16" : "fp32",
           *cpu ? " / " : "", cpu);
  /* one line in the file */
  for (char *c = out; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
}

/* The cache key hashes every byte of the model's files (tens of MB: tens of ms), too much for
 * every job of a daemon: keys are remembered per (directory, purpose, machine) as long as the
 * directory's files keep their names, sizes and modification times. */
#define AT_MEMO 16
static struct {
  unsigned char id[32];
  char key[VS_CACHE_KEY_LEN + 1];
} at_memo[AT_MEMO];
static int at_memo_n, at_memo_next;

/* A hash of what the memo depends on; 0 when the directory cannot be listed. */
static int at_memo_id(const char *dir, const char *purpose, const char *machine,
                      unsigned char id[32]) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, 32);
  const char *parts[] = {dir, purpose, machine};
  for (int i = 0; i < 3; i++)
    crypto_generichash_update(&st, (const unsigned char *)parts[i], strlen(parts[i]) + 1);
  /* readdir order is stable while the directory is unchanged; a change shows anyway */
  for (struct dirent *e; (e = readdir(d));) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (e->d_name[0] == '.' || stat(path, &sb)) continue;
    long long v[4] = {(long long)sb.st_size, (long long)sb.st_mtim.tv_sec,
                      (long long)sb.st_mtim.tv_nsec, (long long)sb.st_ino};
    crypto_generichash_update(&st, (const unsigned char *)e->d_name, strlen(e->d_name) + 1);
    crypto_generichash_update(&st, (const unsigned char *)v, sizeof v);
  }
  closedir(d);
  crypto_generichash_final(&st, id, 32);
  return 1;
}

/* vs_cache_key through the memo; call with at_lock held. */
static int at_key(const char *dir, const char *purpose, const char *machine,
                  char key[VS_CACHE_KEY_LEN + 1]) {
  unsigned char id[32];
  int have = sodium_init() >= 0 && at_memo_id(dir, purpose, machine, id);
  for (int i = 0; have && i < at_memo_n; i++)
    if (!memcmp(at_memo[i].id, id, sizeof id)) {
      memcpy(key, at_memo[i].key, VS_CACHE_KEY_LEN + 1);
      return VSPEC_OK;
    }
  int rc = vs_cache_key(dir, purpose, machine, key);
  if (!rc && have) {
    memcpy(at_memo[at_memo_next].id, id, sizeof id);
    memcpy(at_memo[at_memo_next].key, key, VS_CACHE_KEY_LEN + 1);
    at_memo_next = (at_memo_next + 1) % AT_MEMO;
    if (at_memo_n < AT_MEMO) at_memo_n++;
  }
  return rc;
}

static void at_file_name(const char *prefix, const char *key, char *out, size_t cap) {
  snprintf(out, cap, "%s-%s.txt", prefix, key);
}

/* "name value\n" at *p: checks the name and returns the value (NUL-terminated in place). */
static char *at_line(char **p, const char *name) {
  char *s = *p, *nl = strchr(s, '\n');
  size_t n = strlen(name);
  if (!nl || strncmp(s, name, n) != 0 || s[n] != ' ') return NULL;
  *nl = 0;
  *p = nl + 1;
  return s + n + 1;
}

/* Parses a choice file into res when it is whole and made for `base` on `machine`, with a
 * choice of the space. */
static int at_parse(char *text, const char *base, const char *machine, const vs_at_space *sp,
                    vs_autotune_result *res) {
  char *p = text, *v, *end;
  char version[16];
  snprintf(version, sizeof version, "%d", VS_AUTOTUNE_VERSION);
  if (!(v = at_line(&p, AT_MAGIC)) || strcmp(v, version) != 0) return 0;
  if (!(v = at_line(&p, "method")) || strcmp(v, base) != 0) return 0;
  if (!(v = at_line(&p, "machine")) || strcmp(v, machine) != 0) return 0;
  if (!(v = at_line(&p, "tuned"))) return 0;
  long long t = strtoll(v, &end, 10);
  if (end == v || *end || t <= 0) return 0;
  if (!(v = at_line(&p, "choice")) || !vs__autotune_valid(sp, v)) return 0;
  snprintf(res->choice, sizeof res->choice, "%s", v);
  res->tuned_at = t;
  res->ar_ms = 0;
  if (!(v = at_line(&p, "ar"))) return 0;
  double ar = strtod(v, &end);
  if (end == v || *end || !(ar > 0)) return 0;
  res->ar_ms = ar;
  /* The table is for reading (and the note's figures); a malformed row just ends it. */
  res->n_cand = 0;
  while (res->n_cand < VS_AUTOTUNE_MAX_CAND && (v = at_line(&p, "candidate"))) {
    vs_autotune_cand *c = &res->cand[res->n_cand];
    if (sscanf(v, "%63s %d %lf %lf %lf %lf", c->param, &c->images, &c->tokens_per_round,
               &c->target_ms, &c->draft_ms, &c->rate) != 6)
      break;
    res->n_cand++;
  }
  if ((v = at_line(&p, "best"))) {
    long b = strtol(v, &end, 10);
    if (end != v && !*end && b >= 0 && b < res->n_cand) res->best = (int)b;
  }
  return 1;
}

static int at_store(const char *dir, const char *name, const vs_autotune_result *res) {
  char buf[AT_FILE_MAX];
  size_t n = (size_t)snprintf(buf, sizeof buf, "%s %d\nmethod %s\nmachine %s\ntuned %lld\n"
                              "choice %s\nar %.4f\n", AT_MAGIC, VS_AUTOTUNE_VERSION, res->base,
                              res->machine, (long long)res->tuned_at, res->choice, res->ar_ms);
  for (int i = 0; i < res->n_cand && n < sizeof buf; i++) {
    const vs_autotune_cand *c = &res->cand[i];
    n += (size_t)snprintf(buf + n, sizeof buf - n, "candidate %s %d %.4f %.4f %.4f %.1f\n",
                          c->param, c->images, c->tokens_per_round, c->target_ms, c->draft_ms,
                          c->rate);
  }
  if (res->best >= 0 && n < sizeof buf)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "best %d\n", res->best);
  if (n >= sizeof buf) return VSPEC_ERANGE;
  return vs_cache_write(dir, name, buf, n);
}

/* ---- the target's cost curve, shared by every method of a model on a machine ----------- */

/* "vspec-autotune-curve 2\nmachine M\nms a b c d e f g\n" */
static int at_curve_parse(char *text, const char *machine, double ms[VS_AT_CURVE_N]) {
  char *p = text, *v, version[16];
  snprintf(version, sizeof version, "%d", VS_AUTOTUNE_VERSION);
  if (!(v = at_line(&p, AT_CURVE_MAGIC)) || strcmp(v, version) != 0) return 0;
  if (!(v = at_line(&p, "machine")) || strcmp(v, machine) != 0) return 0;
  if (!(v = at_line(&p, "ms"))) return 0;
  for (int i = 0; i < VS_AT_CURVE_N; i++) {
    char *end;
    ms[i] = strtod(v, &end);
    if (end == v || !(ms[i] > 0) || ms[i] > 1e6) return 0;
    v = end;
  }
  return *v == 0;
}

/* The target's cost curve at vs__at_curve_nodes: cached per model and machine, measured when
 * absent or refresh is set. */
static int at_cost_curve(vs_models *models, vspec_dev *dev, const char *machine, int refresh,
                         double ms[VS_AT_CURVE_N], int *timed, char *err, size_t errlen) {
  int rows = models->defaults.cfg_scale > 1.0f ? 2 : 1;
  char purpose[128], key[VS_CACHE_KEY_LEN + 1], dir[1024], name[128];
  snprintf(purpose, sizeof purpose, "autotune-curve/%d cfg_rows=%d", VS_AUTOTUNE_VERSION, rows);
  vs_cache_dir(dir, sizeof dir);
  if (at_key(models->dir, purpose, machine, key)) dir[0] = 0;
  at_file_name("autotune-curve", key, name, sizeof name);
  unsigned char *buf = NULL;
  size_t len = 0;
  if (!refresh && *dir && vs_cache_read(dir, name, AT_FILE_MAX, &buf, &len)) {
    buf[len] = 0;
    int ok = memchr(buf, 0, len) == NULL && at_curve_parse((char *)buf, machine, ms);
    free(buf);
    if (ok) return VSPEC_OK;
  }
  for (int i = 0; i < VS_AT_CURVE_N; i++, (*timed)++) {
    int rc = vs_time_forward(dev, &models->target, rows, vs__at_curve_nodes[i], AT_CURVE_MIN_TIME,
                             &ms[i], err, errlen);
    if (rc) return rc;
  }
  if (*dir) {
    char text[512];
    size_t n = (size_t)snprintf(text, sizeof text, "%s %d\nmachine %s\nms", AT_CURVE_MAGIC,
                                VS_AUTOTUNE_VERSION, machine);
    for (int i = 0; i < VS_AT_CURVE_N && n < sizeof text; i++)
      n += (size_t)snprintf(text + n, sizeof text - n, " %.4f", ms[i]);
    if (n + 1 < sizeof text) {
      text[n++] = '\n';
      vs_cache_write(dir, name, text, n); /* a failed write costs the next tuning 1 s */
    }
  }
  return VSPEC_OK;
}

/* ---- resolve -------------------------------------------------------------------------- */

/* Reads a valid cached choice into res; 1 when found. */
static int at_read_choice(const char *dir, const char *name, const vs_method *m,
                          const vs_at_space *sp, vs_autotune_result *res) {
  unsigned char *buf = NULL;
  size_t len = 0;
  if (!*dir || !vs_cache_read(dir, name, AT_FILE_MAX, &buf, &len)) return 0;
  buf[len] = 0; /* vs_cache_read leaves a byte to spare */
  int ok = memchr(buf, 0, len) == NULL && at_parse((char *)buf, res->base, res->machine, sp, res);
  free(buf);
  char err[VSPEC_ERRLEN];
  /* a choice whose method does not fit is tuned again, as a malformed file would be */
  return ok && !vs__autotune_method(m, sp, res->choice, &res->method, err, sizeof err);
}

int vs_autotune_resolve(vs_models *models, vspec_dev *dev, const vs_method *m,
                        const vs_autotune_opts *opts, vs_autotune_result *res, char *err,
                        size_t errlen) {
  memset(res, 0, sizeof *res);
  res->best = -1;
  res->method = *m;
  if (!vs_autotune_wanted(m)) return VSPEC_OK;
  int rc;
  /* size=auto weighs acceptance against the target's cost of verifying a token tree; a MAR
   * target verifies a group of generation steps with a bidirectional pass and a diffusion
   * head per token, a cost that curve does not describe. */
  if (models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS) {
    snprintf(err, errlen, "size=auto is not supported for continuous-token (MAR) models "
             "(model '%s'); use depth=L explicitly", models->name);
    return VSPEC_ENOTSUP;
  }
  vs_at_space sp;
  if ((rc = vs__autotune_space(models, m, &sp, err, errlen))) return rc;
  int rows = models->defaults.cfg_scale > 1.0f ? 2 : 1;
  unsigned flags = opts ? opts->flags : 0;
  /* the cache's key and its "method" line: the method without its size (compose writes none) */
  vs_method_compose(m, m->sched_params, res->base, sizeof res->base);
  at_machine(dev, res->machine, sizeof res->machine);
  char purpose[1200], key[VS_CACHE_KEY_LEN + 1], dir[1024], name[128];
  snprintf(purpose, sizeof purpose, "autotune/%d %s cfg_rows=%d", VS_AUTOTUNE_VERSION,
           res->base, rows);

  pthread_mutex_lock(&at_lock);
  vs_cache_dir(dir, sizeof dir);
  /* No key (an unreadable model directory): tune without the cache. */
  if (at_key(models->dir, purpose, res->machine, key)) dir[0] = 0;
  at_file_name("autotune", key, name, sizeof name);
  if (!(flags & VS_AUTOTUNE_REFRESH) && at_read_choice(dir, name, m, &sp, res)) {
    res->from_cache = res->stored = 1;
    pthread_mutex_unlock(&at_lock);
    return VSPEC_OK;
  }
  double t0 = vs_now(), curve[VS_AT_CURVE_N];
  if (opts && opts->progress)
    opts->progress(opts->user, 0.0, "size=auto: timing the target's forwards on this machine");
  rc = at_cost_curve(models, dev, res->machine, flags & VS_AUTOTUNE_REFRESH, curve,
                          &res->timed, err, errlen);
  if (!rc) rc = vs__autotune_measure(models, dev, m, &sp, curve, opts, res, err, errlen);
  res->tune_s = vs_now() - t0;
  if (!rc && *dir) res->stored = at_store(dir, name, res) == VSPEC_OK;
  pthread_mutex_unlock(&at_lock);
  return rc;
}
