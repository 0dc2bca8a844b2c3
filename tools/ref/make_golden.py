#!/usr/bin/python3
"""Regenerate tests/golden/** for vspec's C tests (run from anywhere):

    /usr/bin/python3 tools/ref/make_golden.py            # writes tests/golden/
    /usr/bin/python3 tools/ref/make_golden.py --check    # recompute, compare with committed

For each micro model: random weights (fixed seeds) -> original-format LlamaGen checkpoint
({"model": state_dict}) in a temp dir -> tools/convert_llamagen.py -> committed .safetensors ->
reloaded into tools/ref/llamagen_ref.py, cast to float64 -> golden outputs stored as float32
(ints I32, pixels U8). The .pt files are not kept. Also runs the reference self-checks and
tools/ref/test_convert.py on the temp checkpoints.

Semantics: LlamaGen autoregressive/models/gpt.py (GPT), autoregressive/models/generate.py
(sampling) and tokenizer/tokenizer_image/vq_model.py (VQ), as restated in llamagen_ref.py.
"""

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)
import convert_llamagen  # noqa: E402
import llamagen_ref as R  # noqa: E402
import safetensors_io as st  # noqa: E402
import test_convert  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "golden")
# Optional cross-check: a directory of key lists of the real checkpoints ("name shape" per
# line, e.g. from a state dict dump of LlamaGen's GPT-B, GPT-XL t2i and VQ-16); unset: skipped.
KEYS_DIR = os.environ.get("VSPEC_REF_KEYS", "")

# ---- micro configurations (tiny models on the released models' code paths) --------------
C2I_CFG = R.GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16, num_classes=10,
                      class_dropout_prob=0.1, cls_token_num=1, multiple_of=32, model_type="c2i")
T2I_CFG = R.GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16, caption_dim=16,
                      cls_token_num=120, multiple_of=32, model_type="t2i")
HD100_CFG = R.GPTConfig(dim=200, n_layer=1, n_head=2, vocab_size=64, block_size=16,
                        num_classes=10, cls_token_num=1, multiple_of=32, model_type="c2i")
VQ_KW = dict(ch=32, ch_mult=[1, 2], z_channels=32, codebook_size=64, codebook_embed_dim=8,
             num_res_blocks=2)
GRID = 4

GREEDY_MIN_MARGIN = 1e-3     # top-1 minus top-2 logit at every greedy step
PIXEL_MIN_MARGIN = 2e-3      # distance (in byte units) of x*255+0.5 from an integer
TOL_EXACT = 1e-9             # float64 cross-checks
WEIGHTS_DTYPE = "f32"        # storage dtype of the committed model files (--weights-dtype)
SAMPLE_SCALE = 0.35          # sampleN.logits = SAMPLE_SCALE * cfg.logits (+ ties)


# ---- helpers ------------------------------------------------------------------------------

def f32(x):
    return np.ascontiguousarray(x.detach().to(torch.float64).numpy().astype(np.float32))


def i32(x):
    return np.ascontiguousarray(torch.as_tensor(x).numpy().astype(np.int32))


def maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


def init_gpt(model: R.GPT, seed: int):
    """Random weights with O(1) activations and logits. Unlike LlamaGen's init, `output` is not
    zero (that would make every logit 0) and the RMSNorm weights are not all ones."""
    g = torch.Generator().manual_seed(seed)
    d = model.cfg.dim
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name == "output.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (0.6 / d ** 0.5))
            elif name.endswith("embedding_table.weight") or name == "tok_embeddings.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("uncond_embedding"):
                p.copy_(torch.randn(p.shape, generator=g))
            else:                                    # nn.Linear [out, in]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def init_vq(model: R.VQModel, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("codebook_used"):
                p.zero_()
            elif name == "quantize.embedding.weight":
                # deliberately NOT unit rows: the engine must L2-normalise at lookup, as
                # VectorQuantizer.get_codebook_entry does
                scale = 0.3 + 2.0 * torch.rand(p.shape[0], 1, generator=g)
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif p.dim() == 1 and (".norm" in name):          # GroupNorm affine
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:                                 # conv bias
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:                                              # conv weight [out, in, kh, kw]
                fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                gain = 0.6 if name == "decoder.conv_out.weight" else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * gain / fan_in ** 0.5)


