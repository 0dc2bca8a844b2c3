/*
 * tests/support/accept_rule.h - an acceptance rule of the built plugins, created from its
 * parameter string on a CPU host, for the tests of the rules' maths (test_accept_rules,
 * test_gsd, test_relaxed_reference).
 */
#ifndef VS_TEST_ACCEPT_RULE_H
#define VS_TEST_ACCEPT_RULE_H

#include <stddef.h>

#include "core/registry.h"
#include "vspec/plugin.h"

typedef struct vs_test_rule {
  vs_plugin *plugin;
  const vspec_accept_vtable *vt;
  vspec_rule *r;
} vs_test_rule;

/* Opens the registry of $VSPEC_BUILD/plugins (build/plugins by default) on a CPU host: 0, or
 * nonzero with the reason printed. Once per test program, before any rule is made. */
int vs_test_rules_open(void);
void vs_test_rules_close(void);

/* The rule `name` created with `params` ("delta=0.2,k=4"); fails the test when it cannot be. */
vs_test_rule vs_test_rule_make(const char *name, const char *params);
void vs_test_rule_drop(vs_test_rule *x);

/* The status of creating `name` with `params` (the rule destroyed again when it was made),
 * its message in err. */
int vs_test_rule_create_error(const char *name, const char *params, char *err, size_t n);

#endif /* VS_TEST_ACCEPT_RULE_H */
