#!/bin/sh
# What to run first on a lent GPU: the GPU suite, then the benchmarks behind the GPU goals
# (docs/BENCHMARKS.md, "On a GPU"), each goal printed next to its figure, then where a
# step's time goes (tools/gpu/kernels.sh). About 4-6 minutes on an H200 (2026-11-28); every
# step has its own time limit, so one that hangs cannot eat the loan, and the later steps
# (chains, concurrency, kernels) run only while the steps before them left the time.
#
#   make gpu-bundle                                  # here: build/gpu-bundle and its .tar.xz
#   tools/gpu/check.sh [BUNDLE_DIR] [OUT_DIR]        # there, from the repository root
#   tools/gpu/check.sh build/gpu-bundle.tar.xz       # the same from the packed bundle (carry
#                                                    # that one: the checkout is 48 MB already)
#
# BUNDLE_DIR defaults to build/gpu-bundle (or build where there is no bundle), OUT_DIR to
# out/gpu-check: the logs, the cost curve and the eval's JSON land there. DEVICE=cuda:N
# picks another GPU, IMAGES (default 24) sets the images per method of the fmnist table,
# SANITIZERS (default "memcheck racecheck synccheck") the compute-sanitizer tools to run.
# Exit status: that of the GPU suite (the goals are figures to record, not a pass/fail).
set -u
B=${1:-build/gpu-bundle}
case $B in # the packed bundle (make gpu-bundle writes both): unpacked beside the archive
  *.tar.xz) tar xJf "$B" -C "$(dirname "$B")" && B=${B%.tar.xz} ;;
esac
[ -x "$B/vspec-bench" ] || B=build
OUT=${2:-out/gpu-check}
DEVICE=${DEVICE:-cuda}
IMAGES=${IMAGES:-24}
SANITIZERS=${SANITIZERS-memcheck racecheck synccheck}
mkdir -p "$OUT"
# Seconds since the start (dash, the usual /bin/sh, has no $SECONDS).
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
[ -d "$B/lib" ] && export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BENCH="$B/vspec-bench"
PLUG="--plugins $B/plugins"
# size=auto tunes on this GPU into a fresh cache: a CPU's choice means nothing here.
VSPEC_CACHE_DIR=$(mktemp -d)
export VSPEC_CACHE_DIR

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2
git log -1 --format='build of %h (%cs)' 2>/dev/null

echo "== GPU suite (tools/gpu/run_gpu_tests.sh $B)"
timeout 200 tools/gpu/run_gpu_tests.sh "$B" >"$OUT/gpu-tests.log" 2>&1
suite=$?
grep -E '^== |^\[  (FAILED|PASSED|SKIPPED) |^GPU tests:|not ok|FAIL' "$OUT/gpu-tests.log" | tail -40

# Races and out-of-bounds accesses that leave results right by luck: the fused kernels and
# the device walk (a block that broadcasts thread 0's decisions through shared memory, on 3
# cases per rule) under compute-sanitizer (shipped with the CUDA toolkit; skipped where the
# machine has none).
if [ -z "$SANITIZERS" ] || [ "$(elapsed)" -ge 240 ]; then
  echo "== compute-sanitizer: skipped (SANITIZERS='$SANITIZERS', $(elapsed) s gone)"
elif command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in $SANITIZERS; do
    echo "== compute-sanitizer --tool $tool test_cuda_fused"
    VSPEC_BUILD="$B" timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$B/tests/gpu/test_cuda_fused" \
      >"$OUT/sanitizer-$tool.log" 2>&1
    echo "exit $? ($(grep -o 'ERROR SUMMARY: .*' "$OUT/sanitizer-$tool.log" || echo 'no summary'))"
    echo "== compute-sanitizer --tool $tool test_cuda_walk"
    VSPEC_BUILD="$B" VSPEC_WALK_CASES=3 timeout 40 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$B/tests/gpu/test_cuda_walk" >"$OUT/sanitizer-walk-$tool.log" 2>&1
    echo "exit $? ($(grep -o 'ERROR SUMMARY: .*' "$OUT/sanitizer-walk-$tool.log" || echo 'no summary'))"
  done
