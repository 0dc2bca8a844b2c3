#!/usr/bin/python3
"""LANTERN / LANTERN++ verification as the authors' code does it, restated in PyTorch, and
the fixture tests/golden/relaxed_ref/cases.txt that tests/test_relaxed_reference.c replays
through the `lantern` and `lanternpp` plugins with `reject=reference`:

    /usr/bin/python3 tools/ref/lantern_ref.py            # writes the fixture
    /usr/bin/python3 tools/ref/lantern_ref.py --check    # recompute, compare with committed

Semantics (our own transcription from reading jadohu/LANTERN models/ea_model_llamagen.py;
no code copied):
  EaModel.evaluate_posterior_v1 (static trees, sampled drafts; a chain is a static tree of
    width 1): at a node the target distribution g = softmax(filtered logits); each child x
    (in order, duplicates skipped) is accepted with g(A(x)) / p_c(x), p_c the conditional
    draft probability; on rejection the draft distribution of the parent with the earlier
    siblings zeroed and renormalised, then, when A(x) has a neighbour, its first k+1
    neighbours zeroed (not renormalised), is subtracted from g; g = norm(max(0, g - p')).
  EaModel.evaluate_posterior (dynamic trees, deterministic drafts, p(x) = 1): accepted with
    g(A(x)); on rejection g(x) = 0 and, when A(x) has a neighbour, the first k+1 neighbours
    too; g renormalised.
  A(x): neighbours n_1..n_k of x (nearest_latents[x, :k], x excluded); the pool is
    g(x) + cumsum up to the last index where cumsum <= delta (LANTERN) or <= (lambda - 1)
    g(x) (LANTERN++, lantern_delta > 1).
  Greedy (logits_processor None): x is accepted iff argmax of softmax(raw logits) with g(x)
    replaced by the pooled mass is x (torch.argmax: the first maximum).
An empty residual (upstream: uniform fallback) is written as all zeros.
"""

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "golden", "relaxed_ref", "cases.txt")


def pool(g, table, x, k, delta):
    """g(A(x)) and whether A(x) has a neighbour (upstream's indices != -1)."""
    px = float(g[x])  # a value: g changes in place after a rejection
    nearest = g[table[x, :k]]
    cs = torch.cumsum(nearest, dim=0)
    budget = (delta - 1) * px if delta > 1.0 else delta
    idx = (cs <= budget).nonzero(as_tuple=True)[0]
    if idx.numel() == 0:
        return px, False
    return px + float(cs[idx[-1]]), True


def node_walk(g, table, k, delta, children, draft):
    """One node of the walk: per child (accept probability, residual after rejecting it)."""
    g = g.clone()
    out = []
    tried = []
    for x in children:
        pooled, has = pool(g, table, x, k, delta)
        if draft is None:
            acp = pooled
        else:
            pc = draft.clone()
            if tried:
                pc[tried] = 0
                pc = pc / pc.sum()
            acp = pooled / pc[x]
        if draft is None:
            g[x] = 0
            if has:
                g[table[x, :k + 1]] = 0
        else:
            if has:
                pc[table[x, :k + 1]] = 0
            g = g - pc
            g[g < 0] = 0
        if g.sum() > 0:
            g = g / g.sum()
        else:
            g = torch.zeros_like(g)
        out.append((float(min(acp, 1.0)), g.clone()))
        tried.append(x)
    return out


def greedy(g, table, k, delta, x):
    pooled, _ = pool(g, table, x, k, delta)
    h = g.clone()
    h[x] = pooled
    return int(torch.argmax(h).item() == x)


def table_for(V, gen):
    """A neighbour table from random codebook rows, x excluded, closest first."""
    code = torch.randn(V, 3, generator=gen)
    d = torch.cdist(code, code)
    d.fill_diagonal_(float("inf"))
    return torch.topk(d, V - 1, dim=-1, largest=False)[1]


def dist(V, gen, zeros):
    a = torch.rand(V, generator=gen) ** 3
    if zeros:  # a filtered (top-k) distribution: some codes carry no mass
        a[torch.randperm(V, generator=gen)[:zeros]] = 0
    return (a / a.sum()).float()


def fmt(v):
    return " ".join("%.9g" % float(t) for t in v)


def cases():
    gen = torch.Generator().manual_seed(16)
    V = 12
    lines = []
    n = 0
    for rule, budgets in (("lantern", (0.05, 0.2, 0.6)), ("lanternpp", (1.5, 3.0, 20.0))):
        for delta in budgets:
            for k in (1, 3, 11):
                for sampled in (1, 0):
                    for rep in range(3):
                        table = table_for(V, gen)
                        g = dist(V, gen, rep)
                        p = dist(V, gen, 0) if sampled else None
                        children = torch.randperm(V, generator=gen)[:4].tolist()
                        res = node_walk(g, table, k, delta, children, p)
                        key = "delta" if rule == "lantern" else "lambda"
                        lines.append("case %s k=%d,%s=%g,reject=reference %d %d %d"
                                     % (rule, k, key, delta, V, sampled, len(children)))
                        lines.append("table " + " ".join(str(int(t)) for t in table.flatten()))
                        lines.append("q " + fmt(g))
                        if sampled:
                            lines.append("p " + fmt(p))
                        for x, (acp, r) in zip(children, res):
                            lines.append("sib %d %.9g %s" % (x, acp, fmt(r)))
                        lines.append("greedy " + " ".join(
                            str(greedy(g, table, k, delta, x)) for x in children))
                        n += 1
    return "# generated by tools/ref/lantern_ref.py; %d cases\n" % n + "\n".join(lines) + "\n"


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
