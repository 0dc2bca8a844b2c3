#!/bin/sh
# The benchmark tables of docs/BENCHMARKS.md, reproducible:
#
#   tools/run_benchmarks.sh sd  [IMAGES]   speculative decoding: exact, LANTERN, LANTERN++,
#                                          UniformRSD, Cool-SD, fixed trees and tree=auto
#   tools/run_benchmarks.sh vvs [IMAGES]   VVS: uniform and dynamic skipping, ablations
#   tools/run_benchmarks.sh claims [IMAGES]  the rows the papers' claims are judged on (AR, best
#                                          exact, Cool-SD, LANTERN, LANTERN++, VVS); 5000
#                                          images unless IMAGES is given
#   tools/run_benchmarks.sh cspd [IMAGES]  continuous SD on models/fmnist-mar, exact: draft
#                                          lengths 4/8/16 x pre-fill 0.05/0.15, against MAR's
#                                          sampler (the target alone)
#   tools/run_benchmarks.sh cspd-lenient [IMAGES]  the same with the reference's tau = 42
#   tools/run_benchmarks.sh mar-cfg [IMAGES]   the CFG sweep behind models/fmnist-mar's default
#                                          (the target alone, CFG 1.5 / 2 / 3 / 4)
#   tools/run_benchmarks.sh cspd-steps [IMAGES]  the target alone at 16, 8 and 4 generation
#                                          steps (one run each: num_iter is per run), and at
#                                          64 on other seeds (the noise between image sets)
#   tools/run_benchmarks.sh sjd [IMAGES]   drafting without a draft model: Speculative Jacobi
#                                          Decoding with each coupling, SJD-PAC's tree, Cool-SD
#                                          and GSD over its drafts, next to the best drafter-based
#                                          rows (MODEL=DIR for a model that has no drafter: the
#                                          drafter rows are left out; a random GPT-B-shaped
#                                          checkpoint: tools/random_llamagen.py DIR)
#   tools/run_benchmarks.sh coverage [IMAGES] [SETS]  the coverage of eval's intervals: SETS
#                                          (default 20) pairs of disjoint sets of IMAGES AR
#                                          images compared as a method with AR; features cached
#                                          in out/coverage-IMAGES.bin (a stopped run goes on)
#
# Results go to out/bench-<table>.{json,md,png}; each names its machine (CPU model, the
# instruction set the CPU kernels ran, precision, threads, the GPU where one generated). IMAGES defaults to 1000; one compute thread
# (THREADS=N to change); fp32 weights (PRECISION=bf16 for bf16, AMX on the CPU); SUFFIX=-x
# names the outputs out/bench-<table>-x.*. Every ratio is measured interleaved within one run; on 2 cores the
# two tables can run side by side, one core each, with nothing else heavy beside them.
set -eu
cd "$(dirname "$0")/.."
table=${1:-sd}
images=${2:-1000}
model=${MODEL:-models/fmnist}
mkdir -p out

