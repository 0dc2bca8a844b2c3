#!/bin/sh
# The GPU benchmarks of docs/BENCHMARKS.md ("On a GPU"), in one run on a machine with a GPU:
#
#   tools/gpu/run_gpu_bench.sh [BUILD_DIR] [OUT_DIR] [IMAGES]
#
# BUILD_DIR defaults to build (or a tools/gpu/bundle.sh copy: then set
# LD_LIBRARY_PATH=BUILD_DIR/lib), OUT_DIR to out/gpu, IMAGES (the fmnist SD table) to 200.
# Writes OUT_DIR/costcurve-*.txt (random-weight GPT-B, GPT-L and GPT-XL shapes, bf16 and
# fp32: one-token step, 1..64-node verify with 2 CFG rows, one 256-token image) and
# OUT_DIR/fmnist-sd.{json,md} (vanilla AR against exact SD and Cool-SD with size=auto,
# interleaved per image, on the GPU) and OUT_DIR/concurrency-gpt-b.txt (8 concurrent GPT-B
# jobs against one, vspecd-bench --batch 8). DEVICE=cuda:N picks another GPU.
set -eu
BUILD=${1:-build}
OUT=${2:-out/gpu}
IMAGES=${3:-200}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
BENCH="$BUILD/vspec-bench"
PLUG="--plugins $BUILD/plugins"

# LlamaGen's shapes (autoregressive/models/gpt.py GPT_B / GPT_L / GPT_XL): LAYERSxDIMxHEADS,
# vocabulary 16384, 16x16 tokens (a 256x256 image).
for shape in gpt-b:12x768x12x16384x16 gpt-l:24x1024x16x16384x16 gpt-xl:36x1280x20x16384x16; do
  name=${shape%%:*}
  spec=${shape#*:}
  [ "$name" = gpt-b ] && spec=gpt-b
  for prec in bf16 fp32; do
    echo "== costcurve $name $prec"
    "$BENCH" costcurve --random "$spec" --label "random $name, $prec" --device "$DEVICE" \
      --precision "$prec" --min-time 0.5 --image $PLUG | tee "$OUT/costcurve-$name-$prec.txt"
  done
done

# models/fmnist: AR vs speculative decoding with size=auto, on the GPU (bf16 and fp32).
H="drafter=head"
methods="ar;sd:exact@standard:shape=static,$H,size=auto"
methods="$methods;sd:coolsd:delta=2@standard:shape=static,$H,size=auto"
methods="$methods;sd:coolsd:delta=2@standard:shape=chain,drafter=model,size=auto"
for prec in bf16 fp32; do
  echo "== fmnist SD table, $prec"
  "$BENCH" eval --model models/fmnist --methods "$methods" --images "$IMAGES" --seed 0 \
    --device "$DEVICE" --precision "$prec" $PLUG --json "$OUT/fmnist-sd-$prec.json" \
    --markdown "$OUT/fmnist-sd-$prec.md"
done

# Issue 29 item 6: 8 concurrent GPT-B jobs (AR, the model's default sampling) against one job
# alone, batched and not (three daemons on the GPU, interleaved rounds; "batched / one job" is
# the goal's ratio, at least 5x).
echo "== 8 concurrent GPT-B jobs"
"$BUILD/vspecd-bench" --gpt-b --device "$DEVICE" --batch 8 --jobs 32 --rounds 3 --method ar |
  tee "$OUT/concurrency-gpt-b.txt"
