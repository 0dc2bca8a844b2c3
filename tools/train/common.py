"""Shared helpers for the Fashion-MNIST model family (tools/train/).

Data: Debian's dataset-fashion-mnist IDX files. Pixels follow the project decision:
28x28 grey -> pad 2 px each side with background 0 -> 32x32 -> x/127.5 - 1 in [-1, 1]
-> replicated to 3 channels for the VQ tokenizer (decoded images go back to grey by the
channel mean). The classifier sees the 1-channel padded image in [-1, 1].
"""

import gzip
import json
import os
import struct
import sys
import time


def _has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def setup_env():
    """Must run before numpy/torch load libblas.so.3 (BLIS picks its kernels at load time;
    numpy loads it too), so common.py calls it on import, before importing numpy.

    Debian's torch and numpy use the system libblas.so.3; on this machine that is BLIS
    (openmp), whose runtime detection falls back to the slow 'generic' kernels on this AMD
    CPU: forcing the 'skx' (AVX-512) sub-configuration is ~4x faster per thread.
    OPENBLAS_CORETYPE does the same if the alternative points to OpenBLAS. Training-only;
    never used by tests."""
    if _has_avx512():
        os.environ.setdefault("BLIS_ARCH_TYPE", "skx")
        os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    # BLIS GEMMs run single-threaded: BLIS fixes its thread count at load time, and with 2
    # OpenMP threads a GEMM slowed down ~2.5x whenever another process held one of the two
    # shared cores. VSPEC_TRAIN_THREADS=1 (a stage running beside another stage) also pins
    # torch to one thread; otherwise ThreadTuner picks 1 or 2 torch threads at run time.
    os.environ.setdefault("BLIS_NUM_THREADS", "1")


setup_env()

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import safetensors_io  # noqa: E402  (tools/safetensors_io.py)

DATA_DIR = "/usr/share/datasets/fashion-mnist"
WORK = os.path.join(HERE, "work")
MODELS = os.path.join(ROOT, "models", "fmnist")
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def setup_torch(threads=2):
    setup_env()
    import torch
    torch.set_num_threads(threads)
    return torch


