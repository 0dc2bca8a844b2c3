#!/usr/bin/python3
"""Tokenize Fashion-MNIST with the exported VQ (models/fmnist/vq.safetensors).

(Named tokenize_codes.py, not tokenize.py: a tokenize.py next to the training scripts would
shadow Python's stdlib `tokenize` module, which torch imports through inspect/linecache.)

Writes tools/train/work/tokens/{train,test}.npz:
  train: codes uint16 [60000, 2, 64] (original, horizontally flipped), labels int64 [60000]
  test:  codes uint16 [10000, 64], labels int64 [10000]
Codes are raster order over the 8x8 grid, as LlamaGen's extract_codes_c2i.py.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

torch = common.setup_torch()
import numpy as np  # noqa: E402

from models import VQModel  # noqa: E402


def load_vq(path):
    st, meta = common.load_state(path)
    model = VQModel(ch=int(meta["ch"]), z_channels=int(meta["z_channels"]),
                    codebook_size=int(meta["codebook_size"]),
                    codebook_embed_dim=int(meta["codebook_embed_dim"]))
    model.load_state_dict(st, strict=True)
    model.eval()
    return model, meta


@torch.no_grad()
def encode_all(model, images32, log, bs=500, tag=""):
    out = np.zeros((len(images32), 64), np.uint16)
    t0 = time.time()
    for i in range(0, len(images32), bs):
        x = torch.from_numpy(common.to_rgb(images32[i:i + bs]))
        _, _, idx = model.encode(x)
        out[i:i + bs] = idx.numpy().astype(np.uint16)
        if (i // bs) % 20 == 0:
            log(f"{tag} {i + bs}/{len(images32)} ({time.time() - t0:.0f}s)")
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vq", default=os.path.join(common.MODELS, "vq.safetensors"))
    p.add_argument("--out", default=os.path.join(common.WORK, "tokens"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = common.Logger(os.path.join(args.out, "tokenize.log"))
    model, _ = load_vq(args.vq)
    te, te_lab = common.load_fmnist("test")
    test_path = os.path.join(args.out, "test.npz")
    if not os.path.exists(test_path):
        codes = encode_all(model, common.pad32(te), log, tag="test")
        np.savez(test_path + ".tmp.npz", codes=codes, labels=te_lab)
        os.replace(test_path + ".tmp.npz", test_path)
    tr, tr_lab = common.load_fmnist("train")
    tr32 = common.pad32(tr)
    train_path = os.path.join(args.out, "train.npz")
    part = os.path.join(args.out, "train_part_{}.npy")
    for k, imgs in enumerate([tr32, tr32[:, :, ::-1].copy()]):
        if not os.path.exists(part.format(k)):
            codes = encode_all(model, imgs, log, tag=f"train[{'orig' if k == 0 else 'flip'}]")
            np.save(part.format(k) + ".tmp.npy", codes)
            os.replace(part.format(k) + ".tmp.npy", part.format(k))
    codes = np.stack([np.load(part.format(0)), np.load(part.format(1))], axis=1)
    np.savez(train_path + ".tmp.npz", codes=codes, labels=tr_lab)
    os.replace(train_path + ".tmp.npz", train_path)
    used = len(np.unique(codes))
    log(f"done: train codes {codes.shape}, distinct codes used {used}/1024")


if __name__ == "__main__":
    main()