else
  echo "== compute-sanitizer: not on this machine"
fi

echo "== cost curve: random GPT-B shape, bf16, CFG"
timeout 120 "$BENCH" costcurve --random gpt-b --device "$DEVICE" --precision bf16 \
  --sizes 1,16,64 --min-time 0.2 --image --counters --sessions 1,2,4,8 $PLUG \
  >"$OUT/costcurve-gpt-b-bf16.txt" 2>&1
cat "$OUT/costcurve-gpt-b-bf16.txt"

# The kernel switches against the defaults, interleaved, twice: the generic attention kernel
# (VSPEC_CUDA_ATTENTION=generic), plain launches (VSPEC_CUDA_PDL=off) and RoPE with the KV
# stores in a kernel of their own (VSPEC_CUDA_ROPE=separate); each line is one
# costcurve: the CFG one-token step and 64-node verify in ms, one image in s.
if [ "$(elapsed)" -lt 300 ]; then
  echo "== kernel switches, GPT-B bf16 (ms: 1-node and 64-node CFG forward; s: one image)"
  for rep in 1 2; do
    for sw in VSPEC_CUDA_ATTENTION=auto VSPEC_CUDA_ATTENTION=generic VSPEC_CUDA_PDL=off \
      VSPEC_CUDA_ROPE=separate; do
      env "$sw" timeout 60 "$BENCH" costcurve --random gpt-b --device "$DEVICE" --precision bf16 \
        --sizes 1,64 --min-time 0.2 --image $PLUG 2>&1 |
        awk -F'|' -v sw="$sw" '$2+0 == 1 && NF > 7 {one = $6} $2+0 == 64 && NF > 7 {v = $6}
          /^one image/ {split($0, a, ": "); split(a[2], b, " "); img = b[1]}
          END {gsub(/ /, "", one); gsub(/ /, "", v); printf "%-30s %s ms, %s ms, %s s\n", sw, one, v, img}'
    done
  done | tee "$OUT/switches.txt"
fi

echo "== models/fmnist: AR against SD with size=auto, bf16, $IMAGES images"
timeout 150 "$BENCH" eval --model models/fmnist --images "$IMAGES" --seed 0 --no-quality \
  --device "$DEVICE" --precision bf16 $PLUG --json "$OUT/fmnist-sd.json" \
  --methods "ar;sd:exact;sd:coolsd:delta=2" >"$OUT/fmnist-sd.txt" 2>&1
tail -12 "$OUT/fmnist-sd.txt"

# Issue 29 item 5: chains and a static tree (ABI 1.10) drawn on the device (a round waits once)
# against drawn on the host (a wait per draft forward), the same methods, fp32 so that the
# tokens are comparable.
STATIC="sd:coolsd:delta=2@standard:shape=static,tree=fmnist,drafter=head"
CHAINS="ar;sd:exact@standard:shape=chain,depth=4,drafter=model;sd:coolsd:delta=2@standard:shape=chain,depth=5,drafter=model;sd:exact@standard:shape=chain,depth=4,drafter=head;$STATIC"
for d in host device; do
  if [ "$(elapsed)" -ge 420 ]; then
    echo "== fmnist chains drawn on the $d: skipped ($(elapsed) s gone)"
    continue
  fi
  echo "== models/fmnist chains, drafts drawn on the $d (VSPEC_DRAFT_DRAW=$d), $IMAGES images"
  VSPEC_DRAFT_DRAW=$d timeout 95 "$BENCH" eval --model models/fmnist --images "$IMAGES" \
    --seed 0 --no-quality --device "$DEVICE" $PLUG --json "$OUT/fmnist-draw-$d.json" \
    --methods "$CHAINS" >"$OUT/fmnist-draw-$d.txt" 2>&1
  tail -7 "$OUT/fmnist-draw-$d.txt"
done

