/*
 * http/http_answer.c - pieces of a generation's answer that the plain one (http_generate.c)
 * and the streamed one (http_stream.c) share: revised_prompt, the PNG as base64, OpenAI's
 * usage object (http/http_internal.h).
 */
#include "http/http_internal.h"

#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/png_upscale.h"

/* What revised_prompt says: the class the prompt was taken as ("Sneaker", "class 7"). */
json_t *vs__http_revised_prompt(const vs_http_job *j) {
  char t[80];
  if (!j->has_class) return json_null();
  if (j->class_name[0]) return json_string(j->class_name);
  snprintf(t, sizeof t, "class %d", (int)j->class_label);
  return json_string(t);
}

/* Job j's PNG, enlarged `upscale` times, as base64 (malloc'd), or NULL with *r the error. */
char *vs__http_png_b64(const vs_http_job *j, int upscale, vs_http_reply *r) {
  size_t len = 0;
  const void *png = vs_conn_blob(j->result, VSPEC__BLOB_KIND__BLOB_PNG, &len);
  uint8_t *big = NULL;
  if (!png || !len) {
    vs__http_error(r, 500, NULL, "the daemon's result carries no PNG");
    return NULL;
  }
  char err[256];
  int bw, bh;
  if (upscale > 1 && vs_png_upscale(png, len, upscale, &big, &len, &bw, &bh, err, sizeof err)) {
    vs__http_error(r, 500, "size", "size: %s", err);
    return NULL;
  }
  size_t b64_len = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
  char *b64 = malloc(b64_len);
  if (b64) sodium_bin2base64(b64, b64_len, big ? big : png, len, sodium_base64_VARIANT_ORIGINAL);
  else vs__http_error(r, 500, NULL, "out of memory");
  free(big);
  return b64;
}

/* OpenAI's usage object: no input tokens (no text encoder), the image tokens made. */
json_t *vs__http_usage(const vs_http_batch *b) {
  json_int_t out = 0;
  for (int i = 0; i < b->n; i++) {
    const Vspec__Result *res = b->jobs[i].result ? b->jobs[i].result->ev->result : NULL;
    if (res && res->stats) out += (json_int_t)res->stats->tokens;
  }
  return json_pack("{s:i,s:I,s:I,s:{s:i,s:i}}", "input_tokens", 0, "output_tokens", out,
                   "total_tokens", out, "input_tokens_details", "text_tokens", 0,
                   "image_tokens", 0);
}
