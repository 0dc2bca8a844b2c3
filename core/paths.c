#include "core/paths.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void vs_exe_dir(char *out, size_t cap) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (cap) out[0] = '\0';
  if (n <= 0) return;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = '\0';
  snprintf(out, cap, "%s", slash == exe ? "/" : exe);
}

static int paths_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

void vs_default_plugin_dir(char *out, size_t cap) {
  char dir[4096], p[4200];
  vs_exe_dir(dir, sizeof dir);
  if (*dir) {
    snprintf(p, sizeof p, "%s/plugins", dir);
    if (paths_exists(p)) {
      snprintf(out, cap, "%s", p);
      return;
    }
    snprintf(p, sizeof p, "%s/../lib/vspec/plugins", dir);
    if (paths_exists(p)) {
      snprintf(out, cap, "%s", p);
      return;
    }
  }
  snprintf(out, cap, "build/plugins");
}

void vs_default_data_path(const char *rel, char *out, size_t cap) {
  char dir[4096], p[4400];
  vs_exe_dir(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/../share/vspec/%s", dir, rel);
  snprintf(out, cap, "%s", !paths_exists(rel) && *dir && paths_exists(p) ? p : rel);
}