def round_weights_(model, dtype=None):
    """Round weights through the storage dtype so the in-memory seed searches see exactly the
    values the committed file will hold (no-op for f32)."""
    tdt = {"f32": torch.float32, "f16": torch.float16,
           "bf16": torch.bfloat16}[dtype or WEIGHTS_DTYPE]
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.copy_(t.to(tdt).to(t.dtype))
    return model


def pixel_margin(img):
    """Smallest distance (in byte units) of x*255+0.5 from an integer, x = (clamp(img)+1)/2."""
    v = ((img.clamp(-1, 1) + 1) / 2) * 255 + 0.5
    frac = v - v.floor()
    return torch.minimum(frac, 1 - frac).min().item()


def save_checkpoint(model, path):
    """Original LlamaGen layout: {"model": state_dict, ...} (as train_c2i.py saves it)."""
    torch.save({"model": model.state_dict(), "steps": 0}, path)


def convert(pt, out, *flags, dtype=None):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    convert_llamagen.main([pt, out, "--verify", "--dtype", dtype or WEIGHTS_DTYPE, *flags])


def load_gpt(path):
    tensors, meta = st.load(path)
    cfg = R.gpt_config_from_metadata(meta)
    model = R.GPT(cfg)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},
                          strict=True)
    return model.double().eval(), cfg


def load_vq(path):
    tensors, meta = st.load(path)
    model = R.VQModel(**R.vq_kwargs_from_metadata(meta), show_usage=False)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()},
                          strict=True)
    return model.double().eval()


def same_cfg(a: R.GPTConfig, b: R.GPTConfig):
    keys = ["dim", "n_layer", "n_head", "kv_heads", "multiple_of", "ffn_dim_multiplier",
            "rope_base", "norm_eps", "vocab_size", "cls_token_num", "block_size", "model_type",
            "class_dropout_prob"]
    keys += ["num_classes"] if a.model_type == "c2i" else ["caption_dim"]
    for k in keys:
        assert getattr(a, k) == getattr(b, k), (k, getattr(a, k), getattr(b, k))


# ---- GPT goldens --------------------------------------------------------------------------

def run_prefill_decode(model, cond, tokens, emb_mask=None):
    """CFG batch [cond ; uncond]; returns prefill (logits, feats) [2, V/d] and per-token
    decode logits/feats [n, 2, V/d], plus the cache and mask for further use."""
    T = model.cfg.cls_token_num
    cond_all = torch.cat([cond, model.null_cond(cond)])
    em = None if emb_mask is None else torch.cat([emb_mask, emb_mask])   # cond mask twice (generate)
    cache = model.new_cache(2)
    mask = R.llamagen_mask(2, cache.length, T, em)
    lg, ft = model.prefill(cache, cond_all, mask)
    pre = (lg[:, -1], ft[:, -1])
    dl, df = [], []
    for i, t in enumerate(tokens.tolist()):
        lg, ft = model.decode(cache, torch.tensor([t, t]), T + i, mask)
        dl.append(lg[:, 0])
        df.append(ft[:, 0])
    dec = (torch.stack(dl) if dl else None, torch.stack(df) if df else None)
    return pre, dec, cache, mask, cond_all, em


def check_against_causal(model, cond_all, em, tokens, pre, dec, what):
    """Full-sequence causal forward (no cache) must equal prefill + cached decode."""
    T = model.cfg.cls_token_num
    ids = tokens.view(1, -1).repeat(2, 1)
    lg, ft = model.causal_forward(cond_all, ids, em)
    d1 = maxdiff(lg[:, T - 1], pre[0])
    d2 = maxdiff(ft[:, T - 1], pre[1])
    d3 = maxdiff(lg[:, T:].transpose(0, 1), dec[0]) if len(tokens) else 0.0
    d4 = maxdiff(ft[:, T:].transpose(0, 1), dec[1]) if len(tokens) else 0.0
    worst = max(d1, d2, d3, d4)
    assert worst < 1e-12, f"{what}: causal vs cached differ by {worst}"
    return worst


