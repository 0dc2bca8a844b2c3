#!/usr/bin/python3
"""Golden outputs of the *trained* shipped model, from the float64 PyTorch reference.

The C engine must reproduce the trained Fashion-MNIST target as PyTorch computes it:
prefill and decode logits for fixed inputs, a tree forward, and the VQ decoder's pixels for
a token grid. Writes tests/golden/fmnist/golden.safetensors (kept small); the C side is
tests/test_fmnist_golden.c.

    /usr/bin/python3 tools/ref/make_trained_golden.py [--model models/fmnist]
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import make_golden as MG  # noqa: E402  (loaders and the prefill/decode/tree helpers)
import safetensors_io as st  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "fmnist"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "fmnist",
                                                  "golden.safetensors"))
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.model, "vspec-model.json")))
    gpt_path = os.path.join(args.model, manifest["target"]["gpt"])
    vq_path = os.path.join(args.model, manifest["target"]["vq"])
    model, cfg = MG.load_gpt(gpt_path)
    vq = MG.load_vq(vq_path)
    torch.manual_seed(0)
    cls = 7
    n = 8
    tokens = torch.randint(0, cfg.vocab_size, (n,))
    pre, dec, _, _, cond_all, em = MG.run_prefill_decode(model, torch.tensor([cls]), tokens)
    MG.check_against_causal(model, cond_all, em, tokens, pre, dec, "fmnist")
    out = {
        "cond.class": np.array([cls], np.int32),
        "prefill.logits": MG.f32(pre[0]), "prefill.features": MG.f32(pre[1]),
        "decode.tokens": MG.i32(tokens), "decode.logits": MG.f32(dec[0]),
        "decode.features": MG.f32(dec[1]),
    }
    # a tree after 3 committed tokens, as in the micro goldens
    prefix, parents, commit = 3, [-1, 0, 0, 1, 1, 2, 3], [0, 1, 3]
    tree_tokens = [int(t) for t in torch.randint(0, cfg.vocab_size, (len(parents),))]
    after = int(torch.randint(0, cfg.vocab_size, (1,)))
    tl, tf, al, af, _ = MG.tree_goldens(model, cond_all, tokens, prefix, tree_tokens, parents,
                                        commit, after)
    out.update({"tree.prefix": np.array([prefix], np.int32),
                "tree.tokens": np.array(tree_tokens, np.int32),
                "tree.parents": np.array(parents, np.int32),
                "tree.logits": MG.f32(tl), "tree.features": MG.f32(tf),
                "commit.path": np.array(commit, np.int32), "after.token": np.array([after], np.int32),
                "after.logits": MG.f32(al), "after.features": MG.f32(af)})
    grid = int(round(cfg.block_size ** 0.5))
    codes = torch.randint(0, cfg.vocab_size, (grid * grid,))
    with torch.no_grad():
        img = vq.decode_code(codes.view(1, -1), (grid, grid))[0]
    out["vq.codes"] = MG.i32(codes)
    out["vq.pixels"] = MG.R.to_pixels(img).numpy().astype(np.uint8)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    st.save(args.out, out, {"note": "float64 reference of the trained model, "
                                    "tools/ref/make_trained_golden.py"})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
