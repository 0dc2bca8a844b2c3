#!/bin/sh
# The demo through the daemon (make demo DAEMON=1): start vspecd on private ipc endpoints,
# generate one image per class with the vspec CLI (live progress, previews written), show
# `vspec status`, then stop the daemon with SIGTERM (it drains and exits 0).
#   tools/demo_daemon.sh [BUILD_DIR] [MODEL_DIR]
set -eu
BUILD=${1:-build}
MODEL=${2:-models/fmnist}
if [ ! -d "$MODEL" ]; then
  echo "demo: $MODEL is not there (not trained yet?): using tests/golden/micro_c2i"
  MODEL=tests/golden/micro_c2i
fi
OUT=$BUILD/demo-daemon
RUN=$(mktemp -d /tmp/vspec-demo-XXXXXX)
JOB=ipc://$RUN/job.sock
ADMIN=ipc://$RUN/admin.sock
mkdir -p "$OUT"
"$BUILD/vspecd" --endpoint "$JOB" --admin "$ADMIN" --plugins "$BUILD/plugins" \
  --set models.fmnist= --model "demo=$MODEL" --default-model demo --log-level warn &
PID=$!
cleanup() { kill -TERM "$PID" 2>/dev/null || true; rm -rf "$RUN"; }
trap cleanup EXIT INT TERM
# vspec fails at once while the socket is not there yet: ask until the daemon answers (it
# loads the model first), for at most 30 s, and stop if it died.
i=0
until "$BUILD/vspec" ping --via-admin --admin "$ADMIN" --timeout 5 >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -ge 300 ] || ! kill -0 "$PID" 2>/dev/null; then
    echo "demo: vspecd did not answer on $ADMIN" >&2
    exit 1
  fi
  sleep 0.1
done
CLASSES=$("$BUILD/vspec" status --json --admin "$ADMIN" | sed -n 's/.*"num_classes": \([0-9]*\).*/\1/p')
CLASSES=${CLASSES:-10}
c=0
while [ "$c" -lt "$CLASSES" ]; do
  "$BUILD/vspec" generate --server "$JOB" --class "$c" --seed "$c" \
    --out "$OUT/class-$c.png" --previews "$OUT/previews-$c"
  c=$((c + 1))
done
"$BUILD/vspec" status --admin "$ADMIN"
kill -TERM "$PID"
wait "$PID"
trap - EXIT INT TERM
rm -rf "$RUN"
echo "demo: $CLASSES images in $OUT/ (previews in $OUT/previews-*/), through vspecd"
