"""Small, readable PyTorch reference of LlamaGen (GPT + VQ tokenizer) for vspec.

Written from a reading of LlamaGen's autoregressive/models/gpt.py, generate.py and
tokenizer/tokenizer_image/vq_model.py (the upstream class or function is named below), not
copied from them. State-dict key names and shapes are exactly those of the released
checkpoints (gpt.py Transformer, vq_model.py VQModel), so `load_state_dict` accepts an
original checkpoint's "model" dict.

Runs on Debian's torch 1.13 (CPU); no F.scaled_dot_product_attention (torch >= 2.0), the
attention is written out by hand. Every module can be cast to float64 with `.double()`; the
"computed in fp32" steps of LlamaGen (RMSNorm, RoPE) are computed in *at least* fp32, so a
float64 model stays float64 end to end (that is how the golden data are produced).

Contents
  GPTConfig, ffn_hidden_dim, rope_table_2d, apply_rope
  GPT                 c2i / t2i transformer; generic masked forward with explicit positions,
                      KV cache slots and boolean masks (tree attention), causal helpers
  KVCache
  llamagen_mask       LlamaGen's causal mask incl. the t2i caption mask + forced diagonal
  top_k_top_p_filter, sample, generate
  VQModel             Encoder, Decoder, VectorQuantizer, decode_code, to_pixels
"""

import math
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def find_multiple(n: int, k: int) -> int:
    """Round n up to a multiple of k (gpt.py find_multiple: FFN rule, cache length)."""
    return n if n % k == 0 else n + k - (n % k)


def _calc_dtype(x: torch.Tensor) -> torch.dtype:
    # LlamaGen computes RMSNorm and RoPE in fp32 (gpt.py RMSNorm, apply_rotary_emb). We use
    # "at least fp32" so that a float64 model (golden data) is not degraded to fp32 in these
    # two places.
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


# ============================================================================================
# GPT
# ============================================================================================

@dataclass
class GPTConfig:
    """Hyper-parameters of LlamaGen's ModelArgs (gpt.py) that matter for inference."""
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: Optional[int] = None
    multiple_of: int = 256
    ffn_dim_multiplier: Optional[float] = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def grid(self) -> int:
        g = int(round(math.sqrt(self.block_size)))
        assert g * g == self.block_size, "block_size must be a square (G*G)"
        return g

    @property
    def seq_len(self) -> int:
        """T + N: condition tokens plus image tokens (generate.py)."""
        return self.cls_token_num + self.block_size


# Presets (gpt.py GPT_models): name -> (n_layer, n_head, dim)
GPT_PRESETS = {
    "GPT-B": (12, 12, 768), "GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536), "GPT-XXXL": (48, 40, 2560), "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200), "GPT-7B": (32, 32, 4096),
}


def ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: Optional[float] = None) -> int:
    """SwiGLU hidden size F (gpt.py FeedForward): int(2*4d/3), optional multiplier, round UP
    to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return find_multiple(hidden, multiple_of)


def gpt_param_count(cfg: GPTConfig) -> int:
    """Parameter count, per layer 4d^2 + 3dF + 2d (MHA; the t2i uncond buffer is NOT included)."""
    d, F_ = cfg.dim, ffn_hidden_dim(cfg.dim, cfg.multiple_of, cfg.ffn_dim_multiplier)
    per_layer = 4 * d * d + 3 * d * F_ + 2 * d
    if cfg.model_type == "c2i":
        cond = (cfg.num_classes + (1 if cfg.class_dropout_prob > 0 else 0)) * d
    else:
        cond = cfg.caption_dim * d + d * d
    return cond + 2 * cfg.vocab_size * d + cfg.n_layer * per_layer + d


def rope_table_2d(grid: int, head_dim: int, base: float, cls_token_num: int,
                  dtype=torch.float32) -> torch.Tensor:
    """LlamaGen's 2-D RoPE table (gpt.py precompute_freqs_cis_2d): [T + G*G, head_dim/2, 2]
    holding (cos, sin).

    Pair j < hd/4 rotates by row*theta_j, pair j >= hd/4 by col*theta_(j-hd/4),
    theta_k = base^(-2k/(hd/2)). The T condition rows are (0, 0) -- NOT identity: this zeroes
    the q and k of every condition token, exactly as the released models were trained.
    """
    assert head_dim % 4 == 0, "2-D RoPE needs head_dim divisible by 4"
    half = head_dim // 2
    k_per_axis = half // 2
    # theta computed like the reference (fp32 when dtype is fp32; float64 for golden data).
    theta = 1.0 / (base ** (torch.arange(0, half, 2, dtype=dtype)[:k_per_axis] / half))
    idx = torch.arange(grid, dtype=dtype)
    rows = idx[:, None].expand(grid, grid)          # [r][c] -> r
    cols = idx[None, :].expand(grid, grid)          # [r][c] -> c
    angle = torch.cat([rows[..., None] * theta, cols[..., None] * theta], dim=-1)  # [G,G,half]
    grid_tab = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1)
    grid_tab = grid_tab.reshape(grid * grid, half, 2)        # raster order r*G + c
    cond_tab = torch.zeros(cls_token_num, half, 2, dtype=dtype)
    return torch.cat([cond_tab, grid_tab], dim=0)


def apply_rope(x: torch.Tensor, tab: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2j], x[2j+1]) (gpt.py apply_rotary_emb; gpt-fast
    layout, not rotate_half).

    x: [B, L, H, hd]; tab: [B, L, hd/2, 2] or [L, hd/2, 2] (cos, sin) per position.
    """
    cd = _calc_dtype(x)
    xs = x.to(cd).reshape(*x.shape[:-1], -1, 2)
    if tab.dim() == 3:
        tab = tab.unsqueeze(0)
    tab = tab.to(cd).unsqueeze(2)                    # [B, L, 1, hd/2, 2]
    c, s = tab[..., 0], tab[..., 1]
    x0, x1 = xs[..., 0], xs[..., 1]
    out = torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1)
    return out.flatten(-2).to(x.dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w; normalisation in >= fp32, cast back BEFORE * w (gpt.py)."""

    def __init__(self, dim: int, eps: float = 1e-5, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x):
        xf = x.to(_calc_dtype(x))
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


class LabelEmbedder(nn.Module):
    """c2i condition (as gpt.py): table with num_classes (+1 null row when dropout_prob > 0)."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float, device=None):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + (1 if dropout_prob > 0 else 0), dim,
                                            device=device)

    def forward(self, labels):                      # labels [B] -> [B, 1, d]
        return self.embedding_table(labels).unsqueeze(1)