# Issue 29 item 6: 8 concurrent GPT-B jobs (random weights, VQ-16 decoder, AR) on one
# GPU: one job alone, 8 workers with a stream each, and 8 workers batched through the forward
# gate (three daemons, interleaved). Only while the loan has time left for it (about 2-3
# minutes): the steps above come first.
if [ "$(elapsed)" -lt 480 ]; then
  echo "== 8 concurrent GPT-B jobs (vspecd-bench --gpt-b --batch 8)"
  timeout 240 "$B/vspecd-bench" --gpt-b --device "$DEVICE" --batch 8 --jobs 16 --rounds 1 \
    --method ar >"$OUT/concurrency-gpt-b.txt" 2>&1
  tail -14 "$OUT/concurrency-gpt-b.txt"
  # the batches without the batch ops of ABI 1.9 (an op per session), for the A/B
  if [ "$(elapsed)" -lt 400 ]; then
    echo "== the same, batches without the batch ops (VSPEC_MULTI=sessions)"
    VSPEC_MULTI=sessions timeout 120 "$B/vspecd-bench" --gpt-b --device "$DEVICE" --batch 8 \
      --jobs 16 --rounds 1 --method ar >"$OUT/concurrency-gpt-b-sessions.txt" 2>&1
    grep '^| batched' "$OUT/concurrency-gpt-b-sessions.txt"
  fi
  if [ "$(elapsed)" -lt 420 ]; then
    echo "== the same, batches eager (VSPEC_MULTI_GRAPHS=off)"
    VSPEC_MULTI_GRAPHS=off timeout 120 "$B/vspecd-bench" --gpt-b --device "$DEVICE" --batch 8 \
      --jobs 16 --rounds 1 --method ar >"$OUT/concurrency-gpt-b-eager.txt" 2>&1
    grep '^| batched' "$OUT/concurrency-gpt-b-eager.txt"
  fi
else
  echo "== 8 concurrent GPT-B jobs: skipped ($(elapsed) s gone; run it alone, docs/BENCHMARKS.md)"
fi

# kernel_table TIMEOUT TITLE NODES [SESSIONS]: tools/gpu/kernels.sh, then the summary of its
# table (kernel_table.py), kept as kernels-table-TAG.txt
kernel_table() {
  tag=random-gpt-b-bf16-$3${4:+-x$4}
  echo "== kernels of $2"
  SESSIONS=${4:-} KTIMEOUT=$1 tools/gpu/kernels.sh "$B" "$OUT" "$3"
  python3 tools/gpu/kernel_table.py "$OUT/kernels-$tag.csv" --groups 1 \
    >"$OUT/kernels-table-$tag.txt" 2>&1
  grep -v '^| [0-9]' "$OUT/kernels-table-$tag.txt" | head -16
}

# Where a step's time goes: each kernel of a GPT-B one-token CFG step and its duration
# (Nsight Compute, eager), the same for a 64-node verify (128 rows: the tensor-core path, the
# goal furthest from its figure) and for a cross-job batch of 8 sessions (item 6's forward),
# then the attention kernel in depth (stall reasons by source line), while the loan has time;
# docs/BENCHMARKS.md "On a GPU" has the last table.
if [ "$(elapsed)" -lt 420 ]; then
  kernel_table 90 "a GPT-B step" 1
  [ "$(elapsed)" -lt 460 ] && kernel_table 60 "a GPT-B 64-node verify" 64
  [ "$(elapsed)" -lt 475 ] && kernel_table 60 "a GPT-B batch of 8 one-token CFG steps" 1 8
  if [ "$(elapsed)" -lt 490 ]; then
    KERNEL=tree_attention KTIMEOUT=60 tools/gpu/kernels.sh "$B" "$OUT" 1
  fi
else
  echo "== kernels of a GPT-B step: skipped ($(elapsed) s gone)"
fi

