#!/usr/bin/python3
"""VVS reference formulas (arXiv 2511.13587; HyattDD/VVS models/skip_utils_llamagen.py and
EAGLE-2's candidate order), restated here for tests/test_vvs.c, and the fixture they make:

    /usr/bin/python3 tools/ref/vvs_ref.py            # writes tests/golden/vvs/cases.txt
    /usr/bin/python3 tools/ref/vvs_ref.py --check    # recompute, compare with committed

What is restated (our reading of the reference code, written for this project):
  * candidate order: one candidate per leaf; each is the root-to-leaf list of node indices
    (-1 padded) and the list is sorted lexicographically with -1 counted as larger than any
    node (EAGLE-2's retrieve_indices sort when sampling);
  * similarity (compute_similarity_pytorch_jit, mode exp_decay): every second candidate;
    each path's drafted tokens (the root dropped) embedded with the codebook, zero-padded to
    the longest path, L2-normalised; per position the cosine where both paths have a token,
    else 0; weights decay^l normalised over the longest path's positions; the mean over
    pairs i < j; fewer than two paths -> 0.0;
  * the per-pair variant (vvs norm=pair): weights normalised over the positions both paths
    have, a single path -> 1.0;
  * reused features (retrieve_features, policy reuse_prev): with a cache of n entries (0 the
    oldest), optionally `staleness` entries older (the cache cut by that many at the end),
    gamma tokens take the gamma most recent entries, or, when there are fewer, the cache in
    order and its last entry repeated.

Fixture format (text, one record per line group):
  codebook V D / V lines of D floats
  sim n alpha / parents (n-1 ints, nodes 1..n-1) / tokens (n ints) / longest pair
  slots n_fcache staleness gamma s_0 .. s_{gamma-1}
"""

import argparse
import os
import sys

import torch
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "golden", "vvs", "cases.txt")


def candidate_paths(parents):
    """Root-to-leaf node-index paths in the reference code's order."""
    n = len(parents)
    has_child = [False] * n
    for i in range(1, n):
        has_child[parents[i]] = True
    paths = []
    for i in range(1, n):
        if has_child[i]:
            continue
        p = [i]
        while p[-1] != 0:
            p.append(parents[p[-1]])
        paths.append(list(reversed(p)))
    big = n + 5
    width = max(len(p) for p in paths)
    return sorted(paths, key=lambda p: p + [big] * (width - len(p)))


def similarity_longest(paths, tokens, codebook, decay):
    seqs = [codebook[torch.tensor([tokens[x] for x in p[1:]], dtype=torch.long)]
            for p in paths[::2]]
    if len(seqs) < 2:
        return 0.0
    n, longest = len(seqs), max(s.shape[0] for s in seqs)
    padded = torch.zeros(n, longest, codebook.shape[1], dtype=torch.float64)
    valid = torch.zeros(n, longest, dtype=torch.float64)
    for i, s in enumerate(seqs):
        padded[i, :s.shape[0]] = s
        valid[i, :s.shape[0]] = 1.0
    unit = F.normalize(padded, p=2.0, dim=2)
    cos = torch.einsum("nld,mld->lnm", unit, unit)
    both = valid.T[:, :, None] * valid.T[:, None, :]
    w = decay ** torch.arange(longest, dtype=torch.float64)
    w = w / w.sum()
    sim = torch.einsum("l,lnm->nm", w, cos * both)
    iu = torch.triu_indices(n, n, offset=1)
    return float(sim[iu[0], iu[1]].mean())


def similarity_pair(paths, tokens, codebook, decay):
    sub = paths[::2]
    if len(sub) < 2:
        return 1.0
    total, pairs = 0.0, 0
    for i in range(len(sub)):
        for j in range(i + 1, len(sub)):
            a = [tokens[x] for x in sub[i][1:]]
            b = [tokens[x] for x in sub[j][1:]]
            m = min(len(a), len(b))
            w = decay ** torch.arange(m, dtype=torch.float64)
            c = F.cosine_similarity(codebook[a[:m]], codebook[b[:m]], dim=1)
            total += float((w * c).sum() / w.sum())
            pairs += 1
    return total / pairs


def stale_slots(n_fcache, staleness, gamma):
    cache = torch.arange(n_fcache)
    if staleness > 0:
        cache = cache[:-staleness]
    if gamma <= cache.shape[0]:
        return cache[cache.shape[0] - gamma:].tolist()
    return torch.cat([cache, cache[-1:].repeat(gamma - cache.shape[0])]).tolist()


def random_tree(g, n, max_depth):
    parents, depth = [-1], [0]
    for i in range(1, n):
        while True:
            p = int(torch.randint(0, i, (1,), generator=g))
            if depth[p] < max_depth:
                break
        parents.append(p)
        depth.append(depth[p] + 1)
    return parents


def build():
    g = torch.Generator().manual_seed(16)
    V, D = 12, 5
    # positive entries: every cosine is > 0, so each similarity can be bracketed by
    # thresholds in [0, 1]; rows of unequal length, so normalisation matters
    codebook = (0.05 + torch.rand(V, D, generator=g)).to(torch.float32).to(torch.float64)
    lines = ["codebook %d %d" % (V, D)]
    lines += [" ".join("%.9g" % v for v in row.tolist()) for row in codebook]
    trees = [[-1, 0, 1, 2], [-1, 0, 0], [-1, 0, 1, 0, 3, 4]]  # chain; two leaves; unequal
    for _ in range(9):
        trees.append(random_tree(g, int(torch.randint(5, 16, (1,), generator=g)), 5))
    for k, parents in enumerate(trees):
        n = len(parents)
        tokens = torch.randint(0, V, (n,), generator=g).tolist()
        alpha = [0.9, 0.5, 1.0][k % 3]
        paths = candidate_paths(parents)
        lines.append("sim %d %.9g" % (n, alpha))
        lines.append(" ".join(str(p) for p in parents[1:]))
        lines.append(" ".join(str(t) for t in tokens))
        lines.append("%.9g %.9g" % (similarity_longest(paths, tokens, codebook, alpha),
                                    similarity_pair(paths, tokens, codebook, alpha)))
    for n_fcache, staleness, gamma in [(10, 0, 3), (10, 2, 3), (4, 0, 4), (2, 0, 4), (5, 3, 3),
                                       (6, 1, 1), (1, 0, 3)]:
        s = stale_slots(n_fcache, staleness, gamma)
        lines.append("slots %d %d %d %s" % (n_fcache, staleness, gamma,
                                            " ".join(str(x) for x in s)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file")
    args = ap.parse_args()
    text = build()
    if args.check:
        with open(OUT) as f:
            same = f.read() == text
        print("identical" if same else "DIFFERENT: " + OUT)
        return 0 if same else 1
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote", OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
