/*
 * kernels/cpu/cpu_ops.c - the CPU ops table. The ops a fused forward issues go through
 * cpu_graph.c's entries, which record them while a graph is recorded (ABI 1.5).
 */
#include "kernels/cpu/cpu_dev.h"

static const vspec_ops cpu_ops = {
    .struct_size = sizeof(vspec_ops),
    .device = VSPEC_DEVICE_CPU,
    .name = "cpu",

    .alloc = vs_cpu_alloc,
    .free = vs_cpu_free,
    .upload = vs_cpu_upload,
    .download = vs_cpu_download,
    .copy = vs_cpu_copy,
    .reserve_scratch = vs_cpu_reserve_scratch,

    .gemm = vs_cpu_gemm,
    .linear = vs_cpu_rec_linear, /* recordable (cpu_graph.c): a forward's head */

    .rmsnorm = vs_cpu_rmsnorm,
    .groupnorm = vs_cpu_groupnorm,
    .silu = vs_cpu_silu,
    .swiglu = vs_cpu_swiglu,
    .gelu_tanh = vs_cpu_gelu_tanh,
    .add = vs_cpu_add,

    .rope2d_table = vs_cpu_rope2d_table,
    .rope_apply = vs_cpu_rope_apply,

    .attention = vs_cpu_attention,

    .softmax = vs_cpu_softmax,
    .log_softmax = vs_cpu_log_softmax,
    .cfg_combine = vs_cpu_cfg_combine,
    .logits_to_probs = vs_cpu_logits_to_probs,
    .sample = vs_cpu_sample,
    .argmax = vs_cpu_argmax,

    .conv2d = vs_cpu_conv2d,
    .upsample_nearest2x = vs_cpu_upsample_nearest2x,

    .copy3d = vs_cpu_copy3d,
    .layernorm = vs_cpu_layernorm,
    .gelu = vs_cpu_gelu,
    .mul = vs_cpu_mul,
    .weight_format = vs_cpu_weight_format,
    .alloc_uninit = vs_cpu_alloc_uninit,

    .gather_rows = vs_cpu_rec_gather_rows,
    .rmsnorm_rows = vs_cpu_rec_rmsnorm_rows,
    .linear_add = vs_cpu_rec_linear_add,
    .norm_swiglu = vs_cpu_rec_norm_swiglu,
    .norm_qkv_rope = vs_cpu_rec_norm_qkv_rope,
    .tree_attention = vs_cpu_rec_tree_attention,
    .sample_tokens = vs_cpu_rec_sample_tokens,

    .graph_begin = vs_cpu_graph_begin,
    .graph_end = vs_cpu_graph_end,
    .graph_launch = vs_cpu_graph_launch,
    .graph_free = vs_cpu_graph_free,
};

const vspec_ops *vs_cpu_ops(void) { return &cpu_ops; }
