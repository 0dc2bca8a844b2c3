/*
 * tests/support/strict_utf8.h - an independent judge of the strings vspec emits: strict UTF-8
 * (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF) without control
 * characters. Written apart from core/text.c so that the daemon is not judged by its own code.
 */
#ifndef VS_TEST_STRICT_UTF8_H
#define VS_TEST_STRICT_UTF8_H

#include <stddef.h>

/* Offset of the first byte of s[0..n) that strict UTF-8 refuses or that starts a control
 * character (C0, DEL, C1; with format_controls also U+2028/9 and the bidirectional controls,
 * which core/text.c escapes too); -1 when there is none. */
long vt_utf8_bad_at(const char *s, size_t n, int format_controls);

#endif /* VS_TEST_STRICT_UTF8_H */