class ThreadTuner:
    """The 2 cores are shared: when another process occupies one core, 2 OpenMP threads can
    be several times slower than 1 (barrier waits on the starved thread). At step 6, every
    `period_s` seconds and after a sudden slow step, try the other thread count for `trial`
    steps and keep whichever is faster."""

    def __init__(self, torch, period_s=120.0, trial=4, log=None, choices=(1, 2)):
        self.torch, self.period_s, self.trial, self.log = torch, period_s, trial, log
        if os.environ.get("VSPEC_TRAIN_THREADS", "auto") == "1":
            choices = (1,)
        self.choices = choices
        self.base_period_s, self.max_period_s = period_s, 8 * period_s
        self.nt = choices[0]
        torch.set_num_threads(self.nt)
        self.recent = []
        self.trial_left = 0
        self.trial_times = []
        self.n = 0

    def before_step(self):
        self.n += 1
        now = time.time()
        if not hasattr(self, "last_trial_t"):
            self.last_trial_t = now
        slow = (len(self.recent) >= 4 and self.n - getattr(self, "last_trial", 0) > 2 * self.trial
                and self.recent[-1] > 2.5 * sorted(self.recent)[len(self.recent) // 2])
        due = self.n == 6 or now - self.last_trial_t > self.period_s
        if (len(self.choices) > 1 and self.trial_left == 0 and len(self.recent) >= 3
                and (due or slow)):
            self.last_trial = self.n
            self.last_trial_t = now
            self.trial_left = self.trial
            self.trial_times = []
            other = [c for c in self.choices if c != self.nt][0]
            self.torch.set_num_threads(other)

    def after_step(self, dt):
        if self.trial_left > 0:
            self.trial_times.append(dt)
            self.trial_left -= 1
            t_cur = sorted(self.recent)[len(self.recent) // 2]
            if self.trial_left > 0 and dt > 3 * t_cur:   # clearly worse: stop early
                self.trial_left = 0
                self.torch.set_num_threads(self.nt)
                self.period_s = min(self.period_s * 2, self.max_period_s)
                return
            if self.trial_left == 0:
                other = self.torch.get_num_threads()
                tt = self.trial_times[1:] or self.trial_times
                t_other = sorted(tt)[len(tt) // 2]
                if t_other < 0.9 * t_cur:
                    if self.log:
                        self.log(f"threads {self.nt} -> {other} ({t_cur:.2f}s -> {t_other:.2f}s/step)")
                    self.nt = other
                    self.recent = list(tt)
                    self.period_s = self.base_period_s
                else:
                    if self.log and self.n < 20:
                        self.log(f"threads: keeping {self.nt} ({t_cur:.2f}s vs {t_other:.2f}s/step)")
                    self.torch.set_num_threads(self.nt)
                    self.period_s = min(self.period_s * 2, self.max_period_s)
            return
        self.recent = (self.recent + [dt])[-8:]


def load_idx(path):
    """Read an IDX file (big-endian u32 magic, u32 dims, then uint8 data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic = struct.unpack(">I", raw[:4])[0]
    if magic >> 8 != 0x08:  # 0x0000_08_nd: unsigned byte data
        raise ValueError(f"{path}: unsupported IDX magic {magic:#x}")
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(dims).copy()


def load_fmnist(split):
    """split 'train' (60k) or 'test' (10k) -> (images uint8 [N,28,28], labels int64 [N])."""
    prefix = {"train": "train", "test": "t10k"}[split]
    images = load_idx(os.path.join(DATA_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(DATA_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    return images, labels.astype(np.int64)


def pad32(images):
    """uint8 [N,28,28] -> uint8 [N,32,32], 2 px of background (0) on every side."""
    return np.pad(images, ((0, 0), (2, 2), (2, 2)), mode="constant", constant_values=0)


def to_unit(images32):
    """uint8 [N,32,32] -> float32 [N,1,32,32] in [-1, 1]."""
    return (images32.astype(np.float32) / 127.5 - 1.0)[:, None]


def to_rgb(images32):
    """uint8 [N,32,32] -> float32 [N,3,32,32] in [-1, 1] (grey replicated)."""
    return np.repeat(to_unit(images32), 3, axis=1)


def rgb_to_grey(x):
    """Decoded [N,3,H,W] in [-1,1] -> grey [N,1,H,W] (channel mean, clamped to [-1,1])."""
    return x.mean(axis=1, keepdims=True).clip(-1, 1) if isinstance(x, np.ndarray) \
        else x.mean(dim=1, keepdim=True).clamp(-1, 1)


def save_grid(path, grey, nrow=10, scale=3):
    """grey [N,1,H,W] (numpy or torch) in [-1,1] -> PNG grid (LlamaGen's byte rule)."""
    from PIL import Image
    g = grey.detach().cpu().numpy() if hasattr(grey, "detach") else np.asarray(grey)
    n, _, h, w = g.shape
    ncol = nrow
    nr = (n + ncol - 1) // ncol
    canvas = np.full((nr * (h + 2) + 2, ncol * (w + 2) + 2), 128, np.uint8)
    b = np.clip((np.clip(g[:, 0], -1, 1) + 1) / 2 * 255 + 0.5, 0, 255).astype(np.uint8)
    for i in range(n):
        r, c = divmod(i, ncol)
        canvas[2 + r * (h + 2):2 + r * (h + 2) + h, 2 + c * (w + 2):2 + c * (w + 2) + w] = b[i]
    img = Image.fromarray(canvas, "L")
    if scale != 1:
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    img.save(path)


# ---- optimisation ------------------------------------------------------------------------

def adamw(decay, no_decay, lr, wd):
    """AdamW as every trainer here uses it: weight decay on `decay` only, betas (0.9, 0.95)."""
    import torch
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def warmup_cosine(step, lr, warmup, steps):
    """Linear warmup over `warmup` steps, then cosine to 5 % of the peak at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * t)))


# ---- checkpoints / logging ---------------------------------------------------------------

def epoch_batch(n, bs, step, seed):
    """Indices of training step `step`'s batch: epoch e is a permutation of range(n) seeded
    by seed * 1000 + e, cut into n // bs batches. A function of the step alone, so a run
    resumed from a checkpoint sees the same batches as an uninterrupted one."""
    ep, k = divmod(step, n // bs)
    perm = np.random.default_rng(seed * 1000 + ep).permutation(n)
    return perm[k * bs:(k + 1) * bs]


def atomic_torch_save(obj, path):
    import torch
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_ckpt(path):
    import torch
    if os.path.exists(path):
        return torch.load(path, map_location="cpu")
    return None


class Logger:
    def __init__(self, path=None):
        self.f = None
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.f = open(path, "a", buffering=1)

    def __call__(self, *args):
        msg = time.strftime("%H:%M:%S ") + " ".join(str(a) for a in args)
        print(msg, flush=True)
        if self.f:
            self.f.write(msg + "\n")


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path, default=None):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


# ---- safetensors export ------------------------------------------------------------------

def export_state(path, state, metadata, fp16=True, keep_fp32=()):
    """Write a state dict as safetensors. Floating tensors become F16 (unless fp16=False or the
    name matches an entry of keep_fp32 as a substring); metadata values are strings."""
    out = {}
    for name, t in state.items():
        a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        if a.dtype in (np.float32, np.float64):
            if fp16 and not any(k in name for k in keep_fp32):
                if np.abs(a).max(initial=0) > 65000:
                    raise ValueError(f"{name}: out of fp16 range")
                a = a.astype(np.float16)
            else:
                a = a.astype(np.float32)
        out[name] = np.ascontiguousarray(a)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    safetensors_io.save(path, out, {k: str(v) for k, v in metadata.items()})


def load_state(path):
    """safetensors -> (dict of float32 torch tensors, metadata)."""
    import torch
    tensors, meta = safetensors_io.load(path)
    return {k: torch.from_numpy(np.asarray(v, dtype=np.float32) if v.dtype != np.int64 else v)
            for k, v in tensors.items()}, meta


def fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{(s % 3600) // 60:02d}m{s % 60:02d}s"


# ---- FID in the classifier's 128-d feature space ----------------------------------------

def feature_stats(feats):
    """feats [N, D] -> (mean F64 [D], covariance F64 [D, D]); covariance uses N-1 like
    numpy.cov / pytorch-fid."""
    f = np.asarray(feats, dtype=np.float64)
    return f.mean(axis=0), np.cov(f, rowvar=False)


def fid_from_stats(mu1, s1, mu2, s2):
    """Frechet distance ||mu1-mu2||^2 + tr(s1 + s2 - 2 (s1 s2)^{1/2}); the trace of the
    matrix square root is computed as sum sqrt(eig(r s2 r)) with r = s1^{1/2} (symmetric),
    which is exact for PSD matrices and needs no scipy."""
    d = mu1 - mu2
    w, v = np.linalg.eigh(s1)
    r = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    m = r @ s2 @ r
    ev = np.linalg.eigvalsh((m + m.T) / 2)
    return float(d @ d + np.trace(s1) + np.trace(s2) - 2 * np.sqrt(np.clip(ev, 0, None)).sum())
