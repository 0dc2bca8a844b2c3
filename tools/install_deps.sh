#!/bin/sh
# Installs every Debian package vspec needs to build, test, run and train.
# clang, libclang-rt-dev (libFuzzer and the sanitizer runtimes) and llvm (llvm-symbolizer for
# readable reports) are for make fuzz / the fuzz pass of make test. libhiredis-dev is the
# fleet queue's Redis client (fleet/fleet_queue.c); redis-server is for the tests, which each
# start a private instance on a unix socket and never use the system service Debian's package
# may enable on 127.0.0.1:6379 (stop it if this machine has no other use for it).
# libmicrohttpd-dev serves vspecd's HTTP endpoint ([http]); its tests drive it with curl, and
# with OpenAI's Python SDK (PyPI's openai, pinned below), installed into .venv in the
# repository (git-ignored; python3-venv makes it) beside Debian's python3 packages, which it
# sees: tests/python/test_openai.py runs under .venv/bin/python.
# Idempotent and non-interactive; uses sudo when not run as root.
set -eu

PKGS="build-essential pkg-config
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libsodium-dev
  libpng-dev zlib1g-dev libblis-pthread-dev liblapacke-dev liblapack-dev
  libjansson-dev libinih-dev libcmocka-dev libhiredis-dev redis-server
  libmicrohttpd-dev curl
  clang libclang-rt-dev llvm
  python3 python3-numpy python3-torch python3-pil dataset-fashion-mnist
  python3-zmq python3-protobuf protobuf-compiler python3-venv"

# The version tests/python/test_openai.py was written against; change it there too.
OPENAI_VERSION=3.57.0
VENV="$(cd "$(dirname "$0")/.." && pwd)/.venv"

# OpenAI's SDK into the repository's venv, unless that version is there already.
install_openai() {
  if "$VENV/bin/python" -c "import sys, openai; sys.exit(openai.__version__ != '$OPENAI_VERSION')" \
      2>/dev/null; then
    echo "deps: openai $OPENAI_VERSION present in $VENV"
    return 0
  fi
  echo "deps: installing openai==$OPENAI_VERSION into $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "openai==$OPENAI_VERSION"
}

if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

if [ -z "$missing" ]; then
  echo "deps: all packages present"
  install_openai
  exit 0
fi
echo "deps: installing$missing"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
install_openai
