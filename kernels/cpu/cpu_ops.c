/*
 * kernels/cpu/cpu_ops.c - the CPU ops table: vs_cpu_<op> for every op of
 * include/vspec/ops_list.h (declared in cpu_dev.h). The ops a fused forward issues go through
 * cpu_graph.c's entries instead, which record them while a graph is recorded (ABI 1.5).
 */
#include "kernels/cpu/cpu_dev.h"

/* The table's entry for an op whose entry is not vs_cpu_<op> itself: the recordable ops
 * (cpu_graph.c). An op this device lacked would be defined NULL here. */
#define vs_cpu_linear vs_cpu_rec_linear /* a forward's head */
#define vs_cpu_gather_rows vs_cpu_rec_gather_rows
#define vs_cpu_rmsnorm_rows vs_cpu_rec_rmsnorm_rows
#define vs_cpu_linear_add vs_cpu_rec_linear_add
#define vs_cpu_norm_swiglu vs_cpu_rec_norm_swiglu
#define vs_cpu_norm_qkv_rope vs_cpu_rec_norm_qkv_rope
#define vs_cpu_tree_attention vs_cpu_rec_tree_attention
#define vs_cpu_sample_tokens vs_cpu_rec_sample_tokens
#define vs_cpu_draw_probs vs_cpu_rec_draw_probs
#define vs_cpu_norm_qkv_rope_batch vs_cpu_rec_norm_qkv_rope_batch
#define vs_cpu_tree_attention_batch vs_cpu_rec_tree_attention_batch

static const vspec_ops cpu_ops = {
    .struct_size = sizeof(vspec_ops),
    .device = VSPEC_DEVICE_CPU,
    .name = "cpu",
#define VS_CPU_ENTRY(ret, name, params, args, minor, kind) .name = vs_cpu_##name,
    VSPEC_OPS(VS_CPU_ENTRY)
#undef VS_CPU_ENTRY
};

const vspec_ops *vs_cpu_ops(void) { return &cpu_ops; }
