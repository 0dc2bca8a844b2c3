/*
 * Writes the seed corpus of fuzz_request (tests/fuzz/corpus/request/): real requests as the
 * vspec CLI and vspecd-bench send them, packed by protobuf-c, in the target's input form (each
 * frame as a 2-byte little-endian length and its bytes; 0xffff = the rest of the input).
 *
 *   build/fuzz/targets/request_seeds DIR      (make fuzz-seeds)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/vspec.pb-c.h"

static const char *dir;

typedef struct frame {
  const void *data;
  size_t len;
} frame;

static void put_len(FILE *f, size_t n) {
  fputc((int)(n & 0xff), f);
  fputc((int)(n >> 8 & 0xff), f);
}

/* frames[] as the target reads them; the last one runs to the end of the file. */
static void write_seed(const char *name, const frame *frames, int n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  for (int i = 0; i < n; i++) {
    put_len(f, i + 1 < n ? frames[i].len : 0xffff);
    fwrite(frames[i].data, 1, frames[i].len, f);
  }
  fclose(f);
}

/* The usual message: delimiter, the packed request, blob frames (their descriptors filled
 * in here, as vs_wire_send_request does). */
static void request(const char *name, Vspec__Request *r, const frame *blobs, int n_blobs,
                    const int *kinds) {
  Vspec__Blob desc[4], *descp[4];
  for (int i = 0; i < n_blobs; i++) {
    vspec__blob__init(&desc[i]);
    desc[i].kind = kinds[i];
    desc[i].size = blobs[i].len;
    descp[i] = &desc[i];
  }
  r->n_blobs = (size_t)n_blobs;
  r->blobs = descp;
  if (!r->version) r->version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  size_t len = vspec__request__get_packed_size(r);
  uint8_t *body = malloc(len ? len : 1);
  vspec__request__pack(r, body);
  frame frames[6] = {{"", 0}, {body, len}};
  for (int i = 0; i < n_blobs; i++) frames[2 + i] = blobs[i];
  write_seed(name, frames, 2 + n_blobs);
  free(body);
}

static void submit(const char *name, Vspec__Submit *s) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.has_request_id = 1;
  r.request_id = 7;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = s;
  request(name, &r, NULL, 0, NULL);
}

static void submits(void) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  submit("submit-empty", &s);
  s.model = "micro";
  s.method = "ar";
  s.has_seed = 1, s.seed = 42;
  s.has_class_label = 1, s.class_label = 3;
  s.has_credit = 1, s.credit = 8;
  s.has_preview = 1, s.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  s.has_preview_every_tokens = 1, s.preview_every_tokens = 4;
  s.has_temperature = 1, s.temperature = 0.9f;
  s.has_top_k = 1, s.top_k = 10;
  s.has_top_p = 1, s.top_p = 0.95f;
  s.has_cfg_scale = 1, s.cfg_scale = 2.0f;
  s.has_cfg_interval = 1, s.cfg_interval = 8;
  s.has_priority = 1, s.priority = 2;
  s.has_deadline_ms = 1, s.deadline_ms = 5000;
  s.has_progress_interval_ms = 1, s.progress_interval_ms = 50;
  s.tag = "seed-ar";
  submit("submit-micro-ar", &s);

  Vspec__Submit sd = VSPEC__SUBMIT__INIT;
  sd.model = "self";
  sd.method = "sd:exact@standard:shape=chain,depth=3";
  sd.has_preview = 1, sd.preview = VSPEC__PREVIEW_KIND__PREVIEW_DECODE;
  submit("submit-self-method", &sd);

  Vspec__Submit parts = VSPEC__SUBMIT__INIT;
  parts.model = "self";
  parts.accept = "lantern";
  parts.accept_params = "k=10,delta=0.2";
  parts.sched = "vvs";
  parts.sched_params = "interval=2";
  parts.draft = "model";
  parts.has_preview_every_rounds = 1, parts.preview_every_rounds = 2;
  submit("submit-self-parts", &parts);

  Vspec__Submit cool = VSPEC__SUBMIT__INIT;
  cool.model = "self";
  cool.accept = "coolsd";
  cool.accept_params = "schedule=linear";
  submit("submit-self-coolsd", &cool);

  Vspec__Submit mar = VSPEC__SUBMIT__INIT;
  mar.model = "mar";
  mar.accept = "continuous";
  mar.sched_params = "shape=chain,depth=2";
  mar.has_num_iter = 1, mar.num_iter = 4;
  mar.cfg_schedule = "constant";
  mar.has_preview = 1, mar.preview = VSPEC__PREVIEW_KIND__PREVIEW_DECODE;
  submit("submit-mar-cspd", &mar);

  Vspec__Submit bad = VSPEC__SUBMIT__INIT;
  bad.model = "micro";
  bad.has_class_label = 1, bad.class_label = 99;
  submit("submit-invalid-class", &bad);
  Vspec__Submit bad2 = VSPEC__SUBMIT__INIT;
  bad2.has_priority = 1, bad2.priority = 11;
  bad2.tag = "tab\there";
  submit("submit-invalid-priority", &bad2);
}

