#!/bin/sh
# Runs the libFuzzer targets of tests/fuzz/ (built by `make SAN=fuzz fuzz-targets`).
#
#   run.sh probe               exit 0 if $FUZZ_CC (clang) can build libFuzzer targets, else
#                              say why fuzzing is skipped and exit 1
#   run.sh run BUILD           make fuzz: each target for $FUZZ_RUNS inputs (at most
#                              $FUZZ_TIME s), from its seed corpus and regression inputs;
#                              fails too when the target's RSS grows more than
#                              $FUZZ_RSS_BOUND_MB (default 8) after the warm-up (the first
#                              tenth of the inputs), under an ASan quarantine of
#                              $FUZZ_QUARANTINE_MB (default 4)
#   run.sh check BUILD         make fuzz-check (make test): every seed and regression input
#                              once, then $FUZZ_CHECK_TIME s of fuzzing per target, two
#                              targets at a time
#   run.sh seeds BUILD         rewrite tests/fuzz/corpus/request/ (tests/fuzz/request_seeds.c)
#
# Seeds live in tests/fuzz/corpus/NAME/, inputs that once crashed in tests/fuzz/regressions/NAME/
# (both committed). New inputs libFuzzer finds go to BUILD/work/NAME/, never into the committed
# corpus; a crash leaves its input in BUILD/artifacts/ and fails the run. Logs: BUILD/logs/.
set -u

mode=${1:-}
build=${2:-build/fuzz}
here=tests/fuzz

probe() {
  cc=${FUZZ_CC:-clang}
  if ! command -v "$cc" >/dev/null 2>&1; then
    echo "fuzz: skipped: $cc not found (make deps installs clang and libclang-rt-dev)"
    return 1
  fi
  tmp=$(mktemp -d) || return 1
  printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' > "$tmp/p.c"
  if ! "$cc" -fsanitize=fuzzer,address,undefined "$tmp/p.c" -o "$tmp/p" >/dev/null 2>&1; then
    rm -rf "$tmp"
    echo "fuzz: skipped: $cc cannot link libFuzzer with ASan/UBSan (make deps installs libclang-rt-dev)"
    return 1
  fi
  rm -rf "$tmp"
  return 0
}

# libFuzzer options per target: inputs up to a few KB (a request with a t2i caption needs
# 8 KB), one input may take 10 s at most (a hang is a failure too).
max_len() {
  case $1 in
    request) echo 12000 ;;
    safetensors) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

targets() {
  for f in "$here"/fuzz_*.c; do basename "$f" .c | sed 's/^fuzz_//'; done
}

# The summary line of one run from its log: inputs, time, coverage.
summary() {
  log=$1
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
  cov=$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED|pulse|NEW|REDUCE)' "$log" | tail -n 1 |
        sed -n 's/.*cov: \([0-9]*\) ft: \([0-9]*\) corp: \([0-9]*\).*/cov \1, ft \2, corpus \3/p')
  echo "${runs:-?} inputs, ${speed:-?}/s, peak RSS ${rss:-?} MB, ${cov:-no coverage line}"
}

run_target() { # name, seconds, runs
  name=$1
  bin=$build/targets/fuzz_$name
  work=$build/work/$name
  log=$build/logs/$name.log
  rm -rf "$work"
  mkdir -p "$work" "$build/artifacts" "$build/logs"
  set -- "$work" "$here/corpus/$name"
  [ -d "$here/regressions/$name" ] && set -- "$@" "$here/regressions/$name"
  t0=$(date +%s)
  "$bin" -runs="$runs" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$(max_len "$name")" -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$name-" "$@" > "$log" 2>&1
  rc=$?
  t1=$(date +%s)
  if [ $rc -ne 0 ]; then
    echo "fuzz_$name: FAILED (exit $rc) after $((t1 - t0)) s; input in $build/artifacts/, log $log:"
    grep -E 'ERROR|SUMMARY|does not hold|Test unit written' "$log" | head -n 20
    return 1
  fi
  echo "fuzz_$name: ok, $((t1 - t0)) s: $(summary "$log")"
  [ -n "${rss_bound_mb:-}" ] || return 0
  rss_check "$name" "$log"
}

