#!/usr/bin/env python3
"""Reference transcriptions (numpy, written from scratch) of the acceptance rules used by
training-free speculative Jacobi decoding for visual AR models.

Upstream sources (read, not copied):
  SJD    tyshiwo1/Accelerating-T2I-AR-with-SJD : scheduler/jacobi_iteration_lumina_mgpt.py
           SpeculativeSampler.__call__ / reject_sampling_single_token / get_reject_sampling_logits,
           prefix_matching_next_tokens, push_forward_model_kwargs_and_inputs,
           get_multi_token_for_preparation (draft init), JacobiSampler._sample (loop).
  MC-SJD junhyukso/SCD : lumina1/scheduler/jacobi_iteration_lumina_mgpt_SCDMC.py
           (SpeculativeSampler.__call__ without the `break`)  -> maximal coupling
         junhyukso/SCD : lumina1/scheduler/jacobi_iteration_lumina_mgpt_GS.py
           (_sample_from_probs_with_global_rand + shifting self.random_table) -> Gumbel coupling
  GSD    junhyukso/GSD : scheduler/jacobi_iteration_lumina_mgpt.py  SpeculativeSampler.__call__

Conventions (match upstream):
  The forward input is a window x[0..L-1]: x[0] is the last *committed* token (its KV is not
  cached yet), x[1..L-1] are drafts.  The forward returns p[0..L-1]; p[j] is the target
  distribution for the token *after* x[j] (so draft x[i] is checked against p[i-1]).
  q[i] is the distribution draft x[i] was drawn from (q[0] is unused).
  p and q are the *final sampling distributions*: softmax(top-k(CFG-mixed logits)) at T=1.

Run `python3 tools/ref/sjd_ref.py` for the self-checks (needs only numpy; about 30 s).
vspec's side is plugins/drafter/jacobi.c; docs/SPECULATIVE.md explains where it differs.
"""
import numpy as np


def _norm(v):
    s = v.sum()
    return v / s


def residual(p, q):
    """norm(max(0, p - q)); SJD: get_reject_sampling_logits -> softmax(log(clamp(p-q, min=0)))."""
    r = np.maximum(p - q, 0.0)
    s = r.sum()
    if s <= 0:            # p == q exactly: rejection has prob 0, any choice is fine
        return p.copy()
    return r / s


# --------------------------------------------------------------------------------------
# (a) one SJD iteration
# --------------------------------------------------------------------------------------
def sjd_iteration(p, q, x, u, y, rng):
    """One SJD verification step with upstream semantics.

    p : [L, V] current target dists (p[j] = dist of the token after x[j]).
    q : [L, V] recorded draft dists (q[i] for draft x[i]; q[0] ignored).
    x : [L] ints, x[0] = last committed token, x[1:] drafts.
    u : [L] uniforms (u[i] used to test x[i]; upstream draws rand[B,L,V] and reads [b,i,x_i]).
    y : [L] ints, y[j] ~ p[j] already sampled (upstream samples every position with
        torch.multinomial before verification: sampling_logits2tokens).
    rng : np.random.Generator for the residual draw (torch.multinomial upstream).

    Returns (emitted, carry_tokens, carry_q):
      emitted      : tokens committed this iteration, 1..L of them
                     (k accepted drafts + 1 residual sample, or L-1 accepted + 1 bonus y[L-1]).
      carry_tokens : drafts for the next window = y[n:] (fresh samples from the *current* p
                     at the positions after the first rejection, conditioned on the rejected
                     prefix) -- the Jacobi update.
      carry_q      : their recorded q = p[n:].
    The next window is [emitted[-1]] + carry_tokens + (n-1) new init drafts, i.e. length L again.
    The KV of inputs x[0..n-1] is kept, KV of x[n..L-1] is dropped (delete_false_key_value).
    """
    L = len(x)
    out = list(y)               # resampled_target_tokens = advanced_tokens.clone()
    n = L                       # first_misaligned_token_index default: all accepted
    for i in range(1, L):
        xi = x[i]
        ratio = min(1.0, p[i - 1, xi] / q[i, xi])   # no epsilon upstream (q[i,xi] > 0 by construction)
        if u[i] < ratio:
            out[i - 1] = xi                          # accept draft as output of position i-1
        else:
            out[i - 1] = rng.choice(p.shape[1], p=residual(p[i - 1], q[i]))
            n = i
            break
    emitted = out[:n]           # matched_next_tokens = next_tokens[:, :n]
    carry_tokens = out[n:]      # unmatched_next_tokens (== y[n:], untouched)
    carry_q = p[n:]             # unmatched_next_scores (current p, post top-k/CFG)
    return emitted, carry_tokens, carry_q


