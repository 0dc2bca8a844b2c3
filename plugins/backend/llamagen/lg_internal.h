/*
 * plugins/backend/llamagen/lg_internal.h - internal types of the LlamaGen backend plugin.
 *
 * Its files call one way: llamagen.c (the plugin's vtables) -> gpt.c (the GPT's weights and
 * sessions) -> gpt_multi.c (cross-job batches) -> gpt_forward.c (prefill, forward, commit; the
 * layers and the head a batch shares) -> gpt_device.c (what a forward leaves on the device: the
 * walk, a draft's draw) and gpt_work.c (a session's work buffers); vq_decoder.c (the image
 * tokenizer's decoder) and lg_meta.c (metadata) are leaves.
 *
 * The GPT follows FoundationVision/LlamaGen autoregressive/models/gpt.py (sampling and masks:
 * autoregressive/models/generate.py) and the VQ decoder tokenizer/tokenizer_image/vq_model.py;
 * the comments in this backend name the upstream class or function they follow.
 */
#ifndef LG_INTERNAL_H
#define LG_INTERNAL_H

#include "../device_tokens.h"
#include "../kv_tree.h"
#include "vspec/plugin.h"

#define LG_MAX_LAYERS 128
#define LG_MAX_STAGES 8
#define LG_MAX_RES 8

typedef struct lg_layer {
  const float *attention_norm, *wqkv, *wo, *ffn_norm, *w1, *w3, *w2;
} lg_layer;

typedef struct lg_gpt {
  int t2i;                 /* model_type */
  int dim, n_layer, n_head, n_kv_head, head_dim, ffn_hidden, vocab;
  int grid, n_image;       /* G, N = G*G */
  int n_cond;              /* T = cls_token_num */
  int num_classes;         /* c2i: real classes; the null class is row num_classes */
  int has_null_class;
  int caption_len, caption_dim;
  float rope_base, norm_eps;
  const float *class_table;          /* c2i [num_classes(+1), dim] */
  const float *cap_fc1, *cap_fc2;    /* t2i [dim, caption_dim], [dim, dim] */
  const float *uncond_caption;       /* t2i [caption_len, caption_dim] */
  const float *tok_embeddings;       /* [vocab, dim] */
  const float *norm, *output;        /* [dim], [vocab, dim] */
  lg_layer layers[LG_MAX_LAYERS];
  float *rope_table;                 /* device [(T + N), head_dim/2, 2] */
} lg_gpt;

typedef struct lg_conv { const float *w, *b; int cout, cin, k; } lg_conv;
typedef struct lg_norm { const float *g, *b; int c; } lg_norm;
typedef struct lg_res {
  lg_norm norm1, norm2;
  lg_conv conv1, conv2, nin; /* nin.w == NULL when cin == cout */
} lg_res;
typedef struct lg_attn {
  lg_norm norm;
  lg_conv q, k, v, proj;
} lg_attn;
typedef struct lg_stage {
  int n_res;
  lg_res res[LG_MAX_RES];
  int n_attn;
  lg_attn attn[LG_MAX_RES];
  int has_upsample;
  lg_conv upsample;
} lg_stage;

typedef struct lg_vq {
  int codebook_size, embed_dim;
  float *codebook_norm; /* device [codebook_size, embed_dim], L2-normalised rows */
  float *codebook_raw;  /* host copy of the stored rows (for LANTERN neighbour tables) */
  lg_conv post_quant, conv_in, conv_out;
  lg_res mid_res[2];
  lg_attn mid_attn;
  int n_stages;
  lg_stage stages[LG_MAX_STAGES];
  lg_norm norm_out;
  int max_channels;
} lg_vq;

