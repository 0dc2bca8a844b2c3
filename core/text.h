/*
 * core/text.h - text that leaves the process: valid UTF-8, no control characters, bounded.
 *
 * Protobuf `string` fields must hold UTF-8 (strict decoders refuse the whole message when one
 * does not), log lines and terminals must not be steered by bytes from the network, and a
 * value echoed in an error message must show exactly which bytes were wrong. One function
 * does all of it, vs_text_clean; vs_text_quote is how a client's bytes are echoed.
 *
 * Bytes that cannot be shown are written as \xNN rather than replaced by U+FFFD: the output
 * stays ASCII where the input was, the log already spoke this way, and an operator (or a
 * client reading its error) learns which byte it was, where U+FFFD says only "something".
 */
#ifndef VS_TEXT_H
#define VS_TEXT_H

#include <stddef.h>
#include <stdint.h>

enum {
  /* Escape every byte outside printable ASCII, valid UTF-8 included: for bytes a client
   * sent, so that nothing it chose (bidirectional overrides, look-alike letters) reaches
   * a reader unmarked. */
  VS_TEXT_ASCII = 1,
  /* Write '\' as "\\", so that a literal "\x1b" cannot pass for an escaped byte. */
  VS_TEXT_BACKSLASH = 2,
};

/* Writes src[0..n) into dst (capacity cap >= 1, always NUL-terminated) as valid UTF-8 in
 * which every byte that is not part of a valid UTF-8 character (overlong forms, surrogates
 * and code points past U+10FFFF included), every control character (C0, DEL, C1, the
 * line and paragraph separators and the bidirectional controls) and, with `flags`, more, is
 * written as \xNN. NUL bytes inside src[0..n) are escaped too. Output is cut at a character
 * or escape boundary, never inside one, and then ends with "..." (when cap leaves room).
 * Returns strlen(dst). */
size_t vs_text_clean(char *dst, size_t cap, const char *src, size_t n, unsigned flags);

/* A client's bytes for a message: src[0..n) between single quotes, escaped with
 * VS_TEXT_ASCII | VS_TEXT_BACKSLASH, cut to fit cap. Returns dst (for printf). */
const char *vs_text_quote(char *dst, size_t cap, const char *src, size_t n);

/* Length of the longest prefix of s[0..n) that is valid UTF-8 (NUL counts as valid here):
 * n when all of it is. */
size_t vs_text_utf8_prefix(const char *s, size_t n);

/* Length of the longest prefix of s[0..n) that vs_text_clean(.., 0) leaves as it is (valid
 * UTF-8 and no control character): n when all of it is. */
size_t vs_text_clean_prefix(const char *s, size_t n);

/* The UTF-8 character at s[0..n): its length (1-4) and code point, or 0 when s does not
 * start with a valid one (n == 0 included). */
int vs_text_utf8_char(const char *s, size_t n, uint32_t *cp);

/* Whether code point cp is a control character as vs_text_clean means it. */
int vs_text_is_control(uint32_t cp);

#endif /* VS_TEXT_H */
