#!/usr/bin/env python3
"""Writes a random-weight checkpoint in llama2.c's original ("version 0") file format, so that
karpathy/llama2.c's run.c times batch-1 decoding on the same shape as a vspec model.

The format, as read by run.c's read_checkpoint()/memory_map_weights(): seven int32 (dim,
hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a positive vocab_size means the
output head shares the token embedding), then float32 arrays in this order: token embedding
[vocab, dim]; per-layer attention RMSNorm [L, dim]; wq [L, dim, dim]; wk and wv
[L, kv_dim, dim]; wo [L, dim, dim]; FFN RMSNorm [L, dim]; w1 [L, hidden, dim]; w2
[L, dim, hidden]; w3 [L, hidden, dim]; final RMSNorm [dim]; and two legacy RoPE tables
[seq_len, head_dim / 2] that run.c skips.

Only the shape matters for timing (every weight is read once per token either way), so the
values are N(0, 0.02^2) and the norms are 1.

usage: write_weights.py OUT DIM HIDDEN LAYERS HEADS KV_HEADS VOCAB SEQ_LEN
"""
import struct
import sys

import numpy as np


def main(argv):
    if len(argv) != 9:
        sys.stderr.write(__doc__.split("\n\n")[-1] + "\n")
        return 2
    out = argv[1]
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = (int(v) for v in argv[2:])
    if dim % heads or heads % kv_heads:
        sys.stderr.write("write_weights.py: DIM must divide by HEADS and HEADS by KV_HEADS\n")
        return 2
    head_dim = dim // heads
    kv_dim = kv_heads * head_dim
    rng = np.random.default_rng(1234)

    def normal(f, *shape):
        # One layer's block at a time keeps memory at a single matrix for big shapes.
        for _ in range(shape[0] if len(shape) == 3 else 1):
            block = shape[1:] if len(shape) == 3 else shape
            f.write((rng.standard_normal(block, dtype=np.float32) * 0.02).tobytes())

    def ones(f, *shape):
        f.write(np.ones(shape, dtype=np.float32).tobytes())

    with open(out, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len))
        normal(f, vocab, dim)
        ones(f, layers, dim)
        normal(f, layers, dim, dim)
        normal(f, layers, kv_dim, dim)
        normal(f, layers, kv_dim, dim)
        normal(f, layers, dim, dim)
        ones(f, layers, dim)
        normal(f, layers, hidden, dim)
        normal(f, layers, dim, hidden)
        normal(f, layers, hidden, dim)
        ones(f, dim)
        normal(f, seq_len, head_dim // 2)
        normal(f, seq_len, head_dim // 2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
