/*
 * clients/last_job.h - the last job this user submitted to each server through the CLI, for
 * `vspec cancel --last` (job ids such as 8808317955088799277 are not for typing).
 *
 * One small state file, $XDG_STATE_HOME/vspec/last-jobs (else ~/.local/state/vspec/): a
 * line "JOB ENDPOINT" per job endpoint, the newest first, at most VS_LAST_JOB_MAX lines.
 * It is replaced atomically (a temporary file renamed over it), so a reader never sees half
 * of it; of two clients accepted at the same moment the later rename wins.
 */
#ifndef VS_LAST_JOB_H
#define VS_LAST_JOB_H

#include <stddef.h>

#define VS_LAST_JOB_MAX 32

/* The state file's path; 0, or -1 with err saying why there is none (no $HOME). */
int vs_last_job_path(char *path, size_t n, char *err, size_t errlen);
/* Records job as the last one submitted to endpoint. 0, or -1 with err. */
int vs_last_job_save(const char *endpoint, unsigned long long job, char *err, size_t errlen);
/* The last job submitted to endpoint: 1 (in *job), 0 when none is recorded, -1 with err. */
int vs_last_job_load(const char *endpoint, unsigned long long *job, char *err, size_t errlen);

#endif /* VS_LAST_JOB_H */
