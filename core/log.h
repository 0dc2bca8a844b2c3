/*
 * core/log.h - process-wide logging to stderr with a level filter.
 *
 * Every line carries a level and a source ("registry", "llamagen", "job 12"); the daemon
 * prefixes job ids through `who` so a job's story can be grepped out of the log.
 */
#ifndef VS_LOG_H
#define VS_LOG_H

#include "vspec/types.h"

void vs_log_set_level(int level);  /* VSPEC_LOG_*; default VSPEC_LOG_WARN */
int vs_log_get_level(void);
int vs_log_parse_level(const char *name); /* "error".."debug" or -1 */
void vs_log(int level, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif /* VS_LOG_H */
