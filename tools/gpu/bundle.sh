#!/bin/sh
# Copies what the GPU suite and the GPU benchmarks need into one directory that can travel
# to a GPU machine without this machine's Debian packages: the binaries and plugins in the
# build's own layout (so VSPEC_BUILD and the CUDA module lookup work unchanged), and in
# lib/ every shared library they load that is neither glibc's nor CUDA's.
#
#   tools/gpu/bundle.sh BUILD_DIR OUT_DIR
#
# On the GPU machine, from the repository root (models/ and tests/golden/ travel with it):
#   LD_LIBRARY_PATH=OUT_DIR/lib OUT_DIR/... or tools/gpu/run_gpu_tests.sh OUT_DIR
set -eu
BUILD=$1
OUT=$2
rm -rf "$OUT"
mkdir -p "$OUT/lib" "$OUT/tests/gpu" "$OUT/tests/plugins" "$OUT/plugins"
cp "$BUILD"/vspec-bench "$BUILD"/vspecd-bench "$BUILD"/vspecd "$BUILD"/vspec "$OUT/"
cp "$BUILD"/plugins/*.so "$OUT/plugins/"
# The registry refuses plugins its group or others can write, whatever the umask here was.
chmod go-w "$OUT/plugins" "$OUT"/plugins/*.so
cp "$BUILD"/tests/plugins/*.so "$OUT/tests/plugins/" 2>/dev/null || true
cp "$BUILD"/tests/gpu/test_* "$OUT/tests/gpu/"
# The CPU suite's tests that tools/gpu/run_gpu_tests.sh runs again on the GPU (keep the lists alike).
for t in test_llamagen_golden test_eagle_golden test_fused_forward test_graph_replay \
         test_eagle_graphs test_device; do
  cp "$BUILD/tests/$t" "$OUT/tests/"
done
if [ -f "$BUILD/lib/libvspec-cuda.so" ]; then
  cp "$BUILD/lib/libvspec-cuda.so" "$OUT/lib/"
else
  echo "bundle: $BUILD/lib/libvspec-cuda.so is missing (built when nvcc is found)" >&2
  exit 1
fi
# Shared libraries, minus the C library (the target has its own, newer) and CUDA's.
for f in "$OUT"/vspec-bench "$OUT"/vspecd-bench "$OUT"/vspecd "$OUT"/vspec "$OUT"/tests/test_* "$OUT"/tests/gpu/test_* \
         "$OUT"/plugins/*.so; do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*) ;;
    libstdc++.so*|libgcc_s.so*) ;; # the target's own are newer, and CUDA's libraries need them
    libcuda*|libcublas*|libcudart*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
# Debug sections are most of the bytes, and the bundle must travel (the device tool carries at
# most 64 MiB): symbols stay, so backtraces still name functions.
find "$OUT" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-debug {} + 2>/dev/null || true
du -sh "$OUT" | awk '{print "bundle: " $1 " in " $2}'
# The checkout that travels with it (models/, tests/golden/) is about 48 MB already: the
# bundle travels packed (about 9 MB), unpacked there with `tar xJf OUT.tar.xz -C <its parent>`
# (tools/gpu/check.sh does that itself when given the archive).
if command -v xz >/dev/null 2>&1; then
  tar cf - -C "$(dirname "$OUT")" "$(basename "$OUT")" | xz -T0 -6 >"$OUT.tar.xz"
  du -sh "$OUT.tar.xz" | awk '{print "packed: " $1 " in " $2}'
fi
