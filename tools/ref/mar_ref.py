"""A faithful PyTorch reference of MAR (LTH14/mar), written from its semantics.

Used three ways: in float64 for the golden tests of the C `mar` backend
(tools/ref/make_mar_golden.py), in float32 for training the Fashion-MNIST MAR pair
(tools/train/train_mar.py), and for converting real checkpoints (tools/convert_mar.py).
Parameter names and shapes are the released checkpoints' (models/mar.py, models/diffloss.py).

What it reproduces (file and function of LTH14/mar):
  - timm's ViT `Block` (pre-norm, LayerNorm eps 1e-6, qkv with bias, exact-erf GELU, no mask,
    no positional rotation);
  - `MAR.forward_mae_encoder` (64 buffer slots filled with the class embedding, the learned
    `fake_latent` for the unconditional row, LayerNorm z_proj_ln after the position
    embedding, only buffer + known tokens enter the encoder), `forward_mae_decoder`
    (mask_token at unknown positions, diffusion_pos_embed_learned added to the output);
  - `MAR.sample_tokens`: cosine mask schedule, at least one token revealed and one kept
    masked per step, the first mask_len positions of the order stay masked, CFG linear or
    constant schedule;
  - `SimpleMLPAdaLN` (diffloss.py): timestep embedding [cos, sin] in float32, adaLN
    (shift, scale, gate) ResBlocks, final layer with a parameter-free LayerNorm;
  - the diffusion of diffusion/gaussian_diffusion.py + respace.py: cosine schedule over 1000
    steps respaced to 100, epsilon prediction, learned-range variance (unclamped v), no x0
    clipping, temperature on the per-step noise only, no noise at the last step, CFG on
    epsilon with both halves evaluated at the conditional x; training loss MSE(eps) + the
    variational bound in bits with the mean detached (LossType.MSE with learn_sigma).
Sampling takes its noises as arguments, so C and Python can be fed the same ones.
"""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-6


