#!/bin/sh
# Batch-1 decode speed of vspec against karpathy/llama2.c on the same model shapes, measured
# side by side (interleaved) on this machine.
#
#   git clone https://github.com/karpathy/llama2.c /path/to/llama2.c   # not vendored here
#   tools/llama2c/compare.sh /path/to/llama2.c [RUNS] [THREADS]
#
# Shapes: GPT-B as LlamaGen builds it (12 layers, width 768, 12 heads, FFN 2048, vocab 16384,
# 256 image tokens + 1 class token) and the shipped models/fmnist target (8 layers, width 256,
# 4 heads, FFN 768, vocab 1024, 64 + 1 tokens). Both programs decode one row (no CFG) and
# compute every logit.
#   llama2.c: run.c built as its `make runomp` does (-Ofast -fopenmp -march=native),
#             OMP_NUM_THREADS=THREADS, greedy (-t 0) over the whole sequence; its
#             "achieved tok/s" line (the mean over positions 1..n).
#   vspec:    `vspec-bench costcurve --random SHAPE --sizes 1 --threads THREADS`, its
#             "batch-1 decode ... tokens/s (1 row)" line (a 1-token forward over a half-image
#             prefix, median over 1 s).
# Each of RUNS rounds (default 5) runs both, alternating which goes first; the table gives the
# medians and the median of the per-round ratios. THREADS defaults to 1. Results go to
# out/llama2c-compare-PRECISION-tTHREADS.md. PRECISION=bf16 runs vspec with bf16 weights (AMX
# on the CPU); llama2.c stays fp32, so that row compares what each program offers, not equal
# arithmetic.
set -eu
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [ ! -f "$1/run.c" ]; then
  echo "usage: $0 LLAMA2C_DIR [RUNS] [THREADS]  (LLAMA2C_DIR: a clone of karpathy/llama2.c)" >&2
  exit 2
fi
src=$1
runs=${2:-5}
threads=${3:-1}
python=${PYTHON:-/usr/bin/python3}
precision=${PRECISION:-fp32}
work=out/llama2c
mkdir -p "$work"
make -s all
${CC:-gcc} -Ofast -fopenmp -march=native "$src/run.c" -lm -o "$work/run"

# name | llama2.c: dim hidden layers heads kv_heads vocab seq | vspec --random
shapes="gpt-b:768 2048 12 12 12 16384 257:gpt-b
fmnist:256 768 8 4 4 1024 65:8x256x4x1024x8"

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

l2c_rate() { # weights seq
  OMP_NUM_THREADS=$threads "$work/run" "$1" -z "$src/tokenizer.bin" -t 0 -n "$2" -i "" \
    2>&1 >/dev/null | sed -n 's/^achieved tok\/s: *//p'
}
vspec_rate() { # shape
  ./build/vspec-bench costcurve --random "$1" --sizes 1 --min-time 1 --threads "$threads" \
    --precision "$precision" \
    2>/dev/null | sed -n 's/^batch-1 decode: *\([0-9.]*\) tokens\/s (1 row).*/\1/p'
}

out=out/llama2c-compare-$precision-t$threads.md
{
  echo "| shape | vspec ($precision) tokens/s | llama2.c tokens/s | vspec / llama2.c (median of $runs) |"
  echo "|---|---:|---:|---:|"
} > "$out.tmp"
echo "$shapes" | while IFS=: read -r name l2c shape; do
  set -- $l2c
  weights="$work/$name.bin"
  [ -f "$weights" ] || $python tools/llama2c/write_weights.py "$weights" "$@"
  seq=$7
  : > "$work/$name.runs"
  r=0
  while [ "$r" -lt "$runs" ]; do
    if [ $((r % 2)) -eq 0 ]; then
      a=$(vspec_rate "$shape"); b=$(l2c_rate "$weights" "$seq")
    else
      b=$(l2c_rate "$weights" "$seq"); a=$(vspec_rate "$shape")
    fi
    if [ -z "$a" ] || [ -z "$b" ]; then
      echo "$0: $name: a run printed no rate (vspec '$a', llama2.c '$b')" >&2
      exit 1
    fi
    echo "$a $b" >> "$work/$name.runs"
    echo "$name round $((r + 1)): vspec $a tokens/s, llama2.c $b tokens/s" >&2
    r=$((r + 1))
  done
  va=$(cut -d' ' -f1 "$work/$name.runs" | median)
  lb=$(cut -d' ' -f2 "$work/$name.runs" | median)
  ratio=$(awk '{print $1 / $2}' "$work/$name.runs" | median)
  printf '| %s | %.1f | %.1f | %.2f |\n' "$name" "$va" "$lb" "$ratio" >> "$out.tmp"
done
mv "$out.tmp" "$out"
echo "threads: $threads; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" >> "$out"
cat "$out"