# make fuzz (issue 32, finding 8): the target's VmRSS at its first input, at the end of the
# warm-up and at exit (tests/fuzz/fuzz.h writes the line); growth after the warm-up past
# $rss_bound_mb fails the run. Memory the fuzzer keeps by design (its corpus in memory, a
# few hundred KB) is inside the bound.
rss_check() { # name, log
  line=$(grep '^fuzz-rss: ' "$2" | tail -n 1)
  if [ -z "$line" ]; then
    echo "fuzz_$1: RSS: FAILED: no fuzz-rss line in $2"
    return 1
  fi
  # shellcheck disable=SC2086
  set -- "$1" $line
  # fuzz-rss: inputs N start_kb A warm_inputs W warm_kb B end_kb C max_kb D
  start_kb=$6 warm_inputs=$8 warm_kb=${10} end_kb=${12} max_kb=${14}
  if [ "$warm_inputs" -eq 0 ]; then
    echo "fuzz_$1: RSS: FAILED: the run ended before its warm-up ($warm_at inputs): raise FUZZ_TIME"
    return 1
  fi
  growth=$((end_kb - warm_kb))
  verdict=within
  [ "$growth" -gt $((rss_bound_mb * 1024)) ] && verdict=EXCEEDED
  echo "fuzz_$1: RSS start $((start_kb / 1024)) MB, after the warm-up ($warm_inputs inputs)" \
    "$((warm_kb / 1024)) MB, end $((end_kb / 1024)) MB, max $((max_kb / 1024)) MB;" \
    "growth after the warm-up $growth kB, bound $rss_bound_mb MB: $verdict"
  [ "$verdict" = within ]
}

# Every committed input once, as files: libFuzzer runs each and stops.
replay() {
  name=$1
  bin=$build/targets/fuzz_$name
  log=$build/logs/$name-replay.log
  mkdir -p "$build/logs"
  files=$(find "$here/corpus/$name" "$here/regressions/$name" -type f 2>/dev/null | sort)
  [ -n "$files" ] || { echo "fuzz_$name: no seeds in $here/corpus/$name"; return 1; }
  # shellcheck disable=SC2086
  if ! "$bin" -timeout=10 -rss_limit_mb=2048 $files > "$log" 2>&1; then
    echo "fuzz_$name: FAILED replaying the committed inputs; log $log:"
    grep -E 'ERROR|SUMMARY|does not hold|Running:' "$log" | tail -n 20
    return 1
  fi
  echo "fuzz_$name: $(echo "$files" | wc -l) committed inputs replayed"
}

case $mode in
  probe) probe; exit $? ;;
  run)
    runs=${FUZZ_RUNS:-1000000}
    secs=${FUZZ_TIME:-3600}
    fail=0
    rss_bound_mb=${FUZZ_RSS_BOUND_MB:-8}
    warm_at=$((runs / 10))
    # ASan's quarantine (256 MB by default) keeps freed memory for a while: it would fill
    # through most of a million inputs and look like growth; 16 MB still fills past the
    # warm-up of the text targets (+5 MB), 4 MB within it.
    ASAN_OPTIONS="quarantine_size_mb=${FUZZ_QUARANTINE_MB:-4}${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export ASAN_OPTIONS
    VSPEC_FUZZ_RSS_WARM=$warm_at
    export VSPEC_FUZZ_RSS_WARM
    echo "fuzz: $runs inputs per target, at most $secs s each; RSS growth after the warm-up" \
      "($warm_at inputs) at most $rss_bound_mb MB, ASan quarantine ${FUZZ_QUARANTINE_MB:-4} MB"
    for t in $(targets); do run_target "$t" || fail=1; done
    exit $fail ;;
  check)
    runs=-1
    secs=${FUZZ_CHECK_TIME:-4}
    fail=0
    # Two targets at a time (make test's machines have 2 cores; each target is one process):
    # the same inputs and seconds per target in half the time. Their lines are printed at
    # the end, in the targets' order.
    mkdir -p "$build/logs"
    set -- $(targets)
    while [ $# -gt 0 ]; do
      pids=
      for t in "$1" ${2:+"$2"}; do
        ( st=0; replay "$t" || st=1; run_target "$t" || st=1; exit $st ) \
          > "$build/logs/$t-check.out" 2>&1 &
        pids="$pids $!"
      done
      shift; [ $# -gt 0 ] && shift
      for p in $pids; do wait "$p" || fail=1; done
    done
    for t in $(targets); do cat "$build/logs/$t-check.out"; done
    exit $fail ;;
  seeds)
    mkdir -p "$here/corpus/request"
    "$build/targets/request_seeds" "$here/corpus/request" &&
      echo "fuzz: wrote $(ls "$here/corpus/request" | wc -l) seeds to $here/corpus/request" ;;
  *)
    echo "usage: $0 probe | run BUILD | check BUILD | seeds BUILD" >&2
    exit 2 ;;
esac
