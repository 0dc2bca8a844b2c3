#!/bin/sh
# The GPU suite (make gpu-test): the tests of tests/gpu/ and the golden tests again on a
# CUDA device. A test that finds no usable CUDA device exits 77 and is reported as
# skipped, never as passed; the suite fails if any test fails.
#
#   tools/gpu/run_gpu_tests.sh [BUILD_DIR]      (default build)
#
# VSPEC_TEST_DEVICE (default cuda) picks the GPU, e.g. cuda:1.
set -u
BUILD=${1:-build}
DEVICE=${VSPEC_TEST_DEVICE:-cuda}
export VSPEC_BUILD="$BUILD"
passed=0 failed=0 skipped=0 failures=""

run() { # NAME COMMAND...
  name=$1
  shift
  echo "== $name"
  "$@"
  rc=$?
  case $rc in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)); failures="$failures $name" ;;
  esac
}

for t in "$BUILD"/tests/gpu/test_*; do
  [ -x "$t" ] || continue
  run "$(basename "$t")" env VSPEC_TEST_DEVICE="$DEVICE" "$t"
done
# The golden tests against the float64 PyTorch reference, on the GPU in fp32.
for t in test_llamagen_golden test_eagle_golden; do
  run "$t ($DEVICE, fp32)" env VSPEC_TEST_DEVICE="$DEVICE" VSPEC_TEST_PRECISION=fp32 \
    "$BUILD/tests/$t"
done
# Whole forwards on the fused ops against the unfused ops, on the GPU (fp32 and bf16).
for p in fp32 bf16; do
  run "test_fused_forward ($DEVICE, $p)" env VSPEC_TEST_DEVICE="$DEVICE" \
    VSPEC_TEST_PRECISION=$p "$BUILD/tests/test_fused_forward"
done

# CUDA graphs replayed against the same padded forwards run eagerly, and whole jobs.
run "test_graph_replay ($DEVICE, fp32)" env VSPEC_TEST_DEVICE="$DEVICE" \
  VSPEC_TEST_PRECISION=fp32 "$BUILD/tests/test_graph_replay"
# The EAGLE head's forwards through graphs against the same forwards padded, eagerly.
run "test_eagle_graphs ($DEVICE, fp32)" env VSPEC_TEST_DEVICE="$DEVICE" \
  VSPEC_TEST_PRECISION=fp32 "$BUILD/tests/test_eagle_graphs"

echo
if [ $passed -eq 0 ] && [ $failed -eq 0 ]; then
  echo "GPU tests: all $skipped skipped (no CUDA device)"
else
  echo "GPU tests: $passed passed, $failed failed, $skipped skipped${failures:+ (failed:$failures)}"
fi
[ $failed -eq 0 ]
