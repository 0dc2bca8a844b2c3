#!/usr/bin/python3
"""Distil the draft GPT towards the target's guided distribution (knowledge distillation for
speculative decoding, as DistillSpec, arXiv 2310.08461: train the draft on the divergence
that the acceptance rule pays for).

Why: a drafted token is accepted with probability sum_v min(q, p) at T = 1, where q is the
target's and p the draft's distribution after CFG (Leviathan et al., arXiv 2211.17192,
Sec. 3: the acceptance rate is 1 - TV(q, p)). The draft trained on the data
(train_gpt.py) only learns q indirectly. Here both models see the same prefix with the class
and with the null class, both pairs of logits are mixed by LlamaGen's CFG rule
(u + s (c - u), s = the model's default cfg_scale) and the draft's mixed distribution is
pulled towards the target's by

    loss = TV(q, p) + kl_weight * KL(q || p)

TV is what acceptance pays; the small forward-KL term keeps the gradient informative where
the two distributions do not overlap yet. The draft keeps its architecture and parameter
names, so the C engine loads it as before; at inference it still runs with CFG, as the
target does.

Prefixes: the training codes (the 60k images and their flips, teacher forced, as
train_gpt.py reads them). The acceptance proxy mean sum_v min(q, p) is measured on held-out
target samples drawn at the default cfg (the prefixes the draft sees when it drafts; cached
in work/distill/prefixes.npz) before and after; eval_samples.py computes the same proxy for
the model card. Resumable: work/distill/ckpt.pt every few minutes.
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

import sampling  # noqa: E402
from train_eagle import load_gpt  # noqa: E402
from train_gpt import gpt_metadata, val_loss  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=common.MODELS)
    p.add_argument("--init", default=os.path.join(common.WORK, "draft", "draft.safetensors"),
                   help="the draft trained on the data (train_gpt.py --name draft)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--kl-weight", type=float, default=0.1)
    p.add_argument("--cfg", type=float, default=None, help="default: the manifest's cfg_scale")
    p.add_argument("--held-out", type=int, default=500, help="target samples to evaluate on")
    p.add_argument("--gen-bs", type=int, default=250)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--tokens", default=os.path.join(common.WORK, "tokens"))
    p.add_argument("--work", default=os.path.join(common.WORK, "distill"))
    p.add_argument("--out", default=None, help="default: the models' draft.safetensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    a = p.parse_args()
    a.out = a.out or os.path.join(a.models, "draft.safetensors")
    return a


def default_cfg(models_dir):
    spec = common.read_json(os.path.join(models_dir, "vspec-model.json"), {})
    return float(spec.get("defaults", {}).get("cfg_scale", 1.5))


@torch.no_grad()
def target_prefixes(target, n, cfg, bs, seed, path, log):
    """n target samples (labels i mod 10) at cfg, cached in chunks so a restart resumes."""
    have = dict(np.load(path)) if os.path.exists(path) else {"codes": np.zeros((0, 64), np.int64)}
    codes = have["codes"]
    labels = np.arange(n) % 10
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    while len(codes) < n:
        i = len(codes)
        gen.manual_seed(seed * 1_000_003 + i)  # each chunk reproducible on its own
        c = torch.from_numpy(labels[i:i + bs])
        out = sampling.generate(target, c, cfg_scale=cfg, generator=gen).numpy()
        codes = np.concatenate([codes, out])
        np.savez(path + ".tmp.npz", codes=codes)
        os.replace(path + ".tmp.npz", path)
        log(f"target samples {len(codes)}/{n} ({time.time() - t0:.0f}s)")
    return torch.from_numpy(codes[:n]), torch.from_numpy(labels)


def guided_logits(model, c, x, cfg):
    """CFG-mixed logits for prefixes x [B, 64] of classes c [B] (rows [cond; uncond])."""
    b = len(x)
    cc = torch.cat([c, torch.full_like(c, model.num_classes)])
    logits = model(cc, torch.cat([x, x])[:, :-1])
    return sampling.cfg_combine(logits, b, cfg) if cfg > 1.0 else logits[:b]


def divergences(q, logp):
    """Per-position TV(q, p) and KL(q || p); q probabilities, logp log-probabilities."""
    p = logp.exp()
    tv = 0.5 * (q - p).abs().sum(-1)
    kl = (q * (torch.log(q.clamp_min(1e-30)) - logp)).sum(-1)
    return tv, kl


@torch.no_grad()
def acceptance_proxy(target, draft, codes, labels, cfg, bs=100):
    """Mean over positions of sum_v min(q, p): one drafted token's acceptance rate at T = 1."""
    acc = []
    for i in range(0, len(codes), bs):
        x, c = codes[i:i + bs], labels[i:i + bs]
        q = F.softmax(guided_logits(target, c, x, cfg), -1)
        p = F.softmax(guided_logits(draft, c, x, cfg), -1)
        acc.append(torch.minimum(q, p).sum(-1).mean(0))
    per_pos = torch.stack(acc).mean(0)
    return float(per_pos.mean()), per_pos