def greedy_margins(trace):
    m = float("inf")
    for lg in trace:
        top2 = torch.topk(lg, 2, dim=-1).values
        m = min(m, (top2[..., 0] - top2[..., 1]).min().item())
    return m


def tree_depths(parents):
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def ancestors_or_self(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]                                  # root .. i


def tree_goldens(model, cond_all, dec_tokens, prefix, tree_tokens, parents, commit, after_tok):
    T = model.cfg.cls_token_num
    P = T + prefix                                   # committed sequence length = first tree slot
    cache = model.new_cache(2)
    causal = R.llamagen_mask(2, cache.length, T)
    model.prefill(cache, cond_all, causal)
    for i in range(prefix):
        t = int(dec_tokens[i])
        model.decode(cache, torch.tensor([t, t]), T + i, causal)

    n = len(tree_tokens)
    depth = tree_depths(parents)
    positions = torch.tensor([P + d for d in depth])         # RoPE/sequence positions
    slots = torch.arange(P, P + n)                           # cache slots of the tree nodes
    assert P + n <= cache.length
    tmask = torch.zeros(2, n, cache.length, dtype=torch.bool)
    tmask[:, :, :P] = True                                   # committed prefix
    for i in range(n):
        for a in ancestors_or_self(parents, i):
            tmask[:, i, P + a] = True                        # ancestors and itself
    h = model.embed_tokens(torch.tensor(tree_tokens).view(1, -1).repeat(2, 1))
    tl, tf = model.forward(h, positions, tmask, cache, slots)   # [2, n, V]
    tree_l, tree_f = tl.transpose(0, 1), tf.transpose(0, 1)       # [n, 2, V]

    # cross-check: every node == causal run of its root-to-node path from scratch
    worst = 0.0
    for i in range(n):
        path = [int(t) for t in dec_tokens[:prefix]] + [tree_tokens[a] for a in
                                                        ancestors_or_self(parents, i)]
        ids = torch.tensor(path).view(1, -1).repeat(2, 1)
        cl, cf = model.causal_forward(cond_all, ids)
        worst = max(worst, maxdiff(cl[:, -1], tree_l[i]), maxdiff(cf[:, -1], tree_f[i]))
    assert worst < TOL_EXACT, f"tree vs causal path: {worst}"

    # commit: the accepted chain must be a root-to-leaf path
    assert parents[commit[0]] == -1 and all(parents[commit[j]] == commit[j - 1]
                                            for j in range(1, len(commit)))
    # compact accepted K/V into consecutive slots, then feed one more token causally
    cache.copy_slots([P + c for c in commit], list(range(P, P + len(commit))))
    pos = P + len(commit)
    al, af = model.decode(cache, torch.tensor([after_tok, after_tok]), pos, causal)
    path = [int(t) for t in dec_tokens[:prefix]] + [tree_tokens[c] for c in commit] + [after_tok]
    cl, cf = model.causal_forward(cond_all, torch.tensor(path).view(1, -1).repeat(2, 1))
    w2 = max(maxdiff(cl[:, -1], al[:, 0]), maxdiff(cf[:, -1], af[:, 0]))
    assert w2 < TOL_EXACT, f"after-commit vs causal: {w2}"
    return tree_l, tree_f, al[:, 0].unsqueeze(0), af[:, 0].unsqueeze(0), max(worst, w2)


def make_tie(logits, k, n_tied):
    """Copy of logits where the n_tied values ranked k-1 .. k+n_tied-2 (0-based) all equal the
    k-th largest, so top-k with threshold = k-th largest keeps k + n_tied - 1 tokens."""
    out = logits.clone()
    order = torch.argsort(out, descending=True)
    for j in range(1, n_tied):
        out[order[k - 1 + j]] = out[order[k - 1]]
    return out


