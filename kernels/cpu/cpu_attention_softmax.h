/*
 * kernels/cpu/cpu_attention_softmax.h - the masked softmax of one row of attention scores.
 */
#ifndef VS_CPU_ATTENTION_SOFTMAX_H
#define VS_CPU_ATTENTION_SOFTMAX_H

#include <stdint.h>

#include "kernels/cpu/cpu_dev.h"

/* Floats a score row takes: n rounded up to whole 16-lane vectors. */
#define VS_SOFTMAX_ROW_FLOATS(n) (((n) + 15) & ~15)

/* In place on s[0..n): entries whose mask byte is 0 become 0, the rest e^(s - max) / sum over
 * the visible ones (mask NULL: all visible), in the device's instruction set; every set gives
 * the same bits. Returns 0, with the row zeroed, when nothing is visible. s must hold
 * VS_SOFTMAX_ROW_FLOATS(n) floats: the entries from n on are scratch, read and written by the
 * AVX-512 loops as whole vectors (a masked store stalls the next load of its line). */
int vs_cpu_masked_softmax(const vspec_dev *dev, float *s, const uint8_t *mask, int n);

#endif /* VS_CPU_ATTENTION_SOFTMAX_H */
