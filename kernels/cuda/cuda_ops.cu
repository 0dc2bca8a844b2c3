/*
 * kernels/cuda/cuda_ops.cu - the CUDA ops table: the same contract as the CPU's
 * (include/vspec/ops.h), with device pointers.
 */
#include <string.h>

#include "kernels/cuda/cuda_dev.h"

static vspec_ops vs__cuda_ops_table(void) {
  vspec_ops o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof(vspec_ops);
  o.device = VSPEC_DEVICE_CUDA;
  o.name = "cuda";
  o.alloc = vs_cuda_alloc;
  o.free = vs_cuda_free;
  o.alloc_uninit = vs_cuda_alloc_uninit; /* ABI 1.3 */
  o.upload = vs_cuda_upload;
  o.download = vs_cuda_download;
  o.copy = vs_cuda_copy;
  o.reserve_scratch = vs_cuda_reserve_scratch;
  o.gemm = vs_cuda_gemm;
  o.linear = vs_cuda_linear;
  o.rmsnorm = vs_cuda_rmsnorm;
  o.groupnorm = vs_cuda_groupnorm;
  o.silu = vs_cuda_silu;
  o.swiglu = vs_cuda_swiglu;
  o.gelu_tanh = vs_cuda_gelu_tanh;
  o.add = vs_cuda_add;
  o.rope2d_table = vs_cuda_rope2d_table;
  o.rope_apply = vs_cuda_rope_apply;
  o.attention = vs_cuda_attention;
  o.softmax = vs_cuda_softmax;
  o.log_softmax = vs_cuda_log_softmax;
  o.cfg_combine = vs_cuda_cfg_combine;
  o.logits_to_probs = vs_cuda_logits_to_probs;
  o.sample = vs_cuda_sample;
  o.argmax = vs_cuda_argmax;
  o.conv2d = vs_cuda_conv2d;
  o.upsample_nearest2x = vs_cuda_upsample_nearest2x;
  o.copy3d = vs_cuda_copy3d;
  o.layernorm = vs_cuda_layernorm;
  o.gelu = vs_cuda_gelu;
  o.mul = vs_cuda_mul;
  o.gather_rows = vs_cuda_gather_rows;
  o.rmsnorm_rows = vs_cuda_rmsnorm_rows;
  o.linear_add = vs_cuda_linear_add;
  o.norm_swiglu = vs_cuda_norm_swiglu;
  o.norm_qkv_rope = vs_cuda_norm_qkv_rope;
  o.tree_attention = vs_cuda_tree_attention;
  o.sample_tokens = vs_cuda_sample_tokens;
  o.graph_begin = vs_cuda_graph_begin; /* ABI 1.5 */
  o.graph_end = vs_cuda_graph_end;
  o.graph_launch = vs_cuda_graph_launch;
  o.graph_free = vs_cuda_graph_free;
  return o;
}

const vspec_ops *vs_cuda_ops(void) {
  static const vspec_ops table = vs__cuda_ops_table();
  return &table;
}
