/*
 * kernels/cuda/cuda_ops.cu - the CUDA ops table: the same contract as the CPU's
 * (include/vspec/ops.h), with device pointers; vs_cuda_<op> for every op of
 * include/vspec/ops_list.h (declared in cuda_dev.h) but the ones left NULL below.
 */
#include <string.h>

#include "kernels/cuda/cuda_dev.h"

/* The ops this device does not have: their entries stay NULL (the op's comment in
 * ops_list.h says what callers do then). */
#define vs_cuda_weight_format NULL /* one weight format per precision */

static vspec_ops cuda_ops_table(void) {
  vspec_ops o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof(vspec_ops);
  o.device = VSPEC_DEVICE_CUDA;
  o.name = "cuda";
#define VS_CUDA_ENTRY(ret, name, params, args, minor, kind) o.name = vs_cuda_##name;
  VSPEC_OPS(VS_CUDA_ENTRY)
#undef VS_CUDA_ENTRY
  return o;
}

const vspec_ops *vs_cuda_ops(void) {
  static const vspec_ops table = cuda_ops_table();
  return &table;
}
