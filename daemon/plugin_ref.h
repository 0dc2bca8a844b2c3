/*
 * daemon/plugin_ref.h - how an admin names a plugin to reload: "NAME", "KIND/NAME" or
 * "KIND_NAME" (KIND = backend, accept, sched; NAME [a-z0-9_]). The text comes off the admin
 * socket, so it is read here, apart from the server's state, where the fuzzer can reach it
 * (tests/fuzz/fuzz_request.c).
 */
#ifndef VS_PLUGIN_REF_H
#define VS_PLUGIN_REF_H

#include <stddef.h>

/* Fills *kind (VSPEC_PLUGIN_*, or -1 when the text names no kind: the caller looks for the
 * one kind that has a file of that name) and name (64 bytes). Returns 0 or VSPEC_EINVAL with
 * a message quoting the text. */
int vs_plugin_ref_parse(const char *text, int *kind, char name[64], char *err, size_t errlen);

#endif /* VS_PLUGIN_REF_H */