def main():
    a = parse()
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    log = common.Logger(os.path.join(a.work, "distill.log"))
    torch.manual_seed(a.seed)
    cfg = a.cfg if a.cfg is not None else default_cfg(a.models)
    target, _ = load_gpt(os.path.join(a.models, "target.safetensors"))
    draft, meta = load_gpt(a.init)
    draft.train()
    for p_ in draft.parameters():
        p_.requires_grad_(True)

    ho_codes, ho_labels = target_prefixes(target, a.held_out, cfg, a.gen_bs, a.seed,
                                          os.path.join(a.work, "prefixes.npz"), log)
    tr = np.load(os.path.join(a.tokens, "train.npz"))
    data_codes = torch.from_numpy(tr["codes"].astype(np.int64).reshape(-1, 64))  # [120000, 64]
    data_labels = torch.from_numpy(np.repeat(tr["labels"], 2))                    # orig, flip

    decay = [p_ for p_ in draft.parameters() if p_.dim() >= 2]
    no_decay = [p_ for p_ in draft.parameters() if p_.dim() < 2]
    opt = common.adamw(decay, no_decay, a.lr, a.wd)
    ck_path = os.path.join(a.work, "ckpt.pt")
    step, elapsed = 0, 0.0
    ck = common.load_ckpt(ck_path)
    if ck is not None:
        draft.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, acc0 = ck["step"], ck["elapsed"], ck.get("accept_before", float("nan"))
        log(f"resumed at step {step}")
    else:
        acc0, _ = acceptance_proxy(target, draft, ho_codes, ho_labels, cfg)
        log(f"acceptance proxy before: {acc0:.4f} (held-out target samples, cfg {cfg})")
    t_start = time.time() - elapsed
    last_ck = time.time()
    hist = []
    while step < a.steps:
        # seed + 1: the batch order of the run that made the shipped draft
        j = torch.from_numpy(common.epoch_batch(len(data_codes), a.bs, step, a.seed + 1))
        x, c = data_codes[j], data_labels[j]
        for g in opt.param_groups:
            g["lr"] = common.warmup_cosine(step, a.lr, a.warmup, a.steps)
        with torch.no_grad():
            q = F.softmax(guided_logits(target, c, x, cfg), -1)
        logp = F.log_softmax(guided_logits(draft, c, x, cfg), -1)
        tv, kl = divergences(q, logp)
        loss = tv.mean() + a.kl_weight * kl.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        hist.append((tv.mean().item(), kl.mean().item()))
        if step % 50 == 0:
            h = np.mean(hist, 0)
            log(f"step {step}/{a.steps} TV {h[0]:.4f} KL {h[1]:.4f} lr {common.warmup_cosine(step, a.lr, a.warmup, a.steps):.2e}")
            hist = []
        if step % a.eval_every == 0 or step == a.steps:
            draft.eval()
            acc, _ = acceptance_proxy(target, draft, ho_codes, ho_labels, cfg)
            draft.train()
            log(f"eval step {step}: acceptance proxy {acc:.4f}")
        if time.time() - last_ck > a.ckpt_minutes * 60 or step == a.steps:
            common.atomic_torch_save({"model": draft.state_dict(), "opt": opt.state_dict(),
                                      "step": step, "elapsed": time.time() - t_start,
                                      "accept_before": acc0, "args": vars(a)}, ck_path)
            last_ck = time.time()

    draft.eval()
    acc, per_pos = acceptance_proxy(target, draft, ho_codes, ho_labels, cfg)
    log(f"acceptance proxy after: {acc:.4f}; by row of the 8x8 grid: "
        f"{[round(float(v), 3) for v in per_pos.reshape(8, 8).mean(1)]}")
    te = np.load(os.path.join(a.tokens, "test.npz"))
    te_codes, te_labels = torch.from_numpy(te["codes"].astype(np.int64)), torch.from_numpy(te["labels"])
    vl, vacc = val_loss(draft, te_codes, te_labels)
    vlu, _ = val_loss(draft, te_codes, te_labels, null=True)
    log(f"test loss on the data: {vl:.4f} (ppl {np.exp(vl):.2f}) top1 {vacc:.4f}; uncond {vlu:.4f} "
        f"(before: {meta.get('test_loss_cond')}, uncond {meta.get('test_loss_uncond')})")
    extra = {k: v for k, v in meta.items() if k.startswith("train_")}
    extra.update({"test_loss_cond": f"{vl:.4f}", "test_loss_uncond": f"{vlu:.4f}",
                  "data_test_loss_before_distill": meta.get("test_loss_cond", ""),
                  "distilled_from": "target.safetensors", "distill_steps": step,
                  "distill_cfg": cfg, "distill_loss": f"TV + {a.kl_weight} KL(q||p)",
                  "distill_accept_proxy": f"{acc:.4f}", "params": meta.get("params", "")})
    common.export_state(a.out, draft.state_dict(), gpt_metadata(draft, extra), fp16=True)
    d16, _ = load_gpt(a.out)
    acc16, _ = acceptance_proxy(target, d16, ho_codes, ho_labels, cfg)
    log(f"fp16 export: acceptance proxy {acc16:.4f} -> {a.out} "
        f"({common.fmt_time(time.time() - t_start)})")
    common.write_json(os.path.join(a.work, "result.json"), {
        "steps": step, "batch": a.bs, "cfg": cfg, "accept_proxy_before": acc0,
        "accept_proxy": acc, "accept_proxy_fp16": acc16, "held_out": a.held_out,
        "test_loss": vl, "test_top1": vacc, "test_loss_uncond": vlu,
        "test_loss_before": float(meta.get("test_loss_cond", "nan")),
        "train_time_s": time.time() - t_start, "args": vars(a)})


if __name__ == "__main__":
    main()
