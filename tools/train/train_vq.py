#!/usr/bin/python3
"""Train the LlamaGen-architecture VQ tokenizer on Fashion-MNIST (32x32, 3 channels) and
export models/fmnist/vq.safetensors.

Losses (LlamaGen vq_loss without the optional LPIPS/GAN terms): L2 reconstruction
+ codebook MSE + beta(0.25) * commitment, codebook L2-normalised (codebook_l2_norm).
Extra training-only trick: codebook rows unused for `--restart-every` steps are re-seeded
from recent encoder outputs (does not change the inference architecture).
Resumable: checkpoints to tools/train/work/vq/ckpt.pt every few minutes.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

torch = common.setup_torch()
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models import VQModel, count_params  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--ch", type=int, default=32)
    p.add_argument("--z-channels", type=int, default=64)
    p.add_argument("--codebook-size", type=int, default=1024)
    p.add_argument("--embed-dim", type=int, default=8)
    p.add_argument("--beta", type=float, default=0.25)
    p.add_argument("--entropy", type=float, default=0.0)
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--restart-every", type=int, default=200)
    p.add_argument("--restart-until", type=float, default=0.8, help="fraction of steps")
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--eval-every", type=int, default=600)
    p.add_argument("--work", default=os.path.join(common.WORK, "vq"))
    p.add_argument("--out", default=os.path.join(common.MODELS, "vq.safetensors"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def lr_at(step, total, base, warm=200):
    if step < warm:
        return base * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return base * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, t))))


@torch.no_grad()
def evaluate(model, x_test, bs=250):
    model.eval()
    mse, used = 0.0, torch.zeros(model.quantize.n_e, dtype=torch.bool)
    for i in range(0, len(x_test), bs):
        x = x_test[i:i + bs]
        rec, _, idx = model(x)
        g = common.rgb_to_grey(rec)
        mse += ((g - x[:, :1]) ** 2).sum().item()
        used[idx.flatten()] = True
    model.train()
    n = len(x_test) * 32 * 32
    m = mse / n
    return {"mse": m, "psnr": 10 * np.log10(4.0 / m), "usage": int(used.sum())}


def export(model, args, path, extra_meta):
    state = {k: v for k, v in model.state_dict().items()}
    meta = {"vspec.kind": "llamagen-vq", "ch": args.ch, "ch_mult": "[1,2,2]",
            "num_res_blocks": 2, "z_channels": args.z_channels,
            "codebook_size": args.codebook_size, "codebook_embed_dim": args.embed_dim,
            "codebook_l2_norm": "true", "image_size": "32", "in_channels": 3,
            "out_channels": 3, "norm": "GroupNorm(32, eps=1e-6)",
            "dataset": "fashion-mnist (28x28 padded to 32x32, grey replicated to RGB, [-1,1])"}
    meta.update(extra_meta)
    common.export_state(path, state, meta, fp16=True, keep_fp32=("quantize.embedding",))


def main():
    args = parse()
    os.makedirs(args.work, exist_ok=True)
    log = common.Logger(os.path.join(args.work, "train.log"))
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    tr, _ = common.load_fmnist("train")
    te, _ = common.load_fmnist("test")
    x_train = common.pad32(tr)                       # uint8 [60000,32,32]
    x_test = torch.from_numpy(common.to_rgb(common.pad32(te[:2000])))

    model = VQModel(ch=args.ch, z_channels=args.z_channels, codebook_size=args.codebook_size,
                    codebook_embed_dim=args.embed_dim, beta=args.beta, entropy_ratio=args.entropy)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    log(f"VQ ch={args.ch} params enc {count_params(model.encoder)/1e6:.3f}M "
        f"dec {count_params(model.decoder)/1e6:.3f}M total {count_params(model)/1e6:.3f}M")

    ck_path = os.path.join(args.work, "ckpt.pt")
    step, elapsed = 0, 0.0
    ck = common.load_ckpt(ck_path)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        rng = np.random.default_rng(args.seed + step)
        torch.manual_seed(args.seed + step)
        log(f"resumed at step {step} ({common.fmt_time(elapsed)} trained)")

    tuner = common.ThreadTuner(torch, log=log)
    n_e = args.codebook_size
    usage_window = torch.zeros(n_e)
    z_pool = []
    last_ck = time.time()
    t_start = time.time() - elapsed
    hist = []
    while step < args.steps:
        tuner.before_step()
        t0 = time.time()
        idx = rng.integers(0, len(x_train), args.bs)
        xb = x_train[idx].copy()
        flip = rng.random(args.bs) < 0.5
        xb[flip] = xb[flip][:, :, ::-1]
        x = torch.from_numpy(common.to_rgb(xb))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr)
        z = model.quant_conv(model.encoder(x))
        zq, qloss, codes = model.quantize(z)
        rec = model.decode(zq)
        rec_loss = F.mse_loss(rec, x)
        loss = rec_loss + sum(qloss.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        with torch.no_grad():
            usage_window += torch.bincount(codes.flatten(), minlength=n_e).float()
            zf = F.normalize(z.detach().permute(0, 2, 3, 1).reshape(-1, args.embed_dim), dim=-1)
            z_pool = (z_pool + [zf])[-8:]
        if (args.restart_every > 0 and step % args.restart_every == 0
                and step < args.restart_until * args.steps):
            dead = (usage_window == 0).nonzero().flatten()
            if len(dead) > 0:
                pool = torch.cat(z_pool)
                pick = pool[torch.randint(0, len(pool), (len(dead),))]
                pick = F.normalize(pick + 0.01 * torch.randn_like(pick), dim=-1)
                with torch.no_grad():
                    model.quantize.embedding.weight.data[dead] = pick
                # reset the Adam state for the re-seeded rows
                st = opt.state.get(model.quantize.embedding.weight)
                if st:
                    st["exp_avg"][dead] = 0
                    st["exp_avg_sq"][dead] = 0
            log(f"step {step}: codes used in window {int((usage_window > 0).sum())}/{n_e}, "
                f"re-seeded {len(dead)}")
            usage_window.zero_()
        dt = time.time() - t0
        tuner.after_step(dt)
        hist.append([rec_loss.item()] + [v.item() for v in qloss.values()])
        if step % 50 == 0:
            h = np.mean(hist, axis=0)
            hist = []
            log(f"step {step}/{args.steps} rec {h[0]:.5f} " +
                " ".join(f"{k} {v:.5f}" for k, v in zip(qloss.keys(), h[1:])) +
                f" lr {lr_at(step, args.steps, args.lr):.2e} {dt:.2f}s/step nt={tuner.nt}")
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate(model, x_test)
            log(f"eval step {step}: test grey MSE {ev['mse']:.5f} PSNR {ev['psnr']:.2f} dB "
                f"usage {ev['usage']}/{n_e}")
        if time.time() - last_ck > args.ckpt_minutes * 60 or step == args.steps:
            elapsed = time.time() - t_start
            common.atomic_torch_save({"model": model.state_dict(), "opt": opt.state_dict(),
                                      "step": step, "elapsed": elapsed, "args": vars(args)},
                                     ck_path)
            last_ck = time.time()

    elapsed = time.time() - t_start
    model.eval()
    # Final metrics on the full test set, fp32 and with the fp16-rounded export.
    x_all = torch.from_numpy(common.to_rgb(common.pad32(te)))
    ev = evaluate(model, x_all)
    log(f"final fp32: test MSE {ev['mse']:.5f} PSNR {ev['psnr']:.2f} usage {ev['usage']}")
    with torch.no_grad():
        rec, _, _ = model(x_all[:50])
    grid = torch.cat([x_all[:50, :1].view(5, 10, 1, 32, 32),
                      common.rgb_to_grey(rec).view(5, 10, 1, 32, 32)], dim=1).view(100, 1, 32, 32)
    common.save_grid(os.path.join(args.work, "recon.png"), grid)
    meta = {"train_steps": step, "train_batch": args.bs, "train_time_s": int(elapsed),
            "test_mse_grey": f"{ev['mse']:.6f}", "test_psnr_db": f"{ev['psnr']:.3f}",
            "codebook_used_test": ev["usage"]}
    export(model, args, args.out, meta)
    # re-load the fp16 export and measure it
    st, _ = common.load_state(args.out)
    m16 = VQModel(ch=args.ch, z_channels=args.z_channels, codebook_size=args.codebook_size,
                  codebook_embed_dim=args.embed_dim)
    m16.load_state_dict(st, strict=True)
    ev16 = evaluate(m16, x_all[:2000])
    ev32 = evaluate(model, x_all[:2000])
    log(f"fp16 export vs fp32 on 2000 test images: MSE {ev16['mse']:.6f} vs {ev32['mse']:.6f}")
    common.write_json(os.path.join(args.work, "result.json"),
                      {"fp32": ev, "fp16_2000": ev16, "fp32_2000": ev32, "steps": step, "batch": args.bs,
                       "train_time_s": elapsed, "params": count_params(model),
                       "params_encoder": count_params(model.encoder),
                       "params_decoder": count_params(model.decoder), "args": vars(args)})
    log(f"done in {common.fmt_time(elapsed)} -> {args.out}")


if __name__ == "__main__":
    main()
