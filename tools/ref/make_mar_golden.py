#!/usr/bin/python3
"""Golden outputs for the `mar` backend and the MAR sampler, from the float64 reference
(tools/ref/mar_ref.py), on a micro MAR with random weights.

Writes tests/golden/micro_mar/: target.safetensors and draft.safetensors (converted from
checkpoints in LTH14/mar's format by tools/convert_mar.py, which this also tests: the EMA
weights must be the ones converted), vspec-model.json, and golden.safetensors with
  - the transformer's condition vectors for a partly known grid and for step 0,
  - diffusion-head outputs for assorted timesteps,
  - the respaced schedule,
  - whole generations (MAR.sample_tokens) for a given order and noises, with CFG linear
    and without CFG, and their decoded pixels.

    /usr/bin/python3 tools/ref/make_mar_golden.py

With --model, the same goldens for a shipped MAR instead (nothing is trained or converted):

    /usr/bin/python3 tools/ref/make_mar_golden.py --model models/fmnist-mar/target.safetensors \
        --out tests/golden/fmnist_mar

builds the reference from the file's metadata and shapes, loads its weights (float32 values
run in float64), and writes OUT/golden.safetensors (the tensors above at that model's sizes,
with whole generations: CFG linear at 8 and at 64 steps, and one without CFG), a symlink
OUT/target.safetensors to the file and OUT/vspec-model.json. tests/test_mar_golden.c checks
tests/golden/fmnist_mar (the shipped target) by default, another OUT with
VSPEC_MAR_GOLDEN_DIR=OUT.
"""

import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import mar_ref as M  # noqa: E402
import safetensors_io as st  # noqa: E402
import convert_mar  # noqa: E402

OUT = os.path.join(ROOT, "tests", "golden", "micro_mar")
SEQ, C, CLASSES = 16, 16, 10
NUM_ITER = 8
LOWVAR_SHIFT = 2.0


def fmnist16():
    """Fashion-MNIST training images at 16x16 (2x2 mean pooling of the padded 32x32), as
    16 tokens of 4x4 patches: data the micro models learn in seconds."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
    import common  # noqa: E402
    imgs, labels = common.load_fmnist("train")
    x = common.to_unit(common.pad32(imgs[:6000]))[:, 0]
    x = x.reshape(-1, 16, 2, 16, 2).mean(axis=(2, 4))
    tok = x.reshape(-1, 4, 4, 4, 4).transpose(0, 1, 3, 2, 4).reshape(-1, SEQ, C)
    return torch.from_numpy(np.ascontiguousarray(tok)), torch.from_numpy(labels[:6000])


def micro(dim, depth, heads, hw, hd, seed, data, steps=600):
    """A micro MAR trained briefly (a random diffusion head predicts noise of the wrong
    scale, and its samples blow up, which would make the goldens measure float round-off
    amplification instead of the model)."""
    torch.manual_seed(seed)
    m = M.MAR(seq_len=SEQ, token_dim=C, enc_dim=dim, enc_depth=depth, enc_heads=heads,
              dec_dim=dim, dec_depth=depth, dec_heads=heads, class_num=CLASSES, buffer_size=4,
              diffloss_d=hd, diffloss_w=hw, attn_dropout=0.0, proj_dropout=0.0)
    m.init_weights()
    tok, lab = data
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95))
    base = M.Diffusion(None)
    m.train()
    for i in range(steps):
        idx = torch.randint(0, len(tok), (64,))
        loss = m.training_loss(tok[idx], lab[idx], base)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"micro dim {dim}: loss {loss.item():.3f} after {steps} steps")
    return m.double().eval()


def convert(model, heads, name, tmp, clip):
    """Save in LTH14/mar's format with distinct 'model' and 'model_ema', convert, and load the
    EMA back as the reference (so the reference runs the file's float32 values)."""
    ema = {k: v.clone() for k, v in model.state_dict().items()}
    raw = {k: v + 0.5 for k, v in ema.items()}  # anything else: the EMA must be taken
    pth = os.path.join(tmp, f"{name}.pth")
    torch.save({"model": {k: v.float() for k, v in raw.items()},
                "model_ema": {k: v.float() for k, v in ema.items()}, "epoch": 0}, pth)
    out = os.path.join(OUT, f"{name}.safetensors")
    convert_mar.main([pth, out, "--heads", str(heads), "--tokenizer", "patch4", "--num-iter",
                      str(NUM_ITER), "--verify"] + (["--clip-denoised"] if clip else []))
    tensors, meta = st.load(out)
    assert meta["tokenizer"] == "patch4" and meta["buffer_size"] == "4"
    sd = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in tensors.items()}
    model.load_state_dict(sd)
    model.clip_denoised = clip
    for k, v in ema.items():
        assert (sd[k] - v.float().double()).abs().max() == 0, f"{name}: not the EMA weights ({k})"
    return model


