"""PyTorch models with LlamaGen's architecture and parameter names (written from a reading
of LlamaGen's autoregressive/models/gpt.py and tokenizer/tokenizer_image/vq_model.py, not
copied from LlamaGen):

* VQModel       - LlamaGen VQ tokenizer (encoder, L2-normalised codebook, decoder), ch a parameter.
* GPT           - LlamaGen GPT c2i (2-D RoPE with zero rotation for the class position,
                  RMSNorm eps 1e-5, bias-free fused wqkv, SwiGLU with the multiple_of rule).
* EagleHead     - EAGLE-1 draft head with LANTERN's parameter names (cnets_llamagen.py).
* Classifier    - small CNN for metrics (conv/ReLU/GAP/linear at inference).

Hand-written attention (torch 1.13 has no scaled_dot_product_attention).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# =========================================================================================
# VQ tokenizer
# =========================================================================================

def Normalize(c):
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = Normalize(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = Normalize(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)
        self.cin, self.cout = cin, cout

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        if self.cin != self.cout:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = Normalize(c)
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        n = self.norm(x)
        q = self.q(n).reshape(b, c, h * w).transpose(1, 2)   # [b, hw, c]
        k = self.k(n).reshape(b, c, h * w)                   # [b, c, hw]
        v = self.v(n).reshape(b, c, h * w)                   # [b, c, hw]
        att = torch.softmax(torch.bmm(q, k) * (c ** -0.5), dim=2)   # [b, i, j]
        o = torch.bmm(v, att.transpose(1, 2)).reshape(b, c, h, w)   # o[c,i] = sum_j w[i,j] v[c,j]
        return x + self.proj_out(o)


class Downsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))


class Upsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Encoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, in_channels=3):
        super().__init__()
        self.nlev = len(ch_mult)
        self.num_res_blocks = num_res_blocks
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        in_mult = (1,) + tuple(ch_mult)
        self.conv_blocks = nn.ModuleList()
        block_in = ch
        for lvl in range(self.nlev):
            blk = nn.Module()
            res, attn = nn.ModuleList(), nn.ModuleList()
            block_in = ch * in_mult[lvl]
            block_out = ch * ch_mult[lvl]
            for _ in range(num_res_blocks):
                res.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if lvl == self.nlev - 1:
                    attn.append(AttnBlock(block_in))
            blk.res, blk.attn = res, attn
            if lvl != self.nlev - 1:
                blk.downsample = Downsample(block_in)
            self.conv_blocks.append(blk)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                  ResnetBlock(block_in, block_in)])
        self.norm_out = Normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for lvl, blk in enumerate(self.conv_blocks):
            for i in range(self.num_res_blocks):
                h = blk.res[i](h)
                if len(blk.attn) > 0:
                    h = blk.attn[i](h)
            if lvl != self.nlev - 1:
                h = blk.downsample(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, out_channels=3):
        super().__init__()
        self.nlev = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                  ResnetBlock(block_in, block_in)])
        self.conv_blocks = nn.ModuleList()
        for s in range(self.nlev):
            blk = nn.Module()
            res, attn = nn.ModuleList(), nn.ModuleList()
            block_out = ch * ch_mult[self.nlev - 1 - s]
            for _ in range(num_res_blocks + 1):
                res.append(ResnetBlock(block_in, block_out))
                block_in = block_out
                if s == 0:
                    attn.append(AttnBlock(block_in))
            blk.res, blk.attn = res, attn
            if s != self.nlev - 1:
                blk.upsample = Upsample(block_in)
            self.conv_blocks.append(blk)
        self.norm_out = Normalize(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for s, blk in enumerate(self.conv_blocks):
            for i in range(len(blk.res)):
                h = blk.res[i](h)
                if len(blk.attn) > 0:
                    h = blk.attn[i](h)
            if s != self.nlev - 1:
                h = blk.upsample(h)
        return self.conv_out(swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, n_e, e_dim, beta=0.25, l2_norm=True, entropy_ratio=0.0):
        super().__init__()
        self.n_e, self.e_dim, self.beta, self.l2_norm = n_e, e_dim, beta, l2_norm
        self.entropy_ratio = entropy_ratio
        self.embedding = nn.Embedding(n_e, e_dim)
        self.embedding.weight.data.uniform_(-1.0 / n_e, 1.0 / n_e)
        if l2_norm:
            self.embedding.weight.data = F.normalize(self.embedding.weight.data, p=2, dim=-1)

    def codebook(self):
        w = self.embedding.weight
        return F.normalize(w, p=2, dim=-1) if self.l2_norm else w

    def forward(self, z):
        """z [B, e_dim, H, W] -> (z_q straight-through, losses dict, indices [B, H*W])."""
        b, c, h, w = z.shape
        z = z.permute(0, 2, 3, 1).contiguous()
        zf = z.view(-1, c)
        e = self.codebook()
        if self.l2_norm:
            z = F.normalize(z, p=2, dim=-1)
            zf = F.normalize(zf, p=2, dim=-1)
        d = (zf ** 2).sum(1, keepdim=True) + (e ** 2).sum(1)[None] - 2 * zf @ e.t()
        idx = d.argmin(1)
        zq = e[idx].view(z.shape)
        losses = {}
        if self.training:
            losses["codebook"] = ((zq - z.detach()) ** 2).mean()
            losses["commit"] = self.beta * ((zq.detach() - z) ** 2).mean()
            if self.entropy_ratio > 0:
                p = torch.softmax(-d, dim=1)
                sample_ent = -(p * torch.log(p + 1e-5)).sum(1).mean()
                avg = p.mean(0)
                avg_ent = -(avg * torch.log(avg + 1e-5)).sum()
                losses["entropy"] = self.entropy_ratio * (sample_ent - avg_ent)
        zq = z + (zq - z).detach()
        return zq.permute(0, 3, 1, 2).contiguous(), losses, idx.view(b, h * w)


class VQModel(nn.Module):
    def __init__(self, ch=64, ch_mult=(1, 2, 2), num_res_blocks=2, z_channels=64,
                 codebook_size=1024, codebook_embed_dim=8, beta=0.25, entropy_ratio=0.0):
        super().__init__()
        self.cfg = dict(ch=ch, ch_mult=list(ch_mult), num_res_blocks=num_res_blocks,
                        z_channels=z_channels, codebook_size=codebook_size,
                        codebook_embed_dim=codebook_embed_dim)
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, z_channels)
        self.decoder = Decoder(ch, ch_mult, num_res_blocks, z_channels)
        self.quantize = VectorQuantizer(codebook_size, codebook_embed_dim, beta, True, entropy_ratio)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, 1)

    def encode(self, x):
        return self.quantize(self.quant_conv(self.encoder(x)))

    def decode(self, zq):
        return self.decoder(self.post_quant_conv(zq))

    def decode_code(self, codes, grid):
        e = self.quantize.codebook()
        z = e[codes].view(codes.shape[0], grid, grid, -1).permute(0, 3, 1, 2).contiguous()
        return self.decode(z)

    def forward(self, x):
        zq, losses, idx = self.encode(x)
        return self.decode(zq), losses, idx


# =========================================================================================
# LlamaGen GPT
# =========================================================================================

def find_multiple(n, k):
    return n if n % k == 0 else n + k - (n % k)


def ffn_hidden(dim, multiple_of=256, ffn_dim_multiplier=None):
    h = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        h = int(ffn_dim_multiplier * h)
    return find_multiple(h, multiple_of)


def precompute_freqs_cis_2d(grid_size, n_elem, base=10000, cls_token_num=1):
    """Table [cls_token_num + grid^2, n_elem/2, 2] of (cos, sin); condition rows are zeros.
    Rows use the first n_elem/4 pairs, columns the next n_elem/4 (as gpt.py's
    precompute_freqs_cis_2d)."""
    half = n_elem // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    t = torch.arange(grid_size, dtype=torch.float32)
    f = torch.outer(t, freqs)                                            # [G, hd/4]
    grid = torch.cat([f[:, None, :].expand(-1, grid_size, -1),          # row angle
                      f[None, :, :].expand(grid_size, -1, -1)], dim=-1)  # col angle -> [G,G,hd/2]
    cache = torch.stack([torch.cos(grid), torch.sin(grid)], dim=-1).flatten(0, 1)
    return torch.cat([torch.zeros(cls_token_num, half, 2), cache])


def apply_rotary_emb(x, freqs_cis):
    """x [B, L, H, hd]; freqs_cis [L, hd/2, 2]; interleaved pairs (x[2j], x[2j+1])."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    fc = freqs_cis.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * fc[..., 0] - xs[..., 1] * fc[..., 1],
                       xs[..., 1] * fc[..., 0] + xs[..., 0] * fc[..., 1]], dim=-1)
    return out.flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def causal_attention(q, k, v, mask=None):
    """q [B,H,Lq,hd], k/v [B,H,Lk,hd]; mask bool [Lq,Lk] (true = attend) or None = causal."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if mask is None:
        lq, lk = q.size(2), k.size(2)
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


class Attention(nn.Module):
    def __init__(self, dim, n_head, n_kv_head=None, resid_dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.n_kv_head = n_kv_head or n_head
        self.hd = dim // n_head
        self.dim = dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * self.n_kv_head) * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.drop = nn.Dropout(resid_dropout)

    def forward(self, x, freqs_cis, cache=None, mask=None):
        b, l, _ = x.shape
        kv = self.n_kv_head * self.hd
        q, k, v = self.wqkv(x).split([self.dim, kv, kv], dim=-1)
        q = apply_rotary_emb(q.view(b, l, self.n_head, self.hd), freqs_cis)
        k = apply_rotary_emb(k.view(b, l, self.n_kv_head, self.hd), freqs_cis)
        v = v.view(b, l, self.n_kv_head, self.hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:  # simple append cache: dict with 'k','v'
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if self.n_kv_head != self.n_head:
            r = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        o = causal_attention(q, k, v, mask)
        return self.drop(self.wo(o.transpose(1, 2).reshape(b, l, self.dim)))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden, dropout=0.0):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_head, hidden, norm_eps, dropout=0.0):
        super().__init__()
        self.attention = Attention(dim, n_head, resid_dropout=dropout)
        self.feed_forward = FeedForward(dim, hidden, dropout)
        self.attention_norm = RMSNorm(dim, norm_eps)
        self.ffn_norm = RMSNorm(dim, norm_eps)

    def forward(self, x, freqs_cis, cache=None):
        h = x + self.attention(self.attention_norm(x), freqs_cis, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes, dim, dropout_prob):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + (dropout_prob > 0), dim)
        self.num_classes, self.dropout_prob = num_classes, dropout_prob

    def forward(self, labels, train):
        if train and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels).unsqueeze(1)


class GPT(nn.Module):
    """LlamaGen Transformer (c2i). Sequence: [class token at position 0][image tokens]."""

    def __init__(self, dim=256, n_layer=8, n_head=4, vocab_size=1024, block_size=64,
                 num_classes=10, class_dropout_prob=0.1, cls_token_num=1, rope_base=10000,
                 norm_eps=1e-5, multiple_of=256, dropout=0.0, token_dropout=0.0):
        super().__init__()
        assert (dim // n_head) % 4 == 0
        self.cfg = dict(dim=dim, n_layer=n_layer, n_head=n_head, vocab_size=vocab_size,
                        block_size=block_size, num_classes=num_classes,
                        class_dropout_prob=class_dropout_prob, cls_token_num=cls_token_num,
                        rope_base=rope_base, norm_eps=norm_eps, multiple_of=multiple_of)
        self.cls_token_num = cls_token_num
        self.num_classes = num_classes
        self.hidden = ffn_hidden(dim, multiple_of)
        self.cls_embedding = LabelEmbedder(num_classes, dim, class_dropout_prob)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.tok_dropout = nn.Dropout(token_dropout)
        self.layers = nn.ModuleList([TransformerBlock(dim, n_head, self.hidden, norm_eps, dropout)
                                     for _ in range(n_layer)])
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        grid = int(round(block_size ** 0.5))
        assert grid * grid == block_size
        self.register_buffer("freqs_cis", precompute_freqs_cis_2d(grid, dim // n_head, rope_base,
                                                                  cls_token_num), persistent=False)
        self.initialize_weights()

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.data.normal_(0.0, 0.02)
                if m.bias is not None:
                    m.bias.data.zero_()
            elif isinstance(m, nn.Embedding):
                m.weight.data.normal_(0.0, 0.02)
        nn.init.constant_(self.output.weight, 0)

    def features(self, cond, idx, train=False, start=0, caches=None):
        """Final-norm hidden states. cond [B] labels (None when decoding with caches), idx
        [B, L] image tokens (may be None for prefill). Returns h [B, L', dim] for the new
        positions start..start+L'-1."""
        parts = []
        if cond is not None:
            parts.append(self.cls_embedding(cond, train)[:, :self.cls_token_num])
        if idx is not None and idx.numel() > 0:
            parts.append(self.tok_embeddings(idx))
        h = self.tok_dropout(torch.cat(parts, dim=1))
        fc = self.freqs_cis[start:start + h.size(1)]
        for i, layer in enumerate(self.layers):
            h = layer(h, fc, None if caches is None else caches[i])
        return self.norm(h)

    def forward(self, cond, idx, train=False):
        """Teacher forcing: cond [B], idx [B, N-1] (tokens 0..N-2) -> logits [B, N, V]."""
        return self.output(self.features(cond, idx, train)).float()


# =========================================================================================
# EAGLE-1 draft head (LANTERN cnets_llamagen.py parameter names)
# =========================================================================================

class EagleAttention(nn.Module):
    def __init__(self, dim, n_head):
        super().__init__()
        self.n_head, self.hd, self.dim = n_head, dim // n_head, dim
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, freqs_cis, cache=None, mask=None):
        b, l, _ = x.shape
        q = apply_rotary_emb(self.q_proj(x).view(b, l, self.n_head, self.hd), freqs_cis)
        k = apply_rotary_emb(self.k_proj(x).view(b, l, self.n_head, self.hd), freqs_cis)
        v = self.v_proj(x).view(b, l, self.n_head, self.hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        o = causal_attention(q, k, v, mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, l, self.dim))


class EagleMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer0(nn.Module):
    """Decoder layer index 0: NO input_layernorm (EAGLE skips it for the first layer)."""

    def __init__(self, dim, n_head, hidden, eps):
        super().__init__()
        self.self_attn = EagleAttention(dim, n_head)
        self.mlp = EagleMLP(dim, hidden)
        self.post_attention_layernorm = RMSNorm(dim, eps)

    def forward(self, x, freqs_cis, cache=None):
        h = x + self.self_attn(x, freqs_cis, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    """f_hat[p] = layer0(fc(cat(E[x_{p+1}], f_p))). Token embedding E and lm_head are the
    target's tok_embeddings / output (not stored here). Drafter RoPE table: LlamaGen 2-D
    table with cls_token_num = target_cls_token_num - 1 (= 0 for c2i)."""

    def __init__(self, dim, n_head, hidden, block_size, cls_token_num=0, rope_base=10000,
                 eps=1e-6):
        super().__init__()
        self.fc = nn.Linear(2 * dim, dim, bias=True)
        self.layers = nn.ModuleList([EagleLayer0(dim, n_head, hidden, eps)])
        grid = int(round(block_size ** 0.5))
        fc = precompute_freqs_cis_2d(grid, dim // n_head, rope_base, cls_token_num)
        fc = torch.cat([fc, torch.zeros(16, fc.size(1), 2)])  # beyond the grid: zero rotation
        self.register_buffer("freqs_cis", fc, persistent=False)

    def forward(self, tok_emb, feat, start=0, caches=None):
        h = self.fc(torch.cat([tok_emb, feat], dim=-1))
        fc = self.freqs_cis[start:start + h.size(1)]
        for i, layer in enumerate(self.layers):
            h = layer(h, fc, None if caches is None else caches[i])
        return h


# =========================================================================================
# Classifier (metrics only)
# =========================================================================================

class Classifier(nn.Module):
    """Input [B,1,32,32] in [-1,1]. Training: conv(3x3, no bias) -> BatchNorm -> ReLU per
    stage; export folds BatchNorm into conv weight/bias, so inference is
    conv(3x3, stride s, pad 1, bias) -> ReLU (x7) -> global average pool (= the 128-d feature,
    FID space) -> linear 128 -> 10 (logits)."""

    SPEC = [  # (cin, cout, stride)
        (1, 32, 1), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1),
        (128, 128, 1)]

    def __init__(self, dropout=0.3):
        super().__init__()
        self.convs = nn.ModuleList()
        self.bns = nn.ModuleList()
        for cin, cout, s in self.SPEC:
            self.convs.append(nn.Conv2d(cin, cout, 3, s, 1, bias=False))
            self.bns.append(nn.BatchNorm2d(cout))
        self.fc = nn.Linear(128, 10)
        self.drop = nn.Dropout(dropout)

    def features(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = F.relu(bn(conv(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x):
        f = self.features(x)
        return self.fc(self.drop(f)), f

    def folded_state(self):
        """Inference weights with BatchNorm (running stats) folded into the convs."""
        out = {}
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            out[f"conv{i}.weight"] = (conv.weight * scale[:, None, None, None]).detach().clone()
            out[f"conv{i}.bias"] = (bn.bias - bn.running_mean * scale).detach().clone()
        out["fc.weight"] = self.fc.weight.detach().clone()
        out["fc.bias"] = self.fc.bias.detach().clone()
        return out


class FoldedClassifier(nn.Module):
    """The exported inference network (what the C side rebuilds)."""

    def __init__(self, state):
        super().__init__()
        self.w = {k: v.float() for k, v in state.items()}
        self.strides = [s for _, _, s in Classifier.SPEC]

    def features(self, x):
        for i, s in enumerate(self.strides):
            x = F.relu(F.conv2d(x, self.w[f"conv{i}.weight"], self.w[f"conv{i}.bias"], s, 1))
        return x.mean(dim=(2, 3))

    def forward(self, x):
        f = self.features(x)
        return F.linear(f, self.w["fc.weight"], self.w["fc.bias"]), f


def count_params(m):
    return sum(p.numel() for p in m.parameters())