def sjd_init_drafts(n_new, img_vocab, V, rng, q_kind="onehot"):
    """New window positions.  SJD (get_multi_token_for_preparation, scheme 'random'):
    uniform random image-vocab tokens with q recorded as ONE-HOT at the token (score 1.0),
    so their acceptance prob is simply p(x).  SJD-PAC records q = uniform(1/|img_vocab|)."""
    toks = rng.choice(img_vocab, size=n_new)
    qs = np.zeros((n_new, V))
    if q_kind == "onehot":
        qs[np.arange(n_new), toks] = 1.0
    else:
        qs[:, img_vocab] = 1.0 / len(img_vocab)
    return list(toks), qs


# --------------------------------------------------------------------------------------
# (b) MC-SJD coupled redraw of a not-yet-verified window position
# --------------------------------------------------------------------------------------
def mc_coupled_redraw(x_old, q_old, p_new, u, rng, upstream_q=False):
    """Maximal coupling (SCD: jacobi_iteration_lumina_mgpt_SCDMC.py SpeculativeSampler.__call__,
    i.e. the SJD loop with the `break` removed).  For every window position AFTER the first
    rejection: keep the old draft with prob min(1, p_new(x)/q_old(x)), else draw from
    norm(max(0, p_new - q_old)).  The result is distributed exactly as p_new and equals x_old
    with the maximal possible probability 1 - TV(q_old, p_new).

    Recorded q for the next iteration:
      theory / this function default : p_new (the marginal of the coupled draw).
      upstream SCDMC (upstream_q=True): q_old if kept (resampled_target_scores[..] = draft_prob),
                                        p_new if redrawn.   See self-check 3 below.
    """
    if u < min(1.0, p_new[x_old] / q_old[x_old]):
        return x_old, (q_old if upstream_q else p_new)
    return rng.choice(len(p_new), p=residual(p_new, q_old)), p_new


