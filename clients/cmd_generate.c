/*
 * clients/cmd_generate.c - vspec generate: submit a job, stream its progress and previews, write the image.
 */
#include "clients/cli.h"

/* Writes the result's PNG; with upscale > 1, enlarged nearest-neighbour on this side (the
 * daemon sends the image at the model's size: decoding its PNG here needs no protocol change
 * and works with any daemon, broker or gateway). The text chunks the daemon writes are
 * written again. *w, *h: the size written. */
static int vs__write_image(const char *path, const void *png, size_t len, int upscale,
                           const char *describe, unsigned *w, unsigned *h) {
  if (upscale <= 1) return vs__write_file(path, png, len);
  char err[VSPEC_ERRLEN];
  uint8_t *rgb = NULL, *big = NULL;
  int width, height, rc = vs_png_decode_rgb(png, len, &rgb, &width, &height, err, sizeof err);
  if (rc) {
    fprintf(stderr, "vspec: the daemon's image: %s\n", err);
    return -1;
  }
  if ((uint64_t)width * height * (uint64_t)upscale * upscale > VS_PNG_READ_MAX_PIXELS) {
    fprintf(stderr, "vspec: --upscale %d would make a %dx%d image: too large\n", upscale,
            width * upscale, height * upscale);
    free(rgb);
    return -1;
  }
  if (vs_rgb_upscale(rgb, width, height, upscale, &big)) {
    fprintf(stderr, "vspec: out of memory for --upscale %d\n", upscale);
    free(rgb);
    return -1;
  }
  vs_png_text text[] = {{"vspec", describe}, {"Software", "vspecd"}};
  rc = vs_png_write_file(path, big, width * upscale, height * upscale, describe ? text : text + 1,
                         describe ? 2 : 1, err, sizeof err);
  if (rc) fprintf(stderr, "vspec: %s\n", err);
  *w = (unsigned)(width * upscale);
  *h = (unsigned)(height * upscale);
  free(rgb);
  free(big);
  return rc ? -1 : 0;
}

static void usage_generate(FILE *f) {
  fprintf(f,
          "usage: vspec generate [options]\n"
          "\n"
          "Submits one image job to vspecd, shows its progress, writes the PNG.\n"
          "\n"
          "  --class C            class label (default 0); `vspec status` names each\n"
          "                       model's classes (models/fmnist: 7 is Sneaker)\n"
          "  --seed S             seed (default 0); the same seed gives the same image\n"
          "  --model NAME         a model the daemon serves (default: the daemon's default)\n"
          "  --method M           complete method: ar | sd:RULE[:PARAMS][@SCHED[:PARAMS]]\n"
          "  --accept RULE        speculative decoding with acceptance rule RULE (exact,\n"
          "                       lantern, lanternpp, uniform_rsd, coolsd, ...; continuous\n"
          "                       for continuous-token (MAR) models, with --sched-param\n"
          "                       shape=chain,depth=L: L draft steps per verification)\n"
          "  --param K=V          a parameter of the rule (repeatable), e.g. delta=0.2\n"
          "  --sched SCHED        scheduler (default standard; vvs)\n"
          "  --sched-param K=V    a parameter of the scheduler (repeatable); without a draft\n"
          "                       size (depth, total_tokens, tree) the daemon uses size=auto:\n"
          "                       the size tuned for the model on its machine (cached)\n"
          "  --draft D            drafter: auto | model | head\n"
          "  --temperature T, --top-k K, --top-p P, --cfg S, --cfg-interval I\n"
          "                       sampling (default: the model's; MAR models take --cfg\n"
          "                       but not --top-k, --top-p or --cfg-interval)\n"
          "  --num-iter N         MAR models: generation steps (default: the model's)\n"
          "  --cfg-schedule S     MAR models: linear (guidance grows as the image fills in;\n"
          "                       MAR's default) | constant\n"
          "  --out FILE           output PNG (default out.png)\n"
          "  --upscale K          enlarge the output PNG K times (1-64), nearest neighbour,\n"
          "                       here on the client; previews keep the daemon's size\n"
          "  --previews DIR       write progressive previews into DIR (preview-NNN.png)\n"
          "  --preview-kind K     lut (default) | decode | tokens\n"
          "  --preview-every N    a preview every N tokens (default: the daemon's, 1/8 image)\n"
          "  --deadline MS        cancel the job if not done MS ms after acceptance\n"
          "  --priority P         -10..10, higher first (default 0)\n"
          "  --tag TEXT           a label for the daemon's log\n"
          "  --job-id N           fleet mode (a vspec-gateway): this job's id, 1 to 2^63-1; the\n"
          "                       same command again follows that job instead of starting\n"
          "                       another (after a lost connection, say); vspecd ignores it\n"
          "  --json               JSON lines on stdout: one per event, the last is the\n"
          "                       result (with stats and tokens) or the error\n"
          "  --quiet              no progress output\n"
          VS_NET_OPTIONS_HELP
          "\n"
          "Ctrl-C cancels the job. Exit status: 0 image written, 1 job failed or output not\n"
          "written, 2 usage, 3 daemon unreachable, 4 request refused as invalid, 5 busy or\n"
          "shutting down (retry later), 6 cancelled or deadline passed, 130 interrupted.\n");
}