/* ABI 1.5 graphs (gpt_forward.c, "graphs"): how a session runs its tree forwards. */
enum {
  LG_GRAPHS_OFF = 0, /* eagerly, n nodes as asked */
  LG_GRAPHS_ON = 1,  /* padded to a node-count bucket, through a recorded graph per bucket */
  LG_GRAPHS_PAD = 2  /* padded to the bucket, eagerly: the reference replay must equal */
};
/* How forward_multi runs (llamagen.c, "multi"). */
enum { LG_MULTI_AUTO = 0, LG_MULTI_FUSED = 1, LG_MULTI_UNFUSED = 2, LG_MULTI_SESSIONS = 3 };

/* Buckets of 1, 2, 4, .. 256 nodes (at most the session's work rows); a forward of more
 * nodes runs eagerly. Head kinds: features only, logits, a draw on the device, a draft's draw
 * that stays there. */
#define LG_GRAPH_BUCKETS 9
#define LG_GRAPH_HEADS 4

typedef struct lg_graph {
  vspec_graph *graph;     /* NULL until the first forward of its shape records it */
  vspec_sample_spec draw; /* the draw it was recorded with (its scalars are in the graph) */
} lg_graph;

/* A cross-job batch's trunk (the embeddings to the head rows' norm) as a graph, for the
 * batches of one shape on one lane (gpt_multi.c, lg__multi_graph): the shape is what the
 * batch's ops are called with (sessions, rows, head rows, the longest cache); which sessions,
 * and their trees, are in the entries uploaded each time. */
#define LG_MULTI_GRAPHS 8
typedef struct lg_mgraph {
  int count, M, K, max_slots; /* count 0: a free slot */
  vspec_graph *graph;         /* NULL: seen once; recorded when the shape comes again */
  unsigned last;              /* the lane's batch clock at its last use (the least recent goes) */
} lg_mgraph;

/* The devices cross-job batches of one model run on (a server's lanes): each keeps its own
 * batch workspace and graphs (gpt_multi.c, lg_lane). */
#define LG_LANES 16

struct vspec_model {
  const vspec_host *host;
  vspec_dev *load_dev;
  vspec_tensor_file *gpt_file, *vq_file;
  int has_gpt, has_vq;
  lg_gpt gpt;
  lg_vq vq;
  int max_nodes;
  int int8_asked; /* weight_format=int8 requests stand for the GPT's linears (gpt.c) */
  int graphs;     /* LG_GRAPHS_*: the load parameter graphs=, else VSPEC_GRAPHS, else on
                   * where the device has graphs and is not the CPU (llamagen.c) */
  int multi;      /* LG_MULTI_*: the load parameter multi=, else VSPEC_MULTI */
  int multi_graphs; /* batches through graphs (gpt_multi.c): multi_graphs=, else
                     * VSPEC_MULTI_GRAPHS, else on */
  char arch[32];
  _Atomic(struct lg_lane *) lanes[LG_LANES]; /* forward_multi's, by batch device (gpt_multi.c) */
};

/* The work buffers of one forward, row-major by (session, row, node): a session's own,
 * sized for its max_nodes, or the growable batch workspace of lg_forward_multi. */
#define LG_IDX_INTS(rows) (10 * (size_t)(rows) + 16)

typedef struct lg_work {
  float *x, *h, *qkv, *att, *ff1, *ff3, *logits;
  int32_t *pos;    /* host [rows] */
  int32_t *tok;    /* host [rows]: the token of each row (its embedding row) */
  /* The integer inputs of a fused forward, staged on the host and uploaded in one transfer
   * (lg_idx): tokens, positions, head rows, tree parents, cache slots and the tree's
   * lengths, then the device draw's uniforms, guidance flags and tokens
   * [idx_ints: at least LG_IDX_INTS(rows); a batch's also holds the entries of its batch
   * ops]. */
  int32_t *idx_host, *idx_dev;
  size_t rows;     /* capacity in rows */
  size_t idx_ints; /* capacity of idx_host and idx_dev in int32 words */
} lg_work;

