/*
 * tests/support/proc_mem.h - what /proc says of a process's memory: how many of its mappings
 * name a file, and its resident size. For the tests that a repeated failure (a plugin whose
 * init fails, reloaded again and again) leaves the process as it was.
 */
#ifndef VS_PROC_MEM_H
#define VS_PROC_MEM_H

#include <sys/types.h>

/* Lines of /proc/PID/maps (pid 0: this process) whose path contains `needle`; -1 when the
 * file cannot be read. */
int vs_proc_maps_count(pid_t pid, const char *needle);
/* VmRSS of /proc/PID/status in KiB (pid 0: this process); -1 when it cannot be read. */
long vs_proc_rss_kb(pid_t pid);

#endif /* VS_PROC_MEM_H */
