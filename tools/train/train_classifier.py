#!/usr/bin/python3
"""Train the metrics classifier (small CNN) on Fashion-MNIST and export
models/fmnist/classifier.safetensors, fid_ref.safetensors and classifier_golden.safetensors.

Inference network (BatchNorm folded): 7 x [conv3x3 (stride 1/1/2/1/2/1/1, pad 1, bias) ->
ReLU] -> global average pool -> 128-d feature (FID space) -> linear 128->10.
Input: the padded 32x32 grey image in [-1, 1], shape [B, 1, 32, 32].
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

from models import Classifier, FoldedClassifier, count_params  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--bs", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--work", default=os.path.join(common.WORK, "classifier"))
    p.add_argument("--outdir", default=common.MODELS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit-steps", type=int, default=0, help="debug: steps per epoch")
    return p.parse_args()


@torch.no_grad()
def run(net, x, bs=500):
    logits, feats = [], []
    for i in range(0, len(x), bs):
        l, f = net(x[i:i + bs])
        logits.append(l)
        feats.append(f)
    return torch.cat(logits), torch.cat(feats)


def layer_spec():
    layers = []
    for i, (cin, cout, s) in enumerate(Classifier.SPEC):
        layers.append({"op": "conv2d", "weight": f"conv{i}.weight", "bias": f"conv{i}.bias",
                       "in": cin, "out": cout, "kernel": 3, "stride": s, "padding": 1})
        layers.append({"op": "relu"})
    layers.append({"op": "global_avg_pool", "note": "output = 128-d feature (FID space)"})
    layers.append({"op": "linear", "weight": "fc.weight", "bias": "fc.bias", "in": 128,
                   "out": 10, "note": "output = logits"})
    return layers


def main():
    args = parse()
    os.makedirs(args.work, exist_ok=True)
    log = common.Logger(os.path.join(args.work, "train.log"))
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    tr_img, tr_lab = common.load_fmnist("train")
    te_img, te_lab = common.load_fmnist("test")
    tr32, te32 = common.pad32(tr_img), common.pad32(te_img)
    x_te = torch.from_numpy(common.to_unit(te32))
    y_te = torch.from_numpy(te_lab)

    net = Classifier()
    log(f"classifier params {count_params(net)}")
    steps_per_epoch = args.limit_steps or len(tr32) // args.bs
    total = steps_per_epoch * args.epochs
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=total,
                                                pct_start=0.15)
    ck_path = os.path.join(args.work, "ckpt.pt")
    epoch, elapsed = 0, 0.0
    ck = common.load_ckpt(ck_path)
    if ck is not None:
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sched.load_state_dict(ck["sched"])
        epoch, elapsed = ck["epoch"], ck["elapsed"]
        log(f"resumed after epoch {epoch}")
    tuner = common.ThreadTuner(torch, log=log)
    t_start = time.time() - elapsed
    while epoch < args.epochs:
        rng = np.random.default_rng(args.seed + epoch)
        perm = rng.permutation(len(tr32))
        net.train()
        tl, tc, tn = 0.0, 0, 0
        for s in range(steps_per_epoch):
            tuner.before_step()
            t0 = time.time()
            idx = perm[s * args.bs:(s + 1) * args.bs]
            xb = tr32[idx].copy()
            flip = rng.random(len(idx)) < 0.5
            xb[flip] = xb[flip][:, :, ::-1]
            # random shifts of up to 2 px (the padding is background)
            dx, dy = rng.integers(-2, 3, 2)
            xb = np.roll(xb, (dy, dx), axis=(1, 2))
            x = torch.from_numpy(common.to_unit(xb))
            y = torch.from_numpy(tr_lab[idx])
            logits, _ = net(x)
            loss = F.cross_entropy(logits, y, label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tuner.after_step(time.time() - t0)
            tl += loss.item() * len(idx)
            tc += (logits.argmax(1) == y).sum().item()
            tn += len(idx)
        epoch += 1
        net.eval()
        logits, _ = run(net, x_te)
        acc = (logits.argmax(1) == y_te).float().mean().item()
        elapsed = time.time() - t_start
        log(f"epoch {epoch}/{args.epochs} train loss {tl / tn:.4f} acc {tc / tn:.4f} "
            f"test acc {acc:.4f} ({common.fmt_time(elapsed)})")
        common.atomic_torch_save({"model": net.state_dict(), "opt": opt.state_dict(),
                                  "sched": sched.state_dict(), "epoch": epoch,
                                  "elapsed": elapsed}, ck_path)

    # ---- export (folded) -------------------------------------------------------------
    net.eval()
    folded = {k: v.float() for k, v in net.folded_state().items()}
    fnet = FoldedClassifier(folded)
    lt, ft = run(fnet, x_te)
    acc = (lt.argmax(1) == y_te).float().mean().item()
    l_bn, _ = run(net, x_te)
    log(f"folded test acc {acc:.4f} (max |logit diff| vs BN net "
        f"{(lt - l_bn).abs().max().item():.2e})")
    meta = {"vspec.kind": "classifier-cnn", "input": "[B,1,32,32] float32, padded grey image "
            "x/127.5-1 in [-1,1] (28x28 Fashion-MNIST padded by 2 px of background)",
            "layers": json.dumps(layer_spec()), "feature_dim": "128",
            "feature": "global average pool output after the last ReLU (FID space)",
            "num_classes": "10", "classes": json.dumps(common.CLASSES),
            "test_accuracy": f"{acc:.4f}", "train_epochs": str(args.epochs),
            "train_time_s": str(int(elapsed))}
    os.makedirs(args.outdir, exist_ok=True)
    common.export_state(os.path.join(args.outdir, "classifier.safetensors"), folded, meta,
                        fp16=False)
    # reload what was written, compute everything from the exported weights
    st, _ = common.load_state(os.path.join(args.outdir, "classifier.safetensors"))
    fnet = FoldedClassifier(st)
    lt, ft = run(fnet, x_te)
    x_tr = torch.from_numpy(common.to_unit(tr32))
    ltr, ftr = run(fnet, x_tr)
    acc = (lt.argmax(1) == y_te).float().mean().item()
    acc_tr = (ltr.argmax(1) == torch.from_numpy(tr_lab)).float().mean().item()
    mu_te, s_te = common.feature_stats(ft.numpy())
    mu_tr, s_tr = common.feature_stats(ftr.numpy())
    fid_tt = common.fid_from_stats(mu_tr, s_tr, mu_te, s_te)
    # FID of 5000 random test images vs the full test / train stats (sample-size reference)
    sub = np.random.default_rng(1).permutation(len(ft))[:5000]
    m5, s5 = common.feature_stats(ft.numpy()[sub])
    fid5_te = common.fid_from_stats(m5, s5, mu_te, s_te)
    fid5_tr = common.fid_from_stats(m5, s5, mu_tr, s_tr)
    log(f"exported: test acc {acc:.4f}, train acc {acc_tr:.4f}, FID(train, test) {fid_tt:.4f}, "
        f"FID(5k test subset, test) {fid5_te:.4f}, FID(5k test subset, train) {fid5_tr:.4f}")
    fmeta = {"vspec.kind": "fid-ref", "feature": "classifier.safetensors 128-d GAP feature",
             "covariance": "unbiased (N-1)", "test.n": "10000", "train.n": "60000",
             "fid_train_vs_test": f"{fid_tt:.6f}", "fid_test5k_vs_test": f"{fid5_te:.6f}",
             "fid_test5k_vs_train": f"{fid5_tr:.6f}"}
    common.safetensors_io.save(os.path.join(args.outdir, "fid_ref.safetensors"),
                               {"test.mu": mu_te, "test.sigma": s_te,
                                "train.mu": mu_tr, "train.sigma": s_tr}, fmeta)
    common.safetensors_io.save(
        os.path.join(args.outdir, "classifier_golden.safetensors"),
        {"images": x_te[:16].numpy().astype(np.float32),
         "features": ft[:16].numpy().astype(np.float32),
         "logits": lt[:16].numpy().astype(np.float32),
         "labels": te_lab[:16].astype(np.int64)},
        {"vspec.kind": "classifier-golden", "source": "first 16 Fashion-MNIST test images",
         "computed_with": "classifier.safetensors weights (float32, torch conv2d)"})
    common.write_json(os.path.join(args.work, "result.json"),
                      {"test_acc": acc, "train_acc": acc_tr, "fid_train_vs_test": fid_tt,
                       "fid_test5k_vs_test": fid5_te, "fid_test5k_vs_train": fid5_tr,
                       "params": count_params(net), "epochs": args.epochs,
                       "train_time_s": elapsed})
    log("done")


if __name__ == "__main__":
    main()