class CaptionMLP(nn.Module):
    """cap_proj: fc1 (no bias) -> tanh-approximate GELU -> fc2 (no bias) (gpt.py MLP)."""

    def __init__(self, in_dim: int, dim: int, device=None):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, dim, bias=False, device=device)
        self.fc2 = nn.Linear(dim, dim, bias=False, device=device)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i condition (gpt.py CaptionEmbedder): cap_proj over [B, 120, caption_dim] features.

    uncond_embedding is a *buffer* [120, caption_dim] holding the raw (pre-cap_proj) features
    of the unconditional branch; 120 is hard-wired in LlamaGen (CaptionEmbedder's token_num,
    which Transformer does not pass).
    """

    def __init__(self, caption_dim: int, dim: int, token_num: int = 120, device=None):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim, device=device)
        self.register_buffer("uncond_embedding", torch.zeros(token_num, caption_dim, device=device))

    def forward(self, caption):                     # [B, T, C] -> [B, T, d]
        return self.cap_proj(caption)


class KVCache:
    """Per-layer K/V storage [B, Hkv, S, hd], zero-initialised (as gpt.py). Slots are explicit, so
    a caller can place tree nodes anywhere and later compact accepted nodes (copy_slots)."""

    def __init__(self, cfg: GPTConfig, batch: int, length: int, dtype=torch.float32):
        shape = (batch, cfg.kv_heads, length, cfg.head_dim)
        self.length = length
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)]

    def copy_slots(self, src: List[int], dst: List[int]):
        src_t, dst_t = torch.tensor(src), torch.tensor(dst)
        for layer in range(len(self.k)):
            self.k[layer][:, :, dst_t] = self.k[layer][:, :, src_t].clone()
            self.v[layer][:, :, dst_t] = self.v[layer][:, :, src_t].clone()


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, device=None):
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        # fused, bias-free; rows [q (H*hd) | k (Hkv*hd) | v (Hkv*hd)], head-major inside (gpt.py)
        self.wqkv = nn.Linear(cfg.dim, (self.n_head + 2 * self.n_kv) * self.hd, bias=False,
                              device=device)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False, device=device)

    def forward(self, x, tab, mask, cache: Optional[KVCache], layer: int, slots):
        """x [B, L, d]; tab [L, hd/2, 2] RoPE rows of the tokens' positions; mask [B, L, Skv]
        bool (True = attend) over the cache slots (or over the L tokens when cache is None)."""
        B, L, _ = x.shape
        q, k, v = self.wqkv(x).split([self.n_head * self.hd, self.n_kv * self.hd,
                                      self.n_kv * self.hd], dim=-1)
        q = apply_rope(q.view(B, L, self.n_head, self.hd), tab).transpose(1, 2)   # [B, H, L, hd]
        k = apply_rope(k.view(B, L, self.n_kv, self.hd), tab).transpose(1, 2)
        v = v.view(B, L, self.n_kv, self.hd).transpose(1, 2)
        if cache is not None:
            cache.k[layer][:, :, slots] = k
            cache.v[layer][:, :, slots] = v
            k, v = cache.k[layer], cache.v[layer]
        # GQA: query head h uses kv head h // (H / Hkv) (repeat_interleave, as Attention.forward)
        rep = self.n_head // self.n_kv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)        # [B, H, L, S]
        scores = scores.masked_fill(~mask[:, None, :, :], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)                       # [B, H, L, hd]
        return self.wo(out.transpose(1, 2).reshape(B, L, self.n_head * self.hd))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), all bias-free (gpt.py FeedForward)."""

    def __init__(self, cfg: GPTConfig, device=None):
        super().__init__()
        hidden = ffn_hidden_dim(cfg.dim, cfg.multiple_of, cfg.ffn_dim_multiplier)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False, device=device)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False, device=device)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False, device=device)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, device=None):
        super().__init__()
        self.attention = Attention(cfg, device=device)
        self.feed_forward = FeedForward(cfg, device=device)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)

    def forward(self, x, tab, mask, cache, layer, slots):
        x = x + self.attention(self.attention_norm(x), tab, mask, cache, layer, slots)
        return x + self.feed_forward(self.ffn_norm(x))


