#!/usr/bin/env python3
"""torch_backend_perf.py — ``torch.distributed.all_reduce`` on the "ddplug"
backend and on gloo, side by side in one run, with ddplug's own path
(``ddplug.Context.allreduce``, no torch.distributed) as the reference the
backend should reach; and ``send``/``recv`` on both backends in the same run.

    .venv/bin/python bench/torch_backend_perf.py [-n 2] [-b 8] [-e 64M] [--repeat 3] [--json FILE]
    .venv/bin/python bench/torch_backend_perf.py --profile      # where an 8-byte call's time goes

Each rank (torchrun-style environment, one torch thread) creates one TCPStore
and then, --repeat times, in turn: initialises torch.distributed with backend
"ddplug" (plugin from DDPLUG_CONFIG, else the library's CPU default) and times, per size (float32,
sizes doubling from -b to -e), ``dist.all_reduce(t)`` and ``ctx.allreduce(t)``
on the group's own context; destroys it; initialises gloo and times
``dist.all_reduce(t)``. Every size is checked once per backend (#wrong). The
slowest rank's mean time per call is kept, and the best of the repeats
(the machine is shared: the minimum is the least disturbed run). Prints one
table and, with --json, writes it.

Point-to-point (--p2p-sizes, default 8 B and 16 MiB; ranks 0 and 1): a
ping-pong of ``dist.send``/``dist.recv`` (rank 0 sends, rank 1 sends it back),
one-way time = half a round trip, on ddplug and on gloo; beside it, on ddplug,
a 16 MiB ``dist.broadcast`` from rank 0, whose bus bandwidth (bytes / time) is
what moving 16 MiB between ranks costs the plugin's collectives: a second
table compares the two (goals: 8 B at most 10 us one way, 16 MiB at least
80 % of the broadcast's bandwidth).

Beside both, torch.distributed's own cost per call: the same ``dist.all_reduce``
and ``dist.send``/``dist.recv`` on a process group whose calls do nothing but
return one finished Work (``NOOP``, registered only here). No backend reached
through ``torch.distributed`` can cost less; the tables show what ddplug adds
above it.

--profile (8 bytes, one backend): the layers of one call, each timed the same
way — the C call through ctypes, ddplug's Python path, the backend's
ProcessGroup.allreduce, torch's dist.all_reduce (synchronous, and async + wait)
— and the functions cProfile sees in dist.all_reduce.

--instructions (8 bytes; needs valgrind): instructions per call on rank 0, the
others running natively: the no-op group, ddplug (``dist.all_reduce``, the own
path, send + recv), gloo and torch's C++ ``FakeProcessGroup``. Rank 0 runs
under callgrind with its instrumentation switched on only around each layer's
calls. Unlike wall time on a shared machine, the count is the same from run to
run, so it is the measure of a change to the per-call path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def human(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}iB"
    return f"{n} B"


def iterations(seconds_per_call: float, budget_s: float) -> int:
    """Calls that fill about ``budget_s`` (5 .. 20000)."""
    return max(5, min(20000, int(budget_s / max(seconds_per_call, 1e-7))))


NOOP = "ddplug_bench_noop"


def register_noop() -> None:
    """Register ``NOOP``: a ProcessGroup whose all_reduce, broadcast, barrier,
    send and recv do nothing and return one finished Work. ``dist.all_reduce``
    on it is torch.distributed's own cost per call (argument checks, options,
    group look-up, Work.wait): the floor of every backend's time."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup, _create_work_from_future

    if NOOP in dist.Backend.backend_list:
        return
    fut = torch.futures.Future()
    fut.set_result(None)
    done = _create_work_from_future(fut)

    class NoopGroup(ProcessGroup):
        allreduce = staticmethod(lambda tensors, opts=None: done)
        broadcast = staticmethod(lambda tensors, opts=None: done)
        barrier = staticmethod(lambda opts=None: done)
        send = staticmethod(lambda tensors, dst, tag=0: done)
        recv = staticmethod(lambda tensors, src, tag=0: done)

        def getBackendName(self) -> str:
            return NOOP

    dist.Backend.register_backend(NOOP, lambda opts, backend_options=None: NoopGroup(opts.group_rank,
                                                                                    opts.group_size),
                                  extended_api=True, devices=["cpu"])