# ---- timm ViT Block ------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, dim, num_heads, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    def __init__(self, dim, hidden, drop=0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()  # exact erf form
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, attn_drop=0.0, proj_drop=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.attn = Attention(dim, num_heads, attn_drop, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# ---- the diffusion head (models/diffloss.py) ----------------------------------------------

def timestep_embedding(t, dim=256, max_period=10000):
    """[cos, sin] of t * exp(-ln(10000) k / half), frequencies and arguments in float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden, freq=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(freq, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.freq = freq

    def forward(self, t):
        e = timestep_embedding(t, self.freq).to(self.mlp[0].weight.dtype)
        return self.mlp(e)


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class ResBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.in_ln = nn.LayerNorm(ch, eps=LN_EPS)
        self.mlp = nn.Sequential(nn.Linear(ch, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(ch, 3 * ch))

    def forward(self, x, y):
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, ch, out):
        super().__init__()
        self.norm_final = nn.LayerNorm(ch, elementwise_affine=False, eps=LN_EPS)
        self.linear = nn.Linear(ch, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(ch, 2 * ch))

    def forward(self, x, y):
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    def __init__(self, in_ch, width, out_ch, z_ch, depth):
        super().__init__()
        self.in_channels = in_ch
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_ch, width)
        self.input_proj = nn.Linear(in_ch, width)
        self.res_blocks = nn.ModuleList([ResBlock(width) for _ in range(depth)])
        self.final_layer = FinalLayer(width, out_ch)

    def init_weights(self):
        """MAR's initialisation: xavier linears, small time MLP, zeroed adaLN and output."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        for b in self.res_blocks:
            nn.init.zeros_(b.adaLN_modulation[-1].weight)
            nn.init.zeros_(b.adaLN_modulation[-1].bias)
        for p in [self.final_layer.adaLN_modulation[-1].weight,
                  self.final_layer.adaLN_modulation[-1].bias, self.final_layer.linear.weight,
                  self.final_layer.linear.bias]:
            nn.init.zeros_(p)

    def forward(self, x, t, c):
        y = self.time_embed(t) + self.cond_embed(c)
        x = self.input_proj(x)
        for b in self.res_blocks:
            x = b(x, y)
        return self.final_layer(x, y)

    def forward_with_cfg(self, x, t, c, cfg_scale):
        """Rows [cond ; uncond]: both halves run at the conditional x; eps is guided, each
        half keeps its own v."""
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half], 0), t, c)
        eps, rest = out[:, :self.in_channels], out[:, self.in_channels:]
        ce, ue = torch.split(eps, len(eps) // 2, 0)
        g = ue + cfg_scale * (ce - ue)
        return torch.cat([torch.cat([g, g], 0), rest], 1)


class DiffLoss(nn.Module):
    def __init__(self, target_channels, z_channels, depth, width):
        super().__init__()
        self.in_channels = target_channels
        self.net = SimpleMLPAdaLN(target_channels, width, 2 * target_channels, z_channels, depth)


# ---- the diffusion schedule (diffusion/gaussian_diffusion.py, respace.py) -----------------

def cosine_betas(n=1000, max_beta=0.999):
    def abar(s):
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
    return np.array([min(1 - abar((i + 1) / n) / abar(i / n), max_beta) for i in range(n)],
                    dtype=np.float64)


def space_timesteps(num_timesteps, count):
    """respace.py's section rule for one section of `count` steps."""
    frac_stride = (num_timesteps - 1) / (count - 1) if count > 1 else 1
    cur, taken = 0.0, []
    for _ in range(count):
        taken.append(round(cur))
        cur += frac_stride
    return taken


class Diffusion:
    """Constants of a (respaced) cosine-schedule diffusion, float64 as in the reference."""

    def __init__(self, steps=None, base=1000):
        betas = cosine_betas(base)
        abar = np.cumprod(1.0 - betas)
        if steps is not None and steps != base:
            self.timesteps = space_timesteps(base, steps)
            last, nb = 1.0, []
            for i in self.timesteps:
                nb.append(1 - abar[i] / last)
                last = abar[i]
            betas = np.array(nb, dtype=np.float64)
        else:
            self.timesteps = list(range(base))
        self.betas = betas
        self.num_timesteps = len(betas)
        a = 1.0 - betas
        self.abar = np.cumprod(a)
        self.abar_prev = np.append(1.0, self.abar[:-1])
        self.sqrt_abar = np.sqrt(self.abar)
        self.sqrt_1m_abar = np.sqrt(1.0 - self.abar)
        self.sqrt_recip_abar = np.sqrt(1.0 / self.abar)
        self.sqrt_recipm1_abar = np.sqrt(1.0 / self.abar - 1)
        self.post_var = betas * (1.0 - self.abar_prev) / (1.0 - self.abar)
        self.post_log_var = np.log(np.append(self.post_var[1], self.post_var[1:]))
        self.coef1 = betas * np.sqrt(self.abar_prev) / (1.0 - self.abar)
        self.coef2 = (1.0 - self.abar_prev) * np.sqrt(a) / (1.0 - self.abar)
        self.log_betas = np.log(betas)

    def _x(self, arr, k, like):
        """_extract_into_tensor: the float64 constant rounded to float32 (as the reference
        does whatever the model's dtype), then broadcast over the token's channels."""
        v = torch.from_numpy(arr)[k].float().to(like.dtype)
        return v.reshape(-1, 1) if v.dim() else v

    def mean_logvar(self, out, x, k, clip=False):
        """p_mean_variance for respaced step k: (mean, log variance, x0) from the net output;
        clip = clip_denoised (x0 clamped to [-1, 1] before the posterior mean: MAR samples
        with False, pixel-space tokens with True as ADM does)."""
        c = x.shape[1]
        eps, v = out[:, :c], out[:, c:]
        min_log, max_log = self._x(self.post_log_var, k, x), self._x(self.log_betas, k, x)
        frac = (v + 1) / 2
        logvar = frac * max_log + (1 - frac) * min_log
        x0 = self._x(self.sqrt_recip_abar, k, x) * x - self._x(self.sqrt_recipm1_abar, k, x) * eps
        if clip:
            x0 = x0.clamp(-1, 1)
        mean = self._x(self.coef1, k, x) * x0 + self._x(self.coef2, k, x) * x
        return mean, logvar, x0

    # -- training (the base, unspaced diffusion) --------------------------------------------
    def training_loss(self, net, x0, t, c):
        """LossType.MSE with LEARNED_RANGE: mse(eps) + vb (bits), the vb term with the
        predicted mean detached; per-row losses [N]."""
        noise = torch.randn_like(x0)
        st = torch.as_tensor(self.sqrt_abar, dtype=x0.dtype)[t][:, None]
        s1 = torch.as_tensor(self.sqrt_1m_abar, dtype=x0.dtype)[t][:, None]
        xt = st * x0 + s1 * noise
        out = net(xt, t, c)
        ch = x0.shape[1]
        eps, v = out[:, :ch], out[:, ch:]
        mse = ((noise - eps) ** 2).mean(1)
        frozen = torch.cat([eps.detach(), v], 1)
        mean, logvar, _ = self.mean_logvar(frozen, xt, t)
        ap = torch.as_tensor(self.abar_prev, dtype=x0.dtype)[t][:, None]
        a_ = torch.as_tensor(self.abar, dtype=x0.dtype)[t][:, None]
        b_ = torch.as_tensor(self.betas, dtype=x0.dtype)[t][:, None]
        true_mean = (b_ * ap.sqrt() / (1 - a_)) * x0 + ((1 - ap) * (1 - b_).sqrt() / (1 - a_)) * xt
        true_logvar = torch.as_tensor(self.post_log_var, dtype=x0.dtype)[t][:, None]
        kl = 0.5 * (-1.0 + logvar - true_logvar + torch.exp(true_logvar - logvar)
                    + (true_mean - mean) ** 2 * torch.exp(-logvar))
        kl = kl.mean(1) / math.log(2.0)
        nll = -discretized_gaussian_log_likelihood(x0, mean, 0.5 * logvar).mean(1) / math.log(2.0)
        vb = torch.where(t == 0, nll, kl)
        return mse + vb

    # -- sampling with given noises ------------------------------------------------------------
    def sample(self, net, c, noise, step_noise, temperature=1.0, cfg=1.0, clip=False):
        """p_sample_loop of DiffLoss.sample with explicit noises: `noise` [n, C] is x_{K-1}
        (not temperature-scaled), step_noise [K, n, C] the per-step noise (index = respaced
        step; step 0 is unused: no noise at the last step). With cfg != 1, c holds [cond ;
        uncond] rows for the n tokens (2n rows) and the cond half is returned.
        Returns (sample, final mean, final log variance, sum over k >= 1 of log sigma_k)."""
        n = noise.shape[0]
        x = noise
        sum_log_sigma = torch.zeros_like(noise)
        for k in reversed(range(self.num_timesteps)):
            t = torch.full((c.shape[0],), self.timesteps[k], dtype=torch.long)
            if cfg != 1.0:
                out = net.forward_with_cfg(torch.cat([x, x], 0), t, c, cfg)[:n]
            else:
                out = net(x, t, c)
            mean, logvar, _ = self.mean_logvar(out, x, torch.full((n,), k, dtype=torch.long), clip)
            if k == 0:
                return mean, mean, logvar, sum_log_sigma
            sum_log_sigma = sum_log_sigma + 0.5 * logvar
            x = mean + torch.exp(0.5 * logvar) * temperature * step_noise[k]


def approx_standard_normal_cdf(x):
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    centered = x - means
    inv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_1m_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_1m_cdf_min, delta))