def llamagen_mask(batch: int, size: int, cls_token_num: int = 0,
                  emb_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LlamaGen's [B, S, S] boolean mask (generate.py generate): causal (k <= q); with a t2i
    caption validity mask m [B, T], columns 0..T-1 of every row are multiplied by m[b] and
    then the diagonal is forced true (so a pad slot still sees itself)."""
    mask = torch.tril(torch.ones(size, size, dtype=torch.bool)).unsqueeze(0).repeat(batch, 1, 1)
    if emb_mask is not None:
        T = cls_token_num
        mask[:, :, :T] &= emb_mask.to(torch.bool)[:, None, :T]
        mask |= torch.eye(size, dtype=torch.bool).unsqueeze(0)
    return mask


class GPT(nn.Module):
    """LlamaGen `Transformer` (c2i and t2i) with the original state-dict layout (gpt.py)."""

    def __init__(self, cfg: GPTConfig, device=None):
        super().__init__()
        self.cfg = cfg
        if cfg.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(cfg.num_classes, cfg.dim, cfg.class_dropout_prob,
                                               device=device)
        elif cfg.model_type == "t2i":
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, device=device)
        else:
            raise ValueError(f"model_type must be c2i or t2i, got {cfg.model_type!r}")
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim, device=device)
        self.layers = nn.ModuleList([TransformerBlock(cfg, device=device)
                                     for _ in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, device=device)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False, device=device)

    # ---- pieces ---------------------------------------------------------------------------
    @property
    def dtype(self):
        return self.tok_embeddings.weight.dtype

    def rope(self) -> torch.Tensor:
        c = self.cfg
        tab_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        return rope_table_2d(c.grid, c.head_dim, c.rope_base, c.cls_token_num, tab_dtype)

    def embed_cond(self, cond) -> torch.Tensor:
        """c2i: labels [B] (null class = num_classes, gpt.py); t2i: captions [B, T, C]."""
        return self.cls_embedding(cond)[:, :self.cfg.cls_token_num]

    def embed_tokens(self, ids) -> torch.Tensor:
        return self.tok_embeddings(ids)

    def null_cond(self, cond):
        """Unconditional CFG input (generate.py generate): null class row / uncond_embedding."""
        if self.cfg.model_type == "c2i":
            return torch.full_like(cond, self.cfg.num_classes)
        return torch.zeros_like(cond) + self.cls_embedding.uncond_embedding.to(cond.dtype)

    # ---- generic forward ------------------------------------------------------------------
    def forward(self, h, positions, mask, cache: Optional[KVCache] = None, slots=None):
        """Generic forward over embeddings h [B, L, d].

        positions: [L] sequence positions (they select the RoPE rows, freqs_cis[input_pos]);
        mask: bool [B, L, Skv], True = may attend; Skv = cache.length when a cache is given
              (K/V of the L tokens are written to cache slots `slots`, default = positions),
              else L (attention among the L tokens only).
        Returns (logits [B, L, V] , features [B, L, d]) where features = final RMSNorm output
        (the input of the `output` head, Transformer.forward).
        """
        positions = torch.as_tensor(positions, dtype=torch.long)
        if cache is not None:
            slots = positions if slots is None else torch.as_tensor(slots, dtype=torch.long)
            assert mask.shape[-1] == cache.length
        else:
            assert mask.shape[-1] == h.shape[1]
        tab = self.rope()[positions]
        for i, layer in enumerate(self.layers):
            h = layer(h, tab, mask, cache, i, slots)
        feats = self.norm(h)
        logits = self.output(feats)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()                 # LlamaGen casts logits to fp32
        return logits, feats

    # ---- conveniences ---------------------------------------------------------------------
    def cache_length(self, max_new_tokens: Optional[int] = None) -> int:
        n = self.cfg.block_size if max_new_tokens is None else max_new_tokens
        return find_multiple(self.cfg.cls_token_num + n, 8)       # setup_caches

    def new_cache(self, batch: int, length: Optional[int] = None) -> KVCache:
        return KVCache(self.cfg, batch, length or self.cache_length(), self.dtype)

    def causal_forward(self, cond, tokens=None, emb_mask=None):
        """Whole sequence [cond ; tokens] from scratch, no cache (training-style path)."""
        h = self.embed_cond(cond)
        if tokens is not None and tokens.shape[1] > 0:
            h = torch.cat([h, self.embed_tokens(tokens)], dim=1)
        L = h.shape[1]
        mask = llamagen_mask(h.shape[0], L, self.cfg.cls_token_num, emb_mask)
        return self.forward(h, torch.arange(L), mask)

    def prefill(self, cache: KVCache, cond, full_mask):
        """Condition tokens at positions 0..T-1; full_mask = llamagen_mask(B, cache.length...)."""
        T = self.cfg.cls_token_num
        pos = torch.arange(T)
        return self.forward(self.embed_cond(cond), pos, full_mask[:, pos], cache)

    def decode(self, cache: KVCache, ids, pos: int, full_mask):
        """One image token per row (ids [B]) at sequence position pos."""
        p = torch.tensor([pos])
        return self.forward(self.embed_tokens(ids.view(-1, 1)), p, full_mask[:, p], cache)


# ============================================================================================
# Sampling (autoregressive/models/generate.py)
# ============================================================================================

def top_k_top_p_filter(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Returns a filtered copy (removed entries = -inf), rows = last dim (top_k_top_p_filtering).

    top-k: threshold = k-th largest value; entries strictly below are removed, so ties with the
    threshold are KEPT. top-p (after top-k, on the filtered logits): sort descending, cumulative
    softmax c; remove c > top_p shifted right by one, first always kept -> the token that
    crosses top_p is kept.
    """
    out = logits.clone()
    V = out.shape[-1]
    if top_k > 0:
        k = min(max(top_k, 1), V)
        thr = torch.topk(out, k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < thr, float("-inf"))
    if top_p < 1.0:
        sorted_l, order = torch.sort(out, dim=-1, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_l, dim=-1), dim=-1)
        remove_sorted = cum > top_p
        remove_sorted[..., 1:] = remove_sorted[..., :-1].clone()
        remove_sorted[..., 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        out = out.masked_fill(remove, float("-inf"))
    return out


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           sample_logits: bool = True, generator: Optional[torch.Generator] = None):
    """LlamaGen's sample() on logits [B, V] -> (ids [B], probs [B, V])."""
    l = logits / max(temperature, 1e-5)
    if top_k > 0 or top_p < 1.0:
        l = top_k_top_p_filter(l, top_k, top_p)
    probs = torch.softmax(l, dim=-1)
    if sample_logits:
        ids = torch.multinomial(probs, 1, generator=generator).view(-1)
    else:
        ids = torch.argmax(probs, dim=-1)
    return ids, probs


