#!/usr/bin/python3
"""Convert an original MAR checkpoint (LTH14/mar checkpoint-last.pth) to safetensors for vspec.

    /usr/bin/python3 tools/convert_mar.py checkpoint-last.pth mar_base.safetensors --preset mar_base

MAR's evaluation samples from the EMA weights (engine_mar.py evaluate, demo/run_mar.ipynb), so
the `model_ema` entry is converted unless --no-ema. Parameter names are kept as in the
checkpoint (models/mar.py, models/diffloss.py). What the weights do not hold goes into the
safetensors metadata as strings: the head counts (from --preset or --heads), the sampler's
steps (num_sampling_steps, "100" in MAR), the default num_iter, and the tokenizer ("kl16" for
the released models, whose KL-16 VAE vspec does not run; "patch4" for the project's
Fashion-MNIST models). Shapes the weights do hold (widths, depths, sequence, buffer) are
checked for consistency. Needs torch; safetensors I/O is tools/safetensors_io.py.
"""

import argparse
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

# models/mar.py mar_base / mar_large / mar_huge: (depth, heads, width)
PRESETS = {"mar_base": (12, 12, 768), "mar_large": (16, 16, 1024), "mar_huge": (20, 16, 1280)}


class ConvertError(Exception):
    pass


def load_state(path, ema):
    ck = torch.load(path, map_location="cpu")
    if isinstance(ck, dict) and ("model_ema" in ck or "model" in ck):
        key = "model_ema" if ema and "model_ema" in ck else "model"
        if ema and key != "model_ema":
            print(f"{path}: no model_ema, converting 'model'", file=sys.stderr)
        ck = ck[key]
    if not isinstance(ck, dict) or not all(torch.is_tensor(v) for v in ck.values()):
        raise ConvertError(f"{path}: not a MAR checkpoint (a state dict or a dict with "
                           f"'model_ema' / 'model')")
    return {k[7:] if k.startswith("module.") else k: v for k, v in ck.items()}


def shapes(sd):
    def need(k):
        if k not in sd:
            raise ConvertError(f"missing tensor '{k}': not a MAR state dict")
        return sd[k].shape
    s = {}
    s["seq_len"] = need("diffusion_pos_embed_learned")[1]
    s["decoder_embed_dim"] = need("diffusion_pos_embed_learned")[2]
    s["encoder_embed_dim"], s["token_dim"] = need("z_proj.weight")
    s["buffer_size"] = need("encoder_pos_embed_learned")[1] - s["seq_len"]
    s["class_num"] = need("class_emb.weight")[0]
    depth = lambda pat: len({int(m.group(1)) for k in sd for m in [re.match(pat, k)] if m})
    s["encoder_depth"] = depth(r"encoder_blocks\.(\d+)\.")
    s["decoder_depth"] = depth(r"decoder_blocks\.(\d+)\.")
    s["diffloss_d"] = depth(r"diffloss\.net\.res_blocks\.(\d+)\.")
    s["diffloss_w"] = need("diffloss.net.input_proj.weight")[0]
    if need("decoder_pos_embed_learned")[1] != s["seq_len"] + s["buffer_size"]:
        raise ConvertError("encoder and decoder position tables differ in length")
    if need("diffloss.net.final_layer.linear.weight")[0] != 2 * s["token_dim"]:
        raise ConvertError("the diffusion head does not predict 2 x token_dim values "
                           "(learned variance)")
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("out")
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--heads", type=int, help="attention heads (encoder and decoder)")
    ap.add_argument("--decoder-heads", type=int)
    ap.add_argument("--num-sampling-steps", type=int, default=100)
    ap.add_argument("--diffusion-steps", type=int, default=1000,
                    help="the length of the schedule the head was trained on (MAR: 1000)")
    ap.add_argument("--num-iter", type=int, help="default generation steps (MAR: 64)")
    ap.add_argument("--tokenizer", default="kl16", choices=["kl16", "patch4", "none"])
    ap.add_argument("--no-ema", action="store_true")
    ap.add_argument("--clip-denoised", action="store_true",
                    help="the sampler clamps x0 to [-1, 1] (pixel-space tokens; not MAR's)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--verify", action="store_true", help="reload and compare every tensor")
    a = ap.parse_args(argv)
    sd = load_state(a.checkpoint, not a.no_ema)
    s = shapes(sd)
    heads = a.heads
    if a.preset:
        depth, ph, width = PRESETS[a.preset]
        if (s["encoder_depth"], s["encoder_embed_dim"]) != (depth, width):
            raise ConvertError(f"--preset {a.preset} is depth {depth} width {width}; the weights "
                               f"have {s['encoder_depth']} x {s['encoder_embed_dim']}")
        heads = heads or ph
    if not heads:
        raise ConvertError("the head count is not in the weights: give --preset or --heads")
    dheads = a.decoder_heads or heads
    if s["encoder_embed_dim"] % heads or s["decoder_embed_dim"] % dheads:
        raise ConvertError(f"{heads} / {dheads} heads do not divide the widths")
    meta = {"vspec.kind": "mar", "encoder_num_heads": heads, "decoder_num_heads": dheads,
            "num_sampling_steps": a.num_sampling_steps,
            "diffusion_steps": a.diffusion_steps, "tokenizer": a.tokenizer,
            "num_iter": a.num_iter or s["seq_len"], "clip_denoised": int(a.clip_denoised), **s}
    out = {}
    for k, v in sd.items():
        t = v.detach().float().numpy()
        out[k] = safetensors_io.BF16(t) if a.dtype == "bf16" else \
            t.astype({"f32": np.float32, "f16": np.float16}[a.dtype])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    safetensors_io.save(a.out, out, {k: str(v) for k, v in meta.items()})
    if a.verify:
        back, m2 = safetensors_io.load(a.out)
        for k, v in sd.items():
            got = np.asarray(back[k], dtype=np.float32)
            want = v.detach().float().numpy()
            tol = {"f32": 0.0, "f16": 1e-3, "bf16": 1e-2}[a.dtype] * (np.abs(want).max() + 1e-30)
            if got.shape != want.shape or np.abs(got - want).max() > tol:
                raise ConvertError(f"verify: tensor '{k}' differs after the round trip")
        if m2.get("encoder_num_heads") != str(heads):
            raise ConvertError("verify: metadata lost")
    print(f"wrote {a.out}: {len(out)} tensors, {sum(v.numel() for v in sd.values()) / 1e6:.2f} M "
          f"values, heads {heads}/{dheads}, seq {s['seq_len']}, buffer {s['buffer_size']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConvertError as e:
        print(f"convert_mar: {e}", file=sys.stderr)
        sys.exit(1)