# ---- MAR ---------------------------------------------------------------------------------

class MAR(nn.Module):
    def __init__(self, seq_len=256, token_dim=16, enc_dim=768, enc_depth=12, enc_heads=12,
                 dec_dim=768, dec_depth=12, dec_heads=12, mlp_ratio=4.0, class_num=1000,
                 buffer_size=64, diffloss_d=3, diffloss_w=1024, label_drop_prob=0.1,
                 attn_dropout=0.1, proj_dropout=0.1, mask_ratio_min=0.7, diffusion_batch_mul=4):
        super().__init__()
        self.seq_len, self.token_embed_dim, self.buffer_size = seq_len, token_dim, buffer_size
        self.clip_denoised = False  # a sampling setting (metadata clip_denoised), not a weight
        self.num_classes, self.label_drop_prob = class_num, label_drop_prob
        self.mask_ratio_min, self.diffusion_batch_mul = mask_ratio_min, diffusion_batch_mul
        self.class_emb = nn.Embedding(class_num, enc_dim)
        self.fake_latent = nn.Parameter(torch.zeros(1, enc_dim))
        self.z_proj = nn.Linear(token_dim, enc_dim)
        self.z_proj_ln = nn.LayerNorm(enc_dim, eps=LN_EPS)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len + buffer_size, enc_dim))
        self.encoder_blocks = nn.ModuleList([Block(enc_dim, enc_heads, mlp_ratio, attn_dropout,
                                                   proj_dropout) for _ in range(enc_depth)])
        self.encoder_norm = nn.LayerNorm(enc_dim, eps=LN_EPS)
        self.decoder_embed = nn.Linear(enc_dim, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len + buffer_size, dec_dim))
        self.decoder_blocks = nn.ModuleList([Block(dec_dim, dec_heads, mlp_ratio, attn_dropout,
                                                   proj_dropout) for _ in range(dec_depth)])
        self.decoder_norm = nn.LayerNorm(dec_dim, eps=LN_EPS)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len, dec_dim))
        self.diffloss = DiffLoss(token_dim, dec_dim, diffloss_d, diffloss_w)

    def init_weights(self):
        """MAR.initialize_weights: normal(0.02) embeddings, xavier linears, unit LayerNorms;
        the diffusion head's own scheme."""
        for p in [self.class_emb.weight, self.fake_latent, self.mask_token,
                  self.encoder_pos_embed_learned, self.decoder_pos_embed_learned,
                  self.diffusion_pos_embed_learned]:
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        self.diffloss.net.init_weights()

    def forward_mae_encoder(self, tokens, mask, class_embedding):
        x = self.z_proj(tokens)
        b, n, d = x.shape
        x = torch.cat([torch.zeros(b, self.buffer_size, d, dtype=x.dtype), x], 1)
        mwb = torch.cat([torch.zeros(b, self.buffer_size, dtype=mask.dtype), mask], 1)
        if self.training:
            drop = (torch.rand(b) < self.label_drop_prob).unsqueeze(-1).to(x.dtype)
            class_embedding = drop * self.fake_latent + (1 - drop) * class_embedding
        x[:, :self.buffer_size] = class_embedding.unsqueeze(1)
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        x = x[(1 - mwb).nonzero(as_tuple=True)].reshape(b, -1, d)
        for blk in self.encoder_blocks:
            x = blk(x)
        return self.encoder_norm(x)

    def forward_mae_decoder(self, x, mask):
        x = self.decoder_embed(x)
        mwb = torch.cat([torch.zeros(x.size(0), self.buffer_size, dtype=mask.dtype), mask], 1)
        full = self.mask_token.repeat(mwb.shape[0], mwb.shape[1], 1).to(x.dtype).clone()
        full[(1 - mwb).nonzero(as_tuple=True)] = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
        x = full + self.decoder_pos_embed_learned
        for blk in self.decoder_blocks:
            x = blk(x)
        x = self.decoder_norm(x)
        return x[:, self.buffer_size:] + self.diffusion_pos_embed_learned

    def condition(self, tokens, mask, labels, cfg_rows):
        """The diffusion conditions z [rows*b, seq, D] for a token grid and mask; with
        cfg_rows = 2 the batch is [cond ; uncond] (the fake latent)."""
        ce = self.class_emb(labels)
        if cfg_rows == 2:
            tokens = torch.cat([tokens, tokens], 0)
            mask = torch.cat([mask, mask], 0)
            ce = torch.cat([ce, self.fake_latent.repeat(len(labels), 1)], 0)
        return self.forward_mae_decoder(self.forward_mae_encoder(tokens, mask, ce), mask)

    # -- training ------------------------------------------------------------------------------
    def random_mask(self, b, orders):
        """Mask ratio from the left half of a normal at 1 with std 0.25, truncated at
        mask_ratio_min (MAR.mask_ratio_generator); the first ceil(seq * ratio) positions of
        each order are masked."""
        a = (self.mask_ratio_min - 1.0) / 0.25
        lo = torch.special.ndtr(torch.tensor(a, dtype=torch.float64))
        u = lo + (0.5 - lo) * torch.rand((), dtype=torch.float64)
        rate = float(1.0 + 0.25 * torch.special.ndtri(u))
        n = int(np.ceil(self.seq_len * rate))
        mask = torch.zeros(b, self.seq_len)
        mask.scatter_(1, orders[:, :n], 1.0)
        return mask

    def training_loss(self, tokens, labels, diffusion):
        b = tokens.shape[0]
        orders = torch.argsort(torch.rand(b, self.seq_len), dim=1)
        mask = self.random_mask(b, orders).to(tokens.dtype)
        z = self.forward_mae_decoder(self.forward_mae_encoder(tokens, mask,
                                                              self.class_emb(labels)), mask)
        # MAR.forward_loss weights every token's loss by the mask; computing it only for the
        # masked tokens gives the same value and gradient at a fraction of the cost.
        m = self.diffusion_batch_mul
        keep = mask.reshape(b * self.seq_len).bool()
        target = tokens.reshape(b * self.seq_len, -1)[keep].repeat(m, 1)
        zz = z.reshape(b * self.seq_len, -1)[keep].repeat(m, 1)
        t = torch.randint(0, diffusion.num_timesteps, (target.shape[0],))
        return diffusion.training_loss(self.diffloss.net, target, t, zz).mean()