def cfg_combine(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[cond rows ; uncond rows] -> uncond + scale * (cond - uncond) (prefill, decode_one_token)."""
    cond, uncond = logits.chunk(2, dim=0)
    return uncond + (cond - uncond) * scale


@torch.no_grad()
def generate(model: GPT, cond, max_new_tokens: Optional[int] = None, emb_mask=None,
             cfg_scale: float = 1.0, cfg_interval: int = -1, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, sample_logits: bool = True,
             generator: Optional[torch.Generator] = None, trace: Optional[list] = None):
    """LlamaGen's generate() loop. Returns [B, N] code ids.

    CFG doubles the batch as [cond ; uncond]; both halves are fed the same token; decode step i
    (0-based, i.e. the step that produces token i+1) is guided unless cfg_interval > -1 and
    i > cfg_interval; the prefill is always guided. If `trace` is a list, the logits actually
    sampled from at every step ([B, V]) are appended to it.
    """
    cfgm = model.cfg
    N = cfgm.block_size if max_new_tokens is None else max_new_tokens
    T = cfgm.cls_token_num
    use_cfg = cfg_scale > 1.0
    cond_all = torch.cat([cond, model.null_cond(cond)]) if use_cfg else cond
    B2 = cond_all.shape[0]
    cache = model.new_cache(B2, model.cache_length(N))
    if emb_mask is not None:
        emb_mask = torch.cat([emb_mask, emb_mask]) if use_cfg else emb_mask   # cond mask twice
    mask = llamagen_mask(B2, cache.length, T, emb_mask)

    logits, _ = model.prefill(cache, cond_all, mask)
    logits = logits[:, -1]
    if use_cfg:
        logits = cfg_combine(logits, cfg_scale)
    if trace is not None:
        trace.append(logits.clone())
    tok, _ = sample(logits, temperature, top_k, top_p, sample_logits, generator)
    out = [tok]
    for i in range(N - 1):
        x = torch.cat([tok, tok]) if use_cfg else tok
        logits, _ = model.decode(cache, x, T + i, mask)
        logits = logits[:, -1]
        if use_cfg:
            guided = not (cfg_interval > -1 and i > cfg_interval)
            logits = cfg_combine(logits, cfg_scale) if guided else logits.chunk(2, dim=0)[0]
        if trace is not None:
            trace.append(logits.clone())
        tok, _ = sample(logits, temperature, top_k, top_p, sample_logits, generator)
        out.append(tok)
    return torch.stack(out, dim=1)


# ============================================================================================
# VQ tokenizer (tokenizer/tokenizer_image/vq_model.py)
# ============================================================================================

def _norm(c, device=None):
    return nn.GroupNorm(32, c, eps=1e-6, affine=True, device=device)   # vq_model.py Normalize


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    """h = conv2(swish(norm2(conv1(swish(norm1 x))))); out = x + h, where x goes through the
    1x1 nin_shortcut when Cin != Cout (vq_model.py ResnetBlock)."""

    def __init__(self, cin: int, cout: int, device=None):
        super().__init__()
        self.norm1 = _norm(cin, device)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, device=device)
        self.norm2 = _norm(cout, device)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, device=device)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0, device=device)

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all H*W positions, scale 1/sqrt(C) (as vq_model.py)."""

    def __init__(self, c: int, device=None):
        super().__init__()
        self.norm = _norm(c, device)
        self.q = nn.Conv2d(c, c, 1, device=device)
        self.k = nn.Conv2d(c, c, 1, device=device)
        self.v = nn.Conv2d(c, c, 1, device=device)
        self.proj_out = nn.Conv2d(c, c, 1, device=device)

    def forward(self, x):
        B, C, H, W = x.shape
        n = self.norm(x)
        q = self.q(n).reshape(B, C, H * W)
        k = self.k(n).reshape(B, C, H * W)
        v = self.v(n).reshape(B, C, H * W)
        w = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(C), dim=-1)
        o = torch.einsum("bij,bcj->bci", w, v).reshape(B, C, H, W)
        return x + self.proj_out(o)