static int vs__append_param(char *buf, size_t cap, const char *kv) {
  if (!strchr(kv, '=')) {
    fprintf(stderr, "vspec: parameter '%s' is not KEY=VALUE\n", kv);
    return -1;
  }
  size_t n = strlen(buf);
  if (n + strlen(kv) + 2 > cap) {
    fprintf(stderr, "vspec: too many parameters\n");
    return -1;
  }
  snprintf(buf + n, cap - n, "%s%s", n ? "," : "", kv);
  return 0;
}

int vs_cmd_generate(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  /* The CLI's default seed is 0 (the same command, the same image); a submit without a
   * seed would get a random one from the daemon. */
  sub.has_seed = 1;
  sub.seed = 0;
  const char *out = "out.png", *previews = NULL;
  char accept_params[512] = "", sched_params[512] = "";
  int json = 0, quiet = 0, preview_kind = -1;
  long v, upscale = 1;
  double d;
  unsigned long long u;
  enum { O_CLASS = 1, O_SEED, O_MODEL, O_METHOD, O_ACCEPT, O_PARAM, O_SCHED, O_SPARAM, O_DRAFT,
         O_TEMP, O_TOPK, O_TOPP, O_CFG, O_CFGI, O_NITER, O_CFGS, O_OUT, O_PREV, O_PKIND,
         O_PEVERY, O_DEADLINE, O_PRIO, O_TAG, O_JOBID, O_JSON, O_QUIET, O_UPSCALE, O_HELP };
  static const struct option opts[] = {
      {"class", required_argument, 0, O_CLASS},   {"seed", required_argument, 0, O_SEED},
      {"model", required_argument, 0, O_MODEL},   {"method", required_argument, 0, O_METHOD},
      {"accept", required_argument, 0, O_ACCEPT}, {"param", required_argument, 0, O_PARAM},
      {"sched", required_argument, 0, O_SCHED},   {"sched-param", required_argument, 0, O_SPARAM},
      {"draft", required_argument, 0, O_DRAFT},   {"temperature", required_argument, 0, O_TEMP},
      {"top-k", required_argument, 0, O_TOPK},    {"top-p", required_argument, 0, O_TOPP},
      {"cfg", required_argument, 0, O_CFG},       {"cfg-interval", required_argument, 0, O_CFGI},
      {"num-iter", required_argument, 0, O_NITER},
      {"cfg-schedule", required_argument, 0, O_CFGS},
      {"out", required_argument, 0, O_OUT},       {"previews", required_argument, 0, O_PREV},
      {"preview-kind", required_argument, 0, O_PKIND},
      {"preview-every", required_argument, 0, O_PEVERY},
      {"deadline", required_argument, 0, O_DEADLINE},
      {"priority", required_argument, 0, O_PRIO}, {"tag", required_argument, 0, O_TAG},
      {"job-id", required_argument, 0, O_JOBID},
      {"json", no_argument, 0, O_JSON},           {"quiet", no_argument, 0, O_QUIET},
      {"upscale", required_argument, 0, O_UPSCALE},
      {"help", no_argument, 0, O_HELP},           VS_NET_LONGOPTS,
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1, r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    switch (c) {
      case O_CLASS:
        if ((ok = vs_cli_long("--class", optarg, 0, 1 << 30, &v))) {
          sub.has_class_label = 1;
          sub.class_label = (int32_t)v;
        }
        break;
      case O_SEED:
        if ((ok = vs_cli_u64("--seed", optarg, &u))) {
          sub.has_seed = 1;
          sub.seed = u;
        }
        break;
      case O_MODEL: sub.model = optarg; break;
      case O_METHOD: sub.method = optarg; break;
      case O_ACCEPT: sub.accept = optarg; break;
      case O_PARAM: ok = !vs__append_param(accept_params, sizeof accept_params, optarg); break;
      case O_SCHED: sub.sched = optarg; break;
      case O_SPARAM: ok = !vs__append_param(sched_params, sizeof sched_params, optarg); break;
      case O_DRAFT: sub.draft = optarg; break;
      case O_TEMP:
        if ((ok = vs_cli_double("--temperature", optarg, 0, 100, &d))) {
          sub.has_temperature = 1;
          sub.temperature = (float)d;
        }
        break;
      case O_TOPK:
        if ((ok = vs_cli_long("--top-k", optarg, 0, 1 << 30, &v))) {
          sub.has_top_k = 1;
          sub.top_k = (int32_t)v;
        }
        break;
      case O_TOPP:
        if ((ok = vs_cli_double("--top-p", optarg, 1e-9, 1, &d))) {
          sub.has_top_p = 1;
          sub.top_p = (float)d;
        }
        break;
      case O_CFG:
        if ((ok = vs_cli_double("--cfg", optarg, 0, 100, &d))) {
          sub.has_cfg_scale = 1;
          sub.cfg_scale = (float)d;
        }
        break;
      case O_CFGI:
        if ((ok = vs_cli_long("--cfg-interval", optarg, -1, 1 << 30, &v))) {
          sub.has_cfg_interval = 1;
          sub.cfg_interval = (int32_t)v;
        }
        break;
      case O_NITER:
        if ((ok = vs_cli_long("--num-iter", optarg, 0, 1 << 20, &v))) {
          sub.has_num_iter = 1;
          sub.num_iter = (int32_t)v;
        }
        break;
      case O_CFGS:
        /* checked here too, so a typo is a usage error before anything is sent */
        if (strcmp(optarg, "linear") && strcmp(optarg, "constant")) {
          fprintf(stderr, "--cfg-schedule: '%s' is not linear or constant\n", optarg);
          ok = 0;
        }
        sub.cfg_schedule = optarg;
        break;
      case O_OUT: out = optarg; break;
      case O_PREV: previews = optarg; break;
      case O_PKIND:
        if (!strcmp(optarg, "lut")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
        else if (!strcmp(optarg, "decode")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_DECODE;
        else if (!strcmp(optarg, "tokens")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_TOKENS;
        else {
          fprintf(stderr, "--preview-kind: '%s' is not lut, decode or tokens\n", optarg);
          ok = 0;
        }
        break;
      case O_PEVERY:
        if ((ok = vs_cli_long("--preview-every", optarg, 1, 1 << 20, &v))) {
          sub.has_preview_every_tokens = 1;
          sub.preview_every_tokens = (uint32_t)v;
        }
        break;
      case O_DEADLINE:
        if ((ok = vs_cli_long("--deadline", optarg, 1, 7l * 24 * 3600 * 1000, &v))) {
          sub.has_deadline_ms = 1;
          sub.deadline_ms = (uint32_t)v;
        }
        break;
      case O_PRIO:
        if ((ok = vs_cli_long("--priority", optarg, -10, 10, &v))) {
          sub.has_priority = 1;
          sub.priority = (int32_t)v;
        }
        break;
      case O_TAG: sub.tag = optarg; break;
      case O_JOBID:
        if ((ok = vs_cli_u64("--job-id", optarg, &u)) && (u == 0 || u >> 63)) {
          fprintf(stderr, "vspec generate: --job-id %llu is not 1 to 2^63-1\n", u);
          ok = 0;
        }
        if (ok) {
          sub.has_job_id = 1;
          sub.job_id = u;
        }
        break;
      case O_JSON: json = 1; break;
      case O_QUIET: quiet = 1; break;
      case O_UPSCALE: ok = vs_cli_long("--upscale", optarg, 1, 64, &upscale); break;
      case O_HELP:
      case 'h': usage_generate(stdout); return EXIT_OK;
      default: fprintf(stderr, "see vspec generate --help\n"); return EXIT_USAGE;
    }
    if (!ok) return EXIT_USAGE;
  }
  if (optind < argc) {
    fprintf(stderr, "vspec generate: unexpected argument '%s' (see --help)\n", argv[optind]);
    return EXIT_USAGE;
  }
  if (sub.method && (sub.accept || sub.sched || *accept_params || *sched_params || sub.draft)) {
    fprintf(stderr, "vspec generate: give --method or --accept/--sched/--param/--draft, not both\n");
    return EXIT_USAGE;
  }
  if (!sub.accept && (sub.sched || *accept_params || *sched_params || sub.draft)) {
    fprintf(stderr, "vspec generate: --sched, --param and --draft need --accept RULE\n");
    return EXIT_USAGE;
  }
  if (*accept_params) sub.accept_params = accept_params;
  if (*sched_params) sub.sched_params = sched_params;
  if (previews) {
    if (mkdir(previews, 0755) && errno != EEXIST) {
      fprintf(stderr, "vspec generate: cannot create %s: %s\n", previews, strerror(errno));
      return EXIT_FAIL;
    }
    if (preview_kind < 0) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  }
  if (preview_kind >= 0) {
    sub.has_preview = 1;
    sub.preview = preview_kind;
  }
  sub.has_credit = 1;
  sub.credit = 8;

  vs_conn conn;
  if (vs__connect(&conn, &net, net.server, 1)) return EXIT_UNREACHABLE;
  struct sigaction sa = {.sa_handler = vs__on_sigint};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  vs_progress_line pl;
  vs_progress_line_init(&pl, stderr, 0);
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  rq.submit = &sub;
  char err[1024];
  int status = EXIT_UNREACHABLE;
  double t0 = vs_now(), last = t0;
  if (vs_conn_send(&conn, &rq, NULL, 0, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    goto done;
  }
  uint64_t job = 0, rid = rq.request_id;
  int cancel_sent = 0, n_previews = 0;
  double cancel_at = 0;
  for (;;) {
    if (vs__interrupted && job && !cancel_sent) {
      Vspec__Request cr = VSPEC__REQUEST__INIT;
      Vspec__Cancel cc = VSPEC__CANCEL__INIT;
      cc.job_id = job;
      cr.body_case = VSPEC__REQUEST__BODY_CANCEL;
      cr.cancel = &cc;
      vs_conn_send(&conn, &cr, NULL, 0, err, sizeof err);
      cancel_sent = 1;
      last = cancel_at = vs_now();
      if (!quiet && !json) vs_progress_line_note(&pl, "cancelling job %llu ...",
                                                 (unsigned long long)job);
    }
    if (vs__interrupted && !job) {
      status = EXIT_INTERRUPTED;
      goto done;
    }
    /* Heartbeats (a queued fleet job) must not keep an interrupted client waiting forever. */
    if (cancel_sent && vs_now() - cancel_at > 5.0) {
      vs_progress_line_end(&pl);
      fprintf(stderr, "vspec: no word on cancelling job %llu within 5 s; it may still run\n",
              (unsigned long long)job);
      status = EXIT_INTERRUPTED;
      goto done;
    }
    vs_conn_event e;
    int rc = vs_conn_recv(&conn, 200, &e, err, sizeof err);
    if (rc < 0) {
      vs_progress_line_end(&pl);
      fprintf(stderr, "vspec: %s\n", err);
      goto done;
    }
    double now = vs_now();
    if (rc == 0) {
      double limit = cancel_sent ? 5.0 : net.timeout_s;
      if (now - last > limit) {
        vs_progress_line_end(&pl);
        if (!job)
          fprintf(stderr, "vspec: no answer from %s within %.1f s: is vspecd running there?\n",
                  net.server, limit);
        else
          fprintf(stderr, "vspec: the daemon said nothing about job %llu for %.0f s\n",
                  (unsigned long long)job, limit);
        status = cancel_sent ? EXIT_INTERRUPTED : EXIT_UNREACHABLE;
        goto done;
      }
      continue;
    }
    last = now;
    Vspec__Event *ev = e.ev;
    int mine = (job && ev->has_job_id && ev->job_id == job) ||
               (!job && ev->has_request_id && ev->request_id == rid);
    if (!mine || ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT) {
      vs_conn_event_free(&e);
      continue;
    }
    int credit = 0, finished = 0;
    switch (ev->body_case) {
      case VSPEC__EVENT__BODY_ACCEPTED: {
        const Vspec__Accepted *a = ev->accepted;
        job = ev->job_id;
        pl.job = job;
        if (json) {
          printf("{\"event\": \"accepted\", \"job\": %llu, \"queue_position\": %u, \"model\": ",
                 (unsigned long long)job, a->queue_position);
          vs__json_str(stdout, a->model);
          printf(", \"method\": ");
          vs__json_str(stdout, a->method);
          printf(", \"node\": ");
          vs__json_str(stdout, a->node);
          printf("}\n");
          fflush(stdout);
        } else if (!quiet && !a->model) {
          /* fleet mode: a gateway put the job in the queue; a daemon's Accepted follows */
          vs_progress_line_note(&pl, "job %llu queued by %s (%u job(s) waiting before it)",
                                (unsigned long long)job, a->node ? a->node : "?",
                                a->queue_position);
        } else if (!quiet) {
          vs_progress_line_note(&pl, "job %llu accepted by %s: model %s, method %s, %u tokens%s",
                                (unsigned long long)job, a->node ? a->node : "?",
                                a->model ? a->model : "?", a->method ? a->method : "?",
                                a->tokens_total, a->queue_position ? ", queued" : "");
        }
        break;
      }
      case VSPEC__EVENT__BODY_PROGRESS: {
        const Vspec__Progress *p = ev->progress;
        credit = 1;
        if (json) {
          printf("{\"event\": \"progress\", \"job\": %llu, \"seq\": %llu, \"round\": %lld, "
                 "\"tokens_done\": %u, \"tokens_total\": %u, \"tpf\": %.4f, \"mal\": %.4f, "
                 "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"elapsed_s\": %.4f, "
                 "\"changed\": %zu}\n",
                 (unsigned long long)job, (unsigned long long)ev->seq, (long long)p->round,
                 p->tokens_done, p->tokens_total, p->tpf, p->mal, p->accept_rate,
                 p->walk_accept_rate, p->elapsed_s, p->n_positions);
          fflush(stdout);
        } else if (!quiet && p->round >= 0) {
          vs_progress_line_update(&pl, p->tokens_done, p->tokens_total, p->tpf, p->mal,
                                  p->has_accept_rate ? p->accept_rate : -1.0, now - t0);
        } else if (!quiet) {
          vs_progress_line_note(&pl, "job %llu: position %u in the queue",
                                (unsigned long long)job, p->queue_position);
        }
        break;
      }
      case VSPEC__EVENT__BODY_PREVIEW: {
        const Vspec__Preview *p = ev->preview;
        size_t len;
        const void *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
        credit = 1;
        char path[4200] = "";
        if (previews && png) {
          snprintf(path, sizeof path, "%s/preview-%03d.png", previews, n_previews);
          if (vs__write_file(path, png, len)) *path = 0;
        }
        n_previews++;
        if (json) {
          printf("{\"event\": \"preview\", \"job\": %llu, \"seq\": %llu, \"tokens_done\": %u, "
                 "\"tokens_total\": %u, \"file\": ",
                 (unsigned long long)job, (unsigned long long)ev->seq, p->tokens_done,
                 p->tokens_total);
          vs__json_str(stdout, path);
          printf("}\n");
          fflush(stdout);
        }
        break;
      }
      case VSPEC__EVENT__BODY_RESULT: {
        const Vspec__Result *r = ev->result;
        const Vspec__Stats *st = r->stats;
        size_t len = 0, tlen = 0;
        const void *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
        const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tlen);
        finished = 1;
        vs_progress_line_end(&pl);
        unsigned out_w = r->width, out_h = r->height;
        if (!png || vs__write_image(out, png, len, (int)upscale, r->describe, &out_w, &out_h)) {
          if (!png) fprintf(stderr, "vspec: the result carries no PNG\n");
          status = EXIT_FAIL;
          break;
        }
        status = EXIT_OK;
        double wall = now - t0;
        if (json) {
          printf("{\"event\": \"result\", \"job\": %llu, \"out\": ", (unsigned long long)job);
          vs__json_str(stdout, out);
          printf(", \"width\": %u, \"height\": %u, \"upscale\": %ld, \"latency_s\": %.6f, "
                 "\"previews\": %d", out_w, out_h, upscale, wall, n_previews);
          if (st)
            printf(", \"tokens\": %llu, \"target_forwards\": %llu, \"tpf\": %.4f, \"mal\": %.4f, "
                   "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"draft_tokens\": %llu, "
                   "\"drafted\": %llu, \"accepted\": %llu, \"generate_s\": %.6f, "
                   "\"decode_s\": %.6f, \"queue_s\": %.6f, \"preview_s\": %.6f, \"rule\": ",
                   (unsigned long long)st->tokens, (unsigned long long)st->target_forwards,
                   st->tpf, st->mal, st->accept_rate, st->walk_accept_rate,
                   (unsigned long long)st->draft_tokens, (unsigned long long)st->drafted,
                   (unsigned long long)st->accepted, st->generate_s, st->decode_s, st->queue_s,
                   st->preview_s);
          if (st) vs__json_str(stdout, st->rule_version);
          printf(", \"describe\": ");
          vs__json_str(stdout, r->describe);
          printf(", \"grid\": [");
          for (size_t i = 0; tok && i + 4 <= tlen; i += 4)
            printf("%s%d", i ? ", " : "",
                   (int32_t)((uint32_t)tok[i] | (uint32_t)tok[i + 1] << 8 |
                             (uint32_t)tok[i + 2] << 16 | (uint32_t)tok[i + 3] << 24));
          printf("]}\n");
          fflush(stdout);
        } else if (!quiet) {
          fprintf(stderr, "wrote %s (%ux%u): job %llu, %llu tokens, %llu target forwards, TPF "
                  "%.2f, MAL %.2f, accept %.0f%%, %.3f s end to end (%.3f s generating)\n",
                  out, out_w, out_h, (unsigned long long)job,
                  st ? (unsigned long long)st->tokens : 0ull,
                  st ? (unsigned long long)st->target_forwards : 0ull, st ? st->tpf : 0,
                  st ? st->mal : 0, st ? 100.0 * st->accept_rate : 0, wall,
                  st ? st->generate_s : 0);
        }
        break;
      }
      case VSPEC__EVENT__BODY_ERROR: {
        const Vspec__Error *x = ev->error;
        finished = 1;
        vs_progress_line_end(&pl);
        status = vs__exit_for(x->code);
        if (cancel_sent && x->code == VSPEC__ERROR_CODE__ERR_CANCELLED) status = EXIT_INTERRUPTED;
        if (json) {
          printf("{\"event\": \"error\", \"job\": %llu, \"code\": ", (unsigned long long)job);
          vs__json_str(stdout, vs_wire_error_name(x->code));
          printf(", \"message\": ");
          vs__json_str(stdout, x->message);
          if (x->has_retry_after_ms) printf(", \"retry_after_ms\": %u", x->retry_after_ms);
          printf("}\n");
          fflush(stdout);
        }
        if (!json || !quiet) {
          fprintf(stderr, "vspec: %s: %s", vs_wire_error_name(x->code), x->message);
          if (x->has_retry_after_ms) fprintf(stderr, " (retry after %u ms)", x->retry_after_ms);
          fputc('\n', stderr);
        }
        break;
      }
      case VSPEC__EVENT__BODY_RESTARTED: {
        /* Fleet mode: the daemon that had the job died; another one runs it from the start. */
        const Vspec__Restarted *x = ev->restarted;
        vs_progress_line_end(&pl);
        if (json) {
          printf("{\"event\": \"restarted\", \"job\": %llu, \"delivery\": %u, \"node\": ",
                 (unsigned long long)job, x->delivery);
          vs__json_str(stdout, x->node);
          printf("}\n");
          fflush(stdout);
        } else if (!quiet) {
          fprintf(stderr, "vspec: job %llu restarted on %s (its daemon stopped answering; run %u)\n",
                  (unsigned long long)job, x->node ? x->node : "?", x->delivery);
        }
        break;
      }
      default: break;
    }
    vs_conn_event_free(&e);
    if (finished) goto done;
    if (credit) {
      /* Flow control: one more event may come now that this one is handled. */
      Vspec__Request cr = VSPEC__REQUEST__INIT;
      Vspec__Credit cc = VSPEC__CREDIT__INIT;
      cc.job_id = job;
      cc.grant = 1;
      cr.body_case = VSPEC__REQUEST__BODY_CREDIT;
      cr.credit = &cc;
      vs_conn_send(&conn, &cr, NULL, 0, err, sizeof err);
    }
  }
done:
  vs_conn_close(&conn);
  return status;
}
