#!/bin/sh
# Where a forward's time goes on the GPU: every kernel's duration from Nsight Compute (ncu,
# shipped with the CUDA toolkit), for the forwards vspec-bench costcurve times. Run eagerly
# (VSPEC_GRAPHS=off) so that each kernel is its own launch; ncu serialises kernels, so the
# durations are each kernel's own, and the gaps between them are not in the sum.
#
#   tools/gpu/kernels.sh [BUNDLE_DIR] [OUT_DIR] [NODES]     # there, from the repository root
#   python3 tools/gpu/kernel_table.py OUT_DIR/kernels-*.csv  # anywhere: the table per forward
#
# NODES (default 1) is the tree size of the timed forwards; SESSIONS=S adds costcurve
# --sessions S (S sessions' one-token CFG steps as one cross-job batch, timed last, so that
# the table is the batched forward's); MODEL=--random gpt-b (default) or
# MODEL="--model models/fmnist"; PRECISION=bf16 (default) or fp32; KTIMEOUT (default 240)
# limits ncu's run in seconds. About 1-2 minutes.
# KERNEL=REGEX profiles one launch of that kernel in depth instead (the launch after SKIP of
# them): speed of light, occupancy, warp states, and the source lines its warps stall on (the
# CUDA module is built with -lineinfo); the report lands in OUT_DIR too. The default SKIP,
# 310, is a timed one-token CFG step's for a once-per-layer kernel of GPT-B (12 layers) at
# NODES=1: each of the run's four sessions makes 7 forwards (prefill, two prefix forwards, a
# warm-up, three timed), the last session's with 2 rows; 200 is a 64-node prefix forward's.
set -u
B=${1:-build/gpu-bundle}
[ -x "$B/vspec-bench" ] || B=build
OUT=${2:-out/gpu-kernels}
NODES=${3:-1}
MODEL=${MODEL:---random gpt-b}
PRECISION=${PRECISION:-bf16}
mkdir -p "$OUT"
[ -d "$B/lib" ] && export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
if [ -z "$NCU" ]; then
  echo "kernels.sh: ncu (Nsight Compute) is not on this machine" >&2
  exit 77
fi
tag=$(echo "$MODEL" | tr -c 'a-zA-Z0-9\n' '-' | sed 's/^-*//')-$PRECISION-$NODES${SESSIONS:+-x$SESSIONS}
RUN="$B/vspec-bench costcurve $MODEL --device cuda --precision $PRECISION --sizes $NODES ${SESSIONS:+--sessions $SESSIONS} \
  --min-time 0.01 --plugins $B/plugins"
if [ -n "${KERNEL:-}" ]; then
  rep="$OUT/kernel-$(echo "$KERNEL" | tr -c 'a-zA-Z0-9_\n' '-')-$tag"
  VSPEC_GRAPHS=off timeout "${KTIMEOUT:-240}" "$NCU" --clock-control none -k "regex:$KERNEL" \
    --launch-skip "${SKIP:-310}" --launch-count 1 --set detailed --import-source yes \
    -f -o "$rep" $RUN >"$rep.log" 2>&1
  echo "ncu exit $? -> $rep.ncu-rep"
  "$NCU" -i "$rep.ncu-rep" --print-details all >"$rep.txt" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source cuda >"$rep-source.csv" 2>&1 ||
    echo "(this ncu prints no source page: open $rep.ncu-rep in the Nsight Compute GUI)"
  exit 0
fi
# --min-time 0.01: three timed forwards per row count; the last forwards of the run are the
# bound's one-node forwards with 2 rows (kernel_table.py finds the period from the end).
VSPEC_GRAPHS=off timeout "${KTIMEOUT:-240}" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
  --print-units base --csv $RUN >"$OUT/kernels-$tag.csv" 2>"$OUT/kernels-$tag.err"
echo "ncu exit $? -> $OUT/kernels-$tag.csv ($(wc -l <"$OUT/kernels-$tag.csv") lines)"
