/*
 * tests/support/method_of.h - a method for a test's vs_job from its spelling: jobs carry a
 * parsed vs_method (core/job.h), and tests name theirs as users write them.
 */
#ifndef VS_METHOD_OF_H
#define VS_METHOD_OF_H

#include "core/method.h"

/* The parsed method (NULL for "ar": plain AR, as a job without a method). Aborts the test
 * program on a parse error. The method lives in a per-thread ring of 64: a job must run
 * before 64 more are made on its thread. */
const vs_method *vs_method_of(const char *text);

#endif /* VS_METHOD_OF_H */
