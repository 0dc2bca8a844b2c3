#!/usr/bin/python3
"""Train a LlamaGen GPT c2i (target or draft: sizes are flags) on the Fashion-MNIST VQ codes
and export it as safetensors with LlamaGen's parameter names.

Training follows LlamaGen's train_c2i.py: input [class token][codes 0..62], logits at all
64 positions predict codes 0..63, cross entropy, class dropout 0.1 (label -> null class 10)
for CFG. AdamW(0.9, 0.95), weight decay 0.05, grad clip 1.0, warmup-stable-decay schedule.
Data: the 60k training images and their horizontal flips (120k sequences).
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
import torch.nn.functional as F  # noqa: E402

from models import GPT, count_params  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True, help="target or draft")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--min-lr-frac", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--decay-frac", type=float, default=0.25,
                   help="warmup-stable-decay: linear decay over the last fraction of steps")
    p.add_argument("--wd", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--class-dropout", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--tokens", default=os.path.join(common.WORK, "tokens"))
    p.add_argument("--work", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.work = a.work or os.path.join(common.WORK, a.name)
    a.out = a.out or os.path.join(common.MODELS, f"{a.name}.safetensors")
    return a


def lr_at(step, a):
    """Warmup, constant, then linear decay to min_lr_frac over the last decay_frac of the
    steps (so --steps can be changed on resume before the decay starts)."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    d0 = a.steps * (1 - a.decay_frac)
    if step < d0:
        return a.lr
    t = min(1.0, (step - d0) / max(1.0, a.steps - d0))
    return a.lr * (1 - (1 - a.min_lr_frac) * t)


@torch.no_grad()
def val_loss(model, codes, labels, bs=250, null=False):
    model.eval()
    tot, n, correct = 0.0, 0, 0
    for i in range(0, len(codes), bs):
        x = codes[i:i + bs]
        c = labels[i:i + bs] if not null else torch.full_like(labels[i:i + bs], model.num_classes)
        logits = model(c, x[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.size(-1)), x.reshape(-1),
                               reduction="sum").item()
        correct += (logits.argmax(-1) == x).sum().item()
        n += x.numel()
    model.train()
    return tot / n, correct / n


def gpt_metadata(model, extra):
    c = model.cfg
    meta = {"vspec.kind": "llamagen-gpt", "model_type": "c2i", "block_size": c["block_size"],
            "cls_token_num": c["cls_token_num"], "num_classes": c["num_classes"],
            "n_layer": c["n_layer"], "n_head": c["n_head"], "n_kv_head": c["n_head"],
            "dim": c["dim"], "rope_base": c["rope_base"], "norm_eps": "1e-05",
            "multiple_of": c["multiple_of"], "ffn_dim_multiplier": "none",
            "ffn_hidden": model.hidden, "vocab_size": c["vocab_size"],
            "class_dropout_prob": c["class_dropout_prob"], "caption_dim": "0",
            "null_class": c["num_classes"], "image_size": "32", "downsample": "4",
            "dataset": "fashion-mnist VQ codes (60k train images + horizontal flips)"}
    meta.update(extra)
    return meta


