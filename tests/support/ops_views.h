/*
 * tests/support/ops_views.h - a device's ops table with some ops taken away, as a device that
 * lacks them hands it out (header only): set as vspec_host.dev_ops, it makes a backend take
 * its fallback path on the same device, whose results a test then compares.
 */
#ifndef VS_OPS_VIEWS_H
#define VS_OPS_VIEWS_H

#include "kernels/vs_kernels.h"

/* Without the fused ops (ABI 1.4) and sample_tokens: the unfused forward. */
static inline const vspec_ops *vt_ops_unfused(const vspec_dev *d) {
  static vspec_ops t;
  t = *vs_dev_ops(d);
  t.gather_rows = NULL;
  t.rmsnorm_rows = NULL;
  t.linear_add = NULL;
  t.norm_swiglu = NULL;
  t.norm_qkv_rope = NULL;
  t.tree_attention = NULL;
  t.sample_tokens = NULL;
  return &t;
}

/* Without the batch ops (ABI 1.9): a cross-job batch runs each session's attention part as
 * its own ops. */
static inline const vspec_ops *vt_ops_nobatch(const vspec_dev *d) {
  static vspec_ops t;
  t = *vs_dev_ops(d);
  t.norm_qkv_rope_batch = NULL;
  t.tree_attention_batch = NULL;
  return &t;
}

#endif /* VS_OPS_VIEWS_H */
