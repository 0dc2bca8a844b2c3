/*
 * size=auto's stored choices (core/autotune.h): the key, the file and the resolve that reads
 * the cache before tuning.
 *
 * One small text file per (model files, method without its size, CFG rows, machine), named
 * autotune-<key>.txt in the cache directory (core/disk_cache.h):
 *   vspec-autotune 1
 *   method sd:exact@standard:shape=chain,drafter=model
 *   machine cpu (avx2, 2 threads) fp32 / Intel(R) Xeon(R) ...
 *   tuned 1795467600
 *   choice depth=3
 *   candidate depth=1 1.8900 1.7000 0.2000      (tokens/round, target ms, draft ms)
 *   ...
 * Text, so that a user can read what was chosen. A reader checks every line: a file of
 * another version, another method or machine (a hash collision, a copied cache), a choice
 * that is not one of the shape's candidates, or anything malformed is ignored and the method
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
#include "core/params.h"
#include "kernels/vs_kernels.h"

#define AT_MAGIC "vspec-autotune"
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

static void at_file_name(const char *key, char *out, size_t cap) {
  snprintf(out, cap, "autotune-%s.txt", key);
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

/* Parses a cache file into res when it is whole and made for `base` on `machine`. */
static int at_parse(char *text, const char *base, const char *machine, const char *shape,
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
  if (!(v = at_line(&p, "choice"))) return 0;
  const char *tuned;
  char cands[VS_AUTOTUNE_MAX_CAND][48];
  int nc = vs__autotune_candidates(shape, &tuned, cands), known = 0;
  for (int i = 0; i < nc; i++) known |= strcmp(v, cands[i]) == 0;
  if (!known) return 0;
  snprintf(res->choice, sizeof res->choice, "%s", v);
  res->tuned_at = t;
  /* optional (files written before it have none): the AR step's cost, for comparison */
  res->ar_ms = 0;
  if ((v = at_line(&p, "ar"))) {
    double ar = strtod(v, &end);
    if (end != v && !*end && ar > 0) res->ar_ms = ar;
  }
  /* The table is for reading only; a malformed row just ends it. */
  res->n_cand = 0;
  while (res->n_cand < VS_AUTOTUNE_MAX_CAND && (v = at_line(&p, "candidate"))) {
    vs_autotune_cand *c = &res->cand[res->n_cand];
    if (sscanf(v, "%47s %lf %lf %lf", c->param, &c->tokens_per_round, &c->target_ms,
               &c->draft_ms) != 4)
      break;
    if (strcmp(c->param, res->choice) == 0) res->best = res->n_cand;
    res->n_cand++;
  }
  return 1;
}

static int at_store(const char *dir, const char *name, const vs_autotune_result *res) {
  char buf[AT_FILE_MAX];
  size_t n = (size_t)snprintf(buf, sizeof buf, "%s %d\nmethod %s\nmachine %s\ntuned %lld\n"
                              "choice %s\n", AT_MAGIC, VS_AUTOTUNE_VERSION, res->base,
                              res->machine, (long long)res->tuned_at, res->choice);
  if (res->ar_ms > 0 && n < sizeof buf)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "ar %.4f\n", res->ar_ms);
  for (int i = 0; i < res->n_cand && n < sizeof buf; i++) {
    const vs_autotune_cand *c = &res->cand[i];
    n += (size_t)snprintf(buf + n, sizeof buf - n, "candidate %s %.4f %.4f %.4f\n", c->param,
                          c->tokens_per_round, c->target_ms, c->draft_ms);
  }
  if (n >= sizeof buf) return VSPEC_ERANGE;
  return vs_cache_write(dir, name, buf, n);
}

/* The spec of the cached choice: the base method with the choice's parameter added (the
 * parameter it replaces was left out of the base). */
static void at_spec(const vs_method *m, const char *params, const char *choice, char *out,
                    size_t cap) {
  vspec_params *p;
  char err[VSPEC_ERRLEN], rest[512];
  const char *key_end = strchr(choice, '=');
  size_t klen = key_end ? (size_t)(key_end - choice) : strlen(choice);
  rest[0] = 0;
  if (!vs_params_parse(params, &p, err, sizeof err)) {
    size_t used = 0;
    for (size_t i = 0; i < vs_params_count(p); i++) {
      const char *k = vs_params_key(p, i);
      if (strlen(k) == klen && strncmp(k, choice, klen) == 0) continue;
      used += (size_t)snprintf(rest + used, used < sizeof rest ? sizeof rest - used : 0,
                               "%s%s=%s", used ? "," : "", k, vs_params_value(p, i));
    }
    vs_params_free(p);
  }
  snprintf(out, cap, "sd:%s%s%s@%s:%s%s%s", m->rule, *m->rule_params ? ":" : "", m->rule_params,
           m->sched, rest, *rest ? "," : "", choice);
}

int vs_autotune_resolve(vs_models *models, vspec_dev *dev, const vs_method *m, unsigned flags,
                        vs_autotune_result *res, char *err, size_t errlen) {
  memset(res, 0, sizeof *res);
  res->best = -1;
  snprintf(res->spec, sizeof res->spec, "%s", m->text);
  char params[512];
  int rc = vs_autotune_wanted(m, params, sizeof params, err, errlen);
  if (rc <= 0) return rc;
  if (models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS)
    return vs_autotune_measure(models, dev, m, res, err, errlen); /* says why not */
  int rows = models->defaults.cfg_scale > 1.0f ? 2 : 1;
  snprintf(res->base, sizeof res->base, "sd:%s%s%s@%s%s%s", m->rule, *m->rule_params ? ":" : "",
           m->rule_params, m->sched, *params ? ":" : "", params);
  at_machine(dev, res->machine, sizeof res->machine);
  char purpose[1200], key[VS_CACHE_KEY_LEN + 1], dir[1024], name[128], shape[32] = "dynamic";
  snprintf(purpose, sizeof purpose, "autotune/%d %s cfg_rows=%d", VS_AUTOTUNE_VERSION,
           res->base, rows);
  vspec_params *p;
  if (!vs_params_parse(params, &p, err, errlen)) {
    const char *s = vs_param_string(p, "shape");
    if (s) snprintf(shape, sizeof shape, "%s", s);
    vs_params_free(p);
  }

  pthread_mutex_lock(&at_lock);
  vs_cache_dir(dir, sizeof dir);
  /* No key (an unreadable model directory): tune without the cache. */
  if (at_key(models->dir, purpose, res->machine, key)) dir[0] = 0;
  at_file_name(key, name, sizeof name);
  unsigned char *buf = NULL;
  size_t len = 0;
  if (!(flags & VS_AUTOTUNE_REFRESH) && *dir && vs_cache_read(dir, name, AT_FILE_MAX, &buf, &len)) {
    buf[len] = 0; /* vs_cache_read leaves a byte to spare */
    if (memchr(buf, 0, len) == NULL && at_parse((char *)buf, res->base, res->machine, shape, res)) {
      res->from_cache = res->stored = 1;
      at_spec(m, params, res->choice, res->spec, sizeof res->spec);
    }
    free(buf);
  }
  rc = VSPEC_OK;
  if (!res->from_cache) {
    rc = vs_autotune_measure(models, dev, m, res, err, errlen);
    if (!rc && *dir) res->stored = at_store(dir, name, res) == VSPEC_OK;
  }
  pthread_mutex_unlock(&at_lock);
  return rc;
}
