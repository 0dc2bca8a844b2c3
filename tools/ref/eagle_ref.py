#!/usr/bin/python3
"""Float64 reference of the EAGLE-1 draft head over a LlamaGen target, and its goldens.

The head (EAGLE-1, SafeAILab/EAGLE eagle/model/cnets.py; names of LANTERN's LlamaGen drafter,
models/drafters/cnets_llamagen.py):
    h_p  = fc(concat(E[x_p], f_{p-1}))               fc: Linear(2d -> d) with bias
    h_p += o_proj(attn(h_p))                         layer 0: no input RMSNorm
    h_p += down(silu(gate(n)) * up(n)), n = RMSNorm(h_p; post_attention_layernorm)
    feature = h_p (no final norm), logits = target.output(feature)
Attention is causal with LlamaGen's interleaved 2-D RoPE (table with cls_token_num = 0:
row p rotates like image token p; LlamaGen's precompute_freqs_cis_2d).

Writes tests/golden/micro_eagle/{eagle.safetensors,golden.safetensors}; the target is
tests/golden/micro_c2i/gpt.safetensors. Every node's expected output is computed by
running the head on its whole path (committed rows + ancestors + itself) from scratch, so
the C side's KV cache, pending nodes and commit are checked against plain causal runs.

    /usr/bin/python3 tools/ref/eagle_ref.py
"""

import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import safetensors_io as st  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GOLDEN = os.path.join(ROOT, "tests", "golden")
N_HEAD, FFN, EPS, BASE = 4, 96, 1e-6, 10000.0


