#include "core/names.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/text.h"
#include "vspec/types.h"

const vs_name_kind vs_name_model = {"a model name", "._-", 1, "[A-Za-z0-9._-]", 1, 63};
const vs_name_kind vs_name_plugin = {"a plugin name", "_", 0, "[a-z0-9_]", 1, 63};
const vs_name_kind vs_name_method = {"a method", "._:=,@+/- ", 1,
                                     "[A-Za-z0-9._:=,@+/-] and blanks", 1, 1000};
const vs_name_kind vs_name_params = {"a parameter list", "._=,+/- ", 1,
                                     "[A-Za-z0-9._=,+/-] and blanks", 0, 400};
const vs_name_kind vs_name_word = {"a keyword", "_", 0, "[a-z0-9_]", 1, 16};
const vs_name_kind vs_name_reload = {"a plugin to reload (NAME, KIND/NAME or KIND_NAME)", "_/",
                                     0, "[a-z0-9_/]", 1, 80};
const vs_name_kind vs_name_tag = {"a tag", NULL, 0, "UTF-8 text without control characters",
                                  0, 63};
const vs_name_kind vs_name_prompt = {"a prompt", NULL, 0,
                                     "UTF-8 text without control characters", 0, 1000};

/* Bytes of the first character of s[0..n) that k does not allow (0: none), at *at. */
static size_t nm_bad_at(const vs_name_kind *k, const char *s, size_t n, size_t *at) {
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (!k->punct) {
      uint32_t cp;
      int len = vs_text_utf8_char(s + i, n - i, &cp);
      if (len == 0 || vs_text_is_control(cp)) {
        *at = i;
        return len ? (size_t)len : 1;
      }
      i += (size_t)len;
      continue;
    }
    int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             (k->upper && c >= 'A' && c <= 'Z') || (c && strchr(k->punct, c));
    if (!ok) {
      *at = i;
      return 1;
    }
    i++;
  }
  return 0;
}

int vs_name_check(const vs_name_kind *k, const char *field, const char *s, char *err,
                  size_t errlen) {
  size_t n = strlen(s), at = 0, bad;
  if (n < k->min || n > k->max) {
    snprintf(err, errlen, "%s: %s of %zu bytes; %s is %zu-%zu bytes of %s", field,
             n ? "a value" : "an empty value", n, k->what, k->min, k->max, k->shown);
    return VSPEC_EINVAL;
  }
  if ((bad = nm_bad_at(k, s, n, &at))) {
    char q[96], b[24];
    vs_text_clean(b, sizeof b, s + at, bad, VS_TEXT_ASCII | VS_TEXT_BACKSLASH);
    snprintf(err, errlen, "%s: %s has %s at offset %zu; %s is %zu-%zu bytes of %s", field,
             vs_text_quote(q, sizeof q, s, n), b, at, k->what, k->min, k->max, k->shown);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}