def main():
    a = parse()
    os.makedirs(a.work, exist_ok=True)
    log = common.Logger(os.path.join(a.work, "train.log"))
    torch.manual_seed(a.seed)
    tr = np.load(os.path.join(a.tokens, "train.npz"))
    te = np.load(os.path.join(a.tokens, "test.npz"))
    codes = torch.from_numpy(tr["codes"].astype(np.int64).reshape(-1, 64))   # [120000, 64]
    labels = torch.from_numpy(np.repeat(tr["labels"], 2))                     # orig, flip
    vcodes = torch.from_numpy(te["codes"].astype(np.int64))[:2000]
    vlabels = torch.from_numpy(te["labels"])[:2000]

    model = GPT(dim=a.dim, n_layer=a.n_layer, n_head=a.n_head, class_dropout_prob=a.class_dropout,
                dropout=a.dropout)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = common.adamw(decay, no_decay, a.lr, a.wd)
    log(f"GPT {a.name}: dim {a.dim} layers {a.n_layer} heads {a.n_head} ffn {model.hidden} "
        f"params {count_params(model)} ({count_params(model) / 1e6:.3f}M); "
        f"{a.steps} steps x bs {a.bs} = {a.steps * a.bs / len(codes):.2f} epochs of {len(codes)}")

    ck_path = os.path.join(a.work, "ckpt.pt")
    step, elapsed, cpu_prev = 0, 0.0, 0.0
    ck = common.load_ckpt(ck_path)
    if ck is not None:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        cpu_prev = ck.get("cpu", 0.0)
        torch.manual_seed(a.seed + step)
        log(f"resumed at step {step}")
    tuner = common.ThreadTuner(torch, log=log)
    t_start = time.time() - elapsed
    cpu0 = time.process_time() - cpu_prev
    last_ck = time.time()
    hist = []
    model.train()
    while step < a.steps:
        idx = torch.from_numpy(common.epoch_batch(len(codes), a.bs, step, a.seed))
        tuner.before_step()
        t0 = time.time()
        x, c = codes[idx], labels[idx]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        logits = model(c, x[:, :-1], train=True)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        dt = time.time() - t0
        tuner.after_step(dt)
        hist.append(loss.item())
        if step % 50 == 0:
            log(f"step {step}/{a.steps} loss {np.mean(hist):.4f} gnorm {gn:.2f} "
                f"lr {lr_at(step, a):.2e} {dt:.2f}s/step nt={tuner.nt}")
            hist = []
        if step % a.eval_every == 0 or step == a.steps:
            vl, vacc = val_loss(model, vcodes, vlabels)
            log(f"eval step {step}: val loss {vl:.4f} (ppl {np.exp(vl):.1f}) top1 {vacc:.4f}")
        if time.time() - last_ck > a.ckpt_minutes * 60 or step == a.steps:
            elapsed = time.time() - t_start
            common.atomic_torch_save({"model": model.state_dict(), "opt": opt.state_dict(),
                                      "step": step, "elapsed": elapsed, "args": vars(a),
                                      "cpu": time.process_time() - cpu0}, ck_path)
            last_ck = time.time()

    elapsed = time.time() - t_start
    cpu = time.process_time() - cpu0
    model.eval()
    vcodes_all = torch.from_numpy(te["codes"].astype(np.int64))
    vlabels_all = torch.from_numpy(te["labels"])
    vl, vacc = val_loss(model, vcodes_all, vlabels_all)
    vlu, _ = val_loss(model, vcodes_all, vlabels_all, null=True)
    log(f"final fp32: test loss {vl:.4f} (ppl {np.exp(vl):.2f}) top1 {vacc:.4f}; "
        f"uncond test loss {vlu:.4f}")
    meta = gpt_metadata(model, {
        "train_steps": step, "train_batch": a.bs, "train_time_s": int(elapsed),
        "test_loss_cond": f"{vl:.4f}", "test_loss_uncond": f"{vlu:.4f}",
        "params": count_params(model)})
    common.export_state(a.out, model.state_dict(), meta, fp16=True)
    st, _ = common.load_state(a.out)
    m16 = GPT(dim=a.dim, n_layer=a.n_layer, n_head=a.n_head, class_dropout_prob=a.class_dropout)
    m16.load_state_dict(st, strict=True)
    vl16, _ = val_loss(m16, vcodes_all, vlabels_all)
    log(f"fp16 export: test loss {vl16:.4f} (fp32 {vl:.4f})")
    common.write_json(os.path.join(a.work, "result.json"), {
        "params": count_params(model), "steps": step, "batch": a.bs,
        "epochs": step * a.bs / len(codes), "train_time_s": elapsed, "cpu_time_s": cpu, "test_loss": vl,
        "test_ppl": float(np.exp(vl)), "test_top1": vacc, "test_loss_uncond": vlu,
        "test_loss_fp16": vl16, "args": vars(a)})
    log(f"done in {common.fmt_time(elapsed)} -> {a.out}")


if __name__ == "__main__":
    main()
