/*
 * tests/support/tool_output.h - running a program of the build and reading everything it
 * says: the messages under test go to stderr, which vs_run_tool (daemon_harness.h) drops.
 */
#ifndef VS_TOOL_OUTPUT_H
#define VS_TOOL_OUTPUT_H

#include <stddef.h>

/* Runs $VSPEC_BUILD/tool with args (NULL-terminated), its stdout and stderr both into out
 * (NUL-terminated, cut to outlen); a run longer than timeout_s is killed (SIGALRM). Returns
 * the exit status, 128+n when killed by signal n. */
int vs_run_tool_all(const char *tool, const char *const *args, int timeout_s, char *out,
                    size_t outlen);

#endif /* VS_TOOL_OUTPUT_H */
