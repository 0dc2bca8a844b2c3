#!/usr/bin/python3
"""A model directory with a random-weight LlamaGen c2i GPT, converted as a real checkpoint is.

    /usr/bin/python3 tools/random_llamagen.py OUT_DIR [--preset GPT-B] [--out-std 0.05] [--seed 0]

Builds the state dict of LlamaGen's c2i GPT (autoregressive/models/gpt.py, as transcribed in
tools/ref/llamagen_ref.py: 256 image tokens, vocabulary 16384, 1000 classes), saves it as
LlamaGen's training script does ({"model": state_dict}), converts it with
tools/convert_llamagen.py and writes OUT_DIR/vspec-model.json naming it as the target: no VQ
decoder (eval --no-quality, costcurve) and no draft model or head, which is what a user who
converts a checkpoint has. Weights are N(0, 0.02) as gpt.py's _init_weights draws them and
the norms 1, except the output layer: gpt.py zeroes it, which would make every distribution
exactly uniform; N(0, --out-std) gives logits of standard deviation about
out_std * sqrt(dim) instead (1.4 for GPT-B at 0.05). Such a model's distributions are still
far flatter than a trained one's, so acceptance rates measured on it are not a trained model's;
its costs are. Needs torch (Debian python3-torch).
"""

import argparse
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "ref"))
import convert_llamagen  # noqa: E402
import llamagen_ref as R  # noqa: E402


def random_state_dict(preset, out_std, seed):
    n_layer, n_head, dim = R.GPT_PRESETS[preset]
    torch.manual_seed(seed)
    model = R.GPT(R.GPTConfig(dim=dim, n_layer=n_layer, n_head=n_head))
    sd = model.state_dict()
    with torch.no_grad():
        for key, t in sd.items():  # state-dict order: the draws depend on it
            if "norm" in key and key.endswith("weight"):
                t.fill_(1.0)
            elif key.startswith("output"):
                t.normal_(0, out_std)
            else:
                t.normal_(0, 0.02)
    return sd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--preset", default="GPT-B", choices=sorted(R.GPT_PRESETS))
    ap.add_argument("--out-std", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    sd = random_state_dict(args.preset, args.out_std, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        pt = os.path.join(tmp, "gpt.pt")
        torch.save({"model": sd}, pt)
        rc = convert_llamagen.main([pt, os.path.join(args.out_dir, "gpt.safetensors"),
                                    "--preset", args.preset, "--image-size", "256",
                                    "--downsample", "16"])
    if rc:
        return rc
    name = f"random-{args.preset.lower()}"
    with open(os.path.join(args.out_dir, "vspec-model.json"), "w") as f:
        json.dump({"name": name, "target": {"backend": "llamagen", "gpt": "gpt.safetensors"}},
                  f, indent=2)
        f.write("\n")
    print(f"wrote {args.out_dir}: {name}, output std {args.out_std}, seed {args.seed}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