def check_sample_case(l32, temperature, top_k, top_p):
    """Returns probs (float64) and asserts the case is robust for an fp32 implementation."""
    l = l32.double()
    _, probs = R.sample(l.view(1, -1), temperature, top_k, top_p, sample_logits=False)
    probs = probs[0]
    scaled = l / max(temperature, 1e-5)
    filt = R.top_k_top_p_filter(scaled.view(1, -1), top_k, top_p)[0]
    kept = torch.isfinite(filt)
    # no group of equal logits may be split (torch.sort order among ties is unspecified)
    for v in scaled.unique():
        grp = scaled == v
        assert kept[grp].all() or (~kept[grp]).all(), "tie group split by filtering"
    if top_k > 0:
        vals = scaled.unique().sort(descending=True).values
        thr = torch.topk(scaled, top_k).values[-1]
        below = vals[vals < thr]
        if len(below):
            assert (thr - below[0]).item() > 1e-4, "top-k threshold too close to next value"
    if top_p < 1.0:
        kf = R.top_k_top_p_filter(scaled.view(1, -1), top_k, 1.0)[0]
        s = torch.softmax(kf.sort(descending=True).values, dim=-1).cumsum(0)
        assert (s - top_p).abs().min().item() > 1e-4, "top-p cumsum too close to top_p"
    return probs, int(kept.sum())


def gpt_c2i_goldens(tmp, seed_base=1000):
    cfg = C2I_CFG
    cls, scale = 3, 4.0
    # search a seed whose greedy runs have a safe top-1/top-2 margin at every step
    for seed in range(seed_base, seed_base + 200):
        m = R.GPT(cfg)
        init_gpt(m, seed)
        round_weights_(m)
        md = R.GPT(cfg)
        md.load_state_dict(m.state_dict())
        md = md.double().eval()
        margins = []
        for interval in (-1, 3):
            tr = []
            R.generate(md, torch.tensor([cls]), cfg_scale=scale, cfg_interval=interval,
                       sample_logits=False, trace=tr)
            margins.append(greedy_margins(tr))
        if min(margins) > GREEDY_MIN_MARGIN:
            break
    else:
        raise RuntimeError("no seed with a safe greedy margin")
    pt = os.path.join(tmp, "micro_c2i_gpt.pt")
    save_checkpoint(m, pt)
    out_dir = os.path.join(GOLDEN, "micro_c2i")
    gpt_path = os.path.join(out_dir, "gpt.safetensors")
    convert(pt, gpt_path, "--n-head", "4", "--grid", "4", "--multiple-of", "32")
    model, cfg2 = load_gpt(gpt_path)
    same_cfg(cfg, cfg2)

    g = torch.Generator().manual_seed(seed + 7)
    V = cfg.vocab_size
    dec_tokens = torch.randint(0, V, (5,), generator=g)
    tree_tokens = torch.randint(0, V, (7,), generator=g).tolist()
    after_tok = int(torch.randint(0, V, (1,), generator=g))
    parents = [-1, 0, 0, 1, 1, 2, 3]
    commit = [0, 1, 3]
    prefix = 2

    cond = torch.tensor([cls])
    pre, dec, _, _, cond_all, em = run_prefill_decode(model, cond, dec_tokens)
    w_causal = check_against_causal(model, cond_all, em, dec_tokens, pre, dec, "micro_c2i")
    tree_l, tree_f, al, af, w_tree = tree_goldens(model, cond_all, dec_tokens, prefix,
                                                  tree_tokens, parents, commit, after_tok)
    cfg_logits = R.cfg_combine(pre[0], scale)[0]

    out = {
        "cond.class": i32([cls]), "cfg.scale": np.array([scale], np.float32),
        "prefill.logits": f32(pre[0]), "prefill.features": f32(pre[1]),
        "decode.tokens": i32(dec_tokens), "decode.logits": f32(dec[0]),
        "decode.features": f32(dec[1]),
        "tree.prefix": i32([prefix]), "tree.tokens": i32(tree_tokens),
        "tree.parents": i32(parents), "tree.logits": f32(tree_l), "tree.features": f32(tree_f),
        "commit.path": i32(commit), "after.token": i32([after_tok]),
        "after.logits": f32(al), "after.features": f32(af),
        "cfg.logits": f32(cfg_logits),
    }

    # sampling cases: inputs stored explicitly as sampleN.logits (float32); probs computed from
    # exactly those float32 values
    # cfg.logits at scale 4 are so peaked that top-p keeps a single token, so the sampling
    # inputs are SAMPLE_SCALE * cfg.logits (float32), with ties inserted at the top-k border
    base = torch.from_numpy(out["cfg.logits"]).double() * SAMPLE_SCALE
    cases = [("sample", (0.7, 10, 0.8), make_tie(base, 10, 2)),
             ("sample2", (1.0, 0, 0.5), base.clone()),
             ("sample3", (1.3, 5, 1.0), make_tie(base, 5, 3))]
    kept_counts = {}
    for name, (temp, k, p), logits in cases:
        l32 = torch.from_numpy(logits.numpy().astype(np.float32))
        probs, kept = check_sample_case(l32, temp, k, p)
        kept_counts[name] = kept
        out[f"{name}.params"] = np.array([temp, k, p], np.float32)
        out[f"{name}.logits"] = l32.numpy()
        out[f"{name}.probs"] = f32(probs)
    assert kept_counts["sample3"] == 7, kept_counts     # 5 + 2 extra tied tokens kept
    assert min(kept_counts.values()) >= 3, kept_counts   # non-degenerate distributions

    # greedy generation (argmax), cfg_interval -1 and 3
    runs = {}
    for name, interval in (("greedy", -1), ("greedy_interval", 3)):
        tr = []
        toks = R.generate(model, cond, cfg_scale=scale, cfg_interval=interval,
                          sample_logits=False, trace=tr)[0]
        runs[name] = (toks, greedy_margins(tr))
        out[f"{name}.tokens"] = i32(toks)
    min_margin = min(r[1] for r in runs.values())
    assert min_margin > GREEDY_MIN_MARGIN
    out["greedy.min_margin"] = np.array([min_margin], np.float32)
    assert int(runs["greedy"][0][0]) == int(torch.argmax(cfg_logits))

    info = dict(seed=seed, causal_vs_cached=w_causal, tree_vs_causal=w_tree,
                min_margin=min_margin, kept=kept_counts,
                greedy=runs["greedy"][0].tolist(),
                greedy_interval=runs["greedy_interval"][0].tolist())
    return out, info, pt


