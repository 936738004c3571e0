#!/usr/bin/env python3
"""gloo_allreduce_perf.py — torch.distributed gloo allreduce benchmark, same
sizes and output format as ddplug-allreduce-perf, so the tables compare
line by line.

    python bench/gloo_allreduce_perf.py -b 8 -e 256M -f 2 -n 2 --mode tcp

--mode tcp  gloo's TCP transport (the default path of torch.distributed on
            CPU): the workers run without LOCAL_WORLD_SIZE.
--mode shm  gloo's shared-memory allreduce, where the gloo bundled with torch
            has it. Upstream gloo added one (gloo/allreduce_shm.cc, pytorch/gloo
            PR #458, "Intra-node shared memory (SHM) optimizations for CPU
            primitives", 2025): allreduce() switches to it when the
            environment variable LOCAL_WORLD_SIZE equals the group size
            (torchrun sets it); its segments are named
            /dev/shm/shm_allreduce_buffer_<uid>_<addr>_<port>_<rank> (earlier
            revisions: deepspeed_allreduce_buffer_...), and some revisions take
            the world size and rank from PMI_SIZE and PMI_RANK (std::stoi of
            getenv: a crash when unset). This mode sets LOCAL_WORLD_SIZE=n and,
            harmlessly, PMI_SIZE=n and PMI_RANK=rank, then reports whether the
            path is in this torch's libtorch_cpu.so (the strings above) and
            whether it really ran (a segment appeared in /dev/shm).

            Finding for torch 2.13.0+cpu (the .venv of this repository): the
            path is ABSENT. libtorch_cpu.so contains none of
            "shm_allreduce_buffer", "deepspeed_allreduce_buffer",
            "LOCAL_WORLD_SIZE", "PMI_SIZE" (grep -c -a: 0 each), and of gloo's
            source paths compiled into it (strings | grep third_party/gloo)
            it lists gloo/allreduce.cc but no gloo/allreduce_shm.cc. So
            --mode shm measures gloo's TCP path again, with LOCAL_WORLD_SIZE
            set; the run says so (detected at run time, so a later torch with
            the path is measured through it and reported as used).

Every worker pins torch to one intra-op thread (gloo uses its own), checks
the result of one extra allreduce per size (#wrong), and the slowest rank's
average time is reported, as in ddplug-allreduce-perf.
"""
import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import threading
import time

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = {"sum": "SUM", "avg": "AVG", "min": "MIN", "max": "MAX", "prod": "PRODUCT",
       "bor": "BOR", "band": "BAND"}
# Strings that gloo's shared-memory allreduce puts into the library: its
# segment names (current and earlier upstream revisions), the environment
# variables it reads, its source file's path.
SHM_MARKS = (b"shm_allreduce_buffer", b"deepspeed_allreduce_buffer",
             b"LOCAL_WORLD_SIZE", b"PMI_SIZE", b"gloo/allreduce_shm")


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("b")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(float(s))


def args_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=float, default=2.0)
    p.add_argument("-n", type=int, default=2)
    p.add_argument("-d", default="float32", choices=DTYPES)
    p.add_argument("-o", default="sum", choices=sorted(OPS))
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-i", type=int, default=0, help="0 = automatic (>= 20, ~0.1 s per size)")
    p.add_argument("-c", type=int, default=1)
    p.add_argument("--mode", choices=["tcp", "shm"], default="tcp")
    p.add_argument("--json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def torch_gloo_shm_evidence():
    """Look for gloo's shared-memory allreduce in this torch's libtorch_cpu.so.
    Returns (present, path, {marker: found}); present is None when the
    library cannot be read."""
    import mmap
    import torch
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found = {k.decode(): m.find(k) >= 0 for k in SHM_MARKS}
    except (OSError, ValueError):
        return None, lib, {}
    # the segment name is the one string its code cannot do without
    present = found["shm_allreduce_buffer"] or found["deepspeed_allreduce_buffer"]
    return present, lib, found


def describe_evidence(present, lib, found):
    if present is None:
        return f"cannot read {lib}: unknown whether this torch has it"
    marks = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in found.items())
    return (f"{'PRESENT' if present else 'ABSENT'} in this torch build ({lib}: {marks})")


def sizes(a):
    lo, hi = parse_size(a.b), parse_size(a.e)
    s = float(lo)
    while s <= hi * 1.000001:
        yield int(s)
        s *= a.f


def values(torch, op, rank, count, dtype):
    """The same small exact values as ddplug-allreduce-perf (period 1009)."""
    j = torch.arange(count, dtype=torch.int64) % 1009
    if op == "prod":
        v = torch.where((rank + j) % 3 == 0, 2, 1)
    elif op in ("min", "max"):
        v = (rank * 7 + j) % 11
    elif op in ("bor", "band"):
        v = (rank * 3 + j) & 0x3F
    else:
        v = (rank + j) % 5
    return v.to(dtype)