def gumbel_coupled_draw(p_new, g):
    """Gumbel coupling (SCD: _GS.py _sample_from_probs_with_global_rand): token =
    argmax(log p + g) with g = -log(-log(U + 1e-9) + 1e-9), U fixed per ABSOLUTE position:
    self.random_table[1, 64, 65536] is shifted left by the number of committed tokens after
    each Jacobi step (new rows for the tail).  Recorded q = p_new; verification unchanged."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p_new) + g))


# --------------------------------------------------------------------------------------
# (c) GSD acceptance of one draft token
# --------------------------------------------------------------------------------------
def gsd_accept_one(p, q, logits, x, r, rng, emb_dist=None, half=7, p_thr=0.15, d_thr=0.5,
                   emb_limit=10000):
    """GSD (junhyukso/GSD scheduler/jacobi_iteration_lumina_mgpt.py SpeculativeSampler.__call__).

    p, q   : [V] target / recorded-draft distributions (post CFG + top-k softmax).
    logits : [V] target processed logits (CFG + top-k; -inf outside top-k), used only for ranking.
    Group G(x): tokens ranked within [rank(x)-7, rank(x)+7) in the ASCENDING sort of the target
    logits (<=14 tokens incl. x), kept only if |p(j)-p(x)| < 0.15 and (if all ids <= 10000)
    ||E_j - E_x||^2 < 0.5 (E = input embedding table rows, model.embed_tokens.weight[:10000]).
    Accept iff r < min(1, sum_G p / sum_G q).  On rejection: ordinary full-vocab residual
    norm(max(0, p - q)) (NOT group-based), window truncated as in SJD.
    Upstream falls back to min(1, p(x)/q(x)) when the slice is empty (rank(x) < 7 gives a
    negative slice start in torch) -- reproduced here.
    Returns (accepted: bool, token).
    """
    order = np.argsort(logits, kind="stable")           # ascending like torch.sort
    cur = int(np.nonzero(order == x)[0][0])
    lo, hi = cur - half, cur + half
    grp = order[lo:hi]                                  # python slicing == torch slicing here
    if grp.size == 0:
        ratio = min(1.0, p[x] / q[x])
    else:
        mask = np.abs(p[grp] - p[x]) < p_thr
        if emb_dist is not None and grp.max() <= emb_limit:
            mask &= emb_dist[x, grp] < d_thr
        ratio = min(1.0, (p[grp] * mask).sum() / (q[grp] * mask).sum())
    if r < ratio:
        return True, x
    return False, rng.choice(len(p), p=residual(p, q))


# --------------------------------------------------------------------------------------
# self-checks
# --------------------------------------------------------------------------------------
class ToyAR:
    """N-position AR model over V symbols with random, strongly context-dependent conditionals."""

    def __init__(self, N, V, rng, sharp=2.5):
        self.N, self.V = N, V
        self.tab = {}
        self.rng = rng
        self.sharp = sharp

    def p(self, prefix):
        key = tuple(prefix)
        if key not in self.tab:
            z = self.rng.normal(size=self.V) * self.sharp
            e = np.exp(z - z.max())
            self.tab[key] = e / e.sum()
        return self.tab[key]

    def exact(self):
        import itertools
        out = {}
        for s in itertools.product(range(self.V), repeat=self.N):
            pr = 1.0
            for k in range(self.N):
                pr *= self.p(s[:k])[s[k]]
            out[s] = pr
        return out


def simulate(model, method, rng, init="onehot"):
    """Full SJD-family decode of one sequence; window covers all remaining positions.
    method in {'ar','sjd','mc','mc_upstream','gumbel'}."""
    N, V = model.N, model.V
    if method == "ar":
        s = []
        for k in range(N):
            s.append(rng.choice(V, p=model.p(s)))
        return tuple(s)
    c = []
    d, qd = sjd_init_drafts(N, np.arange(V), V, rng, q_kind=init)
    d, qd = list(d), list(qd)
    g = -np.log(-np.log(rng.random((N, V)) + 1e-9) + 1e-9)   # per-absolute-position noise
    while len(c) < N:
        n0 = len(c)
        seq = c + d                                         # d covers positions n0..N-1
        P = [model.p(seq[:k]) for k in range(n0, N)]
        rej = None
        for j, k in enumerate(range(n0, N)):
            x = d[j]
            if rng.random() < min(1.0, P[j][x] / qd[j][x]):
                c.append(x)
            else:
                c.append(rng.choice(V, p=residual(P[j], qd[j])))
                rej = j
                break
        if rej is None:
            break
        nd, nq = [], []
        for j in range(rej + 1, N - n0):
            if method == "sjd":
                nd.append(rng.choice(V, p=P[j])); nq.append(P[j])
            elif method == "gumbel":
                nd.append(gumbel_coupled_draw(P[j], g[n0 + j])); nq.append(P[j])
            elif method in ("mc", "mc_upstream"):
                t, qq = mc_coupled_redraw(d[j], qd[j], P[j], rng.random(), rng,
                                          upstream_q=(method == "mc_upstream"))
                nd.append(t); nq.append(qq)
        d, qd = nd, nq
    return tuple(c)


def tv_from_counts(counts, exact, M):
    return 0.5 * sum(abs(counts.get(s, 0) / M - pr) for s, pr in exact.items())


def main():
    rng = np.random.default_rng(0)

    # 1. tiny random example of one SJD iteration
    L, V = 5, 6
    p = rng.dirichlet(np.ones(V), size=L)
    q = rng.dirichlet(np.ones(V), size=L)
    x = [0] + [int(rng.choice(V, p=q[i])) for i in range(1, L)]
    u = rng.random(L)
    y = [int(rng.choice(V, p=p[j])) for j in range(L)]
    em, ct, cq = sjd_iteration(p, q, x, u, y, rng)
    assert 1 <= len(em) <= L and len(em) + len(ct) == L and cq.shape == (len(ct), V)
    print(f"[1] sjd_iteration: x={x} emitted={em} carry={ct}")

    # 2. single-token losslessness of the residual rule, exact (enumeration over x and accept)
    pp, qq = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    out = np.zeros(V)
    for xi in range(V):
        a = min(1.0, pp[xi] / qq[xi])
        out[xi] += qq[xi] * a
        out += qq[xi] * (1 - a) * residual(pp, qq)
    print(f"[2] exact single-step output == p: max|diff| = {np.abs(out - pp).max():.2e}")
    assert np.allclose(out, pp)
    # maximal coupling keeps x with prob 1-TV
    keep = sum(qq[i] * min(1.0, pp[i] / qq[i]) for i in range(V))
    assert abs(keep - (1 - 0.5 * np.abs(pp - qq).sum())) < 1e-12

    # 3. full-loop Monte Carlo on a toy 4-position AR model (window = whole sequence)
    model = ToyAR(N=4, V=3, rng=np.random.default_rng(1))
    exact = model.exact()
    M = 60000
    res = {}
    for method in ["ar", "sjd", "gumbel", "mc", "mc_upstream"]:
        r2 = np.random.default_rng(123)
        counts = {}
        for _ in range(M):
            s = simulate(model, method, r2)
            counts[s] = counts.get(s, 0) + 1
        res[method] = tv_from_counts(counts, exact, M)
        # chi-square vs exact over cells with expected count >= 5 (tiny cells make chi2 unreliable)
        big = [s for s, pr in exact.items() if M * pr >= 5]
        chi2 = sum((counts.get(s, 0) - M * exact[s]) ** 2 / (M * exact[s]) for s in big)
        print(f"[3] {method:12s} TV(empirical, exact) = {res[method]:.4f}   "
              f"chi2 = {chi2:7.1f} on {len(big) - 1} dof")
    print("    (ar = plain sampling = Monte-Carlo noise floor; unbiased => chi2 ~ dof +- sqrt(2 dof))")
    # single-step SJD-style GSD check on a random example
    logits = np.log(pp)
    acc, tok = gsd_accept_one(pp, qq, logits, int(np.argmax(pp)), 0.5, rng)
    print(f"[4] gsd_accept_one on a toy vector: accepted={acc} token={tok}")


if __name__ == "__main__":
    main()
