#!/usr/bin/python3
"""GSD's grouped acceptance as the authors' code does it, restated in numpy, and the fixture
tests/golden/gsd_ref/cases.txt that tests/test_gsd.c replays through the `gsd` plugin:

    /usr/bin/python3 tools/ref/gsd_ref.py            # writes the fixture
    /usr/bin/python3 tools/ref/gsd_ref.py --check    # recompute, compare with committed

Semantics (our own transcription from reading junhyukso/GSD
scheduler/jacobi_iteration_lumina_mgpt.py, SpeculativeSampler.__call__, arXiv 2508.07747;
no code copied). Upstream writes p for the target and q for the draft; here, as in the C
ABI, q is the target and p the draft:
  order = ascending sort of the target's processed logits; cur = rank of the draft x;
  G = order[cur - 7 : cur + 7] (Python/torch slicing: a negative start selects nothing
    for a vocabulary of at least 14 codes);
  mask = |q[G] - q[x]| < 0.15 and, when max(G) <= 10000, dist[x, G] < 0.5 with dist the
    squared L2 distances of the input token embeddings;
  accept with min(1, sum(q[G] * mask) / sum(p[G] * mask)); an empty slice makes that sum
    fail and the code falls back to min(1, q[x] / p[x]);
  after a rejection: norm(max(0, q - p)) over the whole vocabulary.
The window (7), the probability threshold (0.15) and the distance threshold are parameters
here. The project's deviation (plugins/accept/gsd.c) replaces the embedding distance by a
codebook neighbour rank: the fixture passes dist[x, j] = the rank of j in x's neighbour row
(1 = nearest, x itself 0) and the threshold k + 0.5, so upstream's test `dist < d_thr` is
exactly "j is x or one of x's k nearest codes"; the case's k is the C rule's `k`.
The logits are log(q) (-inf where q is 0, as top-k leaves them), ranked by a stable sort:
ties go by code index, the order the C rule defines (torch.sort promises none).
One-hot drafts (p NULL in the C ABI) are written as p = one-hot at x.
An empty residual (p == q) is written as all zeros.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "golden", "gsd_ref", "cases.txt")


def gsd_accept(q, p, logits, x, dist, half=7, p_thr=0.15, d_thr=0.5, emb_limit=10000):
    """Upstream's acceptance probability of draft x (q target, p draft, both [V])."""
    order = np.argsort(logits, kind="stable")
    cur = int(np.nonzero(order == x)[0][0])
    grp = order[cur - half:cur + half]
    if grp.size == 0:
        return min(1.0, q[x] / p[x])
    mask = np.abs(q[grp] - q[x]) < p_thr
    if dist is not None and grp.max() <= emb_limit:
        mask &= dist[x, grp] < d_thr
    return min(1.0, float((q[grp] * mask).sum() / (p[grp] * mask).sum()))


def residual(q, p):
    r = np.maximum(q - p, 0.0)
    s = r.sum()
    return r / s if s > 0 else np.zeros_like(r)


def table_for(V, rng):
    """A neighbour table from random codebook rows: x excluded, closest first, ties by index."""
    code = rng.standard_normal((V, 3))
    d = ((code[:, None, :] - code[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return np.argsort(d, axis=1, kind="stable")[:, :V - 1]


def rank_dist(table):
    """dist[x, j] = rank of j in x's neighbour row (1 = nearest), 0 on the diagonal."""
    V = table.shape[0]
    dist = np.zeros((V, V))
    for x in range(V):
        dist[x, table[x]] = np.arange(1, V)
    return dist


def f32(v):
    """The values as the fixture stores them (float32), back in float64."""
    return np.asarray(v, dtype=np.float32).astype(np.float64)


def dist_for(V, rng, zeros, sharp):
    a = rng.random(V) ** sharp
    if zeros:  # a filtered (top-k) distribution: some codes carry no mass, tied in the sort
        a[rng.permutation(V)[:zeros]] = 0
    return f32(a / a.sum())


def fmt(v):
    return " ".join("%.9g" % float(t) for t in v)


def cases():
    rng = np.random.default_rng(2508)
    V = 32  # at least 2 * window, so a negative slice start is empty, as in upstream's vocab
    lines = []
    n = 0
    for window in (7, 3):
        for p_thr in (0.15, 0.02):
            for latent in ("k=5", "k=31", "off"):
                for sampled in (1, 0):
                    for rep in range(3):
                        table = table_for(V, rng)
                        q = dist_for(V, rng, 4 * rep, 2 + rep)
                        p = dist_for(V, rng, 0, 2) if sampled else None
                        xs = [int(t) for t in rng.permutation(V)[:6]]
                        if latent == "off":
                            dist, d_thr = None, 0.0
                        else:
                            dist, d_thr = rank_dist(table), int(latent[2:]) + 0.5
                        params = "window=%d,p_thr=%g,%s" % (
                            window, p_thr, "latent=off" if latent == "off" else latent)
                        lines.append("case %s %d %d %d" % (params, V, sampled, len(xs)))
                        lines.append("table " + " ".join(str(int(t)) for t in table.flatten()))
                        lines.append("q " + fmt(q))
                        if sampled:
                            lines.append("p " + fmt(p))
                        logits = np.log(np.where(q > 0, q, 1.0))
                        logits[q == 0] = -np.inf
                        for x in xs:
                            pd = p if sampled else np.eye(V)[x]
                            acp = gsd_accept(q, pd, logits, x, dist, window, p_thr, d_thr, V)
                            lines.append("x %d %.9g %s" % (x, acp, fmt(residual(q, pd))))
                        n += 1
    return "# generated by tools/ref/gsd_ref.py; %d cases\n" % n + "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = cases()
    if a.check:
        same = open(OUT).read() == text
        print("identical" if same else "DIFFERENT")
        sys.exit(0 if same else 1)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
