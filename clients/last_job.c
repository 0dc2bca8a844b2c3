/*
 * clients/last_job.c - the state file behind `vspec cancel --last` (clients/last_job.h).
 */
#include "clients/last_job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The XDG base directory rule: $XDG_STATE_HOME when it is an absolute path, else
 * ~/.local/state. dir gets ".../vspec", path ".../vspec/last-jobs". */
static int lj_state_dir(char *dir, size_t n, char *err, size_t errlen) {
  const char *x = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
  int k;
  if (x && x[0] == '/') k = snprintf(dir, n, "%s/vspec", x);
  else if (home && *home) k = snprintf(dir, n, "%s/.local/state/vspec", home);
  else {
    snprintf(err, errlen, "neither $XDG_STATE_HOME nor $HOME is set");
    return -1;
  }
  if (k < 0 || (size_t)k >= n) {
    snprintf(err, errlen, "the state directory's path is too long");
    return -1;
  }
  return 0;
}

int vs_last_job_path(char *path, size_t n, char *err, size_t errlen) {
  char dir[4000];
  if (lj_state_dir(dir, sizeof dir, err, errlen)) return -1;
  int k = snprintf(path, n, "%s/last-jobs", dir);
  if (k < 0 || (size_t)k >= n) {
    snprintf(err, errlen, "the state file's path is too long");
    return -1;
  }
  return 0;
}

/* mkdir -p for the state directory (mode 0700: it says which jobs this user ran). */
static int lj_mkdirs(char *dir, char *err, size_t errlen) {
  for (char *s = dir + 1;; s++) {
    char c = *s;
    if (c != '/' && c != 0) continue;
    *s = 0;
    int rc = mkdir(dir, 0700);
    *s = c;
    if (rc && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %.*s: %s", (int)(s - dir), dir, strerror(errno));
      return -1;
    }
    if (!c) return 0;
  }
}

/* One line "JOB ENDPOINT": 1 with its parts, 0 when it is not such a line. */
static int lj_parse_line(char *line, unsigned long long *job, char **endpoint) {
  char *end;
  line[strcspn(line, "\n")] = 0;
  errno = 0;
  *job = strtoull(line, &end, 10);
  if (errno || end == line || *end != ' ' || !end[1]) return 0;
  *endpoint = end + 1;
  return 1;
}

int vs_last_job_load(const char *endpoint, unsigned long long *job, char *err, size_t errlen) {
  char path[4100], line[600], *ep;
  if (vs_last_job_path(path, sizeof path, err, errlen)) return -1;
  FILE *f = fopen(path, "r");
  if (!f && errno == ENOENT) return 0;
  if (!f) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  int found = 0;
  while (!found && fgets(line, sizeof line, f))
    found = lj_parse_line(line, job, &ep) && !strcmp(ep, endpoint);
  fclose(f);
  return found;
}

/* The new first line, then the old lines of other endpoints (at most VS_LAST_JOB_MAX in all). */
static int lj_write_lines(FILE *out, const char *path, const char *endpoint,
                           unsigned long long job) {
  char line[600], *ep;
  unsigned long long id;
  int n = 1, ok = fprintf(out, "%llu %s\n", job, endpoint) > 0;
  FILE *in = fopen(path, "r");
  while (in && ok && n < VS_LAST_JOB_MAX && fgets(line, sizeof line, in))
    if (lj_parse_line(line, &id, &ep) && strcmp(ep, endpoint)) {
      ok = fprintf(out, "%llu %s\n", id, ep) > 0;
      n++;
    }
  if (in) fclose(in);
  return ok;
}

int vs_last_job_save(const char *endpoint, unsigned long long job, char *err, size_t errlen) {
  char dir[4000], path[4100], tmp[4200];
  if (strchr(endpoint, '\n') || strlen(endpoint) > 500) {
    snprintf(err, errlen, "endpoint '%s' cannot be recorded", endpoint);
    return -1;
  }
  if (lj_state_dir(dir, sizeof dir, err, errlen) || lj_mkdirs(dir, err, errlen)) return -1;
  snprintf(path, sizeof path, "%s/last-jobs", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *out = fopen(tmp, "w");
  if (!out) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  int ok = lj_write_lines(out, path, endpoint, job);
  ok = fclose(out) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}
