#!/usr/bin/env bash
# test-install.sh — the installed package is usable the way the README says:
# `cmake --install` into a prefix; a custom backend built out of tree with
# find_package(ddplug CONFIG) + ddplug_add_plugin(); a host program built with
# `pkg-config ddplug`; the installed `ddplug info` loads both the installed
# plugins (from the installed plugin directory) and the out-of-tree one.
# usage: test-install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$BUILD" --prefix "$prefix" >/dev/null
libdir=$(ls -d "$prefix"/lib* | head -1)
test -f "$prefix/include/ddplug/ddplug.h"
test -f "$libdir/pkgconfig/ddplug.pc"
test -f "$libdir/cmake/ddplug/ddplugConfig.cmake"
test -f "$prefix/share/ddplug/ddplug-config.schema.json"
readelf -d "$libdir/libddplug.so.1" | grep -q 'soname: \[libddplug.so.1\]'

# 1. a custom backend, out of tree, only against the installed package
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$SRC/examples/custom-backend" -B "$work/backend" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/backend" >/dev/null
plugin=$(find "$work/backend" -name 'libddplug-example.so' | head -1)
test -n "$plugin"

# 2. a host program through pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 $(pkg-config --cflags ddplug) "$SRC/tests/install/consumer.c" \
  -o "$work/consumer" $(pkg-config --libs ddplug) -Wl,-rpath,"$libdir"

# 3. the installed command and library find the installed plugins by name
unset DDPLUG_PLUGIN_PATH
out=$(LD_LIBRARY_PATH="$libdir" "$prefix/bin/ddplug" info "$plugin")
grep -q '^plugin  *example$' <<<"$out"
# The build was configured for its own install prefix; the library looks for
# plugins there, then beside itself — the installed plugin dir is lib/ddplug.
ln -s "$libdir/ddplug/libddplug-example.so" "$libdir/libddplug-example.so"
out=$("$work/consumer")
grep -q "found plugin example" <<<"$out"
echo "ok: installed to $prefix; out-of-tree backend and pkg-config consumer both work"