struct vspec_session {
  vspec_model *m;
  const vspec_host *host;
  const vspec_ops *ops;
  vspec_dev *dev;
  int rows;            /* 1 or 2 (CFG) */
  int max_nodes;       /* forward batch capacity (>= n_cond for prefill) */
  int prefilled;
  int fused;           /* the device has the fused ops of ABI 1.4: a forward uses them */
  int32_t class_label;
  float *cond_embed;   /* device [rows, n_cond, dim]: condition embeddings */
  uint8_t *cond_valid; /* host [n_cond]: t2i caption validity (1 for c2i) */
  uint8_t *prefix_dev; /* device copy of cond_valid for the fused attention; t2i only */
  vs_kv_tree kv;       /* committed + pending nodes (plugins/backend/kv_tree.h) */
  /* per-forward work buffers, [rows * max_nodes, ...] (h: at least caption_len rows) */
  lg_work w;
  uint8_t *mask;       /* host [max_nodes, kv.slots] */
  /* ABI 1.5: LG_GRAPHS_* for this session (OFF where the device lacks fused ops or graphs),
   * its graphs by (bucket, head kind), and failed recordings so far (gpt_forward.c,
   * lg__graph_get: those that would have had to allocate or wait count apart) */
  int graphs;
  lg_graph graph[LG_GRAPH_BUCKETS][LG_GRAPH_HEADS];
  int graph_failures, graph_busy;
  /* ABI 1.6: the walk on the device (vspec_forward_out.walk; gpt_device.c, lg_walk_segs):
   * its inputs staged on the host and their device copy with the results, allocated at the
   * first walk for the session's largest tree, grown where a batch it leads needs more */
  unsigned char *walk_host, *walk_dev;
  size_t walk_bytes;
  /* ABI 1.8: the distributions a draft's draw on the device writes for every node of the
   * forward ([max_nodes, vocab], allocated at the first such forward), before the drawn
   * nodes' rows are copied to vspec_forward_out.draw_probs */
  float *draft_probs;
};

/* gpt_work.c: work buffers for `rows` forward rows; h holds at least h_rows (the caption
 * MLP's), the integer staging at least idx_ints words (and LG_IDX_INTS(rows)). */
int lg_work_alloc(const vspec_host *H, const vspec_ops *ops, vspec_dev *dev, const lg_gpt *g,
                  size_t rows, size_t h_rows, size_t idx_ints, lg_work *w);
void lg_work_free(const vspec_host *H, const vspec_ops *ops, vspec_dev *dev, lg_work *w);

/* gpt.c: weights and sessions */
int lg_gpt_load(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen);
/* Asks the load device for int8 copies of the GPT's linear weights (weight_format=int8);
 * lg_gpt_unload withdraws the requests. */
void lg_gpt_ask_int8(vspec_model *m);
void lg_gpt_unload(vspec_model *m);
/* The scratch a device needs for forwards of `rows` rows: the fused ops' largest temporaries
 * (the normed rows and the up projection of norm_swiglu), at least the device walk's. */
size_t lg_scratch_bytes(const lg_gpt *g, size_t rows);
int lg_session_open(vspec_model *m, vspec_dev *dev, const vspec_session_config *cfg,
                    vspec_session **out, char *err, size_t errlen);
void lg_session_close(vspec_session *s);
/* gpt_forward.c */

/* One session's part of a forward: n nodes whose keys and values go to slots first_slot ..
 * first_slot + n - 1 of its cache, at rows row0 .. row0 + rows * n - 1 of the work buffers
 * (ordered (row, node)); the head reads nodes head_first .. head_first + head_count - 1. */
typedef struct lg_seg {
  vspec_session *s;
  int n, first_slot, row0;
  int head_first, head_count;
  vspec_forward_out *out;
  const int32_t *token_dev; /* ABI 1.8: the batch's tokens drawn on the device, or NULL */
} lg_seg;

/* gpt_multi.c: frees m's batch lanes (their workspaces and graphs, each by its device,
 * which must still be open). */
void lg_lanes_free(vspec_model *m);

/* The most sessions in one forward_multi. */
#define LG_MULTI_MAX 64

/* Adds a batch's nodes to the session's pending tree and writes their tokens (w->tok) and
 * positions (w->pos) from row `row0` on; fills the segment. */
