#include "daemon/plugin_ref.h"

#include <stdio.h>
#include <string.h>

#include "core/registry.h"
#include "vspec/types.h"

int vs_plugin_ref_parse(const char *text, int *kind, char name[64], char *err, size_t errlen) {
  const char *whole = text;
  *kind = -1;
  name[0] = 0;
  /* KIND/NAME or KIND_NAME; a prefix that is no kind is part of the name (accept_x names
   * the rule x, my_rule the plugin my_rule of whichever kind has it). */
  const char *sep = strpbrk(text, "/_");
  if (sep && (size_t)(sep - text) < 16) {
    char k[16];
    memcpy(k, text, (size_t)(sep - text));
    k[sep - text] = 0;
    int parsed = vs_plugin_kind_parse(k);
    if (parsed > 0) {
      *kind = parsed;
      text = sep + 1;
    }
  }
  size_t tl = strlen(text);
  int ok = tl > 0 && tl < 64;
  for (size_t i = 0; ok && i < tl; i++)
    ok = (text[i] >= 'a' && text[i] <= 'z') || (text[i] >= '0' && text[i] <= '9') ||
         text[i] == '_';
  if (!ok) {
    *kind = -1;
    snprintf(err, errlen, "reload: '%.80s' is not a plugin name (NAME, KIND/NAME or "
             "KIND_NAME; KIND = backend, accept, sched)", whole);
    return VSPEC_EINVAL;
  }
  memcpy(name, text, tl + 1);
  return VSPEC_OK;
}
