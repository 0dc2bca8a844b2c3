/*
 * clients/generate.h - the two halves of `vspec generate`: its command line
 * (clients/cmd_generate.c) and the job it follows (clients/cmd_generate_run.c).
 */
#ifndef VS_GENERATE_H
#define VS_GENERATE_H

#include "clients/cli.h"
#include "clients/gen_view.h"

typedef struct vs_gen_opts {
  vs_net_opts net;
  Vspec__Submit sub;       /* what is sent; its strings point into argv and the buffers here */
  const char *out;         /* the PNG to write */
  const char *previews;    /* a folder for the previews, or NULL */
  char accept_params[512], sched_params[512];
  int json, quiet;
  long upscale;
} vs_gen_opts;

/* Submits g's job, follows it to its end and writes the image; the exit status. Every way it
 * ends goes through v, so that --json's last line is the result or an error object. */
int vs__gen_run(vs_gen_opts *g, vs_gen_view *v);

#endif /* VS_GENERATE_H */
