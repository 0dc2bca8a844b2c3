#!/bin/sh
# The benchmark tables of docs/BENCHMARKS.md, reproducible:
#
#   tools/run_benchmarks.sh sd  [IMAGES]   speculative decoding: exact, LANTERN, LANTERN++,
#                                          UniformRSD, Cool-SD, fixed trees and tree=auto
#   tools/run_benchmarks.sh vvs [IMAGES]   VVS: uniform and dynamic skipping, ablations
#
# Results go to out/bench-<table>.{json,md,png}. IMAGES defaults to 1000. The machine is
# shared: run one table at a time, nothing else heavy beside it.
set -eu
cd "$(dirname "$0")/.."
table=${1:-sd}
images=${2:-1000}
model=${MODEL:-models/fmnist}
mkdir -p out

case "$table" in
  sd)
    methods="ar"
    methods="$methods;sd:exact@standard:shape=chain,depth=3,drafter=model"
    methods="$methods;sd:exact@standard:shape=static,drafter=head"
    methods="$methods;sd:exact@standard:shape=dynamic,drafter=head"
    methods="$methods;sd:lantern:k=100,delta=0.2@standard:shape=dynamic,drafter=head"
    methods="$methods;sd:lanternpp:lambda=2@standard:shape=static,drafter=head"
    methods="$methods;sd:uniform_rsd:omega=2@standard:shape=static,drafter=head"
    methods="$methods;sd:coolsd:delta=1.1@standard:shape=static,drafter=head"
    methods="$methods;sd:coolsd:delta=2@standard:shape=static,drafter=head"
    # tree=auto: the size that maximises expected tokens/s on this CPU
    methods="$methods;sd:exact@standard:shape=dynamic,drafter=head,size=auto"
    methods="$methods;sd:lantern:k=100,delta=0.2@standard:shape=dynamic,drafter=head,size=auto"
    methods="$methods;sd:coolsd:delta=2@standard:shape=static,drafter=head,size=auto"
    methods="$methods;sd:coolsd:delta=2@standard:shape=chain,drafter=model,size=auto"
    ;;
  vvs)
    methods="ar"
    for d in 0.1 0.2; do
      lt="sd:lantern:k=100,delta=$d"
      methods="$methods;$lt@standard:shape=dynamic,drafter=head"
      for i in 2 3 4; do
        methods="$methods;$lt@vvs:skip=uniform,interval=$i,drafter=head"
      done
      for s in 0.70 0.75 0.80; do
        methods="$methods;$lt@vvs:skip=dynamic,threshold=$s,drafter=head"
      done
    done
    # VVS with Cool-SD (no paper has tried it)
    methods="$methods;sd:coolsd:delta=2@vvs:skip=uniform,interval=3,drafter=head"
    methods="$methods;sd:coolsd:delta=2@vvs:skip=dynamic,threshold=0.75,drafter=head"
    # ablations (the paper's Table 2): selection x truncation, VVS-U interval 3, delta 0.1
    ab="sd:lantern:k=100,delta=0.1@vvs:skip=uniform,interval=3,drafter=head"
    methods="$methods;$ab,select=confidence"
    methods="$methods;$ab,truncate=off"
    methods="$methods;$ab,select=confidence,truncate=off"
    # feature staleness (Tables 3/5 analogues): own features, blend, one step staler
    methods="$methods;$ab,features=draft"
    methods="$methods;$ab,features=blend"
    methods="$methods;$ab,staleness=1"
    ;;
  *)
    echo "usage: $0 sd|vvs [IMAGES]" >&2
    exit 2
    ;;
esac

make -s all
./build/vspec-bench eval --model "$model" --methods "$methods" --images "$images" --seed 0 \
  --json "out/bench-$table.json" --markdown "out/bench-$table.md" --plot "out/bench-$table.png"
