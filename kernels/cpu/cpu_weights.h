/*
 * kernels/cpu/cpu_weights.h - the CPU device's allocation table and its converted weights.
 *
 * A weight is whatever a backend passes as the `w` of linear: a whole allocation whose
 * contents do not change while it is allocated (include/vspec/ops.h). With bf16 precision the
 * device multiplies with a converted copy of it (AMX tile order, cpu_linear_amx.h, or plain
 * bf16 rows, cpu_linear_bf16.h), made on first use and dropped when the weight is freed. To know that a pointer is a whole
 * allocation, and to find its copy, every vs_cpu_alloc is recorded here (pointer -> bytes).
 *
 * Process-wide, like the memory: a model loaded on one CPU device serves sessions on the
 * others (each daemon worker owns a device), so all of them share the copies. Thread-safe.
 */
#ifndef VS_CPU_WEIGHTS_H
#define VS_CPU_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

/* Records an allocation of `bytes` at p. VSPEC_OK or VSPEC_ENOMEM (the table could not grow;
 * the caller frees p and fails the allocation). */
int vs_cpu_weights_track(void *p, size_t bytes);

/* Forgets the allocation at p and frees its converted copy, if any. Unknown pointers are
 * ignored. */
void vs_cpu_weights_untrack(void *p);

/* The AMX-packed bf16 copy of the weight w [n, k], converted on first use. NULL (the caller
 * takes the fp32 path) when w is not the start of a recorded allocation of at least n * k
 * floats, when its copy was made for another shape, or when memory for the copy is short. */
const uint16_t *vs_cpu_weights_amx(const float *w, int n, int k);

/* The row-major bf16 copy of the weight w [n, k] (round to nearest even), for CPUs without
 * AMX (cpu_linear_bf16.h); the same conditions. A weight has one kind of copy: the kind its
 * first use asked for. */
const uint16_t *vs_cpu_weights_bf16_rows(const float *w, int n, int k);

/* One more (delta 1) or one fewer (delta -1) request for the weight w [n, k] in int8 (the
 * weight_format op). The requests belong to the memory, not to whoever made them: models that
 * share a weight (one file opened twice) share its format while a request stands. VSPEC_OK,
 * or VSPEC_EINVAL when w is not the start of a recorded allocation of at least n * k floats. */
int vs_cpu_weights_request_int8(const float *w, int n, int k, int delta);

/* The packed int8 copy (cpu_linear_amx8.h) of a weight with an int8 request standing, made on
 * first use and kept until the weight goes; NULL when no request stands, the copy was made for
 * another shape, a weight is not finite or memory is short (those two for good). Independent
 * of the bf16 copies: a weight may have both (the bf16 one serves the calls int8 cannot, see
 * vs_cpu_linear). */
const void *vs_cpu_weights_amx8(const float *w, int n, int k);

/* Allocations recorded and bytes of converted copies held (for tests and status). */
void vs_cpu_weights_stats(size_t *allocations, size_t *copy_bytes);

#endif /* VS_CPU_WEIGHTS_H */
