#!/usr/bin/env bash
# check-abi.sh — libddplug.so must stay compatible with the released ABI
# baseline (abi/abi-baseline/libddplug.so.1.abi, written by abidw): within a
# major version functions and struct fields are only ever added (appended),
# never removed, moved, retyped or renumbered.
# usage: check-abi.sh SOURCE_DIR BUILD_DIR
#   exit 0: compatible (additions only); 1: a break, with abidiff's report;
#   77: abidiff (Debian's abigail-tools) is not installed.
# To record a new baseline at a release:
#   abidw --no-corpus-path --headers-dir abi/include/ddplug build/lib/libddplug.so \
#     > abi/abi-baseline/libddplug.so.1.abi
set -uo pipefail
SRC=$1 BUILD=$2
base=$SRC/abi/abi-baseline/libddplug.so.1.abi
lib=$BUILD/lib/libddplug.so
command -v abidiff >/dev/null || { echo "abidiff not installed (apt-get install abigail-tools): skipped"; exit 77; }
report=$(abidiff "$base" "$lib" --headers-dir2 "$SRC/abi/include/ddplug" 2>&1)
rc=$?
# abidiff: bit 1 error, bit 2 usage, bit 4 ABI change, bit 8 incompatible change.
broken=0
(( rc & 3 )) && { echo "abidiff failed to run (exit $rc)"; broken=1; }
(( rc & 8 )) && broken=1
# Changes abidiff calls compatible but our append-only rule forbids.
if grep -Eq '[1-9][0-9]* Removed|data member deletion|offset changed|value changed from|type of .* changed|name of .* changed|enumerator deletion' <<<"$report"; then
  broken=1
fi
if (( broken )); then
  echo "ABI BREAK against $base:"
  echo "$report"
  exit 1
fi
added=$(grep -Ec "^\s*\[A\]" <<<"$report")
echo "ABI compatible with the baseline ($added additions)"
exit 0