def pingpong(dist, t, rank: int) -> None:
    """One round trip of ``t``: rank 0 sends, rank 1 sends it back (others idle)."""
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        dist.send(t, 0)


def noop_pair(dist, t, rank: int, ws: int) -> None:
    """A send and a receive on the no-op group (nothing is communicated)."""
    dist.send(t, (rank + 1) % ws)
    dist.recv(t, (rank + 1) % ws)


# ---- one rank ------------------------------------------------------------------------
def worker(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "hosts" / "python"))
    import ddplug  # noqa: F401  (registers the backend)
    from ddplug.distributed import context_of

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ws, rank == 0)
    sizes = []
    s = parse_size(a.b)
    while s <= parse_size(a.e):
        sizes.append(s)
        s *= int(a.f)

    def timed(fn) -> tuple:
        """(mean seconds per call, calls): a few timed calls decide how many
        fill --budget; every rank takes the largest count (they must issue the
        same collectives)."""
        for _ in range(20):  # warm: caches, the plugin's progress engine in its synchronous mode
            fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        k = torch.tensor([iterations((time.perf_counter() - t0) / 3, a.budget)])
        dist.all_reduce(k, op=dist.ReduceOp.MAX)
        n = int(k.item())
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n, n

    register_noop()
    out: dict = {"rank": rank, "rows": [], "plugin": "", "floor": float("inf"), "p2p_floor": float("inf")}
    rows = {}
    for rep in range(a.repeat):
        # torch.distributed's own cost per 8-byte call (no communication)
        dist.init_process_group(NOOP, store=dist.PrefixStore(f"noop/{rep}", store), rank=rank, world_size=ws)
        t = torch.zeros(2)
        out["floor"] = min(out["floor"], timed(lambda: dist.all_reduce(t))[0] * 1e6)
        if ws >= 2:  # and of an 8-byte send + recv, per direction
            out["p2p_floor"] = min(out["p2p_floor"], timed(lambda: noop_pair(dist, t, rank, ws))[0] / 2 * 1e6)
        dist.destroy_process_group()
        for backend in ("ddplug", "gloo"):
            dist.init_process_group(backend, store=dist.PrefixStore(f"{backend}/{rep}", store), rank=rank,
                                    world_size=ws)
            ctx = context_of() if backend == "ddplug" else None
            if ctx is not None:
                out["plugin"] = ctx.plugin["name"]
            for nbytes in sizes:
                n = max(1, nbytes // 4)
                t = torch.full((n,), float(rank + 1))
                row = rows.setdefault(nbytes, {"size": nbytes, "wrong": 0})
                cols = [(backend, lambda: dist.all_reduce(t))]
                if ctx is not None:
                    cols.append(("own", lambda: ctx.allreduce(t)))
                for name, fn in cols:
                    sec, k = timed(fn)
                    row[name] = min(row.get(name, float("inf")), sec * 1e6)
                    row[f"{name}_calls"] = k
                    t.fill_(float(rank + 1))
                    fn()
                    if not bool((t == float(ws * (ws + 1) // 2)).all()):
                        row["wrong"] += 1
            dist.destroy_process_group()
    out["rows"] = list(rows.values())
    out["p2p"] = p2p_rows(a, rank, ws, store, timed) if ws >= 2 else []  # send/recv need ranks 0 and 1
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def p2p_rows(a: argparse.Namespace, rank: int, ws: int, store, timed) -> list:
    """send/recv one-way times (µs) per size and backend, and on ddplug the
    broadcast of the largest size (the bandwidth anchor): see the module doc."""
    import torch
    import torch.distributed as dist

    sizes = [parse_size(x) for x in a.p2p_sizes.split(",") if x]
    rows = {n: {"size": n, "wrong": 0} for n in sizes}
    for rep in range(a.repeat):
        for backend in ("ddplug", "gloo"):
            dist.init_process_group(backend, store=dist.PrefixStore(f"p2p-{backend}/{rep}", store), rank=rank,
                                    world_size=ws)
            for nbytes in sizes:
                t = torch.full((max(1, nbytes // 4),), float(rank))
                sec, k = timed(lambda: pingpong(dist, t, rank))
                row = rows[nbytes]
                row[backend] = min(row.get(backend, float("inf")), sec / 2 * 1e6)
                row[f"{backend}_calls"] = k
                if rank < 2:  # one checked round: rank 1 sends back what it got
                    t.fill_(float(rank))
                    pingpong(dist, t, rank)
                    if not bool((t == 0.0).all()):
                        row["wrong"] += 1
            if backend == "ddplug" and sizes:
                big = torch.full((max(1, sizes[-1] // 4),), float(rank))
                sec, _ = timed(lambda: dist.broadcast(big, src=0))
                rows[sizes[-1]]["bcast"] = min(rows[sizes[-1]].get("bcast", float("inf")), sec * 1e6)
            dist.destroy_process_group()
    return list(rows.values())


def print_p2p(per_rank: list, n: int, plugin: str, floor: float) -> list:
    """The point-to-point table (the slowest rank's time per size) and its goals."""
    rows = []
    for i, row in enumerate(per_rank[0]):
        merged = dict(row)
        for col in ("ddplug", "gloo", "bcast"):
            if col in row:
                merged[col] = max(pr[i][col] for pr in per_rank)
        merged["wrong"] = sum(pr[i]["wrong"] for pr in per_rank)
        rows.append(merged)
    print(f"\ntorch.distributed.send/recv (one way: half a ping-pong between ranks 0 and 1), float32, {n} ranks,"
          f" plugin {plugin}\n")
    print(f"| {'size':>8} | {'ddplug us':>10} | {'gloo us':>10} | {'gloo / ddplug':>13} | {'ddplug GB/s':>11} |"
          f" {'wrong':>5} |")
    print(f"|{'-' * 10}|{'-' * 12}|{'-' * 12}|{'-' * 15}|{'-' * 13}|{'-' * 7}|")
    for r in rows:
        r["ddplug_gbs"] = r["size"] / (r["ddplug"] * 1e-6) / 1e9
        print(f"| {human(r['size']):>8} | {r['ddplug']:10.1f} | {r['gloo']:10.1f} |"
              f" {r['gloo'] / r['ddplug']:12.1f}x | {r['ddplug_gbs']:11.2f} | {r['wrong']:5d} |")
    print("\ngoals (send/recv):")
    small = next((r for r in rows if r["size"] == 8), None)
    if small:
        print(f"  8 B at most 10 us one way: {small['ddplug']:.1f} us -> {'met' if small['ddplug'] <= 10 else 'NOT met'}")
        small["floor"] = floor
        print(f"    torch.distributed's own cost of a send + recv (a group that does nothing), per direction:"
              f" {floor:.1f} us; ddplug adds {small['ddplug'] - floor:.1f} us")
    big = rows[-1] if rows and "bcast" in rows[-1] and rows[-1]["size"] >= 1 << 20 else None
    if big:
        bcast_gbs = big["size"] / (big["bcast"] * 1e-6) / 1e9
        share = big["ddplug_gbs"] / bcast_gbs
        big["bcast_busbw_gbs"], big["share_of_bcast"] = bcast_gbs, share
        print(f"  {human(big['size'])} at least 80 % of the plugin's broadcast bus bandwidth ({bcast_gbs:.2f} GB/s):"
              f" {big['ddplug_gbs']:.2f} GB/s = {100 * share:.0f} % -> {'met' if share >= 0.8 else 'NOT met'}")
    return rows


def profile(a: argparse.Namespace) -> None:
    """--profile: the layers of one 8-byte call (rank 0 prints)."""
    import cProfile
    import io
    import pstats

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "hosts" / "python"))
    import ddplug  # noqa: F401
    from ddplug._c import _names
    from ddplug._c._capi import F
    from ddplug.distributed import context_of

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("ddplug")
    ctx, pg = context_of(), dist.group.WORLD
    plugin = ctx.plugin["name"]
    t = torch.zeros(2)
    h, p = ctx.handle, t.data_ptr()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    c_allreduce = F.ddplug_allreduce
    f32, op_sum = _names.dtypes()["float32"], _names.ops()["sum"]
    layers = [
        ("C ddplug_allreduce through ctypes", lambda: c_allreduce(h, p, p, 2, f32, op_sum, None)),
        ("ddplug.Context.allreduce (own path)", lambda: ctx.allreduce(t)),
        ("ProcessGroupDdplug.allreduce (synchronous)", lambda: pg.allreduce([t], opts)),
        ("dist.all_reduce", lambda: dist.all_reduce(t)),
        ("dist.all_reduce(async_op=True).wait()", lambda: dist.all_reduce(t, async_op=True).wait()),
    ]
    n = 20000
    res = []
    for name, fn in layers:
        best = best_cpu = float("inf")
        for _ in range(a.repeat):
            for _ in range(1000):
                fn()
            dist.barrier()
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            best_cpu = min(best_cpu, (time.thread_time() - c0) / n * 1e6)
        res.append((name, best, best_cpu))
    prof = cProfile.Profile()
    dist.barrier()
    prof.enable()
    for _ in range(n):
        dist.all_reduce(t)
    prof.disable()
    dist.destroy_process_group()
    if rank == 0:
        print(f"\n8-byte all_reduce on {ws} ranks, plugin {plugin}:"
              f" time per call (best of {a.repeat} x {n} calls); CPU: the calling thread's CPU time"
              " per call (a machine's other load does not add to it; waiting for a peer spins, so on"
              " several ranks it includes the wait)\n")
        print(f"| {'layer':<44} | {'us/call':>8} | {'added':>7} | {'CPU us':>7} | {'added':>7} |")
        print(f"|{'-' * 46}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
        prev = prev_cpu = None
        for name, us, cpu in res[:4]:
            added = f"{us - prev:+.2f}" if prev is not None else "-"
            added_cpu = f"{cpu - prev_cpu:+.2f}" if prev_cpu is not None else "-"
            print(f"| {name:<44} | {us:8.2f} | {added:>7} | {cpu:7.2f} | {added_cpu:>7} |")
            prev, prev_cpu = us, cpu
        print(f"| {res[4][0]:<44} | {res[4][1]:8.2f} | {'':>7} | {res[4][2]:7.2f} | {'':>7} |")
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(10)
        print("\ncProfile of dist.all_reduce (tottime, with the profiler's own overhead):")
        print("\n".join(line for line in s.getvalue().splitlines()[4:] if line.strip()))


# --instructions: its layers, in order, (backend, call) -> label
INSTR_LAYERS = {
    (NOOP, "all_reduce"): "dist.all_reduce, a group that does nothing (torch's own cost)",
    ("ddplug", "all_reduce"): "dist.all_reduce, ddplug",
    ("ddplug", "own"): "ddplug.Context.allreduce (own path)",
    ("gloo", "all_reduce"): "dist.all_reduce, gloo",
    ("fake", "all_reduce"): "dist.all_reduce, torch's C++ FakeProcessGroup",
    (NOOP, "send_recv"): "dist.send + dist.recv, a group that does nothing",
    ("ddplug", "send_recv"): "dist.send + dist.recv, ddplug",
    ("gloo", "send_recv"): "dist.send + dist.recv, gloo",
}


def instructions_worker(a: argparse.Namespace) -> None:
    """--instructions, one rank: every rank makes the same calls, layer by layer;
    rank 0 (under callgrind) tells the parent before and after each layer's
    calls, through files in --out, and waits for its answer."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "hosts" / "python"))
    import ddplug  # noqa: F401
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from ddplug.distributed import context_of

    torch.set_num_threads(1)
    register_noop()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ws, rank == 0)
    t = torch.full((2,), float(rank + 1))

    def handshake(name: str) -> None:
        open(os.path.join(a.out, f"{name}.ready"), "w").close()
        while not os.path.exists(os.path.join(a.out, f"{name}.go")):
            time.sleep(0.01)

    calls = {"all_reduce": lambda: dist.all_reduce(t), "send_recv": lambda: pingpong(dist, t, rank)}
    for i, (backend, layer) in enumerate(INSTR_LAYERS):
        kw = {"store": dist.PrefixStore(f"instr/{i}", store)} if backend != "fake" else {
            "store": dist.HashStore()}
        dist.init_process_group(backend, rank=rank, world_size=ws, **kw)
        fn = calls.get(layer)
        if layer == "own":
            ctx = context_of()
            fn = lambda: ctx.allreduce(t)  # noqa: E731
        elif backend == NOOP and layer == "send_recv":
            fn = lambda: noop_pair(dist, t, rank, ws)  # noqa: E731
        for _ in range(200):  # warm
            fn()
        if backend not in (NOOP, "fake"):
            dist.barrier()
        name = f"{i}-{backend}-{layer}"
        if rank == 0:
            handshake(name)
        for _ in range(a.calls):
            fn()
        if rank == 0:
            open(os.path.join(a.out, f"{name}.done"), "w").close()
            while not os.path.exists(os.path.join(a.out, f"{name}.counted")):
                time.sleep(0.01)
        if backend not in (NOOP, "fake"):
            dist.barrier()
        dist.destroy_process_group()


def instructions(a: argparse.Namespace, tmp: str, procs: list) -> list:
    """--instructions, the parent's side: switch rank 0's instrumentation on
    and off around each layer (callgrind_control), read each dump's total."""
    vg = procs[0]
    cg = os.path.join(tmp, "callgrind.out")

    def control(*args: str) -> None:
        r = subprocess.run(["callgrind_control", *args, str(vg.pid)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"callgrind_control {' '.join(args)} {vg.pid} failed: {r.stdout}{r.stderr}")

    def wait_for(path: str) -> None:
        while not os.path.exists(path):
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit(f"a rank failed: exit codes {[p.poll() for p in procs]}")
            time.sleep(0.02)

    out, dumps = [], 0
    for i, (backend, layer) in enumerate(INSTR_LAYERS):
        name = os.path.join(tmp, f"{i}-{backend}-{layer}")
        wait_for(name + ".ready")
        control("--zero")
        control("--instr=on")
        open(name + ".go", "w").close()
        wait_for(name + ".done")
        control("--instr=off")
        control("--dump")
        dumps += 1
        with open(f"{cg}.{dumps}") as f:
            total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
        open(name + ".counted", "w").close()
        out.append({"backend": backend, "layer": layer, "instructions": total / a.calls})
    return out


def print_instructions(rows: list, a: argparse.Namespace) -> None:
    floor = {r["layer"]: r["instructions"] for r in rows if r["backend"] == NOOP}
    print(f"\n8-byte calls on {a.n} ranks: instructions per call on rank 0 (callgrind, {a.calls} calls per layer;"
          " the other ranks run natively). A send + recv is one of each (on ranks 0 and 1: a round trip)\n")
    print(f"| {'layer':<62} | {'instructions':>12} | {'vs no-op':>8} |")
    print(f"|{'-' * 64}|{'-' * 14}|{'-' * 10}|")
    for r in rows:
        base = floor.get("send_recv" if r["layer"] == "send_recv" else "all_reduce")
        r["vs_noop"] = r["instructions"] / base if base else None
        rel = f"{r['vs_noop']:7.2f}x" if r["vs_noop"] else ""
        print(f"| {INSTR_LAYERS[(r['backend'], r['layer'])]:<62} | {r['instructions']:12,.0f} | {rel:>8} |")


# ---- the parent ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2, help="ranks")
    ap.add_argument("-b", default="8", help="smallest size in bytes (8, 4K, 1M)")
    ap.add_argument("-e", default="64M", help="largest size in bytes")
    ap.add_argument("-f", default="2", help="size factor")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every size; the best is kept")
    ap.add_argument("--budget", type=float, default=0.2, help="seconds of calls per size, backend and run")
    ap.add_argument("--json", default=None, help="also write the table here")
    ap.add_argument("--p2p-sizes", default="8,16M", help="send/recv sizes (comma-separated; the last is also"
                    " the broadcast anchor; empty: none)")
    ap.add_argument("--profile", action="store_true", help="break an 8-byte call down into its layers")
    ap.add_argument("--instructions", action="store_true", help="instructions per 8-byte call on rank 0 (callgrind;"
                    " needs valgrind): the same on every run, where wall time is not")
    ap.add_argument("--calls", type=int, default=5000, help="--instructions: calls per layer")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        profile(a) if a.profile else instructions_worker(a) if a.instructions else worker(a)
        return
    if a.instructions:
        missing = [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]
        if missing:
            raise SystemExit(f"--instructions needs valgrind ({', '.join(missing)} not found): apt-get install valgrind")
        if a.n < 2:
            raise SystemExit("--instructions needs at least 2 ranks (-n 2): send/recv go between ranks 0 and 1")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="ddplug-torch-bench-")
    port = free_port()
    env = dict(os.environ)
    env.setdefault("DDPLUG_BUILD_DIR", str(ROOT / "build"))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    procs = []
    for r in range(a.n):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(a.n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, __file__, "--worker", "--out", tmp, "-b", a.b, "-e", a.e, "-f", a.f,
               "--repeat", str(a.repeat), "--budget", str(a.budget), "--p2p-sizes", a.p2p_sizes] \
            + (["--profile"] if a.profile else []) + (["--instructions", "--calls", str(a.calls)]
                                                      if a.instructions else [])
        if a.instructions and r == 0:
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "-q",
                   f"--callgrind-out-file={os.path.join(tmp, 'callgrind.out')}"] + cmd
        procs.append(subprocess.Popen(cmd, env=e))
    instr = instructions(a, tmp, procs) if a.instructions else None
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    if a.profile:
        return
    if instr is not None:
        print_instructions(instr, a)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"ranks": a.n, "calls": a.calls, "instructions": instr}, f, indent=2)
        return
    results = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(a.n)]
    per_rank = [res["rows"] for res in results]
    plugin = results[0]["plugin"]
    rows = []
    for i, row in enumerate(per_rank[0]):
        merged = dict(row)
        for col in ("ddplug", "own", "gloo"):
            merged[col] = max(pr[i][col] for pr in per_rank)  # the slowest rank's time
        merged["wrong"] = sum(pr[i]["wrong"] for pr in per_rank)
        rows.append(merged)
    load = os.getloadavg()[0]
    print(f"\ntorch.distributed.all_reduce, float32, {a.n} ranks, plugin"
          f" {plugin}; best of {a.repeat} runs, slowest rank"
          f" (load average {load:.1f} on {os.cpu_count()} CPUs)\n")
    print(f"| {'size':>8} | {'ddplug us':>10} | {'own path us':>11} | {'gloo us':>10} | {'vs own':>7} |"
          f" {'gloo / ddplug':>13} | {'ddplug GB/s':>11} | {'wrong':>5} |")
    print(f"|{'-' * 10}|{'-' * 12}|{'-' * 13}|{'-' * 12}|{'-' * 9}|{'-' * 15}|{'-' * 13}|{'-' * 7}|")
    for r in rows:
        r["vs_own"] = r["ddplug"] / r["own"]
        r["gloo_over_ddplug"] = r["gloo"] / r["ddplug"]
        r["ddplug_busbw_gbs"] = r["size"] / (r["ddplug"] * 1e-6) * 2 * (a.n - 1) / a.n / 1e9
        print(f"| {human(r['size']):>8} | {r['ddplug']:10.1f} | {r['own']:11.1f} | {r['gloo']:10.1f} |"
              f" {r['vs_own']:6.2f}x | {r['gloo_over_ddplug']:12.1f}x | {r['ddplug_busbw_gbs']:11.2f} |"
              f" {r['wrong']:5d} |")
    big = [r for r in rows if r["size"] >= 1 << 20]
    small = next((r for r in rows if r["size"] == 8), None)
    print("\ngoals:")
    if big:
        worst = max(big, key=lambda r: r["vs_own"])
        print(f"  >= 1 MiB within 5 % of ddplug's own path: worst {human(worst['size'])} at"
              f" {100 * (worst['vs_own'] - 1):+.1f} % -> {'met' if worst['vs_own'] <= 1.05 else 'NOT met'}")
    floor = max(res["floor"] for res in results)
    if small:
        print(f"  8 B at most 10 us per call: {small['ddplug']:.1f} us -> {'met' if small['ddplug'] <= 10 else 'NOT met'}")
        print(f"    torch.distributed's own cost per call (a group that does nothing): {floor:.1f} us;"
              f" ddplug adds {small['ddplug'] - floor:.1f} us, gloo {small['gloo'] - floor:.1f} us")
    p2p = print_p2p([res["p2p"] for res in results], a.n, plugin, max(res["p2p_floor"] for res in results)) if a.n >= 2 and results[0]["p2p"] else []
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": a.n, "repeat": a.repeat, "plugin": plugin, "load_average": load, "rows": rows,
                       "floor_us": floor, "p2p": p2p}, f, indent=2)


if __name__ == "__main__":
    main()