def vq_goldens(tmp, codes, seed_base=2000):
    for seed in range(seed_base, seed_base + 200):
        m = R.VQModel(**VQ_KW)
        init_vq(m, seed)
        round_weights_(m, "bf16")
        md = R.VQModel(**VQ_KW)
        md.load_state_dict(m.state_dict())
        md = md.double().eval()
        with torch.no_grad():
            img = md.decode_code(codes.view(1, -1), (GRID, GRID))[0]
        if pixel_margin(img) > PIXEL_MIN_MARGIN:
            break
    else:
        raise RuntimeError("no VQ seed with a safe pixel rounding margin")
    pt = os.path.join(tmp, "micro_vq.pt")
    save_checkpoint(m, pt)
    path = os.path.join(GOLDEN, "micro_c2i", "vq.safetensors")
    # bf16 storage: the C loader's bf16 -> f32 path runs on real goldens.
    convert(pt, path, "--ch-mult", "[1,2]", "--image-size", str(GRID * 2), dtype="bf16")
    model = load_vq(path)
    with torch.no_grad():
        img = model.decode_code(codes.view(1, -1), (GRID, GRID))[0]
    assert tuple(img.shape) == (3, 2 * GRID, 2 * GRID), img.shape
    margin = pixel_margin(img)
    assert margin > PIXEL_MIN_MARGIN, margin
    px = R.to_pixels(img)
    out = {"vq.codes": i32(codes), "vq.image": f32(img), "vq.pixels": px.numpy(),
           "vq.pixel_margin": np.array([margin], np.float32)}
    frac_clamped = (img.abs() > 1).double().mean().item()
    return out, dict(seed=seed, pixel_margin=margin, clamped_fraction=frac_clamped,
                     img_min=img.min().item(), img_max=img.max().item()), pt


