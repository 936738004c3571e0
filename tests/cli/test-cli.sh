#!/usr/bin/env bash
# test-cli.sh — the `ddplug` command's info and run subcommands, end to end.
# usage: test-cli.sh DDPLUG_BIN TRAINER_BIN BUILD_DIR
set -uo pipefail
DDPLUG=$1 TRAINER=$2 BUILD=$3
fails=0 n=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect NAME RC REGEX -- COMMAND...: exit status RC and output matching REGEX.
expect() {
  local name=$1 rc=$2 re=$3; shift 4
  n=$((n + 1))
  local out got
  out=$("$@" 2>&1); got=$?
  if [[ $got -ne $rc ]] || ! grep -Eq -- "$re" <<<"$out"; then
    echo "FAIL $name: exit $got (want $rc), output must match /$re/:"
    sed 's/^/    /' <<<"$out"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

# expect_joined: as expect, with REGEX matched against the output's lines
# joined by " | " (for what spans lines).
expect_joined() {
  local name=$1 rc=$2 re=$3; shift 4
  n=$((n + 1))
  local out got
  out=$("$@" 2>&1); got=$?
  if [[ $got -ne $rc ]] || ! grep -Eq -- "$re" <<<"$(paste -sd '|' <<<"$out" | sed 's/|/ | /g')"; then
    echo "FAIL $name: exit $got (want $rc), output must match /$re/:"
    sed 's/^/    /' <<<"$out"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

echo '{"plugin": "example"}' >"$tmp/example.json"
echo 'not a shared object, just text; long enough for the ELF reader to say so' >"$tmp/fake.so"

expect info-name 0 '^plugin +example$' -- "$DDPLUG" info example
expect info-abi 0 '^ABI version +1\.4 ' -- "$DDPLUG" info example
expect info-json 0 '"name": "example".*"abi_version": "1\.4"' -- "$DDPLUG" info --json example
expect info-options 0 '^options +chunk_bytes +int 4096\.\.16777216, multiple of 4096; default 262144: ' -- "$DDPLUG" info cpu
expect info-old-table 0 '^ABI version +1\.0 ' -- "$DDPLUG" info "$BUILD/lib/test-plugins/libddplug-oldtable.so"
expect info-not-found 1 "plugin 'nosuch' not found; searched: .*libddplug-nosuch.so \(no such file\)" -- "$DDPLUG" info nosuch
expect info-not-a-plugin 1 'is not a ddplug plugin: it does not export ddplug_plugin_entry_v1' -- "$DDPLUG" info "$BUILD/lib/test-plugins/libddplug-nosymbol.so"
expect info-not-elf 1 "cannot load plugin '.*fake.so'" -- "$DDPLUG" info "$tmp/fake.so"
expect info-usage 2 'usage: ddplug info' -- "$DDPLUG" info
expect version 0 '^ddplug 0\.' -- "$DDPLUG" --version
expect unknown-command 2 "unknown command 'frobnicate'" -- "$DDPLUG" frobnicate

expect run-trainer 0 'weights identical on every rank: yes' -- "$DDPLUG" run -n 2 -- "$TRAINER" "$tmp/example.json"
expect run-simulated-nodes 0 '3 ranks on 2 node\(s\)' -- "$DDPLUG" run -n 3 --simulate-nodes 2 -- "$TRAINER" "$tmp/example.json"
expect run-failing-rank 3 'rank 1 \(pid [0-9]+\) exited with 3' -- "$DDPLUG" run -n 2 --grace 1 -- sh -c '[ "$RANK" = 1 ] && exit 3; exec sleep 30'
expect run-env 0 'RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1' -- "$DDPLUG" run -n 2 -- sh -c 'echo RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK MASTER_ADDR=$MASTER_ADDR'
expect run-usage 2 'usage: ddplug run' -- "$DDPLUG" run -- true
expect run-bad-number 2 '--nproc needs an integer from 1 to' -- "$DDPLUG" run --nproc x -- true
expect run-missing-program 127 "cannot start 'no-such-program-xyz'" -- "$DDPLUG" run -n 1 -- no-such-program-xyz
# --max-restarts: rank 1 kills itself in the first attempt; the second
# attempt (DDPLUG_RESTART_COUNT=1) runs on the same world, or without the
# lost rank with --shrink-on-restart, on a fresh port.
lose_first='[ "$DDPLUG_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && kill -9 $$; [ "$DDPLUG_RESTART_COUNT" = 0 ] && exec sleep 30; echo "attempt $DDPLUG_RESTART_COUNT: rank $RANK of $WORLD_SIZE"'
expect_joined run-restart 0 'restarting the run \(restart 1 of 2\) with 3 ranks.*attempt 1: rank 2 of 3' -- "$DDPLUG" run -n 3 --grace 1 --max-restarts 2 -- sh -c "$lose_first"
expect_joined run-restart-shrink 0 'restart 1 of 1\) with 2 ranks \(the lost ones left\).*attempt 1: rank 1 of 2' -- "$DDPLUG" run -n 3 --grace 1 --max-restarts 1 --shrink-on-restart -- sh -c "$lose_first"
expect run-restarts-spent 137 'rank 1 \(pid [0-9]+\) was killed by signal 9' -- "$DDPLUG" run -n 2 --grace 1 --max-restarts 1 -- sh -c '[ "$RANK" = 1 ] && kill -9 $$; exec sleep 30'
expect run-tolerate-loss 0 'rank 1 \(pid [0-9]+\) was lost \(signal 9, Killed\); the others go on' -- "$DDPLUG" run -n 2 --grace 1 --tolerate-loss -- sh -c '[ "$RANK" = 1 ] && kill -9 $$; sleep 2; exit 0'
expect run-tolerate-loss-error 5 'rank 0 \(pid [0-9]+\) exited with 5' -- "$DDPLUG" run -n 2 --grace 1 --tolerate-loss -- sh -c '[ "$RANK" = 1 ] && kill -9 $$; exit 5'
expect run-restart-min-nproc 137 '1 would remain, fewer than --min-nproc 2: not restarting' -- "$DDPLUG" run -n 2 --grace 1 --max-restarts 3 --shrink-on-restart --min-nproc 2 -- sh -c '[ "$RANK" = 1 ] && kill -9 $$; exec sleep 30'

echo "$((n - fails)) of $n command cases passed"
[[ $fails -eq 0 ]]