int lg_stage_seg(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out,
                 lg_work *w, int row0, lg_seg *seg, char *err, size_t errlen);
/* The unfused path: a staged segment's attention mask and embeddings; all layers over the
 * segments' M rows; each segment's head nodes normed into w->h (returns how many rows). */
void lg_unfused_inputs(const lg_seg *seg, lg_work *w, const vspec_ops *ops, vspec_dev *dev);
void lg_run_layers(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                   const lg_seg *seg, int count, int M);
int lg_head_rows(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                 const lg_seg *seg, int count);
/* The head over the `rows` normed head rows in w->h: features and logits to each segment's
 * out, the walks they ask for on the device (staged by seg[0]'s session); stage: NULL, or
 * host room for rows x max(vocab, dim) floats, through which a batch downloads once. */
void lg_head_out(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                 const lg_seg *seg, int count, int rows, float *stage);
int lg_prefill(vspec_session *s, vspec_forward_out *out, char *err, size_t errlen);
int lg_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out, char *err,
               size_t errlen);
int lg_commit(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen);
/* The most padding nodes a forward of at most max_nodes nodes gets from its bucket, for a
 * session with work rows for work_nodes nodes: the cache slots kept free for them. */
int lg_graph_pad_room(int max_nodes, int work_nodes);
/* Frees a session's graphs. */
void lg_graphs_free(vspec_session *s);

/* gpt_device.c: what a fused forward leaves on its device (the walk, a draft's draw; the
 * ABI 1.8 fields and helpers both backends share are ../device_tokens.h's vs_bk_*).
 * lg_draft_room: the session's draft_probs (0: out of memory). */
#define LG_DRAFT_MAX 512 /* nodes of a forward that draws a draft on the device */
int lg_draft_room(vspec_session *s);
/* The walks the segments ask for (vspec_forward_out.walk), each over the last of its head
 * nodes in `logits` (the segments' head rows in order, (node, row) in each), on (ops, dev):
 * one upload of every walk's tree, guidance and draft distributions, the op per walk (its own
 * spec: rule, sampling, rows, streams), one download of every result, with the trees' tokens
 * where walk_tokens asks (a few hundred bytes each instead of nodes x rows x vocab floats).
 * The staging is owner's: the session's own, or a batch's lead's. Sets walked[i] and each
 * walker's out->walked; returns how many walked, 0 too when the staging cannot be had: then
 * the logits come down and the engine walks on the host. */
int lg_walk_segs(const vspec_ops *ops, vspec_dev *dev, vspec_session *owner, const float *logits,
                 const lg_seg *seg, int count, int *walked);

/* gpt_multi.c: forward for several sessions of one model at once, computed on `dev`
 * (vspec_backend_vtable.forward_multi) */
int lg_forward_multi(vspec_dev *dev, vspec_session *const *s, const vspec_forward_batch *const *b,
                     vspec_forward_out *const *out, int32_t count, char *err, size_t errlen);

/* vq_decoder.c */
int lg_vq_load(vspec_model *m, vspec_tensor_file *f, char *err, size_t errlen);
void lg_vq_unload(vspec_model *m);
int lg_vq_decode(vspec_model *m, vspec_dev *dev, const int32_t *tokens, uint8_t *rgb, char *err,
                 size_t errlen);
/* Raw decoder output [3, H, W] before clamping (for golden tests through the backend). */
int lg_vq_decode_raw(vspec_model *m, vspec_dev *dev, const int32_t *tokens, float *out_host,
                     char *err, size_t errlen);

/* lg_meta.c: checkpoint metadata as numbers */
int lg_meta_int(vspec_model *m, vspec_tensor_file *f, const char *key, long def, long *out,
                char *err, size_t errlen);
int lg_meta_double(vspec_model *m, vspec_tensor_file *f, const char *key, double def, double *out,
                   char *err, size_t errlen);

#endif /* LG_INTERNAL_H */
