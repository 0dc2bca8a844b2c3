/*
 * core/neighbours.h - the codebook neighbour table LANTERN-style rules need.
 *
 * Row y lists the k codes nearest to y by L2 distance between the raw codebook rows,
 * closest first, y itself excluded (as LANTERN's entrypoints/generate_codebook.py, which uses
 * torch.cdist on the unnormalised VQ embedding weights and sets the diagonal to +inf). Ties
 * are broken by the lower code index so the table is deterministic.
 */
#ifndef VS_NEIGHBOURS_H
#define VS_NEIGHBOURS_H

#include <stdint.h>

/* Returns a malloc'd [vocab, k] table (k clamped to vocab - 1), or NULL on failure. */
int32_t *vs_neighbours_build(const float *codebook, int vocab, int dim, int k, int *k_out);

#endif /* VS_NEIGHBOURS_H */
