#!/usr/bin/python3
"""Convert an original LlamaGen checkpoint (.pt, torch.save) to safetensors for vspec.

    /usr/bin/python3 tools/convert_llamagen.py c2i_B_256.pt gpt_b_256.safetensors \\
        --preset GPT-B --image-size 256 --downsample 16
    /usr/bin/python3 tools/convert_llamagen.py t2i_XL_stage1_256.pt t2i_xl.safetensors \\
        --preset GPT-XL --image-size 256 --downsample 16            # t2i detected from keys
    /usr/bin/python3 tools/convert_llamagen.py vq_ds16_c2i.pt vq16.safetensors --preset VQ-16

Key names are kept exactly as in the checkpoint (gpt.py Transformer, vq_model.py VQModel); only
the training statistic `quantize.codebook_used` (a VectorQuantizer buffer) is dropped.
Hyper-parameters go into the safetensors `__metadata__`, which holds strings only. Values
derivable from tensor shapes are derived from the weights; the rest come from flags and are
checked against the weights where possible.
Needs torch (Debian python3-torch); safetensors I/O is tools/safetensors_io.py.
With the GPT and the VQ in one directory, tools/make_manifest.py writes its vspec-model.json
(with ImageNet-1k's class names for a 1000-class c2i GPT).
"""

import argparse
import json
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

# LlamaGen autoregressive/models/gpt.py, GPT_models: name -> (n_layer, n_head, dim)
GPT_PRESETS = {
    "GPT-B": (12, 12, 768), "GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536), "GPT-XXXL": (48, 40, 2560), "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200), "GPT-7B": (32, 32, 4096),
}
# LlamaGen tokenizer/tokenizer_image/vq_model.py, VQ_models: name -> ch_mult
VQ_PRESETS = {"VQ-16": [1, 1, 2, 2, 4], "VQ-8": [1, 2, 2, 4]}
DROPPED_KEYS = ("quantize.codebook_used",)


class ConvertError(Exception):
    pass


def find_multiple(n, k):
    return n if n % k == 0 else n + k - (n % k)


def ffn_hidden_dim(dim, multiple_of, mult):
    hidden = int(2 * (4 * dim) / 3)                 # gpt.py FeedForward
    if mult is not None:
        hidden = int(mult * hidden)
    return find_multiple(hidden, multiple_of)


# ---- checkpoint loading ------------------------------------------------------------------

def _is_state_dict(obj):
    return isinstance(obj, dict) and len(obj) > 0 and all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in obj.items())


def pick_state_dict(ckpt, use_ema=False):
    """LlamaGen's DDP files hold {"model": sd, ...}; FSDP files are the state dict
    (sample_c2i.py --from-fsdp)."""
    if use_ema:
        if not isinstance(ckpt, dict) or "ema" not in ckpt:
            raise ConvertError("--ema given but the checkpoint has no 'ema' entry")
        sd = ckpt["ema"]
    elif _is_state_dict(ckpt):
        sd = ckpt
    else:
        sd = None
        if isinstance(ckpt, dict):
            for key in ("model", "module", "state_dict"):
                if key in ckpt:
                    sd = ckpt[key]
                    break
        if sd is None:
            top = list(ckpt.keys())[:10] if isinstance(ckpt, dict) else type(ckpt).__name__
            raise ConvertError(f"no state dict found (looked for 'model', 'module', "
                               f"'state_dict' or a plain tensor dict); top level: {top}")
    if not _is_state_dict(sd):
        raise ConvertError("the selected entry is not a {name: tensor} state dict")
    # Some wrappers prefix keys with "module." (DDP) -- strip it if every key has it.
    if all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return {k: v for k, v in sd.items() if k not in DROPPED_KEYS}


def detect_kind(sd):
    if "tok_embeddings.weight" in sd:
        return "gpt"
    if "decoder.conv_in.weight" in sd or "quantize.embedding.weight" in sd:
        return "vq"
    raise ConvertError("cannot tell GPT from VQ: neither 'tok_embeddings.weight' nor "
                       "'decoder.conv_in.weight' is present; pass --kind")


