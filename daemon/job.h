/*
 * daemon/job.h - one job in vspecd, from an accepted Submit to its terminal event.
 *
 * Three owners touch a job, each its own part:
 *  - the request: filled by the loop thread before the job is queued, read-only afterwards;
 *  - `sh`: written by the worker that runs it (the newest token map, the newest preview, the
 *    final result), read by the loop thread; guarded by `mu`. The worker only ever
 *    overwrites, so a slow client costs memory for one state and one preview, not a backlog
 *    (coalescing);
 *  - `lp`: the loop thread's bookkeeping (client, sequence numbers, credit, what the client
 *    has already been sent).
 * The cancel flag is the engine's (vs_job.cancel): any thread may set it, the engine stops at
 * the next round boundary. A reference count keeps the job alive while the loop, the queue,
 * a worker or the mailbox holds it.
 */
#ifndef VS_DJOB_H
#define VS_DJOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/method.h"
#include "core/models.h"
#include "proto/wire.h"

enum { VS_JOB_QUEUED = 0, VS_JOB_RUNNING = 1, VS_JOB_DONE = 2 };

/* Why a job was cancelled (first reason wins). */
enum {
  VS_CANCEL_NONE = 0,
  VS_CANCEL_CLIENT = 1,   /* its client asked */
  VS_CANCEL_ADMIN = 2,    /* an operator asked (admin endpoint) */
  VS_CANCEL_DEADLINE = 3, /* its deadline passed */
  VS_CANCEL_DRAIN = 4,    /* the daemon is shutting down */
  VS_CANCEL_GONE = 5      /* its client disappeared */
};

/* Which sampling fields the request set (the rest come from the model's defaults). */
enum {
  VS_SET_TEMPERATURE = 1,
  VS_SET_TOP_K = 2,
  VS_SET_TOP_P = 4,
  VS_SET_CFG = 8,
  VS_SET_CFG_INTERVAL = 16,
  VS_SET_NUM_ITER = 32,     /* continuous-token models */
  VS_SET_CFG_SCHEDULE = 64
};

struct vs_client;

#define VS_DJOB_MAX_NOTES 4
#define VS_DJOB_NOTE_LEN 640

typedef struct vs_djob_stats {
  int64_t tokens, target_forwards, rounds, drafted, draft_tokens, accepted, skipped_rounds,
      unverified;
  int64_t tree_nodes;
  double tpf, mal, accept_rate, walk_accept_rate; /* core/metrics.h */
  double generate_s, decode_s, queue_s, preview_s;
  int previews;
  char rule_version[96], sched_version[96];
  unsigned model_generation;
} vs_djob_stats;

typedef struct vs_djob vs_djob;
struct vs_djob {
  uint64_t id;
  atomic_int refs;

  /* ---- the request (immutable once queued) ---- */
  char model[64];
  /* built and checked once at submission (daemon/submit.c); size=auto stays for the worker to
   * resolve (daemon/workers.c); method.text is for logs, events and results */
  vs_method method;
  char sched_name[64]; /* for the stats: which plugins served the job */
  char rule_name[64];
  char tag[64];
  int32_t class_label;
  int has_class;          /* a class-conditional model: class_label and class_name apply */
  char class_name[64];    /* its manifest's name for class_label, "" when it names none */
  float *caption;         /* [caption_len, caption_dim] or NULL */
  uint8_t *caption_mask;  /* [caption_len] */
  int caption_len, caption_dim;
  uint64_t seed;
  vs_sampling sampling;   /* fields flagged in sampling_set override the model's defaults */
  unsigned sampling_set;
  int preview_kind;       /* Vspec__PreviewKind */
  int preview_every_tokens, preview_every_rounds;
  int progress;           /* stream progress events */
  double progress_interval; /* seconds between progress events, 0 = every round */
  int priority;
  uint64_t client_key;    /* fairness between clients: its connection (daemon/server_clients.c) */
  int tokens_total;       /* grid of the model at submission */
  double submitted_at;    /* monotonic seconds */
  double deadline;        /* monotonic seconds, 0 = none */