# Trees. Fixed: the static `fmnist` tree (15 nodes, depth 4) with the EAGLE head, the tree
# every rule is compared on (named with tree=fmnist: a rule on the standard scheduler that names
# no size gets size=auto). EAGLE-2's dynamic tree is measured at total_tokens=16: at LANTERN's
# default size (58) a round costs about 4x more on this CPU (two CFG rows x 59 nodes per target
# forward), which no acceptance gain pays back. size=auto: the size that maximises expected
# tokens/s from the measured cost curve and acceptance per depth.
#
# LANTERN's rows: reject=reference is the authors' residual (jadohu/LANTERN,
# evaluate_posterior_v1 on these sampled static trees), the rows that stand for the paper;
# reject=set is the project's variant (exact SD against the relaxed target). lanternpp's
# default is the authors' residual already.
H="drafter=head"
S="shape=static,tree=fmnist,$H"
L1="sd:lantern:k=100,delta=0.1,reject=reference"
L2="sd:lantern:k=100,delta=0.2,reject=reference"
case "$table" in
  sd)
    methods="ar"
    methods="$methods;sd:exact@standard:shape=chain,depth=3,drafter=model"
    methods="$methods;sd:exact@standard:$S"
    methods="$methods;sd:exact@standard:shape=dynamic,total_tokens=16,$H"
    methods="$methods;$L2@standard:$S"
    methods="$methods;sd:lantern:k=100,delta=0.2,reject=set@standard:$S"
    methods="$methods;$L2@standard:shape=dynamic,total_tokens=16,$H"
    methods="$methods;sd:lanternpp:lambda=2@standard:$S"
    methods="$methods;sd:uniform_rsd:omega=2@standard:$S"
    methods="$methods;sd:coolsd:delta=1.1@standard:$S"
    methods="$methods;sd:coolsd:delta=2@standard:$S"
    methods="$methods;sd:exact@standard:shape=static,$H,size=auto"
    methods="$methods;$L2@standard:shape=static,$H,size=auto"
    methods="$methods;sd:lanternpp:lambda=2@standard:shape=static,$H,size=auto"
    methods="$methods;sd:coolsd:delta=2@standard:shape=static,$H,size=auto"
    methods="$methods;sd:coolsd:delta=2@standard:shape=chain,drafter=model,size=auto"
    # Cool-SD's one knob past the paper's settings (1.1, 2): more relaxation early in the
    # chain, still annealed to below 1 at its end
    methods="$methods;sd:coolsd:delta=3@standard:shape=chain,drafter=model,size=auto"
    methods="$methods;sd:coolsd:delta=4@standard:shape=chain,drafter=model,size=auto"
    # the chain docs/BENCHMARKS.md's 2.5x claim rests on, fixed (size=auto's cost curve is as
    # noisy as the machine)
    methods="$methods;sd:coolsd:delta=3@standard:shape=chain,drafter=model,depth=5"
    ;;
  vvs)
    # LANTERN and VVS on the same fixed tree, so the forward counts compare like for like.
    # The VVS scheduler never auto-sizes; its defaults are the reference code's (norm=longest,
    # phase=round, select=uniform).
    T="shape=static,tree=fmnist,$H"
    methods="ar"
    for lt in "$L1" "$L2"; do
      methods="$methods;$lt@standard:$T"
      for i in 2 3 4; do
        methods="$methods;$lt@vvs:skip=uniform,interval=$i,$T"
      done
      for s in 0.70 0.75 0.80; do
        methods="$methods;$lt@vvs:skip=dynamic,threshold=$s,$T"
      done
    done
    # VVS with Cool-SD (no paper has tried it), against Cool-SD alone
    methods="$methods;sd:coolsd:delta=2@standard:$T"
    methods="$methods;sd:coolsd:delta=2@vvs:skip=uniform,interval=3,$T"
    methods="$methods;sd:coolsd:delta=2@vvs:skip=dynamic,threshold=0.75,$T"
    # ablations (the paper's Table 2): selection x truncation, VVS-U interval 3, delta 0.1
    ab="$L1@vvs:skip=uniform,interval=3,$T"
    methods="$methods;$ab,select=confidence"
    methods="$methods;$ab,truncate=off"
    methods="$methods;$ab,select=confidence,truncate=off"
    # feature staleness (Tables 3/5 analogues): own features, blend, one step staler
    methods="$methods;$ab,features=draft"
    methods="$methods;$ab,features=blend"
    methods="$methods;$ab,staleness=1"
    ;;
  claims)
    # The rows the conclusions of docs/BENCHMARKS.md rest on, at 5000 images by default so that
    # their bootstrap intervals can call each paper's claim: AR, the best exact method
    # (size=auto), Cool-SD, LANTERN and LANTERN++ (the authors' residuals), VVS (uniform
    # skipping over LANTERN, the paper's default interval).
    [ $# -ge 2 ] || images=5000
    methods="ar"
    methods="$methods;sd:exact@standard:shape=static,$H,size=auto"
    methods="$methods;sd:coolsd:delta=2@standard:shape=chain,drafter=model,size=auto"
    methods="$methods;sd:coolsd:delta=4@standard:shape=chain,drafter=model,size=auto"
    methods="$methods;sd:coolsd:delta=3@standard:shape=chain,drafter=model,depth=5"
    methods="$methods;sd:coolsd:delta=2@standard:$S"
    methods="$methods;$L2@standard:$S"
    methods="$methods;sd:lanternpp:lambda=2@standard:$S"
    methods="$methods;$L1@vvs:skip=uniform,interval=3,$S"
    ;;
  sjd)
    J="sd:exact@standard:drafter=jacobi"
    methods="ar"
    methods="$methods;$J,init=random"            # SJD as its authors run it
    methods="$methods;$J"
    methods="$methods;$J,coupling=gumbel"
    methods="$methods;$J,coupling=maximal"
    methods="$methods;$J,coupling=maximal,depth=7"
    methods="$methods;$J,coupling=maximal,depth=3"
    methods="$methods;$J,coupling=maximal,continue=3x3"
    methods="$methods;$J,coupling=maximal,continue=3x3,depth=7"
    # lossy rules over the same drafts: Cool-SD, and GSD (which upstream runs inside SJD)
    methods="$methods;sd:coolsd:delta=2@standard:drafter=jacobi,coupling=maximal,depth=7"
    methods="$methods;sd:gsd@standard:drafter=jacobi,init=random"
    methods="$methods;sd:gsd@standard:drafter=jacobi,coupling=maximal"
    if [ -z "${MODEL:-}" ]; then
      methods="$methods;sd:exact@standard:shape=chain,depth=3,drafter=model"
      methods="$methods;sd:coolsd:delta=3@standard:shape=chain,drafter=model,depth=5"
    fi
    ;;
  cspd | cspd-lenient)
    model=${MODEL:-models/fmnist-mar}
    rule="sd:continuous"
    [ "$table" = cspd ] || rule="sd:continuous:tau=42"
    methods="ar"
    for p in 0.05 0.15; do
      for L in 4 8 16; do
        methods="$methods;$rule@standard:shape=chain,depth=$L,prefill=$p"
      done
    done
    ;;
  mar-cfg)
    model=${MODEL:-models/fmnist-mar}
    make -s all
    for g in 1.5 2 3 4; do
      ./build/vspec-bench eval --model "$model" --methods ar --cfg "$g" --images "$images" \
        --seed 0 --threads "${THREADS:-1}" --json "out/bench-mar-cfg$g.json" \
        --markdown "out/bench-mar-cfg$g.md"
    done
    exit 0
    ;;
  coverage)
    make -s all
    sets=${3:-20}
    ./build/vspec-bench eval --model "$model" --methods ar --images "$images" --seed 0 \
      --threads "${THREADS:-1}" --coverage "$sets" --coverage-cache "out/coverage-$images.bin" \
      | tee "out/bench-coverage-$images.md"
    exit 0
    ;;
  cspd-steps)
    model=${MODEL:-models/fmnist-mar}
    make -s all
    # and the default 64 steps on other seeds: how much the figures move between two sets
    # of images of the same process (the noise the tables are read against)
    for n in 16 8 4 64; do
      seed=0
      [ "$n" != 64 ] || seed=$images
      ./build/vspec-bench eval --model "$model" --methods ar --num-iter "$n" --images "$images" \
        --seed "$seed" --threads "${THREADS:-1}" --json "out/bench-cspd-steps$n.json" \
        --markdown "out/bench-cspd-steps$n.md"
    done
    exit 0
    ;;
  *)
    echo "usage: $0 sd|vvs|claims|sjd|cspd|cspd-lenient|mar-cfg|cspd-steps|coverage [IMAGES]" >&2
    exit 2
    ;;
esac

make -s all
# A model without the quality references (a converted checkpoint: tools/random_llamagen.py)
# is measured for speed only.
quality=""
grep -q '"fid_ref"' "$model/vspec-model.json" 2>/dev/null || quality="--no-quality"
./build/vspec-bench eval --model "$model" --methods "$methods" --images "$images" --seed 0 \
  --threads "${THREADS:-1}" --precision "${PRECISION:-fp32}" $quality \
  --json "out/bench-$table${SUFFIX:-}.json" --markdown "out/bench-$table${SUFFIX:-}.md" \
  --plot "out/bench-$table${SUFFIX:-}.png"
