#include "tests/support/proc_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *vs__proc_open(pid_t pid, const char *what) {
  char path[64];
  if (pid) snprintf(path, sizeof path, "/proc/%ld/%s", (long)pid, what);
  else snprintf(path, sizeof path, "/proc/self/%s", what);
  return fopen(path, "r");
}

int vs_proc_maps_count(pid_t pid, const char *needle) {
  FILE *f = vs__proc_open(pid, "maps");
  if (!f) return -1;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) n++;
  fclose(f);
  return n;
}

long vs_proc_rss_kb(pid_t pid) {
  FILE *f = vs__proc_open(pid, "status");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
  fclose(f);
  return kb;
}
