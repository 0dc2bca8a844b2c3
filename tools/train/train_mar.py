#!/usr/bin/python3
"""Train a MAR (LTH14/mar architecture, tools/ref/mar_ref.py) on Fashion-MNIST and export it
as safetensors with MAR's parameter names (the EMA weights, as MAR's evaluation uses).

Tokens: the 32x32 image in [-1, 1] cut into 4x4 patches, one 16-d token per patch (8 x 8
tokens, raster order; a token's 16 values are its patch's pixels row by row). This is the
project's continuous tokenizer (models/fmnist-mar/MODEL_CARD.md says why: lossless, no
training, the 16 dimensions of MAR's KL-16 latents). Training follows main_mar.py /
MAR.forward: random order, mask ratio from a truncated normal (min 0.7), encoder on buffer +
visible tokens, DiffLoss on the masked tokens (--diffusion-mul draws per token; MAR: 4), class
dropout 0.1 (the fake latent), AdamW(0.9, 0.95) with weight decay 0.02, EMA of the weights.
Data: the 60k training images and their horizontal flips.
Resumable: tools/train/work/<name>/ckpt.pt every few minutes.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

torch = common.setup_torch()
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(common.ROOT, "tools", "ref"))
import mar_ref as M  # noqa: E402

PATCH = 4


def patchify(img):
    """[N,1,32,32] -> [N,64,16]: token r*8+c = pixels (4r+dy, 4c+dx), index dy*4+dx."""
    n = img.shape[0]
    g = img.shape[-1] // PATCH
    x = img.reshape(n, g, PATCH, g, PATCH).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(x.reshape(n, g * g, PATCH * PATCH))


def unpatchify(tok):
    n, l, _ = tok.shape
    g = int(round(l ** 0.5))
    x = tok.reshape(n, g, g, PATCH, PATCH).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, 1, g * PATCH, g * PATCH)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="mar_target or mar_draft")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--depth", type=int, default=4, help="encoder and decoder blocks, each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--buffer", type=int, default=16)
    p.add_argument("--head-depth", type=int, default=3)
    p.add_argument("--head-width", type=int, default=256)
    p.add_argument("--diffusion-mul", type=int, default=1,
                   help="diffusion draws per masked token (MAR uses 4)")
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--wd", type=float, default=0.02)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--work", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bench", type=int, default=0, help="time this many steps and exit")
    p.add_argument("--export-only", action="store_true",
                   help="export the EMA weights of the last checkpoint to --out and exit "
                        "(e.g. to look at a model while it trains)")
    a = p.parse_args()
    a.work = a.work or os.path.join(common.WORK, a.name)
    a.out = a.out or os.path.join(common.ROOT, "models", "fmnist-mar", f"{a.name[4:]}.safetensors")
    return a


def lr_at(step, a):
    return common.warmup_cosine(step, a.lr, a.warmup, a.steps)


def build(a):
    return M.MAR(seq_len=64, token_dim=16, enc_dim=a.dim, enc_depth=a.depth, enc_heads=a.heads,
                 dec_dim=a.dim, dec_depth=a.depth, dec_heads=a.heads, class_num=10,
                 buffer_size=a.buffer, diffloss_d=a.head_depth, diffloss_w=a.head_width,
                 diffusion_batch_mul=a.diffusion_mul)


def metadata(a, model):
    return {"vspec.kind": "mar", "seq_len": 64, "grid": 8, "token_dim": 16, "patch": PATCH,
            "tokenizer": "patch4", "encoder_embed_dim": a.dim, "encoder_depth": a.depth,
            "encoder_num_heads": a.heads, "decoder_embed_dim": a.dim, "decoder_depth": a.depth,
            "decoder_num_heads": a.heads, "mlp_ratio": 4, "buffer_size": a.buffer,
            "diffloss_d": a.head_depth, "diffloss_w": a.head_width, "class_num": 10,
            "num_sampling_steps": 100, "diffusion_steps": 1000, "image_size": 32,
            # pixel tokens live in [-1, 1]: the sampler clamps its x0 prediction there (as
            # guided-diffusion's clip_denoised; MAR's latents are unbounded and do not)
            "clip_denoised": 1,
            "params": sum(p.numel() for p in model.parameters())}


def main():
    a = parse()
    log = common.Logger(os.path.join(a.work, "train.log"))
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    imgs, labels = common.load_fmnist("train")
    x = common.to_unit(common.pad32(imgs))
    tokens = np.concatenate([patchify(x), patchify(x[..., ::-1].copy())])
    labels = np.concatenate([labels, labels])
    tokens_t = torch.from_numpy(tokens)
    labels_t = torch.from_numpy(labels)
    model = build(a)
    model.init_weights()
    ema = build(a)
    ema.load_state_dict(model.state_dict())
    ema.eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.dim() < 2 or "pos_embed" in n or "token" in n or "fake_latent" in n
         else decay).append(p)
    opt = common.adamw(decay, no_decay, a.lr, a.wd)
    diffusion = M.Diffusion(None)
    ck_path = os.path.join(a.work, "ckpt.pt")
    step = 0
    ck = common.load_ckpt(ck_path)
    if ck:
        model.load_state_dict(ck["model"])
        ema.load_state_dict(ck["ema"])
        opt.load_state_dict(ck["opt"])
        step = ck["step"]
        torch.set_rng_state(ck["rng"])
        log(f"resumed at step {step}")
    if a.export_only:
        if not ck:
            raise SystemExit(f"{ck_path}: no checkpoint to export")
        common.export_state(a.out, ema.state_dict(), metadata(a, ema), fp16=False)
        print(f"exported the EMA weights of step {step} to {a.out}")
        return
    log(f"{a.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"{len(tokens)} sequences, {a.steps} steps of {a.bs}")
    tuner = common.ThreadTuner(torch, log=log)
    t_ck = time.time()
    t0, run_loss, n_loss = time.time(), 0.0, 0
    model.train()
    while step < a.steps:
        idx = common.epoch_batch(len(tokens), a.bs, step, a.seed)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        tuner.before_step()
        ts = time.time()
        loss = model.training_loss(tokens_t[idx], labels_t[idx], diffusion)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 3.0)
        opt.step()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.mul_(a.ema).add_(pm.detach(), alpha=1 - a.ema)
        tuner.after_step(time.time() - ts)
        run_loss += loss.item()
        n_loss += 1
        step += 1
        if a.bench and step >= a.bench:
            log(f"bench: {(time.time() - t0) / step:.3f} s/step")
            return
        if step % a.log_every == 0:
            log(f"step {step}/{a.steps} loss {run_loss / n_loss:.4f} lr {lr_at(step, a):.2e} "
                f"{(time.time() - t0) / n_loss:.3f} s/step")
            run_loss, n_loss, t0 = 0.0, 0, time.time()
        if time.time() - t_ck > a.ckpt_minutes * 60 or step == a.steps:
            common.atomic_torch_save({"model": model.state_dict(), "ema": ema.state_dict(),
                                      "opt": opt.state_dict(), "step": step,
                                      "rng": torch.get_rng_state()}, ck_path)
            t_ck = time.time()
    common.export_state(a.out, ema.state_dict(), metadata(a, ema), fp16=False)
    log(f"exported {a.out}")


if __name__ == "__main__":
    main()
