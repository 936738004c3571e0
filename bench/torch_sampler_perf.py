#!/usr/bin/env python3
"""torch_sampler_perf.py — torch.utils.data.DistributedSampler measured the way
ddplug-sampler-perf measures ddplug's distributed sampler, same table format.

    .venv/bin/python bench/torch_sampler_perf.py [-N 100000000] [-w 8]
        [--epochs 2] [--chunk 65536] [--ranks R] [--json FILE]

One thread. For every rank r < R (default: all) and epoch: set_epoch, then
iterate the sampler in chunks of --chunk indices (itertools.islice into a
list, then sum: the cheapest way Python can consume it) until it ends.
  indices/s/rank  this rank's indices / the time to produce them (including
                  the epoch start, as for ddplug)
  epoch start     iter(sampler) + the first next(): torch draws the whole
                  permutation (torch.randperm) and turns it into a Python list
                  here, median over ranks and epochs
  extra memory    what this row alone adds: each row runs in a fresh child
                  process (os.fork), whose peak RSS (getrusage) starts at its
                  RSS at the fork; the child first runs the row on a tiny N
                  (so the code is paged in), then extra = its peak RSS minus
                  its RSS before the real row (/proc/self/statm). No row
                  inherits an earlier row's peak — as ddplug-sampler-perf
                  measures it
The last line gives the checksums and the peak RSS of the largest row process.
At N = 1e8 one rank's epoch holds a list of 1e8 Python ints (several GiB):
use --ranks 1 on a small machine; every rank does the same work.
"""
import argparse
import itertools
import json
import os
import resource
import statistics
import sys
import time

import torch
from torch.utils.data import DistributedSampler


class _Sized:
    """A dataset stand-in: DistributedSampler only needs len()."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def rss_kib():
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1])
    return resident * os.sysconf("SC_PAGESIZE") // 1024


def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_row(n, world, ranks, epochs, chunk, shuffle, warm_up=True):
    if warm_up:  # the code paths once on a tiny N, so extra memory is data
        run_row(min(n, 1000), world, 1, 1, chunk, shuffle, warm_up=False)
    base_kib = rss_kib()
    starts, rates, checksum = [], [], 0
    for rank in range(ranks):
        sampler = DistributedSampler(_Sized(n), num_replicas=world, rank=rank,
                                     shuffle=shuffle, seed=42, drop_last=False)
        for epoch in range(epochs):
            t0 = time.perf_counter()
            sampler.set_epoch(epoch)
            it = iter(sampler)
            first = next(it, None)
            t1 = time.perf_counter()
            starts.append((t1 - t0) * 1e6)
            total = 0 if first is None else 1
            checksum += first or 0
            t2 = time.perf_counter()
            while True:
                part = list(itertools.islice(it, chunk))
                if not part:
                    break
                total += len(part)
                checksum += sum(part)
            rates.append(total / (time.perf_counter() - t2 + (t1 - t0)))
            del it
    peak = peak_kib()
    extra = max(0, peak - base_kib)
    return {
        "sampler": "torch DistributedSampler",
        "shuffle": shuffle,
        "N": n,
        "indices_per_s_per_rank": statistics.fmean(rates),
        "min_indices_per_s": min(rates),
        "epoch_start_us": statistics.median(starts),
        "extra_memory_kib": extra,
        "checksum": checksum,
        "peak_rss_kib": peak,
    }


def run_row_isolated(*args):
    """run_row(*args) in a fresh child process (os.fork; the parent has not
    run a torch operation, so no thread pool is copied): its peak RSS is the
    RSS it was forked with plus what the row needs, never an earlier row's
    peak. The row comes back as JSON through a pipe."""
    sys.stdout.flush()
    sys.stderr.flush()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(rfd)
            data = json.dumps(run_row(*args)).encode()
            with os.fdopen(wfd, "wb") as w:
                w.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        sys.exit(f"torch_sampler_perf: the process measuring a row failed (wait status {status})")
    return json.loads(data)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-N", type=int, default=100_000_000)
    p.add_argument("-w", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--chunk", type=int, default=65536)
    p.add_argument("--ranks", type=int, default=-1)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.w < 1 or a.epochs < 1 or a.chunk < 1:
        p.error("-w, --epochs and --chunk must be >= 1")
    ranks = a.w if a.ranks < 1 or a.ranks > a.w else a.ranks
    torch.set_num_threads(1)
    rows = [run_row_isolated(a.N, a.w, ranks, a.epochs, a.chunk, shuffle)
            for shuffle in (True, False)]
    print(f"torch_sampler_perf: world={a.w} ranks measured={ranks} "
          f"epochs={a.epochs} chunk={a.chunk} (one thread, torch {torch.__version__})")
    print(f"| {'sampler':<24} | {'shuffle':<7} | {'N':>11} | {'indices/s/rank':>16} "
          f"| {'min indices/s':>15} | {'epoch start (us)':>16} | {'extra memory (KiB)':>17} |")
    print("|" + "|".join("-" * w for w in (26, 9, 13, 18, 17, 18, 19)) + "|")
    for r in rows:
        print(f"| {r['sampler']:<24} | {'yes' if r['shuffle'] else 'no':<7} | {r['N']:>11} "
              f"| {r['indices_per_s_per_rank'] / 1e6:>14.1f} M "
              f"| {r['min_indices_per_s'] / 1e6:>13.1f} M "
              f"| {r['epoch_start_us']:>16.3f} | {r['extra_memory_kib']:>17.0f} |")
    print("checksums: " + " ".join(str(r["checksum"]) for r in rows)
          + f"; peak RSS {max(r['peak_rss_kib'] for r in rows)} KiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tool": "torch_sampler_perf", "world": a.w, "ranks": ranks,
                       "epochs": a.epochs, "chunk": a.chunk,
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