def expected(torch, op, world, count, dtype):
    acc = values(torch, op, 0, count, torch.int64)
    for r in range(1, world):
        v = values(torch, op, r, count, torch.int64)
        if op == "prod":
            acc = acc * v
        elif op == "min":
            acc = torch.minimum(acc, v)
        elif op == "max":
            acc = torch.maximum(acc, v)
        elif op == "bor":
            acc = acc | v
        elif op == "band":
            acc = acc & v
        else:
            acc = acc + v
    if op == "avg":
        if dtype.is_floating_point:
            return (acc.to(torch.float32) / world).to(dtype) if dtype != torch.float64 \
                else acc.to(torch.float64) / world
        return (acc // world).to(dtype)
    return acc.to(dtype)


def worker(a):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    dtype = getattr(torch, a.d)
    op = getattr(dist.ReduceOp, OPS[a.o])
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    total_wrong = 0
    if rank == 0:
        print(f"# gloo_allreduce_perf: torch {torch.__version__} gloo, {world} ranks, "
              f"{a.d} {a.o}, mode {a.mode}, warmup {a.w}, iters {'fixed' if a.i else 'auto'}")
        print("#")
        print(f"# {'size(B)':>12} {'count':>12} {'type':>9} {'redop':>6} {'time(us)':>12} "
              f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>8}", flush=True)
    for nbytes in sizes(a):
        count = max(1, nbytes // esize)
        nbytes = count * esize
        t = torch.zeros(count, dtype=dtype)
        for _ in range(a.w):
            dist.all_reduce(t, op=op)
        iters = a.i
        if iters == 0:
            t0 = time.perf_counter()
            dist.all_reduce(t, op=op)
            one = time.perf_counter() - t0
            it = torch.tensor([min(20000, max(20, int(0.1 / one) if one > 0 else 1000))])
            dist.broadcast(it, 0)
            iters = int(it.item())
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, op=op)
        per = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        per = per.item()
        wrong = 0
        if a.c:
            t = values(torch, a.o, rank, count, dtype)
            dist.all_reduce(t, op=op)
            exp = expected(torch, a.o, world, count, dtype)
            w = torch.tensor([int((t != exp).sum().item())])
            dist.all_reduce(w)
            wrong = int(w.item())
        total_wrong += wrong
        algbw = nbytes / per / 1e9
        busbw = algbw * 2 * (world - 1) / world
        rows.append({"size": nbytes, "count": count, "time_us": per * 1e6, "algbw": algbw,
                     "busbw": busbw, "wrong": wrong, "iters": iters})
        if rank == 0:
            print(f"  {nbytes:12d} {count:12d} {a.d:>9} {a.o:>6} {per * 1e6:12.2f} "
                  f"{algbw:12.2f} {busbw:12.2f} {wrong:8d}", flush=True)
    if rank == 0:
        print(f"# total wrong elements: {total_wrong}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"tool": "gloo_allreduce_perf", "torch": torch.__version__,
                           "mode": a.mode, "ranks": world, "dtype": a.d, "op": a.o,
                           "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    return 1 if total_wrong else 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    port = free_port()
    evidence = None
    if a.mode == "shm":
        import torch
        evidence = torch_gloo_shm_evidence()
        print(f"# torch {torch.__version__}: gloo shared-memory allreduce "
              f"{describe_evidence(*evidence)}", flush=True)
        if evidence[0] is False:
            print("# --mode shm therefore measures gloo's TCP path (with LOCAL_WORLD_SIZE set)",
                  flush=True)
    seen = set()
    stop = threading.Event()

    def watch_shm():  # did gloo's shared-memory path create its segments?
        while not stop.is_set():
            seen.update(glob.glob("/dev/shm/shm_allreduce_buffer*"))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_shm, daemon=True)
    watcher.start()
    procs = []
    for r in range(a.n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.n), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        if a.mode == "shm":
            # the switch, and what some gloo revisions read with std::stoi
            # (a crash when unset): harmless for a gloo without the path
            env.update(LOCAL_WORLD_SIZE=str(a.n), PMI_SIZE=str(a.n), PMI_RANK=str(r))
        else:
            for k in ("LOCAL_WORLD_SIZE", "PMI_SIZE", "PMI_RANK"):
                env.pop(k, None)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"]
                                      + sys.argv[1:], env=env))
    rc = max(p.wait() for p in procs)
    stop.set()
    watcher.join()
    if a.mode == "shm":
        present, lib, found = evidence
        if seen:
            verdict = f"USED (segments seen in /dev/shm: {len(seen)})"
        elif present is False:
            verdict = "ABSENT in this torch: the rows above are gloo's TCP path"
        else:
            verdict = ("not used (no shm_allreduce_buffer segment appeared; "
                       "switch: LOCAL_WORLD_SIZE == world size)")
        print(f"# gloo shared-memory allreduce: {verdict}; {describe_evidence(*evidence)}",
              flush=True)
        if a.json and os.path.exists(a.json):
            with open(a.json) as f:
                doc = json.load(f)
            doc["shm_used"] = bool(seen)
            doc["shm_in_build"] = bool(present)
            doc["shm_evidence"] = {"library": lib, "markers": found}
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
    return rc


def main():
    a = args_parser().parse_args()
    if a.worker:
        return worker(a)
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