  /* ---- any thread ---- */
  atomic_int cancel;        /* the engine's flag */
  atomic_int cancel_reason; /* VS_CANCEL_* */
  int state;                /* VS_JOB_*; guarded by the queue's lock */
  vs_djob *qnext;           /* queue links; guarded by the queue's lock */
  uint64_t qorder;          /* arrival order in the queue */
  uint64_t qturn;           /* its client's turn (daemon/job_queue.c); the queue's lock */
  int in_mail;              /* in the server's mailbox; guarded by the mailbox lock */
  vs_djob *mail_next;       /* guarded by the mailbox lock: a worker may post the job again
                               while the loop works through the list it took */
  vs_djob *taken_next;      /* the loop's copy of that list (loop thread only) */

  /* ---- worker -> loop, guarded by mu ---- */
  pthread_mutex_t mu;
  struct {
    int started;
    double started_at;
    int dirty;              /* a token-map state the loop has not taken yet */
    int coalesced;          /* rounds folded into it */
    int64_t round;
    int n_tokens;
    int32_t *tokens;        /* [tokens_total] */
    uint8_t *status;        /* [tokens_total] VS_TOKEN_* */
    int whole_map;          /* tokens and status are current over the whole grid (continuous-
                               token models reveal positions in any order); else only their
                               first n_tokens entries are (raster order) */
    double tpf, mal, accept_rate, walk_accept_rate, elapsed_s;
    /* a phase before generation (size=auto tuning): the newest state, for a Phase event */
    int phase_dirty;
    char phase_name[16];
    char phase_msg[256];
    double phase_done;
    /* notices for the client (size=auto's choice), in order, each with its Notice.kind; the
     * Result repeats them */
    int n_notes;
    char notes[VS_DJOB_MAX_NOTES][VS_DJOB_NOTE_LEN];
    char note_kinds[VS_DJOB_MAX_NOTES][16];
    /* the newest preview the loop has not sent yet */
    uint8_t *preview_png;
    size_t preview_len;
    int64_t preview_round;
    int preview_tokens, preview_w, preview_h;
    /* the end */
    int finished;
    int rc;                 /* 0 or a vspec_status */
    char error[512];
    uint8_t *png;
    size_t png_len;
    int width, height, grid_h, grid_w;
    char describe[512];
    vs_djob_stats stats;
  } sh;

  /* ---- loop thread only ---- */
  struct {
    struct vs_client *client; /* its connection; NULL once the client is gone */
    vs_wire_envelope env;     /* the routing envelope its events go back along: the
                                 connection's routing id and whatever frames the peer put
                                 after it (a proxy's client id) */
    vs_djob *client_next;
    vs_djob *id_next;         /* the server's job table */
    int retry;                /* a send hit EAGAIN: pump again from the timer */
    uint64_t seq;             /* next event's sequence number */
    int credit;
    int32_t *sent_tokens;     /* the map as the client knows it */
    uint8_t *sent_status;
    int sent_n;
    int terminal_sent;
    int counted;              /* in the status totals (each job exactly once) */
    int accepted_pending;     /* the Accepted met a full queue: it goes out before anything */
    int in_outbox;            /* a terminal event waits for the client's queue to drain */
    vs_djob *outbox_next;
    double outbox_since;
    uint64_t request_id;
    int queued_reported;      /* last queue position sent */
    double last_event;        /* anything last went along env (daemon/server_events.c) */
    double last_progress;     /* when the last progress event went out */
    int notes_sent;           /* notices the client was sent */
  } lp;
};

/* A job with one reference and `tokens_total` slots in its maps. */
vs_djob *vs_djob_new(uint64_t id, int tokens_total);
void vs_djob_retain(vs_djob *j);
void vs_djob_release(vs_djob *j);
/* Sets the cancel flag; the first reason sticks. */
void vs_djob_cancel(vs_djob *j, int reason);

#endif /* VS_DJOB_H */