def mask_len_at(step, num_iter, seq_len, n_masked):
    """MAR.sample_tokens: tokens still masked after `step`."""
    ratio = np.cos(math.pi / 2.0 * (step + 1) / num_iter)
    return int(max(1, min(n_masked - 1, np.floor(seq_len * ratio))))


def cfg_at(cfg, schedule, seq_len, mask_len):
    if schedule == "linear":
        return 1 + (cfg - 1) * (seq_len - mask_len) / seq_len
    return cfg


@torch.no_grad()
def sample_tokens(model, diffusion, label, order, noise, step_noise, num_iter, cfg=1.0,
                  cfg_schedule="linear", temperature=1.0):
    """MAR.sample_tokens for one image with a given order and noises: noise [seq, C] is each
    position's initial x, step_noise [seq, K, C] its per-step noise (a position's noises are
    used when it is revealed). Returns the token grid [seq, C]."""
    seq, c = model.seq_len, model.token_embed_dim
    tokens = torch.zeros(1, seq, c, dtype=noise.dtype)
    mask = torch.ones(1, seq, dtype=noise.dtype)
    rows = 2 if cfg != 1.0 else 1
    for step in range(num_iter):
        z = model.condition(tokens, mask, torch.tensor([label]), rows)
        ml = mask_len_at(step, num_iter, seq, int(mask[0].sum()))
        nxt = torch.zeros(1, seq, dtype=noise.dtype)
        nxt[0, order[:ml]] = 1.0
        pred = mask[0].bool() if step == num_iter - 1 else (mask[0].bool() ^ nxt[0].bool())
        pos = pred.nonzero(as_tuple=True)[0]
        zc = z[:, pos].reshape(rows * len(pos), -1) if rows == 1 else \
            torch.cat([z[0, pos], z[1, pos]], 0)
        s, *_ = diffusion.sample(model.diffloss.net, zc, noise[pos], step_noise[pos].transpose(0, 1),
                                 temperature, cfg_at(cfg, cfg_schedule, seq, ml),
                                 model.clip_denoised)
        tokens[0, pos] = s
        mask = nxt
    return tokens[0]
