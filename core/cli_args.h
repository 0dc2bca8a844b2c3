/*
 * core/cli_args.h - strict parsing of numeric command-line values.
 *
 * Each function prints "OPTION: 'VALUE' is not ... (allowed ...)" to stderr and returns 0
 * on bad input, 1 on success, so a command can stop with exit code 2.
 */
#ifndef VS_CLI_ARGS_H
#define VS_CLI_ARGS_H

int vs_cli_long(const char *option, const char *text, long lo, long hi, long *out);
int vs_cli_u64(const char *option, const char *text, unsigned long long *out);
int vs_cli_double(const char *option, const char *text, double lo, double hi, double *out);

#endif /* VS_CLI_ARGS_H */