def gpt_t2i_goldens(tmp, seed=3000):
    cfg = T2I_CFG
    m = R.GPT(cfg)
    init_gpt(m, seed)
    round_weights_(m)
    pt = os.path.join(tmp, "micro_t2i_gpt.pt")
    save_checkpoint(m, pt)
    path = os.path.join(GOLDEN, "micro_t2i", "gpt.safetensors")
    convert(pt, path, "--n-head", "4", "--grid", "4", "--multiple-of", "32")
    model, cfg2 = load_gpt(path)
    same_cfg(cfg, cfg2)

    g = torch.Generator().manual_seed(seed + 1)
    T, C, L = cfg.cls_token_num, cfg.caption_dim, 7
    caption = torch.zeros(1, T, C, dtype=torch.float64)
    # left padding as sample_t2i.py: the L valid features in the last L slots, pad slots zero
    caption[0, T - L:] = torch.randn(L, C, generator=g).float().double()
    mask = torch.zeros(1, T, dtype=torch.uint8)
    mask[0, T - L:] = 1
    scale = 7.5
    dec_tokens = torch.randint(0, cfg.vocab_size, (3,), generator=g)
    pre, dec, _, _, cond_all, em = run_prefill_decode(model, caption, dec_tokens, mask)
    w = check_against_causal(model, cond_all, em, dec_tokens, pre, dec, "micro_t2i")
    # the uncond half really is uncond_embedding through cap_proj
    assert torch.equal(cond_all[1], model.cls_embedding.uncond_embedding)
    out = {
        "cond.caption": f32(caption[0]), "cond.mask": mask[0].numpy().astype(np.uint8),
        "cfg.scale": np.array([scale], np.float32),
        "prefill.logits": f32(pre[0]), "prefill.features": f32(pre[1]),
        "decode.tokens": i32(dec_tokens), "decode.logits": f32(dec[0]),
        "decode.features": f32(dec[1]),
        "cfg.logits": f32(R.cfg_combine(pre[0], scale)[0]),
    }
    return out, dict(seed=seed, causal_vs_cached=w), pt


def gpt_hd100_goldens(tmp, seed=4000):
    cfg = HD100_CFG
    assert cfg.head_dim == 100 and cfg.head_dim // 4 == 25
    m = R.GPT(cfg)
    init_gpt(m, seed)
    round_weights_(m, "f16")
    pt = os.path.join(tmp, "micro_hd100_gpt.pt")
    save_checkpoint(m, pt)
    path = os.path.join(GOLDEN, "micro_hd100", "gpt.safetensors")
    # f16 storage: the C loader's f16 -> f32 path runs on real goldens.
    convert(pt, path, "--n-head", "2", "--grid", "4", "--multiple-of", "32", dtype="f16")
    model, cfg2 = load_gpt(path)
    same_cfg(cfg, cfg2)
    g = torch.Generator().manual_seed(seed + 1)
    cls = 5
    dec_tokens = torch.randint(0, cfg.vocab_size, (3,), generator=g)
    pre, dec, _, _, cond_all, em = run_prefill_decode(model, torch.tensor([cls]), dec_tokens)
    w = check_against_causal(model, cond_all, em, dec_tokens, pre, dec, "micro_hd100")
    out = {
        "cond.class": i32([cls]),
        "prefill.logits": f32(pre[0]), "prefill.features": f32(pre[1]),
        "decode.tokens": i32(dec_tokens), "decode.logits": f32(dec[0]),
        "decode.features": f32(dec[1]),
    }
    return out, dict(seed=seed, causal_vs_cached=w), pt


# ---- reference self-checks ----------------------------------------------------------------

def _read_key_file(path):
    shapes = {}
    for line in open(path):
        if " (" not in line:
            continue
        name, rest = line.split(" (", 1)
        dims = rest.split(")")[0]
        shapes[name] = tuple(int(x) for x in dims.split(",") if x.strip())
    return shapes


