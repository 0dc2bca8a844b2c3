#!/usr/bin/env python3
"""tools/gpu/kernel_table.py on a made-up Nsight Compute CSV: ncu's own lines around the
table, a run that loads (kernels seen once), a forward of 5 kernels four times, then one of 3
kernels seven times (the last group, printed first). Each group must be found with its
period and repeats, and each kernel's duration must be the median over its forwards, in us."""
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "gpu", "kernel_table.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def row(i, name, grid, ns):
    return (f'"{i}","1","vspec-bench","h","void {name}<(int)2>(const float *, int)","1","7",'
            f'"(256, 1, 1)","({grid}, 1, 1)","0","9.0","Command line profiler metrics",'
            f'"gpu__time_duration.sum","nsecond","{ns:,}"')


def main():
    lines = ["==PROF== Connected to process 1", HEADER]
    i = 0
    for k in range(3):  # loading: each kernel once
        lines.append(row(i, f"vs_k_load{k}", 1, 5000))
        i += 1
    for rep in range(4):  # a forward of 5 kernels; the first one's median is 2500 ns, mean 4000
        for k in range(5):
            lines.append(row(i, f"vs_k_big{k}", 10 + k, (1000, 2000, 3000, 10000)[rep] if k == 0
                             else 2000))
            i += 1
    for rep in range(7):  # a forward of 3 kernels, 3000 ns each
        for k in range(3):
            lines.append(row(i, f"vs_k_small{k}", 20 + k, 3000))
            i += 1
    lines.append("==PROF== Disconnected from process 1")
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        path = f.name
    try:
        out = subprocess.run([sys.executable, TOOL, path, "--groups", "2", "--min-period", "2"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    fails = []
    want = [f"{i} kernels", "forward of 3 kernels, 7 alike", "forward of 5 kernels, 4 alike",
            "sum of kernel durations: 9.0 us a forward",  # 3 x 3 us
            "| 0 | vs_k_big0 | (10, 1, 1) | (256, 1, 1) | 2.50 |",  # median of 1, 2, 3, 10 us
            "sum of kernel durations: 10.5 us a forward"]  # 2.5 + 4 x 2 us
    for w in want:
        if w not in out:
            fails.append(w)
    if out.index("forward of 3 kernels") > out.index("forward of 5 kernels"):
        fails.append("the last group first")
    if "vs_k_load" in out:
        fails.append("kernels seen once are no forward")
    for f in fails:
        print(f"test_kernel_table: missing or wrong: {f}\n{out}")
    print(f"test_kernel_table: {'FAILED' if fails else 'passed'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