def perturbed(model, eps, seed):
    import copy
    g = torch.Generator().manual_seed(seed)
    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(1 + eps * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def cspd_models(shift=LOWVAR_SHIFT):
    """The nano MARs of the exactness tests of continuous speculative decoding
    (tests/test_cspd_exact.c): 2x2 tokens of 4 values (Fashion-MNIST at 4x4), a 10-step
    sampler, so that tens of thousands of images take seconds. Three worlds, each a target and
    a draft:
      near:   MAR's 1000-step schedule; the draft is the target with its weights perturbed
              by 1 %;
      far:    the same target; the draft a smaller model of its own;
      coarse: a 10-step schedule (final-step sigma ~0.17 rather than MAR's 0.0064, so the
              two final-step Gaussians overlap); the draft is the target with a lower
              learned variance (the v half of the head's output shifted down by `shift`), so
              that every step's sigma is smaller and a trajectory factor of sigma ratios is
              far from 1."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "train"))
    import common  # noqa: E402
    import copy
    imgs, labels = common.load_fmnist("train")
    x = common.to_unit(common.pad32(imgs[:6000]))[:, 0].reshape(-1, 4, 8, 4, 8).mean(axis=(2, 4))
    tok = torch.from_numpy(np.ascontiguousarray(
        x.reshape(-1, 2, 2, 2, 2).transpose(0, 1, 3, 2, 4).reshape(-1, 4, 4)))
    lab = torch.from_numpy(labels[:6000])

    def train(dim, hw, seed, base):
        torch.manual_seed(seed)
        m = M.MAR(seq_len=4, token_dim=4, enc_dim=dim, enc_depth=1, enc_heads=2, dec_dim=dim,
                  dec_depth=1, dec_heads=2, class_num=CLASSES, buffer_size=2, diffloss_d=1,
                  diffloss_w=hw, attn_dropout=0.0, proj_dropout=0.0)
        m.init_weights()
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95))
        m.train()
        for _ in range(400):
            idx = torch.randint(0, len(tok), (64,))
            loss = m.training_loss(tok[idx], lab[idx], base)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return m.double().eval()

    out_dir = os.path.join(ROOT, "tests", "golden", "cspd")
    os.makedirs(out_dir, exist_ok=True)
    target = train(16, 16, 11, M.Diffusion(None))
    target10 = train(16, 16, 14, M.Diffusion(None, base=10))
    lowvar = copy.deepcopy(target10)
    with torch.no_grad():
        lowvar.diffloss.net.final_layer.linear.bias[4:] -= shift
    models = {"target": (target, 1000), "draft_near": (perturbed(target, 0.01, 12), 1000),
              "draft_far": (train(8, 8, 13, M.Diffusion(None)), 1000),
              "target10": (target10, 10), "draft_lowvar10": (lowvar, 10)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (m, steps) in models.items():
            pth = os.path.join(tmp, name + ".pth")
            torch.save({"model_ema": {k: v.float() for k, v in m.state_dict().items()}}, pth)
            convert_mar.main([pth, os.path.join(out_dir, name + ".safetensors"), "--heads", "2",
                              "--tokenizer", "none", "--num-iter", "4",
                              "--diffusion-steps", str(steps), "--num-sampling-steps", "10",
                              "--clip-denoised", "--verify"])
    for world, tgt, draft in [("near", "target", "draft_near"), ("far", "target", "draft_far"),
                              ("coarse", "target10", "draft_lowvar10")]:
        d = os.path.join(out_dir, world)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "vspec-model.json"), "w") as f:
            json.dump({"name": "cspd_" + world,
                       "target": {"backend": "mar", "weights": f"../{tgt}.safetensors"},
                       "draft": {"backend": "mar", "weights": f"../{draft}.safetensors"},
                       "defaults": {"temperature": 1.0, "cfg_scale": 2.0, "num_iter": 4,
                                    "cfg_schedule": "linear"}}, f, indent=2)
            f.write("\n")


def to_pixels(tok):
    """decode_latents of the patch tokenizer: unpatchify, clamp, (x+1)/2*255+0.5, truncate."""
    g = int(round(tok.shape[0] ** 0.5))
    x = tok.reshape(g, g, 4, 4).transpose(1, 2).reshape(4 * g, 4 * g).float()
    x = ((x.clamp(-1, 1) + 1) / 2 * 255 + 0.5).clamp(0, 255).to(torch.uint8)
    return x.numpy()


def goldens(target, d, g, known_idx, cases):
    """The golden tensors of `target` (and of the models in `cases`) with draws from g:
    condition vectors (known_idx: the known positions, or None to draw 3/8 of the grid),
    head outputs, the schedule of d, and whole generations for cases of (name, model, label,
    cfg, cfg schedule, temperature, num_iter)."""
    out = {}
    S, C = target.seq_len, target.token_embed_dim
    # the transformer: a partly known grid, and step 0 (nothing known)
    tokens = torch.randn(1, S, C, generator=g, dtype=torch.float64) * 0.5
    if known_idx is None:
        known_idx = torch.randperm(S, generator=g)[: 3 * S // 8].sort().values.tolist()
    known = torch.zeros(S, dtype=torch.float64)
    known[known_idx] = 1
    with torch.no_grad():
        z = target.condition(tokens, (1 - known)[None], torch.tensor([3]), 2)   # [2, S, D]
        z0 = target.condition(tokens, torch.ones(1, S, dtype=torch.float64),
                              torch.tensor([3]), 2)
    out["cond.tokens"] = tokens[0].numpy().astype(np.float32)
    out["cond.known"] = known.numpy().astype(np.uint8)
    out["cond.class"] = np.array([3], np.int32)
    out["cond.out"] = z.transpose(0, 1).numpy().astype(np.float32)      # [S, rows, D]
    out["cond0.out"] = z0.transpose(0, 1).numpy().astype(np.float32)
    # the diffusion head
    x = torch.randn(5, C, generator=g, dtype=torch.float64)
    t = torch.tensor([0, 10, 500, 999, 61])
    cond = torch.randn(5, target.decoder_norm.weight.shape[0], generator=g, dtype=torch.float64)
    with torch.no_grad():
        eps_v = target.diffloss.net(x, t, cond)
    out.update({"head.x": x.numpy().astype(np.float32), "head.t": t.numpy().astype(np.int32),
                "head.cond": cond.numpy().astype(np.float32),
                "head.out": eps_v.numpy().astype(np.float32)})
    # the schedule
    out["sched.timesteps"] = np.array(d.timesteps, np.int32)
    for name in ["sqrt_recip_abar", "sqrt_recipm1_abar", "coef1", "coef2", "log_betas"]:
        out[f"sched.{name}"] = getattr(d, name).astype(np.float32)
    out["sched.post_log_var"] = d.post_log_var.astype(np.float32)
    # whole generations with a given order and noises (slot 0: x_{K-1}; slot k: step k's
    # noise; slot K: the final step's, unused by MAR's own sampler)
    for name, model, label, cfg, sched, temp, iters in cases:
        order = torch.randperm(S, generator=g)
        noise = torch.randn(S, d.num_timesteps + 1, C, generator=g).double()
        noise = noise.float().double()
        t0 = time.time()
        with torch.no_grad():
            tok = M.sample_tokens(model, d, label, order, noise[:, 0], noise, iters, cfg, sched,
                                  temp)
        if time.time() - t0 > 5:
            print(f"{name}: {time.time() - t0:.1f} s")
        out[f"{name}.order"] = order.numpy().astype(np.int32)
        out[f"{name}.noise"] = noise.numpy().astype(np.float32)
        out[f"{name}.params"] = np.array([label, cfg, temp, iters, sched == "constant"],
                                         np.float32)
        out[f"{name}.tokens"] = tok.numpy().astype(np.float32)
        out[f"{name}.pixels"] = to_pixels(tok)
    return out


def load_shipped(path):
    """The float64 reference of a MAR safetensors file (tools/convert_mar.py's or
    tools/train/train_mar.py's): shapes from the weights, head counts and the sampler's
    settings from the metadata."""
    tensors, meta = st.load(path)
    s = convert_mar.shapes(tensors)
    for k in ["seq_len", "token_dim", "encoder_embed_dim", "decoder_embed_dim", "encoder_depth",
              "decoder_depth", "buffer_size", "diffloss_d", "diffloss_w", "class_num"]:
        if k in meta and int(meta[k]) != int(s[k]):
            raise SystemExit(f"{path}: metadata {k} = {meta[k]}, the weights say {s[k]}")
    heads = int(meta["encoder_num_heads"])
    dheads = int(meta.get("decoder_num_heads", heads))
    hidden = tensors["encoder_blocks.0.mlp.fc1.weight"].shape[0]
    ratio = hidden / s["encoder_embed_dim"]
    if "mlp_ratio" in meta and float(meta["mlp_ratio"]) != ratio:
        raise SystemExit(f"{path}: metadata mlp_ratio {meta['mlp_ratio']}, the weights {ratio}")
    m = M.MAR(seq_len=s["seq_len"], token_dim=s["token_dim"], enc_dim=s["encoder_embed_dim"],
              enc_depth=s["encoder_depth"], enc_heads=heads, dec_dim=s["decoder_embed_dim"],
              dec_depth=s["decoder_depth"], dec_heads=dheads, mlp_ratio=ratio,
              class_num=s["class_num"], buffer_size=s["buffer_size"],
              diffloss_d=s["diffloss_d"], diffloss_w=s["diffloss_w"], attn_dropout=0.0,
              proj_dropout=0.0)
    m = m.double().eval()
    sd = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in tensors.items()}
    m.load_state_dict(sd, strict=True)
    m.clip_denoised = bool(int(meta.get("clip_denoised", "0")))
    d = M.Diffusion(int(meta.get("num_sampling_steps", "100")),
                    base=int(meta.get("diffusion_steps", "1000")))
    if meta.get("tokenizer") != "patch4":
        raise SystemExit(f"{path}: tokenizer {meta.get('tokenizer')}: the goldens decode pixels "
                         f"with the patch4 tokenizer")
    return m, d, meta


def main_model(path, out_dir, num_iter_long=64):
    """Goldens of a shipped model file (module docstring)."""
    path = os.path.abspath(path)
    model, d, meta = load_shipped(path)
    S = model.seq_len
    print(f"{path}: seq {S}, token_dim {model.token_embed_dim}, "
          f"dim {model.decoder_norm.weight.shape[0]}, buffer {model.buffer_size}, "
          f"clip_denoised {int(model.clip_denoised)}, K {d.num_timesteps}")
    os.makedirs(out_dir, exist_ok=True)
    link = os.path.join(out_dir, "target.safetensors")
    if os.path.lexists(link):
        os.remove(link)
    # relative, so that a golden directory inside the repository works from any checkout
    os.symlink(os.path.relpath(path, os.path.abspath(out_dir)), link)
    with open(os.path.join(out_dir, "vspec-model.json"), "w") as f:
        json.dump({"name": os.path.basename(os.path.dirname(path)) + "-golden",
                   "target": {"backend": "mar", "weights": "target.safetensors"},
                   "defaults": {"temperature": 1.0, "cfg_scale": 2.0, "num_iter": 8,
                                "cfg_schedule": "linear"}}, f, indent=2)
        f.write("\n")
    g = torch.Generator().manual_seed(7)
    cases = [("gen", model, 3, 2.0, "linear", 1.0, 8),
             ("gen_nocfg", model, 7, 1.0, "linear", 1.0, 8),
             (f"gen{num_iter_long}", model, 5, 2.0, "linear", 1.0, num_iter_long)]
    out = goldens(model, d, g, None, cases)
    st.save(os.path.join(out_dir, "golden.safetensors"), out,
            {"note": "float64 reference of a shipped MAR, tools/ref/make_mar_golden.py --model",
             "model": os.path.relpath(path, ROOT), "clip_denoised": str(int(model.clip_denoised)),
             "num_classes": str(model.num_classes),
             "num_sampling_steps": str(d.num_timesteps),
             "diffusion_steps": meta.get("diffusion_steps", "1000")})
    print("wrote", out_dir)


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = fmnist16()
        # the target samples as the patch tokens' pixel range asks (x0 clamped); the draft as
        # MAR does (unclamped), so both sampler paths have goldens
        target = convert(micro(32, 2, 4, 32, 2, 1, data), 4, "target", tmp, True)
        draft = convert(micro(16, 1, 2, 16, 1, 2, data), 2, "draft", tmp, False)
    cspd_models()
    with open(os.path.join(OUT, "vspec-model.json"), "w") as f:
        json.dump({"name": "micro_mar",
                   "target": {"backend": "mar", "weights": "target.safetensors"},
                   "draft": {"backend": "mar", "weights": "draft.safetensors"},
                   "defaults": {"temperature": 0.9, "cfg_scale": 2.0, "num_iter": NUM_ITER,
                                "cfg_schedule": "linear"}}, f, indent=2)
        f.write("\n")
    g = torch.Generator().manual_seed(7)
    cases = [("gen", target, 3, 2.0, "linear", 0.9, NUM_ITER),
             ("gen_nocfg", target, 5, 1.0, "linear", 1.0, 5),
             ("gen_const", target, 1, 3.0, "constant", 1.0, SEQ),
             ("gen_draft", draft, 4, 2.0, "linear", 1.0, NUM_ITER)]
    out = goldens(target, M.Diffusion(100), g, [0, 3, 5, 9, 10, 15], cases)
    st.save(os.path.join(OUT, "golden.safetensors"), out,
            {"note": "float64 reference of a micro MAR, tools/ref/make_mar_golden.py"})
    print("wrote", OUT)


if __name__ == "__main__" and sys.argv[1:2] == ["--cspd-only"]:
    cspd_models(float(sys.argv[2]) if len(sys.argv) > 2 else LOWVAR_SHIFT)
elif __name__ == "__main__" and "--model" in sys.argv[1:]:
    import argparse
    ap = argparse.ArgumentParser(description="goldens of a shipped MAR (module docstring)")
    ap.add_argument("--model", required=True, help="a MAR .safetensors (patch4 tokenizer)")
    ap.add_argument("--out", required=True, help="directory for golden.safetensors etc.")
    ap.add_argument("--num-iter-long", type=int, default=64,
                    help="num_iter of the long whole generation (default 64)")
    a = ap.parse_args()
    main_model(a.model, a.out, a.num_iter_long)
elif __name__ == "__main__":
    main()
