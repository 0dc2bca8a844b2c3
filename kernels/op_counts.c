/*
 * kernels/op_counts.c - the counting ops table every device context hands out.
 *
 * What a forward costs on a device is, to first order, how many ops it issues (on a GPU each
 * is a kernel launch, microseconds of fixed cost), how many times data crosses between host
 * and device, and how often the host waits for the device. Those are properties of the code
 * that issues the ops, not of one device, so they are counted here, above every device: the
 * host hands plugins a copy of the device's table whose functions count, then call the
 * device's own (vs_dev_head.cls->ops). A budget that tests assert on the CPU then holds on a
 * GPU too (issue 29: fused ops must lower it, and nothing may raise it unnoticed).
 * Memory management (alloc, free, scratch, weight formats) is not work and is not counted;
 * transfers (upload, download) and waits are counted by each device where it makes them
 * (vs_dev_count_transfer, kernels/vs_device.h), so that one an op makes inside counts too.
 * The cost is one indirect call and one relaxed atomic add per op: a few nanoseconds against
 * the microseconds of the smallest op.
 */
#include <pthread.h>
#include <string.h>

#include "kernels/vs_kernels.h"

static inline vs_dev_head *oc_head(vspec_dev *dev) { return (vs_dev_head *)(void *)dev; }
static inline const vspec_ops *oc_own(vspec_dev *dev) { return oc_head(dev)->cls->ops; }
/* An op recorded into a graph is not issued: it counts when the graph is launched, as the
 * launch (one op, however many it holds). */
static inline void oc_op(vspec_dev *dev) {
  vs_dev_head *h = oc_head(dev);
  vs_dev_count(h->recording ? &h->counters.recorded : &h->counters.ops, 1);
}

/* The counting wrapper of each op of kind op or op_ret (include/vspec/ops_list.h): count, then
 * call the device's own. A fused op (ABI 1.4) is one op, whatever it runs inside (its point is
 * the launches it saves). */
#define OC_COUNT_op(ret, name, params, args)                                                   \
  static ret c_##name params {                                                                 \
    oc_op(dev);                                                                                \
    oc_own(dev)->name args;                                                                    \
  }
#define OC_COUNT_op_ret(ret, name, params, args)                                               \
  static ret c_##name params {                                                                 \
    oc_op(dev);                                                                                \
    return oc_own(dev)->name args;                                                             \
  }
#define OC_COUNT_graph(ret, name, params, args)     /* by hand, below */
#define OC_COUNT_uncounted(ret, name, params, args) /* passed through */
#define OC_COUNT(ret, name, params, args, minor, kind) OC_COUNT_##kind(ret, name, params, args)
VSPEC_OPS(OC_COUNT)
#undef OC_COUNT
#undef OC_COUNT_op
#undef OC_COUNT_op_ret
#undef OC_COUNT_graph
#undef OC_COUNT_uncounted

/* ABI 1.5 graphs: begin and end mark the head as recording (not work themselves); a launch
 * is one op and one launch. graph_free is memory management: not wrapped. */
static int c_graph_begin(vspec_dev *dev) {
  int rc = oc_own(dev)->graph_begin(dev);
  if (rc == VSPEC_OK) oc_head(dev)->recording = 1;
  return rc;
}

static int c_graph_end(vspec_dev *dev, vspec_graph **graph) {
  oc_head(dev)->recording = 0;
  return oc_own(dev)->graph_end(dev, graph);
}

static int c_graph_launch(vspec_dev *dev, vspec_graph *graph) {
  int rc = oc_own(dev)->graph_launch(dev, graph);
  if (rc == VSPEC_OK) { /* a refused launch (none, stale, recording) ran nothing */
    oc_op(dev);
    vs_dev_count(&oc_head(dev)->counters.launches, 1);
  }
  return rc;
}

/* The counting copy of `own`: every op the device has, counted (kinds op, op_ret and graph of
 * ops_list.h); the rest as it is. An op the device lacks stays NULL (the copy, then no
 * wrapper): callers test for NULL to fall back to other ops (vspec_has_fused_ops), and a
 * wrapper would call through NULL. tests/test_op_counts.c checks that every member but the
 * uncounted ones is wrapped. */
#define OC_WRAP_op(name)                                                                       \
  if (own->name) t->name = c_##name;
#define OC_WRAP_op_ret OC_WRAP_op
#define OC_WRAP_graph OC_WRAP_op
#define OC_WRAP_uncounted(name)
#define OC_WRAP(ret, name, params, args, minor, kind) OC_WRAP_##kind(name)
static void oc_build(vspec_ops *t, const vspec_ops *own) {
  *t = *own;
  VSPEC_OPS(OC_WRAP)
}
#undef OC_WRAP

/* One counting table per device class (a process has at most a CPU and a CUDA class). */
#define OC_CLASSES 4
static pthread_mutex_t oc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  const vs_device_class *cls;
  vspec_ops table;
} oc_tables[OC_CLASSES];

const vspec_ops *vs__counted_ops(const vs_device_class *cls) {
  const vspec_ops *t = cls->ops; /* uncounted if the slots are full: never in practice */
  pthread_mutex_lock(&oc_mu);
  for (int i = 0; i < OC_CLASSES; i++) {
    if (oc_tables[i].cls == cls) {
      t = &oc_tables[i].table;
      break;
    }
    if (!oc_tables[i].cls) {
      oc_build(&oc_tables[i].table, cls->ops);
      oc_tables[i].cls = cls;
      t = &oc_tables[i].table;
      break;
    }
  }
  pthread_mutex_unlock(&oc_mu);
  return t;
}

int vs_dev_counters_get(const vspec_dev *dev, vs_dev_counters *out) {
  memset(out, 0, sizeof *out);
  if (!dev) return VSPEC_EINVAL;
  const vs_dev_counters *c = &((const vs_dev_head *)(const void *)dev)->counters;
  out->ops = __atomic_load_n(&c->ops, __ATOMIC_RELAXED);
  out->uploads = __atomic_load_n(&c->uploads, __ATOMIC_RELAXED);
  out->upload_bytes = __atomic_load_n(&c->upload_bytes, __ATOMIC_RELAXED);
  out->downloads = __atomic_load_n(&c->downloads, __ATOMIC_RELAXED);
  out->download_bytes = __atomic_load_n(&c->download_bytes, __ATOMIC_RELAXED);
  out->syncs = __atomic_load_n(&c->syncs, __ATOMIC_RELAXED);
  out->launches = __atomic_load_n(&c->launches, __ATOMIC_RELAXED);
  out->recorded = __atomic_load_n(&c->recorded, __ATOMIC_RELAXED);
  out->orders = __atomic_load_n(&c->orders, __ATOMIC_RELAXED);
  return VSPEC_OK;
}

void vs_dev_counters_sub(vs_dev_counters *a, const vs_dev_counters *b) {
  a->ops -= b->ops;
  a->uploads -= b->uploads;
  a->upload_bytes -= b->upload_bytes;
  a->downloads -= b->downloads;
  a->download_bytes -= b->download_bytes;
  a->syncs -= b->syncs;
  a->launches -= b->launches;
  a->recorded -= b->recorded;
  a->orders -= b->orders;
}