static void caption(void) {
  enum { L = 120, C = 16 };
  static float cap[L * C];
  static uint8_t mask[L];
  for (int i = 0; i < L * C; i++) cap[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
  for (int i = 0; i < L; i++) mask[i] = i >= L - 7;
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "t2i";
  s.has_caption_len = 1, s.caption_len = L;
  s.has_caption_dim = 1, s.caption_dim = C;
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &s;
  frame blobs[2] = {{cap, sizeof cap}, {mask, sizeof mask}};
  int kinds[2] = {VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE, VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8};
  request("submit-t2i-caption", &r, blobs, 2, kinds);
}

static void small_requests(void) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel c = VSPEC__CANCEL__INIT;
  c.job_id = (1ull << 40) | 5;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &c;
  request("cancel", &r, NULL, 0, NULL);

  Vspec__Request r2 = VSPEC__REQUEST__INIT;
  Vspec__Credit cr = VSPEC__CREDIT__INIT;
  cr.job_id = 3;
  cr.grant = 4;
  r2.body_case = VSPEC__REQUEST__BODY_CREDIT;
  r2.credit = &cr;
  request("credit", &r2, NULL, 0, NULL);

  Vspec__Request r3 = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest st = VSPEC__STATUS_REQUEST__INIT;
  r3.has_request_id = 1, r3.request_id = 1;
  r3.body_case = VSPEC__REQUEST__BODY_STATUS;
  r3.status = &st;
  request("status", &r3, NULL, 0, NULL);

  Vspec__Request r4 = VSPEC__REQUEST__INIT;
  Vspec__PluginsRequest pl = VSPEC__PLUGINS_REQUEST__INIT;
  r4.body_case = VSPEC__REQUEST__BODY_PLUGINS;
  r4.plugins = &pl;
  request("plugins", &r4, NULL, 0, NULL);

  Vspec__Request r5 = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r5.body_case = VSPEC__REQUEST__BODY_PING;
  r5.ping = &p;
  request("ping", &r5, NULL, 0, NULL);
  r5.version = 2;
  request("ping-version-2", &r5, NULL, 0, NULL);

  const char *names[] = {"accept/exact", "sched_standard", "llamagen", "accept_lantern"};
  for (int i = 0; i < 4; i++) {
    Vspec__Request rr = VSPEC__REQUEST__INIT;
    Vspec__ReloadRequest rl = VSPEC__RELOAD_REQUEST__INIT;
    rl.name = (char *)names[i];
    rr.body_case = VSPEC__REQUEST__BODY_RELOAD;
    rr.reload = &rl;
    char file[64];
    snprintf(file, sizeof file, "reload-%d", i);
    request(file, &rr, NULL, 0, NULL);
  }
}

/* Framing: a routing frame of the peer's own before the delimiter, and no delimiter. */
static void framing(void) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  uint8_t body[64];
  size_t len = vspec__request__pack(&r, body);
  frame extra[3] = {{"client-7", 8}, {"", 0}, {body, len}};
  write_seed("frame-extra-envelope", extra, 3);
  frame bare[1] = {{body, len}};
  write_seed("frame-no-delimiter", bare, 1);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: request_seeds DIR\n");
    return 2;
  }
  dir = argv[1];
  submits();
  caption();
  small_requests();
  framing();
  return 0;
}
