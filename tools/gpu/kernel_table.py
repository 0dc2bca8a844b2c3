#!/usr/bin/env python3
"""The kernels of one forward and their durations, from tools/gpu/kernels.sh's ncu CSV.

ncu lists every kernel of the run in launch order. A timed forward repeats the same kernels
(name and grid), so reading from the end, the run splits into groups of identical forwards;
each group is printed once, with each kernel's median duration over the group's forwards.

    python3 tools/gpu/kernel_table.py out/gpu-kernels/kernels-*.csv [--groups N]
"""
import argparse
import csv
import statistics
import sys


def read(path):
    """[(signature, short name, grid, block, ns)] in launch order."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0].split("<")[0].strip()
        name = name.replace("void ", "")
        grid, block = r.get("Grid Size", ""), r.get("Block Size", "")
        ns = float(r["Metric Value"].replace(",", ""))
        rows.append(((name, grid, block), name, grid, block, ns))
    return rows


def same(sig, a, b, n):
    for i in range(n):
        if sig[a + i] != sig[b + i]:
            return False
    return True


def groups(rows, max_period=2000):
    """Groups of repeated forwards, last first: (start, period, repeats)."""
    sig = [r[0] for r in rows]
    end, out = len(sig), []
    while end > 0:
        found = None
        for p in range(1, min(max_period, end // 2) + 1):
            if same(sig, end - 2 * p, end - p, p):
                found = p
                break
        if not found:
            end -= 1
            continue
        k = 1
        while end - (k + 1) * found >= 0 and same(sig, end - (k + 1) * found, end - found, found):
            k += 1
        out.append((end - k * found, found, k))
        end -= k * found
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--groups", type=int, default=3, help="groups to print, last first")
    ap.add_argument("--min-period", type=int, default=8,
                    help="ignore repeats shorter than this many kernels")
    a = ap.parse_args()
    for path in a.csv:
        rows = read(path)
        print(f"\n## {path}: {len(rows)} kernels")
        shown = 0
        for start, p, k in groups(rows):
            if p < a.min_period or k < 2 or shown >= a.groups:
                continue
            shown += 1
            total = 0.0
            print(f"\nforward of {p} kernels, {k} alike (kernels {start}..{start + p * k - 1})\n")
            print("| # | kernel | grid | block | us (median) |")
            print("|--:|---|---|---|--:|")
            by_name = {}
            for i in range(p):
                ns = statistics.median(rows[start + j * p + i][4] for j in range(k))
                _, name, grid, block, _ = rows[start + i]
                total += ns
                by_name[name] = by_name.get(name, 0.0) + ns
                print(f"| {i} | {name} | {grid} | {block} | {ns / 1e3:.2f} |")
            print(f"\nsum of kernel durations: {total / 1e3:.1f} us a forward")
            for name, ns in sorted(by_name.items(), key=lambda x: -x[1]):
                print(f"  {name}: {ns / 1e3:.1f} us ({100 * ns / total:.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
