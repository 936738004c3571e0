#!/usr/bin/env bash
# test-torchrun.sh — the C trainer launched by the REAL torchrun (torch's
# elastic agent): since torch 2.4 the agent serves its own TCPStore on
# MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), so ddplug's rank 0 must
# serve elsewhere and publish its port there. Three launches: --standalone
# (c10d rendezvous on one node), static rendezvous on 2 simulated nodes
# (--master-addr/--master-port, the classic multi-node form) and c10d
# rendezvous on 2 simulated nodes (--rdzv-endpoint); plus an explicit
# rendezvous.port, which bypasses torchrun's store. Node identity is
# simulated with DDPLUG_HOST_ID.
# usage: test-torchrun.sh PYTHON TRAINER_BIN BUILD_DIR
# Exit 77 (skipped) when PYTHON has no torch.
set -uo pipefail
PY=$1 TRAINER=$2 BUILD=$3
TORCHRUN=$(dirname "$PY")/torchrun
if [[ ! -x "$TORCHRUN" ]] || ! "$PY" -c 'import torch.distributed.run' 2>/dev/null; then
  echo "skipped: no torchrun beside $PY"
  exit 77
fi
export DDPLUG_PLUGIN_PATH="$BUILD/lib${DDPLUG_PLUGIN_PATH:+:$DDPLUG_PLUGIN_PATH}"
export OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/run.json" <<'JSON'
{"plugin": "cpu", "log_level": "warn", "rendezvous": {"timeout_s": 60}, "timeouts": {"collective_s": 60}}
JSON
free_port() { "$PY" "$(dirname "$0")/../python/free_port.py"; }
fails=0

# check NAME WANT_RANKS WANT_NODES RANK0_LOG LOG...: every launch exited 0
# (its exit status is in LOG.rc), rank 0's log says the run trained to
# identical weights with the expected world.
check() {
  local name=$1 ranks=$2 nodes=$3 log0=$4; shift 4
  local ok=1
  for log in "$@"; do [[ "$(cat "$log.rc")" == 0 ]] || ok=0; done
  grep -q "weights identical on every rank: yes" "$log0" || ok=0
  grep -q "$ranks ranks on $nodes node(s), launched by torchrun" "$log0" || ok=0
  if [[ $ok == 1 ]]; then
    echo "ok   $name"
  else
    echo "FAIL $name"
    for log in "$@"; do echo "---- $log (exit $(cat "$log.rc"))"; grep -v '^W[0-9]' "$log" | sed 's/^/    /' | tail -30; done
    fails=$((fails + 1))
  fi
}

# launch LOG ARGS...: torchrun ARGS in the background, exit status to LOG.rc.
launch() {
  local log=$1; shift
  ( timeout 180 "$TORCHRUN" "$@" >"$log" 2>&1; echo $? >"$log.rc" ) &
}

launch "$tmp/sa.log" --standalone --nproc-per-node 2 --no-python "$TRAINER" "$tmp/run.json"
wait
check standalone 2 1 "$tmp/sa.log" "$tmp/sa.log"

port=$(free_port)
for n in 0 1; do
  DDPLUG_HOST_ID=node$n launch "$tmp/static$n.log" --nnodes 2 --node-rank $n --nproc-per-node 2 \
    --master-addr 127.0.0.1 --master-port "$port" --no-python "$TRAINER" "$tmp/run.json"
done
wait
check static-two-nodes 4 2 "$tmp/static0.log" "$tmp/static0.log" "$tmp/static1.log"

port=$(free_port)
for n in 0 1; do
  DDPLUG_HOST_ID=node$n launch "$tmp/c10d$n.log" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "ddplug-test-$$" --no-python "$TRAINER" "$tmp/run.json"
done
wait
# c10d may number the nodes either way: rank 0's log is the one with the banner.
banner=$(grep -l "launched by torchrun" "$tmp/c10d0.log" "$tmp/c10d1.log" | head -1)
check c10d-two-nodes 2 2 "${banner:-$tmp/c10d0.log}" "$tmp/c10d0.log" "$tmp/c10d1.log"

# An explicit rendezvous.port: ddplug's own store there, torchrun's untouched.
port=$(free_port)
sed "s/\"timeout_s\": 60}/\"timeout_s\": 60, \"port\": $port}/" "$tmp/run.json" >"$tmp/port.json"
launch "$tmp/port.log" --standalone --nproc-per-node 2 --no-python "$TRAINER" "$tmp/port.json"
wait
check explicit-port 2 1 "$tmp/port.log" "$tmp/port.log"

exit $((fails > 0))
