"""Python sampling that follows LlamaGen's generate()/sample() (autoregressive/models/generate.py):
CFG batch [cond ; uncond], null class = num_classes, logits = u + s (c - u), top-k then top-p,
KV cache. Used for quick sample grids and the cfg sweep; the C engine computes the official
numbers."""

import torch
import torch.nn.functional as F


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    logits = logits / max(temperature, 1e-5)
    if top_k > 0:
        k = min(max(top_k, 1), logits.size(-1))
        thr = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < thr, float("-inf"))
    if top_p < 1.0:
        sl, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.cumsum(F.softmax(sl, dim=-1), dim=-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits = logits.scatter(-1, order, sl.masked_fill(remove, float("-inf")))
    return logits


def cfg_combine(logits, b, scale):
    return logits[b:] + scale * (logits[:b] - logits[b:])


@torch.no_grad()
def generate(model, labels, cfg_scale=1.0, temperature=1.0, top_k=0, top_p=1.0,
             cfg_interval=-1, generator=None, greedy=False):
    """labels [B] -> codes [B, N] (raster order)."""
    b = labels.shape[0]
    n = model.cfg["block_size"]
    t = model.cls_token_num
    use_cfg = cfg_scale > 1.0
    cond = torch.cat([labels, torch.full_like(labels, model.num_classes)]) if use_cfg else labels
    caches = [dict() for _ in model.layers]
    h = model.features(cond, None, start=0, caches=caches)
    logits = model.output(h[:, -1]).float()
    if use_cfg:
        logits = cfg_combine(logits, b, cfg_scale)

    def pick(lg):
        if greedy:
            return lg.argmax(-1)
        p = F.softmax(filter_logits(lg, temperature, top_k, top_p), dim=-1)
        return torch.multinomial(p, 1, generator=generator)[:, 0]

    tok = pick(logits)
    out = [tok]
    for i in range(n - 1):
        x = tok[:, None]
        if use_cfg:
            x = torch.cat([x, x])
        h = model.features(None, x, start=t + i, caches=caches)
        logits = model.output(h[:, -1]).float()
        if use_cfg:
            if not (cfg_interval > -1 and i > cfg_interval):
                logits = cfg_combine(logits, b, cfg_scale)
            else:
                logits = logits[:b]
        tok = pick(logits)
        out.append(tok)
    return torch.stack(out, dim=1)
