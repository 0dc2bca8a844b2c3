/*
 * http/http_headers.c - the request's headers, held to the letter before anything is
 * routed (issue 32, finding 3). A proxy in front of vspecd may frame or read a request
 * differently from libmicrohttpd when the request is ambiguous (request smuggling), so every
 * ambiguity is refused rather than resolved one way: Content-Length given more than once
 * (even twice the same: a proxy may have read the other copy), Transfer-Encoding with
 * Content-Length, a transfer coding other than chunked, a control character in a header's
 * name or value (NUL included: MHD's C strings would cut the value short), and an Expect
 * other than 100-continue (417, RFC 9110 10.1.1).
 *
 * What MHD 0.9.75 already refuses itself (probed with raw requests, docs/RELIABILITY.md): a
 * Content-Length that is not one number ("5, 5"), a chunked body that is not chunked, a NUL
 * in a header name. What it passes through, and is refused here: the rest of the list above.
 */
#include "http/http_internal.h"

#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

typedef struct hdr_scan {
  int content_length, transfer_encoding;
  int status;      /* the first refusal, 0 = none */
  char why[160];
} hdr_scan;

/* Whether s (n bytes) holds a byte no header may: a control character other than a tab, DEL,
 * or a NUL before its end. */
static int hdr_has_ctl(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return 1;
  }
  return 0;
}

/* Whether the name is an RFC 9110 token: "X-A : b" (a space before the colon) is refused
 * there (RFC 9112 5.1), since a proxy may take it for another header. */
static int hdr_is_token(const char *s, size_t n) {
  static const char extra[] = "!#$%&'*+-.^_`|~";
  if (!n) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
          (ch && strchr(extra, ch))))
      return 0;
  }
  return 1;
}

static void hdr_refuse(hdr_scan *s, int status, const char *fmt, const char *arg) {
  if (s->status) return;
  s->status = status;
  snprintf(s->why, sizeof s->why, fmt, arg);
}

static enum MHD_Result hdr_one(void *cls, enum MHD_ValueKind kind, const char *key,
                               size_t key_size, const char *value, size_t value_size) {
  (void)kind;
  hdr_scan *s = cls;
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(key_size < 60 ? key_size : 60), key ? key : "");
  for (char *p = name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?'; /* the message stays printable */
  if (!key || !value || hdr_has_ctl(key, key_size) || hdr_has_ctl(value, value_size)) {
    hdr_refuse(s, 400, "the header '%s' holds a control character", name);
    return MHD_YES;
  }
  if (!hdr_is_token(key, key_size)) {
    hdr_refuse(s, 400, "the header name '%s' is not a token", name);
    return MHD_YES;
  }
  if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    if (++s->content_length > 1)
      hdr_refuse(s, 400, "%s is given more than once", MHD_HTTP_HEADER_CONTENT_LENGTH);
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    if (++s->transfer_encoding > 1)
      hdr_refuse(s, 400, "%s is given more than once", MHD_HTTP_HEADER_TRANSFER_ENCODING);
    else if (strcasecmp(value, "chunked"))
      hdr_refuse(s, 501, "Transfer-Encoding '%s' is not served (chunked only)", value);
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_EXPECT) && strcasecmp(value, "100-continue")) {
    hdr_refuse(s, 417, "Expect: '%s' cannot be met (only 100-continue)", value);
  }
  return MHD_YES;
}

int vs__http_check_headers(struct MHD_Connection *c, char *why, size_t whylen) {
  hdr_scan s = {0};
  MHD_get_connection_values_n(c, MHD_HEADER_KIND, hdr_one, &s);
  if (!s.status && s.content_length && s.transfer_encoding)
    hdr_refuse(&s, 400, "%s", "Transfer-Encoding and Content-Length together");
  snprintf(why, whylen, "%s", s.why);
  return s.status;
}
