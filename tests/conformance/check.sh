#!/usr/bin/env bash
# check.sh — run `ddplug conformance` and check its report.
# usage: check.sh EXIT DDPLUG ARGS... -- LINE...
#   EXIT: the exit status expected (0: no check failed; 1: some failed)
#   LINE: extended regular expressions that must each match a line of the
#         report (e.g. '^  PASS  sampler \(distributed\)'); one that starts
#         with ! must match no line
set -uo pipefail
want=$1 cmd=$2
shift 2
args=()
while [[ $# -gt 0 && "$1" != "--" ]]; do args+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
out=$("$cmd" conformance "${args[@]}" 2>&1)
rc=$?
echo "$out"
[[ $rc == "$want" ]] || { echo "FAIL: ddplug conformance exited with $rc, expected $want"; exit 1; }
for line in "$@"; do
  if [[ $line == '!'* ]]; then
    ! grep -Eq -- "${line:1}" <<<"$out" || { echo "FAIL: a line of the report matches: ${line:1}"; exit 1; }
  else
    grep -Eq -- "$line" <<<"$out" || { echo "FAIL: no line of the report matches: $line"; exit 1; }
  fi
done
