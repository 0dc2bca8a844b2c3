#!/usr/bin/python3
"""Sanity metrics for the model card (the C benchmark computes the official numbers).

* rFID: VQ reconstructions of the test set vs the test statistics (tokenizer floor), and a
  real-data floor: N random test images vs the test statistics (FID is biased upwards for
  small N, so compare sample FIDs with the floor at the same N).
* cfg sweep: N target samples (N/10 per class, temperature 1, top_k 0, top_p 1) per cfg
  scale -> classifier accuracy (predicted class == requested class) and FID vs the test set.
  The best FID picks defaults.cfg_scale in models/fmnist/vspec-model.json.
* Draft GPT samples at that cfg.
* Speculative-decoding proxies on target samples at that cfg: mean per-position
  sum_v min(p_target, p_draft) (the acceptance probability of one drafted token at T=1), for
  the draft GPT (teacher-forced on the target's own samples) and for the EAGLE head (one step
  from the target's features), both with CFG applied to cond/uncond drafter rows.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

torch = common.setup_torch()
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sampling  # noqa: E402
from models import FoldedClassifier  # noqa: E402
from tokenize_codes import load_vq  # noqa: E402
from train_eagle import load_gpt, make_head  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default=common.MODELS)
    p.add_argument("--n", type=int, default=1000, help="samples per setting (multiple of 10)")
    p.add_argument("--cfgs", default="1.0,1.5,2.0,2.5,3.0,4.0")
    p.add_argument("--bs", type=int, default=250)
    p.add_argument("--work", default=os.path.join(common.WORK, "eval"))
    p.add_argument("--tokens", default=os.path.join(common.WORK, "tokens"))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class Metrics:
    def __init__(self, models_dir):
        st, _ = common.load_state(os.path.join(models_dir, "classifier.safetensors"))
        self.cls = FoldedClassifier(st)
        ref, _ = common.safetensors_io.load(os.path.join(models_dir, "fid_ref.safetensors"))
        self.mu, self.sigma = ref["test.mu"], ref["test.sigma"]

    @torch.no_grad()
    def __call__(self, grey, labels=None):
        logits, feats = self.cls(grey)
        out = {"fid": float("nan")}
        if len(feats) >= 2:
            mu, s = common.feature_stats(feats.numpy())
            out["fid"] = common.fid_from_stats(mu, s, self.mu, self.sigma)
        if labels is not None:
            out["acc"] = (logits.argmax(1) == labels).float().mean().item()
        return out


@torch.no_grad()
def decode(vq, codes, bs=250):
    out = []
    for i in range(0, len(codes), bs):
        out.append(common.rgb_to_grey(vq.decode_code(codes[i:i + bs], 8)))
    return torch.cat(out)


@torch.no_grad()
def sample_codes(gpt, labels, cfg, bs, gen):
    out = []
    for i in range(0, len(labels), bs):
        out.append(sampling.generate(gpt, labels[i:i + bs], cfg_scale=cfg, generator=gen))
    return torch.cat(out)


@torch.no_grad()
def cfg_probs(logits, b, s):
    lg = sampling.cfg_combine(logits, b, s) if s > 1.0 else logits[:b]
    return F.softmax(lg.float(), dim=-1)


@torch.no_grad()
def acceptance(target, draft, head, codes, labels, s, bs=100):
    """Mean sum_v min(q, p) per position for the draft GPT and the EAGLE head (1 step)."""
    acc_d, acc_e = [], []
    for i in range(0, len(codes), bs):
        x, c = codes[i:i + bs], labels[i:i + bs]
        b = len(x)
        cc = torch.cat([c, torch.full_like(c, target.num_classes)])
        xx = torch.cat([x, x])
        f = target.features(cc, xx[:, :-1])                      # [2b, 64, D]
        q = cfg_probs(target.output(f).float(), b, s)            # [b, 64, V]
        pd = cfg_probs(draft(cc, xx[:, :-1]), b, s)
        acc_d.append(torch.minimum(q, pd).sum(-1).mean(0))       # [64]
        t = target.cls_token_num
        emb = target.tok_embeddings(xx[:, t - 1:t - 1 + 63])
        fe = head(emb, f[:, :63])
        pe = cfg_probs(target.output(fe).float(), b, s)          # predicts positions 1..63
        acc_e.append(torch.minimum(q[:, 1:], pe).sum(-1).mean(0))  # [63]
    return torch.stack(acc_d).mean(0), torch.stack(acc_e).mean(0)


def main():
    a = parse()
    os.makedirs(a.work, exist_ok=True)
    log = common.Logger(os.path.join(a.work, "eval.log"))
    t0 = time.time()
    metrics = Metrics(a.models)
    vq, _ = load_vq(os.path.join(a.models, "vq.safetensors"))
    target, _ = load_gpt(os.path.join(a.models, "target.safetensors"))
    draft, _ = load_gpt(os.path.join(a.models, "draft.safetensors"))
    head = make_head(target)
    st, _ = common.load_state(os.path.join(a.models, "eagle.safetensors"))
    head.load_state_dict(st, strict=True)
    head.eval()
    res = {"n": a.n}

    te, te_lab = common.load_fmnist("test")
    te_grey = torch.from_numpy(common.to_unit(common.pad32(te)))
    sub = torch.from_numpy(np.random.default_rng(a.seed).permutation(len(te))[:a.n])
    res["real_test_subset"] = metrics(te_grey[sub], torch.from_numpy(te_lab)[sub])
    tok = np.load(os.path.join(a.tokens, "test.npz"))
    rec = decode(vq, torch.from_numpy(tok["codes"].astype(np.int64)))
    tlab = torch.from_numpy(tok["labels"])
    rsub = sub[sub < len(rec)]
    res["vq_recon_test_full"] = metrics(rec, tlab)
    res["vq_recon_test_subset"] = metrics(rec[rsub], tlab[rsub])
    res["vq_recon_mse_grey"] = float(((rec - te_grey[:len(rec)]) ** 2).mean())
    log(f"real test subset (n={a.n}): {res['real_test_subset']}")
    log(f"VQ recon full test: {res['vq_recon_test_full']}, subset: {res['vq_recon_test_subset']}, "
        f"MSE {res['vq_recon_mse_grey']:.5f}")

    labels = torch.arange(10).repeat_interleave(a.n // 10)
    gen = torch.Generator().manual_seed(a.seed)
    sweep = {}
    best = None
    for s in [float(v) for v in a.cfgs.split(",")]:
        t1 = time.time()
        codes = sample_codes(target, labels, s, a.bs, gen)
        grey = decode(vq, codes)
        m = metrics(grey, labels)
        m["seconds"] = time.time() - t1
        sweep[str(s)] = m
        log(f"target cfg {s}: FID {m['fid']:.3f} acc {m['acc']:.4f} ({m['seconds']:.0f}s)")
        pick = torch.cat([torch.arange(10) * (a.n // 10) + j for j in range(min(10, a.n // 10))])
        common.save_grid(os.path.join(a.work, f"target_cfg{s}.png"), grey[pick], nrow=10)
        if best is None or m["fid"] < sweep[str(best)]["fid"]:
            best = s
    res["target_cfg_sweep"] = sweep
    res["best_cfg"] = best
    log(f"best cfg by FID: {best}")

    codes = sample_codes(target, labels, best, a.bs, gen)
    grey = decode(vq, codes)
    pick = torch.cat([torch.arange(10) * (a.n // 10) + j for j in range(min(10, a.n // 10))])
    common.save_grid(os.path.join(a.models, "samples_target.png"), grey[pick], nrow=10, scale=2)
    dcodes = sample_codes(draft, labels, best, a.bs, gen)
    dgrey = decode(vq, dcodes)
    res["draft_at_best_cfg"] = metrics(dgrey, labels)
    log(f"draft cfg {best}: {res['draft_at_best_cfg']}")
    common.save_grid(os.path.join(a.work, f"draft_cfg{best}.png"), dgrey[pick], nrow=10)
    common.save_grid(os.path.join(a.models, "samples_draft.png"), dgrey[pick], nrow=10, scale=2)

    for s in sorted({1.0, best}):
        ad, ae = acceptance(target, draft, head, codes[:500], labels[:500], s)
        res[f"accept_cfg{s}"] = {"draft_gpt_mean": float(ad.mean()),
                                 "eagle_1step_mean": float(ae.mean()),
                                 "draft_gpt_per_row": [round(float(v), 4) for v in ad[::8]],
                                 "eagle_per_row": [round(float(v), 4) for v in ae[7::8]]}
        log(f"acceptance proxy at cfg {s} (on target samples drawn at cfg {best}): "
            f"draft GPT {ad.mean():.4f}, EAGLE 1-step {ae.mean():.4f}")
    res["seconds"] = time.time() - t0
    common.write_json(os.path.join(a.work, "results.json"), res)
    spec = {"name": "fmnist",
            "target": {"backend": "llamagen", "gpt": "target.safetensors", "vq": "vq.safetensors"},
            # int8 draft weights where the CPU multiplies them on AMX (docs/DESIGN.md)
            "draft": {"backend": "llamagen", "gpt": "draft.safetensors",
                      "weight_format": "int8"},
            "eagle": {"backend": "eagle", "weights": "eagle.safetensors",
                      "target": "target.safetensors"},
            "class_names": common.CLASSES,
            "classifier": "classifier.safetensors", "fid_ref": "fid_ref.safetensors",
            "defaults": {"cfg_scale": best, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                         "cfg_interval": -1}}
    with open(os.path.join(a.models, "vspec-model.json"), "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    log(f"done in {common.fmt_time(res['seconds'])}")


if __name__ == "__main__":
    main()