def self_checks():
    res = {}
    # RoPE example: hd=16, G=3, T=1; position 2 = token 1 = (row 0, col 1) rotates only pairs
    # 4..7, position 4 = token 3 = (row 1, col 0) rotates only pairs 0..3; row 0 is all zeros.
    tab = R.rope_table_2d(3, 16, 10000.0, 1, torch.float64)
    ident = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert tab.shape == (10, 8, 2) and torch.all(tab[0] == 0)
    assert torch.all(tab[2, :4] == ident) and not torch.all(tab[2, 4:] == ident)
    assert torch.all(tab[4, 4:] == ident) and not torch.all(tab[4, :4] == ident)
    assert abs(tab[2, 4, 0].item() - np.cos(1.0)) < 1e-15          # theta_0 = 1, col 1
    assert abs(tab[4, 1, 1].item() - np.sin(10000 ** (-0.25))) < 1e-15   # theta_1, row 1
    # interleaved pairs
    x = torch.arange(16, dtype=torch.float64).view(1, 1, 1, 16)
    y = R.apply_rope(x, tab[2:3])
    c, s = np.cos(1.0), np.sin(1.0)
    assert abs(y[0, 0, 0, 8].item() - (8 * c - 9 * s)) < 1e-12
    assert abs(y[0, 0, 0, 9].item() - (9 * c + 8 * s)) < 1e-12
    assert torch.all(R.apply_rope(x, tab[0:1]) == 0)                 # condition rows zero q/k

    # FFN rule (gpt.py FeedForward) and the presets' parameter counts (meta device: no memory)
    assert [R.ffn_hidden_dim(d, 256) for d in (768, 1024, 1280)] == [2048, 2816, 3584]
    assert R.ffn_hidden_dim(64, 32) == 192 and R.ffn_hidden_dim(400, 32) == 1088
    b = R.GPT(R.GPTConfig(), device="meta")
    nb = sum(p.numel() for p in b.parameters())
    assert nb == R.gpt_param_count(b.cfg) == 110_888_448, nb
    xl = R.GPT(R.GPTConfig(dim=1280, n_layer=36, n_head=20, model_type="t2i",
                           cls_token_num=120), device="meta")
    nxl = sum(p.numel() for p in xl.parameters())
    nbuf = sum(t.numel() for t in xl.buffers())
    assert nxl == R.gpt_param_count(xl.cfg) == 777_678_080 and nbuf == 245_760, (nxl, nbuf)
    lg = R.GPT(R.GPTConfig(dim=1024, n_layer=24, n_head=16, block_size=576), device="meta")
    assert sum(p.numel() for p in lg.parameters()) == 342_910_976
    vq16 = R.VQModel(device="meta")
    n16 = sum(t.numel() for t in vq16.state_dict().values())
    assert n16 == 71_948_939, n16
    res["param_counts"] = dict(gpt_b=nb, gpt_xl_t2i=nxl, gpt_xl_buffer=nbuf, vq16_numel=n16)

    # key lists against key-list files in KEYS_DIR (when available)
    checked = []
    for fname, mod in (("llamagen_gpt_b_c2i.txt", b), ("llamagen_gpt_xl_t2i.txt", xl),
                       ("llamagen_vq16.txt", vq16)):
        path = os.path.join(KEYS_DIR, fname)
        if KEYS_DIR and os.path.exists(path):
            want = _read_key_file(path)
            got = {k: tuple(v.shape) for k, v in mod.state_dict().items()}
            assert want == got, f"key list differs from {fname}"
            checked.append(fname)
    res["key_files_checked"] = checked

    # VQ shapes: VQ-16 (ch 128) decodes a 1x1 grid to 16x16; micro VQ round trip 8x8 -> 4x4
    with torch.no_grad():
        torch.manual_seed(0)
        v = R.VQModel().eval()
        out = v.decode_code(torch.tensor([[5]]), (1, 1))
        assert tuple(out.shape) == (1, 3, 16, 16), out.shape
        mv = R.VQModel(**VQ_KW).eval()
        codes, zq = mv.encode(torch.rand(2, 3, 8, 8) * 2 - 1)
        assert tuple(codes.shape) == (2, 16) and tuple(zq.shape) == (2, 8, 4, 4)
        assert tuple(mv.decode(zq).shape) == (2, 3, 8, 8)
    res["vq_shapes"] = "ok"

    # GQA path (no released model uses it; LlamaGen's own KV cache cannot run it): Hkv=2
    # equals MHA with K/V heads repeated
    torch.manual_seed(1)
    cg = R.GPTConfig(dim=64, n_layer=1, n_head=4, n_kv_head=2, vocab_size=32, block_size=16,
                     num_classes=4, multiple_of=32)
    mg = R.GPT(cg).double()
    cm = R.GPTConfig(**{**cg.__dict__, "n_kv_head": None})
    mm = R.GPT(cm).double()
    sd = mg.state_dict()
    w = sd["layers.0.attention.wqkv.weight"]
    q, k, vv = w[:64], w[64:96].view(2, 16, 64), w[96:].view(2, 16, 64)
    sd = dict(sd)
    sd["layers.0.attention.wqkv.weight"] = torch.cat(
        [q, k.repeat_interleave(2, 0).reshape(64, 64), vv.repeat_interleave(2, 0).reshape(64, 64)])
    mm.load_state_dict(sd)
    toks = torch.randint(0, 32, (1, 6))
    a = mg.causal_forward(torch.tensor([1]), toks)[0]
    bb = mm.causal_forward(torch.tensor([1]), toks)[0]
    assert maxdiff(a, bb) < 1e-12
    res["gqa"] = "ok"
    return res