class Upsample(nn.Module):
    """Nearest x2 then 3x3 conv (vq_model.py Upsample)."""

    def __init__(self, c: int, device=None):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1, device=device)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    """Zero-pad right/bottom by 1, then 3x3 conv stride 2 padding 0 (vq_model.py Downsample)."""

    def __init__(self, c: int, device=None):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0, device=device)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Encoder(nn.Module):
    """As vq_model.py Encoder: conv_in; levels 0..L-1 with num_res_blocks res blocks (+attn
    at level L-1), Downsample after every level but the last; mid (Res, Attn, Res); GN, swish,
    conv_out."""

    def __init__(self, ch: int = 128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 z_channels: int = 256, in_channels: int = 3, device=None):
        super().__init__()
        L = len(ch_mult)
        self.num_res_blocks = num_res_blocks
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1, device=device)
        self.conv_blocks = nn.ModuleList()
        cin = ch
        for lvl in range(L):
            blk = nn.Module()
            cout = ch * ch_mult[lvl]
            blk.res = nn.ModuleList()
            blk.attn = nn.ModuleList()
            for _ in range(num_res_blocks):
                blk.res.append(ResnetBlock(cin, cout, device))
                cin = cout
                if lvl == L - 1:
                    blk.attn.append(AttnBlock(cout, device))
            if lvl != L - 1:
                blk.downsample = Downsample(cout, device)
            self.conv_blocks.append(blk)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin, device), AttnBlock(cin, device),
                                  ResnetBlock(cin, cin, device)])
        self.norm_out = _norm(cin, device)
        self.conv_out = nn.Conv2d(cin, z_channels, 3, 1, 1, device=device)

    def forward(self, x):
        h = self.conv_in(x)
        for blk in self.conv_blocks:
            for r in range(self.num_res_blocks):
                h = blk.res[r](h)
                if len(blk.attn) > 0:
                    h = blk.attn[r](h)
            if hasattr(blk, "downsample"):
                h = blk.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """As vq_model.py Decoder: conv_in; mid (Res, Attn, Res); stage s = 0..L-1 handles level
    L-1-s with num_res_blocks+1 res blocks, attention after each only in stage 0, nearest
    upsample + conv after every stage but the last; GN, swish, conv_out."""

    def __init__(self, ch: int = 128, ch_mult=(1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 z_channels: int = 256, out_channels: int = 3, device=None):
        super().__init__()
        L = len(ch_mult)
        self.num_res_blocks = num_res_blocks
        cin = ch * ch_mult[L - 1]
        self.conv_in = nn.Conv2d(z_channels, cin, 3, 1, 1, device=device)
        self.mid = nn.ModuleList([ResnetBlock(cin, cin, device), AttnBlock(cin, device),
                                  ResnetBlock(cin, cin, device)])
        self.conv_blocks = nn.ModuleList()
        for s in range(L):
            lvl = L - 1 - s
            blk = nn.Module()
            cout = ch * ch_mult[lvl]
            blk.res = nn.ModuleList()
            blk.attn = nn.ModuleList()
            for _ in range(num_res_blocks + 1):
                blk.res.append(ResnetBlock(cin, cout, device))
                cin = cout
                if s == 0:
                    blk.attn.append(AttnBlock(cout, device))
            if s != L - 1:
                blk.upsample = Upsample(cout, device)
            self.conv_blocks.append(blk)
        self.norm_out = _norm(cin, device)
        self.conv_out = nn.Conv2d(cin, out_channels, 3, 1, 1, device=device)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for blk in self.conv_blocks:
            for r in range(self.num_res_blocks + 1):
                h = blk.res[r](h)
                if len(blk.attn) > 0:
                    h = blk.attn[r](h)
            if hasattr(blk, "upsample"):
                h = blk.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Codebook `embedding` [K, D]; rows are L2-normalised at use time (VectorQuantizer).
    `codebook_used` is a training statistic buffer kept only for key compatibility."""

    def __init__(self, codebook_size: int, embed_dim: int, l2_norm: bool = True,
                 show_usage: bool = True, device=None):
        super().__init__()
        self.l2_norm = l2_norm
        self.embedding = nn.Embedding(codebook_size, embed_dim, device=device)
        if show_usage:
            self.register_buffer("codebook_used", torch.zeros(65536, device=device))

    def codebook(self):
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w   # e / max(||e||, 1e-12)

    def lookup(self, codes, grid_hw):
        """codes [B, H*W] raster order -> z [B, D, H, W]."""
        B = codes.shape[0]
        H, W = grid_hw
        z = self.codebook()[codes.reshape(B, H * W)]                  # [B, HW, D]
        return z.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous()

    def quantize(self, z):
        """z [B, D, H, W] -> (indices [B, H*W], z_q [B, D, H, W]) by nearest (cosine) code."""
        B, D, H, W = z.shape
        zf = z.permute(0, 2, 3, 1).reshape(-1, D)
        e = self.codebook()
        if self.l2_norm:
            zf = F.normalize(zf, p=2, dim=-1)
        d = (zf * zf).sum(1, keepdim=True) + (e * e).sum(1) - 2 * zf @ e.t()
        idx = d.argmin(dim=1)
        zq = e[idx].reshape(B, H, W, D).permute(0, 3, 1, 2).contiguous()
        return idx.reshape(B, H * W), zq


class VQModel(nn.Module):
    """LlamaGen VQModel with `ch` made a constructor parameter (upstream hard-codes 128)."""

    def __init__(self, ch: int = 128, ch_mult=(1, 1, 2, 2, 4), z_channels: int = 256,
                 codebook_size: int = 16384, codebook_embed_dim: int = 8,
                 codebook_l2_norm: bool = True, num_res_blocks: int = 2,
                 show_usage: bool = True, device=None):
        super().__init__()
        self.ch, self.ch_mult = ch, list(ch_mult)
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, z_channels, device=device)
        self.decoder = Decoder(ch, ch_mult, num_res_blocks, z_channels, device=device)
        self.quantize = VectorQuantizer(codebook_size, codebook_embed_dim, codebook_l2_norm,
                                        show_usage, device=device)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, 1, device=device)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, 1, device=device)

    def encode(self, x):
        """images [B, 3, H, W] in [-1, 1] -> (codes [B, N], z_q [B, D, H/ds, W/ds])."""
        return self.quantize.quantize(self.quant_conv(self.encoder(x)))

    def decode(self, z_q):
        return self.decoder(self.post_quant_conv(z_q))     # not clamped (VQModel.decode)

    def decode_code(self, codes, grid_hw):
        return self.decode(self.quantize.lookup(codes, grid_hw))


def to_pixels(img: torch.Tensor) -> torch.Tensor:
    """[3, H, W] decoder output -> uint8 [H, W, 3] per LlamaGen's save path (sample_c2i.py):
    clamp to [-1, 1], (x+1)/2, byte = floor(clamp(x*255 + 0.5, 0, 255))."""
    x = (img.clamp(-1, 1) + 1) / 2
    return (x * 255 + 0.5).clamp(0, 255).floor().to(torch.uint8).permute(1, 2, 0).contiguous()


# ============================================================================================
# Config from converted-file metadata (tools/convert_llamagen.py)
# ============================================================================================

def gpt_config_from_metadata(meta: dict) -> GPTConfig:
    assert meta.get("vspec.kind") == "llamagen-gpt", meta.get("vspec.kind")
    mult = meta["ffn_dim_multiplier"]
    return GPTConfig(
        dim=int(meta["dim"]), n_layer=int(meta["n_layer"]), n_head=int(meta["n_head"]),
        n_kv_head=int(meta["n_kv_head"]), multiple_of=int(meta["multiple_of"]),
        ffn_dim_multiplier=None if mult == "none" else float(mult),
        rope_base=float(meta["rope_base"]), norm_eps=float(meta["norm_eps"]),
        num_classes=int(meta["num_classes"]), caption_dim=int(meta["caption_dim"]),
        class_dropout_prob=float(meta["class_dropout_prob"]), model_type=meta["model_type"],
        vocab_size=int(meta["vocab_size"]), cls_token_num=int(meta["cls_token_num"]),
        block_size=int(meta["block_size"]))


def vq_kwargs_from_metadata(meta: dict) -> dict:
    import json
    assert meta.get("vspec.kind") == "llamagen-vq", meta.get("vspec.kind")
    return dict(ch=int(meta["ch"]), ch_mult=json.loads(meta["ch_mult"]),
                z_channels=int(meta["z_channels"]), codebook_size=int(meta["codebook_size"]),
                codebook_embed_dim=int(meta["codebook_embed_dim"]),
                codebook_l2_norm=meta["codebook_l2_norm"] == "true",
                num_res_blocks=int(meta["num_res_blocks"]))
