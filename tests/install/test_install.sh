#!/bin/sh
# make install into a staging DESTDIR, then use the staged tree as a user and a plugin author
# would: the layout, the SONAME, pkg-config, a plugin built against the installed headers
# alone (README.md's DESTDIR recipe), the installed vspecd (its plugins, models and the CLI
# found from its own place) generating an image with that plugin loaded, and the installed
# vspec-bench generating with the installed model. Run by make check (SAN=0) as install-check.
# Usage: tests/install/test_install.sh BUILD
set -eu
BUILD=${1:-build}
T=$(mktemp -d /tmp/vspec-install.XXXXXX)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAILED: install: $*"; exit 1; }

P=/opt/vspec-test
make --no-print-directory -s install BUILD="$BUILD" DESTDIR="$T/root" PREFIX=$P >"$T/install.log" 2>&1 ||
  { cat "$T/install.log"; fail "make install"; }
R=$T/root$P
for f in bin/vspecd bin/vspec bin/vspec-bench bin/vspec-gateway \
         lib/libvspec.so lib/pkgconfig/vspec-plugin.pc include/vspec/plugin.h \
         lib/vspec/plugins/accept_exact.so share/vspec/models/fmnist/vspec-model.json \
         etc/vspec/vspecd.conf lib/systemd/system/vspecd.service \
         share/bash-completion/completions/vspec share/zsh/site-functions/_vspec; do
  [ -e "$R/$f" ] || fail "$f is not installed"
done
bash -n "$R/share/bash-completion/completions/vspec" || fail "the bash completion does not parse"
readelf -d "$R/lib/libvspec.so" | grep -q 'SONAME.*libvspec\.so\.[0-9]' || fail "no SONAME"
readelf -d "$R/bin/vspecd" | grep -q 'NEEDED.*libvspec\.so\.' || fail "vspecd does not use the shared libvspec"
grep -q "^ExecStart=$P/bin/vspecd -c $P/etc/vspec/vspecd.conf" "$R/lib/systemd/system/vspecd.service" ||
  fail "the unit does not run the installed vspecd with the installed configuration"
grep -q "^admin_endpoint = ipc:///run/vspecd/admin.sock" "$R/etc/vspec/vspecd.conf" ||
  fail "the installed configuration's admin socket is not the unit's runtime directory"
grep -q "^dir = $P/lib/vspec/plugins" "$R/etc/vspec/vspecd.conf" || fail "plugins.dir not rewritten"

# A plugin author's build against the staged tree, exactly as README.md ("Writing a plugin")
# says: the .pc files hold the final paths, PKG_CONFIG_SYSROOT_DIR puts the stage in front of
# them (pkgconf does so for --variable too). In a subshell: make below must not see them.
grep -q "^plugindir=$P/lib/vspec/plugins$" "$R/lib/pkgconfig/vspec-plugin.pc" ||
  fail "vspec-plugin.pc: plugindir is not $P/lib/vspec/plugins"
STAGE=$T/root
(
  umask 022 # vspecd refuses a plugin that group or others can write
  export PKG_CONFIG_PATH=$STAGE$P/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$STAGE
  cc $(pkg-config --cflags vspec-plugin) -fPIC -shared tests/plugins/testrule.c \
     -o "$(pkg-config --variable=plugindir vspec-plugin)/accept_testrule.so"
) || fail "the README's recipe: testrule.c against the staged headers"
[ -f "$R/lib/vspec/plugins/accept_testrule.so" ] ||
  fail "the README's recipe did not put accept_testrule.so into the staged plugin directory"

# The installed programs from another directory: no build tree, no models/ in sight.
cd "$T"
for p in vspecd vspec vspec-gateway vspec-bench; do
  "$R/bin/$p" --version | grep -q "^$p (vspec) .*, plugin ABI " || fail "$p --version"
done
# (defaults.auto_size off: tuning the draft size, seconds, is tests/test_autotune.c's subject)
VSPEC_CACHE_DIR=$T/cache "$R/bin/vspecd" --endpoint "ipc://$T/jobs.sock" --admin "ipc://$T/admin.sock" \
  --set defaults.auto_size=false >"$T/vspecd.log" 2>&1 &
PID=$!
i=0
until "$R/bin/vspec" plugins --admin "ipc://$T/admin.sock" --timeout 1 >"$T/plugins.txt" 2>/dev/null; do
  i=$((i + 1))
  [ $i -lt 60 ] && kill -0 "$PID" 2>/dev/null || { cat "$T/vspecd.log"; fail "the installed vspecd did not start"; }
  sleep 0.5
done
grep -q "testrule" "$T/plugins.txt" || { cat "$T/plugins.txt"; fail "the plugin built with pkg-config is not loaded"; }
"$R/bin/vspec" generate --server "ipc://$T/jobs.sock" --class 3 --seed 1 --method sd:testrule \
  --out "$T/img.png" >"$T/gen.log" 2>&1 || { cat "$T/gen.log"; fail "generate with the installed plugin"; }
[ "$(head -c 4 "$T/img.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "no PNG written"
kill "$PID" && wait "$PID" 2>/dev/null || true
PID=
# The installed vspec-bench finds the installed model as vspecd does (its default
# models/fmnist is not here).
VSPEC_CACHE_DIR=$T/cache "$R/bin/vspec-bench" generate --class 3 --seed 1 --out "$T/bench.png" \
  >"$T/bench.log" 2>&1 || { cat "$T/bench.log"; fail "the installed vspec-bench generate"; }
[ "$(head -c 4 "$T/bench.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "vspec-bench wrote no PNG"

cd - >/dev/null
make --no-print-directory -s uninstall BUILD="$BUILD" DESTDIR="$T/root" PREFIX=$P >/dev/null
left=$(find "$T/root" -type f ! -name vspecd.conf | head -3)
[ -z "$left" ] || fail "uninstall left $left"
echo "PASSED: install (make install into a DESTDIR, pkg-config plugin build, installed vspecd)"