# ---- goals against figures ------------------------------------------------------------
cc="$OUT/costcurve-gpt-b-bf16.txt"
# the 2-row (CFG) column of the latency table: | nodes | 1 row ms | ... | 2 rows ms | ...
step=$(awk -F'|' '$2+0 == 1 && NF > 7 {gsub(/ /, "", $6); print $6; exit}' "$cc" 2>/dev/null)
v64=$(awk -F'|' '$2+0 == 64 && NF > 7 {gsub(/ /, "", $6); print $6; exit}' "$cc" 2>/dev/null)
bound=$(sed -n 's/.*bandwidth bound: .*(\([0-9.]*\) ms per forward).*/\1/p' "$cc" | head -1)
image=$(sed -n 's/^one image by AR with CFG.*: \([0-9.]*\) s .*/\1/p' "$cc" | head -1)
ops=$(awk -F'|' '$2+0 == 1 && $3+0 == 2 && NF == 10 {gsub(/ /, "", $4); print $4; exit}' "$cc")
speed() { # METHOD -> speed-up over AR from the eval's JSON
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
hit = [m for m in d["methods"] if m["requested"].split("@")[0] == sys.argv[2]]
print("%.2fx as %s" % (hit[0]["speedup_vs_ar"], hit[0]["method"]) if hit else "-")' \
    "$OUT/fmnist-sd.json" "$1" 2>/dev/null || echo -
}
ratio() { python3 -c 'import sys; a,b=sys.argv[1:3]; print(f"{float(a)/float(b):.2f}x")' "$1" "$2" 2>/dev/null || echo -; }

echo
echo "== goals (issue 29) and this run's figures"
printf '%-52s | %s\n' "goal" "figure"
printf '%-52s | %s\n' "GPU suite passes" "$(grep '^GPU tests:' "$OUT/gpu-tests.log" || echo "no summary (exit $suite)")"
printf '%-52s | %s\n' "GPT-B bf16, one 256-token image, CFG: <= 0.10 s" "${image:--} s"
printf '%-52s | %s\n' "one-token CFG step <= 2x weights/bandwidth" "${step:--} ms, bound ${bound:--} ms: $(ratio "${step:-x}" "${bound:-x}")"
printf '%-52s | %s\n' "64-node CFG verify <= 1.25x a one-token step" "${v64:--} ms: $(ratio "${v64:-x}" "${step:-x}")"
printf '%-52s | %s\n' "ops of a one-token CFG step: 1 graph (eager 5 x 12 + 3)" "${ops:--}"
printf '%-52s | %s\n' "fmnist exact SD (size=auto) >= 2x AR" "$(speed sd:exact)"
printf '%-52s | %s\n' "fmnist Cool-SD delta=2 (size=auto) >= 2.5x AR" "$(speed sd:coolsd:delta=2)"
for d in host device; do
  for m in "sd:exact@standard:shape=chain,depth=4,drafter=model" "$STATIC"; do
    case $m in *static*) what="Cool-SD static tree, head" ;; *) what="exact chain 4, draft GPT" ;; esac
    printf '%-52s | %s\n' "fmnist $what, drawn on the $d" \
      "$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
hit = [m for m in d["methods"] if m["requested"].startswith(sys.argv[2])]
print("%.2fx over AR" % hit[0]["speedup_vs_ar"] if hit else "-")' "$OUT/fmnist-draw-$d.json" "$m" 2>/dev/null || echo -)"
  done
done
conc=$(sed -n 's/^| batched \/ one job | \([0-9.]*x\) .*/\1/p' "$OUT/concurrency-gpt-b.txt" 2>/dev/null)
wconc=$(sed -n 's/^| workers \/ one job | \([0-9.]*x\) .*/\1/p' "$OUT/concurrency-gpt-b.txt" 2>/dev/null)
printf '%-52s | %s\n' "8 concurrent GPT-B jobs >= 5x one job" "${conc:--} batched, ${wconc:--} unbatched"
# the sessions table's last column at 8: what the batched forward alone allows
fwd8=$(awk -F'|' '$2+0 == 8 && NF == 7 {gsub(/ /, "", $6); print $6; exit}' "$cc" 2>/dev/null)
printf '%-52s | %s\n' "  8 lone forwards / one batched forward of 8" "${fwd8:--}"
echo "(logs in $OUT)"
exit $suite