def _need(sd, key):
    if key not in sd:
        raise ConvertError(f"missing tensor '{key}'")
    return sd[key]


def _fmt_float(x):
    return repr(float(x))


# ---- GPT ---------------------------------------------------------------------------------

def gpt_metadata(sd, args):
    tok = _need(sd, "tok_embeddings.weight")
    vocab_size, dim = tok.shape
    layer_ids = sorted({int(m.group(1)) for k in sd
                        for m in [re.match(r"layers\.(\d+)\.", k)] if m})
    n_layer = len(layer_ids)
    if n_layer == 0 or layer_ids != list(range(n_layer)):
        raise ConvertError(f"layer indices are not 0..n-1: {layer_ids[:8]}...")

    has_cap = "cls_embedding.cap_proj.fc1.weight" in sd
    has_tab = "cls_embedding.embedding_table.weight" in sd
    if has_cap == has_tab:
        raise ConvertError("expected exactly one of cls_embedding.embedding_table (c2i) "
                           "and cls_embedding.cap_proj (t2i)")
    model_type = "t2i" if has_cap else "c2i"
    if args.model_type and args.model_type != model_type:
        raise ConvertError(f"--model-type {args.model_type} contradicts the weights "
                           f"(they are {model_type})")

    # n_head: from --preset or --n-head (not derivable from shapes)
    n_head = args.n_head
    if args.preset:
        if args.preset not in GPT_PRESETS:
            raise ConvertError(f"--preset {args.preset} is not a GPT preset "
                               f"({', '.join(GPT_PRESETS)})")
        p_layer, p_head, p_dim = GPT_PRESETS[args.preset]
        if (p_layer, p_dim) != (n_layer, dim):
            raise ConvertError(f"--preset {args.preset} expects n_layer={p_layer}, dim={p_dim} "
                               f"but the weights have n_layer={n_layer}, dim={dim}")
        if n_head is not None and n_head != p_head:
            raise ConvertError(f"--n-head {n_head} contradicts --preset {args.preset} "
                               f"(n_head={p_head})")
        n_head = p_head
    if n_head is None:
        raise ConvertError("n_head is not derivable from the weights: pass --preset or --n-head")
    if dim % n_head:
        raise ConvertError(f"dim {dim} is not divisible by n_head {n_head}")
    hd = dim // n_head
    if hd % 4:
        raise ConvertError(f"head_dim {hd} not divisible by 4 (2-D RoPE needs hd/4 pairs)")

    qkv_rows = _need(sd, "layers.0.attention.wqkv.weight").shape[0]
    if qkv_rows % hd or (qkv_rows // hd - n_head) % 2 or qkv_rows // hd <= n_head:
        raise ConvertError(f"wqkv has {qkv_rows} rows, inconsistent with n_head={n_head}, "
                           f"head_dim={hd}")
    n_kv_head = (qkv_rows // hd - n_head) // 2
    if n_head % n_kv_head:
        raise ConvertError(f"n_kv_head {n_kv_head} does not divide n_head {n_head}")

    ffn = _need(sd, "layers.0.feed_forward.w1.weight").shape[0]
    expect = ffn_hidden_dim(dim, args.multiple_of, args.ffn_dim_multiplier)
    if expect != ffn:
        raise ConvertError(f"FFN hidden size is {ffn} but multiple_of={args.multiple_of}, "
                           f"ffn_dim_multiplier={args.ffn_dim_multiplier} give {expect}: "
                           f"pass the right --multiple-of / --ffn-dim-multiplier")

    # grid / block_size: only the RoPE table depends on it (gpt.py precompute_freqs_cis_2d)
    if args.grid is not None:
        grid = args.grid
        if args.image_size is not None and args.downsample is not None \
                and args.image_size // args.downsample != grid:
            raise ConvertError("--grid contradicts --image-size / --downsample")
    elif args.image_size is not None and args.downsample is not None:
        if args.image_size % args.downsample:
            raise ConvertError("--image-size is not a multiple of --downsample")
        grid = args.image_size // args.downsample
    else:
        raise ConvertError("block_size is not derivable from the weights: pass --image-size "
                           "and --downsample (e.g. 256 and 16), or --grid")
    if grid <= 0:
        raise ConvertError("grid must be positive")

    if model_type == "c2i":
        rows = sd["cls_embedding.embedding_table.weight"].shape[0]
        num_classes = rows - (1 if args.class_dropout_prob > 0 else 0)
        caption_dim = 0
        cls_token_num = 1 if args.cls_token_num is None else args.cls_token_num
    else:
        num_classes = 0
        caption_dim = sd["cls_embedding.cap_proj.fc1.weight"].shape[1]
        unc = _need(sd, "cls_embedding.uncond_embedding")
        cls_token_num = unc.shape[0] if args.cls_token_num is None else args.cls_token_num
        if cls_token_num != unc.shape[0]:
            raise ConvertError(f"--cls-token-num {cls_token_num} but uncond_embedding has "
                               f"{unc.shape[0]} rows (t2i needs them equal)")
        if unc.shape[1] != caption_dim:
            raise ConvertError("uncond_embedding width differs from cap_proj.fc1 input width")
    if cls_token_num < 1:
        raise ConvertError("--cls-token-num must be >= 1")

    out_w = _need(sd, "output.weight")
    if tuple(out_w.shape) != (vocab_size, dim):
        raise ConvertError(f"output.weight is {tuple(out_w.shape)}, expected {(vocab_size, dim)}")

    return {
        "vspec.kind": "llamagen-gpt",
        "model_type": model_type,
        "block_size": str(grid * grid),
        "cls_token_num": str(cls_token_num),
        "num_classes": str(num_classes),
        "n_layer": str(n_layer),
        "n_head": str(n_head),
        "n_kv_head": str(n_kv_head),
        "dim": str(dim),
        "rope_base": _fmt_float(args.rope_base),
        "norm_eps": _fmt_float(args.norm_eps),
        "multiple_of": str(args.multiple_of),
        "ffn_dim_multiplier": "none" if args.ffn_dim_multiplier is None
                              else _fmt_float(args.ffn_dim_multiplier),
        "vocab_size": str(vocab_size),
        "caption_dim": str(caption_dim),
        "class_dropout_prob": _fmt_float(args.class_dropout_prob),
    }


# ---- VQ ----------------------------------------------------------------------------------

def _parse_ch_mult(text):
    try:
        val = json.loads(text) if text.strip().startswith("[") else \
            [int(t) for t in text.split(",") if t.strip()]
    except (ValueError, json.JSONDecodeError):
        raise ConvertError(f"--ch-mult {text!r}: expected e.g. '[1,1,2,2,4]' or '1,1,2,2,4'")
    if not val or not all(isinstance(v, int) and v > 0 for v in val):
        raise ConvertError(f"--ch-mult {text!r}: expected positive integers")
    return val


def vq_metadata(sd, args):
    emb = _need(sd, "quantize.embedding.weight")
    codebook_size, embed_dim = emb.shape
    conv_in = _need(sd, "decoder.conv_in.weight")
    z_channels = conv_in.shape[1]
    conv_out = _need(sd, "decoder.conv_out.weight")

    stages = sorted({int(m.group(1)) for k in sd
                     for m in [re.match(r"decoder\.conv_blocks\.(\d+)\.", k)] if m})
    L = len(stages)
    if L == 0 or stages != list(range(L)):
        raise ConvertError(f"decoder.conv_blocks indices are not 0..L-1: {stages}")
    n_res = {s: len({int(m.group(1)) for k in sd
                     for m in [re.match(rf"decoder\.conv_blocks\.{s}\.res\.(\d+)\.", k)] if m})
             for s in stages}
    if len(set(n_res.values())) != 1:
        raise ConvertError(f"decoder stages have different res-block counts: {n_res}")
    num_res_blocks = n_res[0] - 1                  # vq_model.py Decoder: num_res_blocks + 1
    # channels per stage -> ch * ch_mult[L-1-s]
    widths = [sd[f"decoder.conv_blocks.{s}.res.0.conv1.weight"].shape[0] for s in stages]

    if args.ch_mult is not None:
        ch_mult = _parse_ch_mult(args.ch_mult)
        src = "--ch-mult"
        if args.preset and VQ_PRESETS.get(args.preset) not in (None, ch_mult):
            raise ConvertError(f"--ch-mult {ch_mult} contradicts --preset {args.preset}")
    elif args.preset:
        if args.preset not in VQ_PRESETS:
            raise ConvertError(f"--preset {args.preset} is not a VQ preset "
                               f"({', '.join(VQ_PRESETS)})")
        ch_mult, src = VQ_PRESETS[args.preset], f"--preset {args.preset}"
    else:
        # Not given: derive it from the decoder widths (ch_mult[0] = 1 assumed, as in every
        # LlamaGen preset).
        base = widths[-1]
        if any(w % base for w in widths):
            raise ConvertError("cannot derive ch_mult from the decoder widths; pass --ch-mult")
        ch_mult, src = [w // base for w in reversed(widths)], None
    if len(ch_mult) != L:
        raise ConvertError(f"{src}: ch_mult {ch_mult} has {len(ch_mult)} levels but the "
                           f"checkpoint has {L} decoder conv_blocks")
    ch = conv_out.shape[1] // ch_mult[0]
    if ch * ch_mult[0] != conv_out.shape[1]:
        raise ConvertError(f"decoder.conv_out input width {conv_out.shape[1]} is not a "
                           f"multiple of ch_mult[0]={ch_mult[0]}")
    expect = [ch * ch_mult[L - 1 - s] for s in stages]
    if expect != widths:
        raise ConvertError(f"{src or 'derived'} ch_mult {ch_mult} with ch={ch} predicts decoder "
                           f"stage widths {expect}, the weights have {widths}")
    if conv_in.shape[0] != ch * ch_mult[-1]:
        raise ConvertError("decoder.conv_in width does not match ch * ch_mult[-1]")

    meta = {
        "vspec.kind": "llamagen-vq",
        "ch": str(ch),
        "ch_mult": json.dumps(ch_mult, separators=(",", ":")),
        "num_res_blocks": str(num_res_blocks),
        "z_channels": str(z_channels),
        "codebook_size": str(codebook_size),
        "codebook_embed_dim": str(embed_dim),
        "codebook_l2_norm": "false" if args.no_l2_norm else "true",
    }
    if args.image_size is not None:
        meta["image_size"] = str(args.image_size)
    return meta


# ---- writing -----------------------------------------------------------------------------

def cast_tensor(t, dtype):
    """torch tensor -> numpy array (or BF16 wrapper) in the requested float dtype."""
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.numpy()
    f32 = t.to(torch.float32).numpy()
    if dtype == "f32":
        return f32
    if dtype == "f16":
        return t.to(torch.float16).numpy()
    return safetensors_io.BF16(f32)


def expected_array(t, dtype):
    """What the file must hold for source tensor t (as float32 / int array)."""
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.numpy()
    if dtype == "f32":
        return t.to(torch.float32).numpy()
    if dtype == "f16":
        return t.to(torch.float16).to(torch.float32).numpy()
    return t.to(torch.bfloat16).to(torch.float32).numpy()


def verify(path, sd, meta, dtype):
    tensors, got_meta = safetensors_io.load(path)
    if set(tensors) != set(sd):
        missing, extra = set(sd) - set(tensors), set(tensors) - set(sd)
        raise ConvertError(f"verify: key sets differ (missing {sorted(missing)[:5]}, "
                           f"extra {sorted(extra)[:5]})")
    if got_meta != meta:
        raise ConvertError("verify: metadata differs after reload")
    for name, src in sd.items():
        want = expected_array(src, dtype)
        got = tensors[name]
        if tuple(got.shape) != tuple(src.shape):
            raise ConvertError(f"verify: {name} shape {got.shape} != {tuple(src.shape)}")
        if not np.array_equal(np.asarray(got, dtype=want.dtype), want):
            raise ConvertError(f"verify: {name} values differ")
    return len(sd)


def build_parser():
    p = argparse.ArgumentParser(
        description="Convert a LlamaGen .pt checkpoint (GPT or VQ) to safetensors "
                    "with vspec metadata.")
    p.add_argument("input", help="checkpoint written by torch.save (.pt/.pth)")
    p.add_argument("output", help="output .safetensors path")
    p.add_argument("--kind", choices=["gpt", "vq"], help="default: detected from the keys")
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32",
                   help="storage dtype of floating tensors (default f32)")
    p.add_argument("--ema", action="store_true", help="convert the 'ema' weights")
    p.add_argument("--verify", action="store_true",
                   help="reload the written file and compare every tensor with the source")
    p.add_argument("--preset", help="GPT-B|GPT-L|GPT-XL|GPT-XXL|GPT-XXXL|GPT-1B|GPT-3B|GPT-7B "
                                    "or VQ-16|VQ-8")
    g = p.add_argument_group("GPT")
    g.add_argument("--n-head", type=int, help="attention heads (or use --preset)")
    g.add_argument("--image-size", type=int, help="image side in pixels (GPT: with "
                   "--downsample gives block_size; VQ: optional metadata)")
    g.add_argument("--downsample", type=int, help="VQ downsample factor (16 for VQ-16)")
    g.add_argument("--grid", type=int, help="token grid side G (block_size = G*G)")
    g.add_argument("--model-type", choices=["c2i", "t2i"], help="default: from the keys")
    g.add_argument("--cls-token-num", type=int,
                   help="condition tokens T (default 1 for c2i, 120 for t2i)")
    g.add_argument("--multiple-of", type=int, default=256, help="FFN rounding (default 256)")
    g.add_argument("--ffn-dim-multiplier", type=float, default=None)
    g.add_argument("--rope-base", type=float, default=10000.0)
    g.add_argument("--norm-eps", type=float, default=1e-5)
    g.add_argument("--class-dropout-prob", type=float, default=0.1,
                   help="> 0 means the class table has a null row (default 0.1)")
    v = p.add_argument_group("VQ")
    v.add_argument("--ch-mult", help="e.g. '[1,1,2,2,4]' (default: --preset, else derived "
                                     "from the decoder widths)")
    v.add_argument("--no-l2-norm", action="store_true",
                   help="codebook_l2_norm = false (all released LlamaGen VQs use true)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.n_head is not None and args.n_head <= 0:
            raise ConvertError("--n-head must be positive")
        if args.downsample is not None and args.downsample <= 0:
            raise ConvertError("--downsample must be positive")
        if not os.path.isfile(args.input):
            raise ConvertError(f"input file not found: {args.input}")
        ckpt = torch.load(args.input, map_location="cpu")
        sd = pick_state_dict(ckpt, args.ema)
        kind = args.kind or detect_kind(sd)
        if kind == "gpt":
            if args.preset and args.preset in VQ_PRESETS:
                raise ConvertError(f"--preset {args.preset} is a VQ preset but the kind is gpt")
            meta = gpt_metadata(sd, args)
        else:
            if args.preset and args.preset in GPT_PRESETS:
                raise ConvertError(f"--preset {args.preset} is a GPT preset but the kind is vq")
            meta = vq_metadata(sd, args)
        tensors = {k: cast_tensor(v, args.dtype) for k, v in sd.items()}
        safetensors_io.save(args.output, tensors, meta)
        if args.verify:
            n = verify(args.output, sd, meta, args.dtype)
            print(f"verified {n} tensors", file=sys.stderr)
    except ConvertError as e:
        parser.error(str(e))
    print(f"wrote {args.output}: {meta['vspec.kind']}, {len(sd)} tensors, {args.dtype}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
