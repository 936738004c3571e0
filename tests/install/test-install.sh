#!/usr/bin/env bash
# test-install.sh — the installed package is usable the way the README says,
# from a prefix other than the configured one, and still after the prefix is
# moved: `cmake --install` into a fresh prefix; the installed programs carry
# only $ORIGIN-relative RPATHs and run with no LD_LIBRARY_PATH; the installed
# library finds its plugins in <libdir>/ddplug relative to itself; a custom
# backend is built out of tree with find_package(ddplug CONFIG) +
# ddplug_add_plugin() and installed by its default rule; a host program is
# built with `pkg-config ddplug`; `ddplug conformance` runs from the moved prefix.
# usage: test-install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset DDPLUG_PLUGIN_PATH LD_LIBRARY_PATH DDPLUG_LIBRARY
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$work/prefix
configured=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
[[ "$configured" != "$prefix" ]] || fail "the test prefix must differ from the configured one"
cmake --install "$BUILD" --prefix "$prefix" >/dev/null
libdir=$(ls -d "$prefix"/lib* | head -1)
test -f "$prefix/include/ddplug/ddplug.h"
test -f "$libdir/pkgconfig/ddplug.pc"
test -f "$libdir/cmake/ddplug/ddplugConfig.cmake"
test -f "$prefix/share/ddplug/ddplug-config.schema.json"
test -f "$libdir/ddplug/libddplug-cpu.so"
readelf -d "$libdir/libddplug.so.1" | grep -q 'soname: \[libddplug.so.1\]'

# Every installed program: RPATH relative to itself, nothing absolute.
for prog in "$prefix"/bin/*; do
  rp=$(readelf -d "$prog" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
  [[ -n "$rp" ]] || fail "$prog has no RPATH: it cannot find libddplug.so.1 without LD_LIBRARY_PATH"
  IFS=: read -ra entries <<<"$rp"
  for e in "${entries[@]}"; do
    case "$e" in
      '$ORIGIN'*) ;;
      */nvidia/nccl/lib) ;;   # ddplug-nccl-overhead links NCCL where it was found
      *) fail "$prog has the absolute RPATH entry '$e' (install RPATHs must be \$ORIGIN-relative)" ;;
    esac
  done
done

# 1. a custom backend, out of tree, only against the installed package; its
#    default install rule puts it in <its prefix>/<libdir>/ddplug.
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$SRC/examples/custom-backend" -B "$work/backend" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build "$work/backend" >/dev/null
cmake --install "$work/backend" --prefix "$work/backend-prefix" >/dev/null
plugin=$work/backend-prefix/lib/ddplug/libddplug-example.so
test -f "$plugin" || fail "ddplug_add_plugin's default install rule did not install $plugin"
# ddplug_PLUGIN_DIR names the install's own plugin directory.
mkdir -p "$work/probe"
cat >"$work/probe/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(probe NONE)
find_package(ddplug CONFIG REQUIRED)
message(STATUS "PLUGIN_DIR=${ddplug_PLUGIN_DIR}")
EOF
probe=$(cmake -S "$work/probe" -B "$work/probe/b" -DCMAKE_PREFIX_PATH="$prefix" | sed -n 's/.*PLUGIN_DIR=//p')
[[ "$(cd "$probe" && pwd -P)" == "$(cd "$libdir/ddplug" && pwd -P)" ]] \
  || fail "ddplug_PLUGIN_DIR is '$probe', expected $libdir/ddplug"

# 2. a host program through pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 $(pkg-config --cflags ddplug) "$SRC/tests/install/consumer.c" \
  -o "$work/consumer" $(pkg-config --libs ddplug) -Wl,-rpath,"$libdir"

# 3. installed command, library and consumer find the installed plugins by
#    name, with no variable set; then the same after moving the prefix.
check_prefix() {
  local p=$1 out
  out=$("$p/bin/ddplug" info cpu) || fail "$p/bin/ddplug info cpu failed"
  grep -q "^file  *$p/lib[^/]*/ddplug/libddplug-cpu.so$" <<<"$out" \
    || fail "ddplug info cpu did not load the plugin from $p: $out"
  out=$("$p/bin/ddplug" info "$plugin")
  grep -q '^plugin  *example$' <<<"$out"
  "$p/bin/ddplug-allreduce-perf" --help >/dev/null || fail "$p/bin/ddplug-allreduce-perf does not run"
  # The search list names the plugin directory beside the library.
  out=$("$p/bin/ddplug" info nosuch 2>&1) && fail "ddplug info nosuch succeeded"
  grep -q "$p/lib[^/]*/ddplug/libddplug-nosuch.so (no such file)" <<<"$out" \
    || fail "the loader did not search beside the library: $out"
}
check_prefix "$prefix"
out=$("$work/consumer")
grep -q "found plugin example at $libdir/ddplug/libddplug-example.so" <<<"$out" \
  || fail "consumer: $out"
mv "$prefix" "$work/moved"
check_prefix "$work/moved"
# The conformance suite from the moved install: its fault wrapper plugin is
# found relative to the library (else the group_create checks would skip).
out=$("$work/moved/bin/ddplug" conformance cpu) || { echo "$out"; fail "ddplug conformance cpu failed"; }
grep -q "^  PASS  a rank whose group_create fails ends the others' ddplug_open promptly$" <<<"$out" \
  || { echo "$out"; fail "the installed conformance suite did not run its group_create check"; }
echo "ok: installed to $prefix (configured: $configured), moved to $work/moved; out-of-tree backend and pkg-config consumer both work"
