#!/usr/bin/python3
"""Train the EAGLE-1 draft head over the exported target GPT (models/fmnist/target.safetensors)
and export models/fmnist/eagle.safetensors (LANTERN cnets_llamagen.py parameter names).

Head (dim D = target dim, H = target heads, F = target FFN hidden):
    x_p   = fc( concat( E[tok at target position p+1], f_p ) )     fc: Linear(2D -> D, bias)
    h     = x_p + o_proj(Attn(q_proj x, k_proj x, v_proj x))        (NO input RMSNorm: layer 0)
    f^_{p+1} = h + down_proj( silu(gate_proj n) * up_proj n ),  n = RMSNorm(h; post_attention_layernorm, eps 1e-6)
    draft logits = target.output(f^_{p+1})
E = target tok_embeddings, f_p = target final-norm output at sequence position p.
Attention: causal over drafter rows, 2-D RoPE (LlamaGen interleaved pairs) with the drafter
table built with cls_token_num = target cls_token_num - 1 = 0, so drafter row p uses the grid
position of image token p (row p//8, col p%8) - the token it embeds.

Training data: teacher-forced target features on the training codes (with flips), for the
cond row (true class) AND the uncond row (null class), no CFG in the loss (LANTERN default).
Loss = SmoothL1(f^, f_next) + 0.1 * CE(softmax(target logits at that position), head logits)
(EAGLE soft labels); uniform feature noise U(-0.1, 0.1) on the input features.
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

from models import GPT, EagleHead, count_params  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--target", default=os.path.join(common.MODELS, "target.safetensors"))
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--bs", type=int, default=64, help="sequences per step (x2 rows: cond+uncond)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--p-w", type=float, default=0.1)
    p.add_argument("--noise", type=float, default=0.2, help="uniform noise width (U(-w/2, w/2))")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--ckpt-minutes", type=float, default=4.0)
    p.add_argument("--tokens", default=os.path.join(common.WORK, "tokens"))
    p.add_argument("--work", default=os.path.join(common.WORK, "eagle"))
    p.add_argument("--out", default=os.path.join(common.MODELS, "eagle.safetensors"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load_gpt(path):
    st, meta = common.load_state(path)
    m = GPT(dim=int(meta["dim"]), n_layer=int(meta["n_layer"]), n_head=int(meta["n_head"]),
            vocab_size=int(meta["vocab_size"]), block_size=int(meta["block_size"]),
            num_classes=int(meta["num_classes"]),
            class_dropout_prob=float(meta["class_dropout_prob"]),
            cls_token_num=int(meta["cls_token_num"]))
    m.load_state_dict(st, strict=True)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, meta


def make_head(target):
    c = target.cfg
    return EagleHead(c["dim"], c["n_head"], target.hidden, c["block_size"],
                     cls_token_num=c["cls_token_num"] - 1, rope_base=c["rope_base"], eps=1e-6)


@torch.no_grad()
def target_rows(target, x, labels):
    """x [B, 64] codes -> features [2B, 64, D] (cond rows then uncond rows), codes [2B, 64]."""
    c = torch.cat([labels, torch.full_like(labels, target.num_classes)])
    xx = torch.cat([x, x])
    return target.features(c, xx[:, :-1]), xx


def head_loss(head, target, feats, xx, noise, p_w):
    """feats [R, 64, D] target features at positions 0..63; xx [R, 64] image codes.
    Drafter row p (0..62): embeds image code p (= target position p+1), gets f_p,
    predicts f_{p+1}."""
    t = target.cls_token_num
    n_in = feats.size(1) - 1
    fin = feats[:, :n_in]
    if noise > 0:
        fin = fin + (torch.rand_like(fin) - 0.5) * noise
    emb = target.tok_embeddings(xx[:, t - 1:t - 1 + n_in])
    pred = head(emb, fin)
    tgt = feats[:, 1:]
    with torch.no_grad():
        tp = F.softmax(target.output(tgt).float(), dim=-1)
    logits = target.output(pred).float()
    vloss = F.smooth_l1_loss(pred, tgt)
    ploss = -(tp * F.log_softmax(logits, dim=-1)).sum(-1).mean()
    agree = (logits.argmax(-1) == tp.argmax(-1)).float()
    return vloss + p_w * ploss, vloss, ploss, agree


def main():
    a = parse()
    os.makedirs(a.work, exist_ok=True)
    log = common.Logger(os.path.join(a.work, "train.log"))
    torch.manual_seed(a.seed)
    target, tmeta = load_gpt(a.target)
    head = make_head(target)
    log(f"EAGLE head params {count_params(head)} over target dim {target.cfg['dim']} "
        f"heads {target.cfg['n_head']} ffn {target.hidden}")
    tr = np.load(os.path.join(a.tokens, "train.npz"))
    te = np.load(os.path.join(a.tokens, "test.npz"))
    codes = torch.from_numpy(tr["codes"].astype(np.int64).reshape(-1, 64))
    labels = torch.from_numpy(np.repeat(tr["labels"], 2))
    vcodes = torch.from_numpy(te["codes"].astype(np.int64))[:1000]
    vlabels = torch.from_numpy(te["labels"])[:1000]
    with torch.no_grad():
        vfeats, vxx = target_rows(target, vcodes, vlabels)

    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ck_path = os.path.join(a.work, "ckpt.pt")
    step, elapsed, cpu_prev = 0, 0.0, 0.0
    ck = common.load_ckpt(ck_path)
    if ck is not None:
        head.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        cpu_prev = ck.get("cpu", 0.0)
        torch.manual_seed(a.seed + step)
        log(f"resumed at step {step}")

    def lr_at(s):
        return common.warmup_cosine(s, a.lr, a.warmup, a.steps)

    @torch.no_grad()
    def evaluate():
        head.eval()
        tot = np.zeros(3)
        agree_c, agree_u = [], []
        r = len(vcodes)
        for i in range(0, r, 250):
            idx = torch.cat([torch.arange(i, min(i + 250, r)), torch.arange(r + i, r + min(i + 250, r))])
            _, vl, pl, ag = head_loss(head, target, vfeats[idx], vxx[idx], 0.0, a.p_w)
            tot += np.array([vl.item(), pl.item(), 1])
            h = ag.size(0) // 2
            agree_c.append(ag[:h].mean().item())
            agree_u.append(ag[h:].mean().item())
        head.train()
        return tot[0] / tot[2], tot[1] / tot[2], float(np.mean(agree_c)), float(np.mean(agree_u))

    tuner = common.ThreadTuner(torch, log=log)
    t_start = time.time() - elapsed
    cpu0 = time.process_time() - cpu_prev
    last_ck = time.time()
    hist = []
    head.train()
    while step < a.steps:
        idx = torch.from_numpy(common.epoch_batch(len(codes), a.bs, step, a.seed))
        tuner.before_step()
        t0 = time.time()
        feats, xx = target_rows(target, codes[idx], labels[idx])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, vl, pl, ag = head_loss(head, target, feats, xx, a.noise, a.p_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(head.parameters(), 0.5)
        opt.step()
        step += 1
        dt = time.time() - t0
        tuner.after_step(dt)
        hist.append([loss.item(), vl.item(), pl.item(), ag.mean().item()])
        if step % 25 == 0:
            h = np.mean(hist, axis=0)
            hist = []
            log(f"step {step}/{a.steps} loss {h[0]:.4f} smoothl1 {h[1]:.4f} ce {h[2]:.4f} "
                f"top1-agree {h[3]:.3f} lr {lr_at(step):.2e} {dt:.2f}s/step nt={tuner.nt}")
        if step % a.eval_every == 0 or step == a.steps:
            vl_, pl_, agc, agu = evaluate()
            log(f"eval step {step}: smoothl1 {vl_:.4f} ce {pl_:.4f} top1 agreement with target "
                f"cond {agc:.3f} uncond {agu:.3f}")
        if time.time() - last_ck > a.ckpt_minutes * 60 or step == a.steps:
            elapsed = time.time() - t_start
            common.atomic_torch_save({"model": head.state_dict(), "opt": opt.state_dict(),
                                      "step": step, "elapsed": elapsed, "args": vars(a),
                                      "cpu": time.process_time() - cpu0}, ck_path)
            last_ck = time.time()

    elapsed = time.time() - t_start
    cpu = time.process_time() - cpu0
    vl_, pl_, agc, agu = evaluate()
    c = target.cfg
    meta = {
        "vspec.kind": "eagle-llamagen",
        "target": os.path.basename(a.target),
        "architecture": "EAGLE-1 head as LANTERN models/drafters/cnets_llamagen.py: "
                        "fc(concat(E[token], feature)) -> 1 Llama decoder layer without input "
                        "RMSNorm -> predicted feature (no final norm); logits = target output",
        "dim": c["dim"], "n_head": c["n_head"], "head_dim": c["dim"] // c["n_head"],
        "n_layer": "1", "intermediate_size": target.hidden, "hidden_act": "silu",
        "norm_eps": "1e-06", "rope_base": c["rope_base"], "rope": "llamagen-2d-interleaved",
        "block_size": c["block_size"], "cls_token_num": c["cls_token_num"] - 1,
        "target_cls_token_num": c["cls_token_num"],
        "rope_rows_beyond_table": "zero rotation (cos=sin=0), as LANTERN's zero padding",
        "fc_input_order": "[token_embedding(D), feature(D)]", "fc_bias": "true",
        "qkvo_bias": "false", "mlp_bias": "false",
        "first_layer_input_norm": "none", "final_norm": "none",
        "embed_tokens": "target tok_embeddings.weight (not stored here)",
        "lm_head": "target output.weight (not stored here)",
        "feature": "target final RMSNorm output norm(h) = lm_head input, per sequence position",
        "position_convention": "drafter row p embeds the image token at target position p+1 "
                               "(image token p for cls_token_num 1) and receives feature f_p "
                               "of target position p; it predicts f_{p+1}, whose logits draft "
                               "the token at target position p+2; RoPE row p of the drafter "
                               "table (grid row p//8, col p%8)",
        "cfg": "run cond and uncond rows, each with its own row's features; combine drafter "
               "logits u + s*(c-u) like the target",
        "train_steps": step, "train_batch_sequences": a.bs, "train_rows": "cond+uncond",
        "train_time_s": int(elapsed), "loss": "SmoothL1(feature) + 0.1*CE(target softmax)",
        "feature_noise": f"uniform U(-{a.noise / 2}, {a.noise / 2})",
        "test_smoothl1": f"{vl_:.5f}", "test_ce": f"{pl_:.5f}",
        "test_top1_agreement_cond": f"{agc:.4f}", "test_top1_agreement_uncond": f"{agu:.4f}",
        "params": count_params(head)}
    common.export_state(a.out, head.state_dict(), meta, fp16=True)
    st, _ = common.load_state(a.out)
    h16 = make_head(target)
    h16.load_state_dict(st, strict=True)
    head.load_state_dict(st)
    vl16, pl16, agc16, agu16 = evaluate()
    log(f"final: smoothl1 {vl_:.4f} ce {pl_:.4f} agree cond {agc:.3f} uncond {agu:.3f}; "
        f"fp16 export agree cond {agc16:.3f} uncond {agu16:.3f}")
    common.write_json(os.path.join(a.work, "result.json"), {
        "params": count_params(head), "steps": step, "batch": a.bs, "train_time_s": elapsed, "cpu_time_s": cpu,
        "test_smoothl1": vl_, "test_ce": pl_, "agree_cond": agc, "agree_uncond": agu,
        "agree_cond_fp16": agc16, "agree_uncond_fp16": agu16, "args": vars(a)})
    log(f"done in {common.fmt_time(elapsed)} -> {a.out}")


if __name__ == "__main__":
    main()
