#!/usr/bin/python3
"""How far bf16 weights move a model's outputs: the tolerance of the GPU's bf16 mode.

The CUDA device's fast mode (kernels/cuda/cuda_gemm.cu) rounds the weights of every linear
layer to bf16 and accumulates in fp32; above 8 rows it rounds the layer inputs to bf16 as
well. This script applies exactly those roundings to the float64 PyTorch reference
(tools/ref/llamagen_ref.py) of a model and reports, over many classes and decode steps with
CFG, how far the logits and the processed next-token distributions move from the exact
model. tests/gpu/test_cuda_models.c takes its bf16 tolerances from these figures (with a
margin for fp32 accumulation order); run it again when the model changes:

    /usr/bin/python3 tools/ref/bf16_deviation.py [--model models/fmnist] [--steps 63]
"""

import argparse
import copy
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import make_golden as MG  # noqa: E402
import llamagen_ref as R  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def to_bf16(t):
    return t.to(torch.bfloat16).to(t.dtype)


def bf16_model(model, round_inputs):
    m = copy.deepcopy(model)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(to_bf16(mod.weight))
                if round_inputs:
                    mod.register_forward_pre_hook(lambda _m, args: (to_bf16(args[0]),))
    return m


def processed(logits, cfg_scale):
    """CFG then softmax at temperature 1 (the shipped defaults: no top-k / top-p)."""
    mixed = logits[1] + cfg_scale * (logits[0] - logits[1])
    return torch.softmax(mixed, dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "fmnist"))
    ap.add_argument("--steps", type=int, default=63, help="decode steps per class")
    ap.add_argument("--classes", type=int, default=10)
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.model, "vspec-model.json")))
    cfg_scale = float(manifest.get("defaults", {}).get("cfg_scale", 4.0))
    model, cfg = MG.load_gpt(os.path.join(args.model, manifest["target"]["gpt"]))
    variants = {"bf16 weights (<= 8 rows)": bf16_model(model, False),
                "bf16 weights and inputs (> 8 rows)": bf16_model(model, True)}
    torch.manual_seed(0)
    stats = {k: {"rel": [], "tv": [], "argmax": 0, "n": 0} for k in variants}
    for cls in range(args.classes):
        tokens = torch.randint(0, cfg.vocab_size, (args.steps,))
        ref_pre, ref_dec, *_ = MG.run_prefill_decode(model, torch.tensor([cls]), tokens)
        ref = [ref_pre[0]] + list(ref_dec[0])
        for name, m in variants.items():
            pre, dec, *_ = MG.run_prefill_decode(m, torch.tensor([cls]), tokens)
            got = [pre[0]] + list(dec[0])
            for a, b in zip(got, ref):
                s = stats[name]
                s["rel"].append(float((a - b).abs().max() / b.abs().max()))
                pa, pb = processed(a, cfg_scale), processed(b, cfg_scale)
                s["tv"].append(float(0.5 * (pa - pb).abs().sum()))
                s["argmax"] += int(torch.argmax(pa) == torch.argmax(pb))
                s["n"] += 1
    print(f"model {args.model}: {args.classes} classes x {args.steps + 1} positions, CFG "
          f"{cfg_scale}, against the exact (float64) model")
    for name, s in stats.items():
        rel, tv = np.array(s["rel"]), np.array(s["tv"])
        print(f"  {name}: max |dlogit| / max |logit|: max {rel.max():.3g}, p99 "
              f"{np.percentile(rel, 99):.3g}; TV of the next-token distribution: max "
              f"{tv.max():.3g}, p99 {np.percentile(tv, 99):.3g}, mean {tv.mean():.3g}; "
              f"same argmax {s['argmax']}/{s['n']}")


if __name__ == "__main__":
    main()