# ---- main ---------------------------------------------------------------------------------

def write(path, tensors):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    st.save(path, tensors, {"generator": "tools/ref/make_golden.py",
                            "precision": "computed in float64, stored as float32"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temp copy and compare with the committed files")
    ap.add_argument("--weights-dtype", choices=["f32", "f16", "bf16"], default="f32",
                    help="storage dtype of the committed model files (default f32); goldens "
                         "are always computed in float64 from the stored values")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir with the .pt files")
    args = ap.parse_args()
    torch.set_grad_enabled(False)

    global GOLDEN, WEIGHTS_DTYPE
    WEIGHTS_DTYPE = args.weights_dtype
    committed = GOLDEN
    if args.check:
        GOLDEN = tempfile.mkdtemp(prefix="golden_check_")
    tmp = tempfile.mkdtemp(prefix="vspec_golden_")
    try:
        print("self-checks:", self_checks())
        c2i, info, c2i_pt = gpt_c2i_goldens(tmp)
        print("micro_c2i:", info)
        vq, vinfo, vq_pt = vq_goldens(tmp, torch.from_numpy(c2i["greedy.tokens"]).long())
        print("micro_c2i vq:", vinfo)
        c2i.update(vq)
        write(os.path.join(GOLDEN, "micro_c2i", "golden.safetensors"), c2i)
        t2i, tinfo, t2i_pt = gpt_t2i_goldens(tmp)
        print("micro_t2i:", tinfo)
        write(os.path.join(GOLDEN, "micro_t2i", "golden.safetensors"), t2i)
        hd, hinfo, _ = gpt_hd100_goldens(tmp)
        print("micro_hd100:", hinfo)
        write(os.path.join(GOLDEN, "micro_hd100", "golden.safetensors"), hd)

        test_convert.run_all(tmp, c2i_pt, t2i_pt, vq_pt)
        print("test_convert: ok")

        if args.check:
            bad = []
            for sub in ("micro_c2i", "micro_t2i", "micro_hd100"):
                for f in sorted(os.listdir(os.path.join(GOLDEN, sub))):
                    a = open(os.path.join(GOLDEN, sub, f), "rb").read()
                    b = open(os.path.join(committed, sub, f), "rb").read()
                    if a != b:
                        bad.append(f"{sub}/{f}")
            print("check:", "identical" if not bad else f"DIFFER: {bad}")
            if bad:
                return 1
        else:
            total = 0
            for dirpath, _, files in os.walk(GOLDEN):
                for f in files:
                    if f.endswith(".safetensors"):
                        total += os.path.getsize(os.path.join(dirpath, f))
            print(f"wrote {GOLDEN} ({total / 1e6:.2f} MB of safetensors)")
    finally:
        if args.keep_tmp:
            print("temp dir kept:", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if args.check:
            shutil.rmtree(GOLDEN, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
