#!/usr/bin/env bash
# test-netns.sh — the mpi plugin across "nodes" that are network namespaces
# on this machine (netns.sh: veth links at 5 Gbit/s through a bridge; no
# netem here, so no added delay), started by real launchers through the
# nsrsh agent, with no MASTER_ADDR: the bootstrap finds rank 0's store
# across the link.
#   1. Open MPI 4.1, 2 nodes x 1 rank: the C trainer trains (weights equal
#      on every rank, 2 nodes found by host identity) and a 16 MiB allreduce
#      benchmark's data crosses node 2's link (its eth0 received > 16 MiB);
#   2. MPICH hydra, the same (UCX told to use TCP on eth0: between
#      namespaces of one kernel it would use shared memory);
#   3. Open MPI, 2 nodes x 2 ranks: the hierarchical allreduce (the node's
#      part through the cpu plugin, the leaders' over MPI) is exact.
# Exit 77 (skipped) where network namespaces are not permitted, or a
# family's launcher or backend is missing (for that family's part).
# usage: test-netns.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
why=$("$here/netns.sh" check) || { rc=$?; echo "SKIP: $why"; exit "$rc"; }
P="dd$(printf '%04x' $((RANDOM % 65536)))n"
N=2
cleanup() { "$here/netns.sh" down "$P" "$N"; rm -rf "$work"; }
work=$(mktemp -d /tmp/ddplug-netns.XXXXXX)
trap cleanup EXIT
"$here/netns.sh" up "$P" "$N" 5gbit || { echo "FAIL: could not make the namespaces"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DDPLUG_PLUGIN_PATH="$build/lib" DDPLUG_LOG=warn DDPLUG_BUILD_DIR="$build"
echo '{"timeouts": {"collective_s": 60}, "data_split": {"audit": "first_epoch"}}' >"$work/run.json"
fails=0 ran=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

ompi() { # SLOTS RANKS CMD...
  local slots=$1 n=$2
  shift 2
  "$here/netns.sh" hosts "$P" "$N" "$slots" ompi >"$work/hosts.ompi"
  timeout 300 "$here/netns.sh" exec "$P" 1 mpirun.openmpi --hostfile "$work/hosts.ompi" -n "$n" \
    --mca plm_rsh_agent "$here/nsrsh" --mca oob_tcp_if_include 10.77.0.0/24 \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca pml ob1 --mca btl tcp,self,vader \
    -x DDPLUG_PLUGIN_PATH -x DDPLUG_LOG -x DDPLUG_BUILD_DIR -x DT_MPI_RANK "$@"
}
hydra() { # SLOTS RANKS CMD...
  local slots=$1 n=$2
  shift 2
  "$here/netns.sh" hosts "$P" "$N" "$slots" hydra >"$work/hosts.hydra"
  timeout 300 "$here/netns.sh" exec "$P" 1 mpiexec.hydra -f "$work/hosts.hydra" -launcher rsh \
    -launcher-exec "$here/nsrsh" -iface eth0 -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0 \
    -n "$n" "$@"
}

two_nodes() { # FAMILY LAUNCHER-FUNCTION
  local fam=$1 run=$2
  local out
  ran=$((ran + 1))
  out=$($run 1 2 "$build/bin/ddplug-c-trainer" "$work/run.json" 2>&1)
  echo "$out" | tail -5
  grep -q "2 ranks on 2 node(s), launched by mpi" <<<"$out" || fail "$fam: the trainer did not see 2 nodes"
  grep -q "weights identical on every rank: yes" <<<"$out" || fail "$fam: the trainer did not finish equal"
  local before after
  before=$("$here/netns.sh" rx "$P" 2)
  out=$($run 1 2 "$build/bin/ddplug-allreduce-perf" --plugin mpi -b 16M -e 16M -w 1 -i 2 2>&1)
  after=$("$here/netns.sh" rx "$P" 2)
  echo "$out" | grep -E "^ +16777216|wrong"
  grep -q "total wrong elements: 0" <<<"$out" || fail "$fam: the 16 MiB allreduce across the link failed: $out"
  (( after - before > 16777216 )) || fail "$fam: node 2's link received only $((after - before)) bytes"
  echo "ok: $fam, 2 nodes x 1 rank ($(( (after - before) / 1048576 )) MiB over node 2's link)"
}

if [[ -f "$build/lib/libddplug-mpi-openmpi.so" ]] && command -v mpirun.openmpi >/dev/null; then
  two_nodes openmpi ompi
  ran=$((ran + 1))
  out=$(DT_MPI_RANK=hier ompi 2 4 "$build/bin/test-mpi" 2>&1)
  n=$(grep -c " HIER 16 allreduces right" <<<"$out")
  [[ $n == 4 ]] || fail "openmpi: the hierarchical allreduce on 2 nodes x 2 ranks: $out"
  echo "ok: openmpi, 2 nodes x 2 ranks, hierarchical allreduce ($n ranks right)"
fi
if [[ -f "$build/lib/libddplug-mpi-mpich.so" ]] && command -v mpiexec.hydra >/dev/null; then
  two_nodes mpich hydra
fi
[[ $ran == 0 ]] && { echo "SKIP: no MPI family with a backend and a launcher"; exit 77; }
[[ $fails == 0 ]] || exit 1
echo "ok: the mpi plugin across network namespaces"
