#!/bin/sh
# Installs (or uninstalls) a built tree in a system package's layout; called by
# `make install` / `make uninstall`, which pass the directories in the environment:
#   BUILD DESTDIR PREFIX BINDIR LIBDIR INCLUDEDIR DATADIR SYSCONFDIR UNITDIR VERSION SONAME
# Everything lands under $DESTDIR (a staging root: empty for the real thing). The paths
# written into vspecd.conf, the unit and the pkg-config files are the final ones, without
# DESTDIR. An existing vspecd.conf is kept (the new one is written next to it as .new).
# The shell completion scripts are written by the built CLI (`vspec completion bash|zsh`)
# into the directories bash-completion and zsh search under DATADIR.
set -eu

mode=${1:-install}
D=${DESTDIR:-}
PLUGINDIR=$LIBDIR/vspec/plugins
SHAREDIR=$DATADIR/vspec
PROGS="vspecd vspec vspec-gateway vspec-bench"
MODELS="fmnist fmnist-mar"
BASH_COMPLETION=$DATADIR/bash-completion/completions/vspec
ZSH_COMPLETION=$DATADIR/zsh/site-functions/_vspec

if [ "$mode" = uninstall ]; then
  for p in $PROGS; do rm -f "$D$BINDIR/$p"; done
  rm -f "$D$LIBDIR/libvspec.so.$VERSION" "$D$LIBDIR/$SONAME" "$D$LIBDIR/libvspec.so" \
        "$D$LIBDIR/libvspec-cuda.so" "$D$LIBDIR/pkgconfig/vspec.pc" \
        "$D$LIBDIR/pkgconfig/vspec-plugin.pc" "$D$UNITDIR/vspecd.service"
  rm -rf "$D$PLUGINDIR" "$D$INCLUDEDIR/vspec" "$D$SHAREDIR" "$D$DATADIR/doc/vspec"
  rm -f "$D$BASH_COMPLETION" "$D$ZSH_COMPLETION"
  rmdir "$D$LIBDIR/vspec" 2>/dev/null || true
  echo "uninstalled from $D$PREFIX (kept $D$SYSCONFDIR/vspec/vspecd.conf)"
  exit 0
fi

# Directories 0755 whatever the umask: vspecd refuses a plugin directory that group or
# others can write (docs/DESIGN.md, "Plugin loading rules").
dirs() { for d in "$@"; do install -d -m 0755 "$d"; done; }
dirs "$D$BINDIR" "$D$LIBDIR/pkgconfig" "$D$PLUGINDIR" "$D$INCLUDEDIR/vspec" \
     "$D$SYSCONFDIR/vspec" "$D$UNITDIR" "$D$SHAREDIR/models" "$D$DATADIR/doc/vspec"

for p in $PROGS; do install -m 0755 "$BUILD/dyn/$p" "$D$BINDIR/$p"; done
install -m 0755 "$BUILD/lib/libvspec.so.$VERSION" "$D$LIBDIR/libvspec.so.$VERSION"
ln -sf "libvspec.so.$VERSION" "$D$LIBDIR/$SONAME"
ln -sf "$SONAME" "$D$LIBDIR/libvspec.so"
# The CUDA module is found next to the programs' ../lib (kernels/device.c).
if [ -f "$BUILD/lib/libvspec-cuda.so" ]; then
  install -m 0755 "$BUILD/lib/libvspec-cuda.so" "$D$LIBDIR/libvspec-cuda.so"
fi
for f in "$BUILD"/plugins/*.so; do install -m 0755 "$f" "$D$PLUGINDIR/"; done
for f in include/vspec/*.h; do install -m 0644 "$f" "$D$INCLUDEDIR/vspec/"; done
for m in $MODELS; do
  [ -d "models/$m" ] || continue
  dirs "$D$SHAREDIR/models/$m"
  find "models/$m" -maxdepth 1 -type f -exec install -m 0644 {} "$D$SHAREDIR/models/$m/" \;
done
for f in README.md docs/*.md; do install -m 0644 "$f" "$D$DATADIR/doc/vspec/"; done
dirs "$(dirname "$D$BASH_COMPLETION")" "$(dirname "$D$ZSH_COMPLETION")"
"$BUILD/vspec" completion bash > "$D$BASH_COMPLETION"
"$BUILD/vspec" completion zsh > "$D$ZSH_COMPLETION"
chmod 0644 "$D$BASH_COMPLETION" "$D$ZSH_COMPLETION"

abi_major=$(sed -n 's/^#define VSPEC_ABI_MAJOR \([0-9]*\)/\1/p' include/vspec/plugin.h)
abi_minor=$(sed -n 's/^#define VSPEC_ABI_MINOR \([0-9]*\)/\1/p' include/vspec/plugin.h)
cat > "$D$LIBDIR/pkgconfig/vspec-plugin.pc" <<PC
# Plugins compile against the headers alone and link nothing of vspec: the host hands them
# its function table (vspec/plugin.h). Install them into plugindir as KIND_NAME.so.
prefix=$PREFIX
includedir=$INCLUDEDIR
plugindir=$PLUGINDIR
abi_major=$abi_major
abi_minor=$abi_minor

Name: vspec-plugin
Description: vspec plugin ABI $abi_major.$abi_minor (acceptance rules, schedulers, model backends)
Version: $VERSION
Cflags: -I\${includedir}
PC
cat > "$D$LIBDIR/pkgconfig/vspec.pc" <<PC
prefix=$PREFIX
libdir=$LIBDIR
includedir=$INCLUDEDIR

Name: vspec
Description: vspec decoding engine (shared library; its C API is internal for now)
Version: $VERSION
Libs: -L\${libdir} -lvspec
Cflags: -I\${includedir}
PC

# vspecd.conf with this layout's paths: the plugins, the installed models (the test models
# of the source tree are not installed), the admin socket in the unit's runtime directory.
conf=$D$SYSCONFDIR/vspec/vspecd.conf
[ -e "$conf" ] && conf=$conf.new
sed -e "s|^dir = build/plugins|dir = $PLUGINDIR|" \
    -e "s|^admin_endpoint = ipc:///tmp/vspecd-admin.sock|admin_endpoint = ipc:///run/vspecd/admin.sock|" \
    -e "s|^\\(fmnist[a-z-]*\\) = models/|\\1 = $SHAREDIR/models/|" \
    -e "/^micro/d" -e "/micro continuous-token/d" etc/vspecd.conf > "$conf"
chmod 0644 "$conf"
sed -e "s|@BINDIR@|$BINDIR|g" -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" -e "s|@DATADIR@|$DATADIR|g" \
    -e "s|@PREFIX@|$PREFIX|g" etc/vspecd.service > "$D$UNITDIR/vspecd.service"
chmod 0644 "$D$UNITDIR/vspecd.service"
echo "installed into $D$PREFIX (configuration $conf)"