def rope_table(grid, hd, base):
    """[grid*grid, hd/2] angles: first hd/4 pairs rotate by the row, the rest by the column."""
    half = hd // 2
    k = np.arange(0, half, 2, dtype=np.float64)[: half // 2]
    theta = 1.0 / (base ** (k / half))
    ang = np.zeros((grid * grid, half))
    for i in range(grid * grid):
        r, c = divmod(i, grid)
        ang[i, : half // 2] = r * theta
        ang[i, half // 2:] = c * theta
    return ang


def rotate(x, ang):
    """x [n, H, hd] interleaved pairs, ang [n, hd/2]."""
    a = x[..., 0::2]
    b = x[..., 1::2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def head(W, E, out, tokens, feats, positions, ang_all):
    """Causal run over one sequence: tokens [n], feats [n, d], positions [n]."""
    d = W["fc.weight"].shape[0]
    hd = d // N_HEAD
    x = np.concatenate([E[tokens], feats], axis=1) @ W["fc.weight"].T + W["fc.bias"]
    q = (x @ W["layers.0.self_attn.q_proj.weight"].T).reshape(-1, N_HEAD, hd)
    k = (x @ W["layers.0.self_attn.k_proj.weight"].T).reshape(-1, N_HEAD, hd)
    v = (x @ W["layers.0.self_attn.v_proj.weight"].T).reshape(-1, N_HEAD, hd)
    ang = ang_all[positions]
    q, k = rotate(q, ang), rotate(k, ang)
    n = len(tokens)
    s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
    s = s + np.triu(np.full((n, n), -np.inf), 1)[None]
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("hij,jhd->ihd", w, v).reshape(n, d)
    x = x + o @ W["layers.0.self_attn.o_proj.weight"].T
    h = rmsnorm(x, W["layers.0.post_attention_layernorm.weight"])
    g = h @ W["layers.0.mlp.gate_proj.weight"].T
    u = h @ W["layers.0.mlp.up_proj.weight"].T
    x = x + (g / (1 + np.exp(-g)) * u) @ W["layers.0.mlp.down_proj.weight"].T
    return x, x @ out.T


def main():
    tgt, meta = st.load(os.path.join(GOLDEN, "micro_c2i", "gpt.safetensors"))
    E = tgt["tok_embeddings.weight"].astype(np.float64)
    out = tgt["output.weight"].astype(np.float64)
    V, d = E.shape
    grid = int(round(math.sqrt(int(meta["block_size"]))))
    rng = np.random.default_rng(5150)

    def w(*shape, s=0.15):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    W = {
        "fc.weight": w(d, 2 * d), "fc.bias": w(d),
        "layers.0.self_attn.q_proj.weight": w(d, d), "layers.0.self_attn.k_proj.weight": w(d, d),
        "layers.0.self_attn.v_proj.weight": w(d, d), "layers.0.self_attn.o_proj.weight": w(d, d),
        "layers.0.mlp.gate_proj.weight": w(FFN, d), "layers.0.mlp.up_proj.weight": w(FFN, d),
        "layers.0.mlp.down_proj.weight": w(d, FFN),
        "layers.0.post_attention_layernorm.weight": (1 + w(d, s=0.1)).astype(np.float32),
    }
    hmeta = {"vspec.kind": "eagle-llamagen", "n_head": str(N_HEAD), "norm_eps": str(EPS),
             "rope_base": str(BASE), "block_size": meta["block_size"], "cls_token_num": "0",
             "target": "gpt.safetensors"}
    out_dir = os.path.join(GOLDEN, "micro_eagle")
    os.makedirs(out_dir, exist_ok=True)
    st.save(os.path.join(out_dir, "eagle.safetensors"), W, hmeta)
    W64 = {k: v.astype(np.float64) for k, v in W.items()}
    ang = rope_table(grid, d // N_HEAD, BASE)
    rows = 2

    # Sequence of calls (the C test replays them): A: chain of 3 (append 0), commit [0, 1];
    # B: tree of 4 with parents [-1, 0, 0, 1] (append 0); C: 2 more nodes appended with
    # parents [2, 3] (pending indices). Features per (node, row).
    committed_tok, committed_feat = [], [[] for _ in range(rows)]
    g = {}

    def run_nodes(name, tokens, parents, feats, pending_tok, pending_feat, pending_par):
        """Expected outputs of new nodes; pending_* accumulate the pending tree."""
        base = len(pending_tok)
        logits = np.zeros((len(tokens), rows, V))
        features = np.zeros((len(tokens), rows, d))
        for i, (t, p) in enumerate(zip(tokens, parents)):
            pending_tok.append(t)
            pending_par.append(p)
            pending_feat.append(feats[i])
            chain = []
            a = base + i
            while a >= 0:
                chain.append(a)
                a = pending_par[a]
            chain.reverse()
            for r in range(rows):
                toks = np.array(committed_tok + [pending_tok[c] for c in chain])
                fs = np.array(committed_feat[r] + [pending_feat[c][r] for c in chain])
                x, lg = head(W64, E, out, toks, fs, np.arange(len(toks)), ang)
                features[i, r], logits[i, r] = x[-1], lg[-1]
        g[name + ".tokens"] = np.array(tokens, np.int32)
        g[name + ".parents"] = np.array(parents, np.int32)
        g[name + ".features_in"] = np.array(feats, np.float32)
        g[name + ".logits"] = logits.astype(np.float32)
        g[name + ".features"] = features.astype(np.float32)

    def feats_for(n):
        return rng.standard_normal((n, rows, d))

    # A
    pt, pf, pp = [], [], []
    run_nodes("a", [5, 17, 40], [-1, 0, 1], feats_for(3), pt, pf, pp)
    for c in [0, 1]:
        committed_tok.append(pt[c])
        for r in range(rows):
            committed_feat[r].append(pf[c][r])
    g["a.commit"] = np.array([0, 1], np.int32)
    # B (append 0 drops the pending node 2 of A)
    pt, pf, pp = [], [], []
    run_nodes("b", [9, 33, 2, 61], [-1, 0, 0, 1], feats_for(4), pt, pf, pp)
    # C (appended)
    run_nodes("c", [12, 50], [2, 3], feats_for(2), pt, pf, pp)
    st.save(os.path.join(out_dir, "golden.safetensors"), g,
            {"note": "float64 reference, tools/ref/eagle_ref.py"})
    print("wrote", out_dir)


if __name__ == "__main__":
    main()
