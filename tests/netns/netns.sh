#!/usr/bin/env bash
# netns.sh — several "nodes" on one machine: network namespaces joined by
# veth links to a bridge, each link rate-limited with tc's tbf (this
# machine's kernel has no netem, so there is no delay or loss to add: only
# bandwidth). Used by the multi-node tests (tests/netns/test-netns.sh) and
# benchmarks (bench/mpi_allreduce_perf.py). Needs root and network
# namespaces; `netns.sh check` says whether they are permitted.
#
#   netns.sh check                      exit 0, or 77 with the reason
#   netns.sh up PREFIX N [RATE]         namespaces PREFIX1..PREFIXN (10.77.0.1..N/24 on
#                                       their eth0) and PREFIXsw (the bridge); RATE e.g. 5gbit
#   netns.sh down PREFIX N              kill what runs in them, delete them
#   netns.sh exec PREFIX I CMD...       run CMD in node I (its own hostname, PREFIXI)
#   netns.sh hosts PREFIX N SLOTS FMT   a hostfile: FMT ompi ("PREFIX1 slots=S") or hydra ("PREFIX1:S")
#   netns.sh rx PREFIX I                bytes node I's eth0 has received
#
# Launchers reach the nodes through tests/netns/nsrsh (an rsh that runs the
# command in the namespace named by the host), and must themselves run in
# node 1 (`netns.sh exec PREFIX 1 mpirun ...`): the others connect back to it.
# Names resolve through /etc/netns/<node>/hosts (ip netns exec mounts it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
shift || true

check() {
  [[ $(id -u) == 0 ]] || { echo "network namespaces need root (this is uid $(id -u))"; return 77; }
  command -v ip >/dev/null || { echo "no 'ip' command (iproute2)"; return 77; }
  command -v tc >/dev/null || { echo "no 'tc' command (iproute2)"; return 77; }
  local probe="ddpchk$$"
  if ! out=$(ip netns add "$probe" 2>&1); then
    echo "network namespaces are not permitted here: ip netns add: $out"
    return 77
  fi
  ip netns del "$probe" 2>/dev/null || true
  return 0
}

up() {
  local p=$1 n=$2 rate=${3:-}
  ip netns add "${p}sw"
  ip netns exec "${p}sw" ip link add br0 type bridge
  ip netns exec "${p}sw" ip link set br0 up
  for i in $(seq 1 "$n"); do
    local ns="$p$i"
    ip netns add "$ns"
    ip link add "v$i" netns "${p}sw" type veth peer name eth0 netns "$ns"
    ip netns exec "${p}sw" ip link set "v$i" master br0 up
    ip netns exec "$ns" ip addr add "10.77.0.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    if [[ -n "$rate" ]]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 10ms
    fi
    mkdir -p "/etc/netns/$ns"
    { echo "127.0.0.1 localhost"; for j in $(seq 1 "$n"); do echo "10.77.0.$j $p$j"; done; } \
      >"/etc/netns/$ns/hosts"
  done
}

down() {
  local p=$1 n=$2
  for i in $(seq 1 "$n") sw; do
    local ns="$p$i"
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for i in $(seq 1 "$n") sw; do
    ip netns del "$p$i" 2>/dev/null || true
    rm -rf "/etc/netns/$p$i"
  done
  rmdir /etc/netns 2>/dev/null || true
}

case "$cmd" in
  check) check ;;
  up) up "$@" ;;
  down) down "$@" ;;
  exec)
    p=$1 i=$2
    shift 2
    exec ip netns exec "$p$i" unshare --uts /bin/sh -c 'hostname "$0"; exec "$@"' "$p$i" "$@" ;;
  hosts)
    p=$1 n=$2 slots=$3 fmt=$4
    for i in $(seq 1 "$n"); do
      if [[ $fmt == hydra ]]; then echo "$p$i:$slots"; else echo "$p$i slots=$slots"; fi
    done ;;
  rx) ip netns exec "$1$2" cat /sys/class/net/eth0/statistics/rx_bytes ;;
  *) sed -n 2,24p "$0"; exit 2 ;;
esac
