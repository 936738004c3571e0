"""step_phases.py — where a training step's time goes, measured on every rank
(bench/lightning_step.py --phases imports this into each rank's process).

Every step is cut into phases at Lightning's hooks, which run in this order in
automatic optimization:

    on_train_batch_start   forward         (training_step)
    on_before_zero_grad    zero_grad       (optimizer_zero_grad: set_to_none or zeroing)
    on_before_backward     backward        (autograd, and the gradient hooks)
    on_after_backward      sync            (the strategy's post_backward: ddplug's finish)
    on_before_optimizer_step optimizer     (optimizer.step, the loop's bookkeeping)
    on_train_batch_end

Inside those, the gradient exchange's own parts are timed where they run, by
wrapping the functions that do them (nothing in ddplug knows it is measured):

    copy-in       ddplug: the gradient hooks (GradientSync's pre-accumulate and
                  post-accumulate hooks: a gradient copied into its bucket, the
                  bookkeeping), less the allreduce starts inside them
    start         starting an allreduce (Context.iallreduce; the torch backend's
                  ProcessGroupDdplug.allreduce)
    wait          waiting for one (Request.wait; DdplugWork.wait)
    copy-out      ddplug: GradientSync.finish less its waits and starts: scaling
                  (when the plugin has no avg op), results copied back into
                  gradients that are not bucket views, the next round's state

A phase's time is its own: what the phases nested in it took (each timed by
its own clock) is not counted twice. For each phase: wall time
(time.perf_counter), the calling thread's CPU time (time.thread_time: a wait
that sleeps costs none) and the process's minor page faults (getrusage
ru_minflt: a gradient written into pages the process has not touched before
costs a fault per 4 KiB page). torch's DDP does its copies and its wait inside
backward (its reducer's autograd hooks and the engine's final callback, in C++),
so for DDP rows they are part of "backward".

One step (the last warm-up step, not timed) also runs under a
TorchDispatchMode that records every operator that reads or writes a tensor of
at least 1 MiB, by phase: how many passes over gradient memory each phase
makes, and how many bytes it allocates (operators that return a new large tensor).
"""

from __future__ import annotations

import collections
import resource
import time
from typing import Any, Callable, Dict, List, Optional

BIG = 1 << 20  # operators on tensors at least this large are counted

TOP = ["forward", "zero_grad", "backward", "sync", "optimizer"]
SUB = ["copy-in", "start", "wait", "copy-out"]
ORDER = ["forward", "zero_grad", "backward", "copy-in", "start", "wait", "copy-out", "sync", "optimizer"]


def _now() -> tuple:
    return (time.perf_counter(), time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)


def _helpers() -> tuple:
    """CPU seconds and minor faults of this process's threads other than the
    calling one (the plugin's progress thread, the torch backend's completion
    thread), from /proc (schedstat: nanoseconds on a CPU)."""
    import os
    import threading

    me = threading.get_native_id()
    cpu, faults = 0.0, 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu += int(f.read().split()[0]) * 1e-9
            with open(f"/proc/self/task/{tid}/stat") as f:
                faults += int(f.read().rsplit(")", 1)[1].split()[7])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return cpu, faults


class Recorder:
    """Phase times of every step of one rank (see the module doc)."""

    def __init__(self) -> None:
        self.steps: List[Dict[str, list]] = []
        self.step_cpu: List[float] = []
        self.step_helpers: List[tuple] = []  # (CPU s, faults) of the other threads per step
        self.ops: Dict[str, Dict[str, list]] = {}  # phase -> op -> [calls, bytes read+written, bytes allocated]
        self._acc: Optional[Dict[str, list]] = None
        self._top: Optional[str] = None
        self._t0: tuple = (0.0, 0.0, 0)
        self._stack: List[list] = []  # [name, start, children (wall, cpu, faults)]
        self._child = [0.0, 0.0, 0]  # nested time inside the current top-level phase
        self._pc0 = 0.0
        self.counting = False

    @property
    def phase(self) -> str:
        if self._stack:
            return self._stack[-1][0]
        return self._top or "outside"

    def begin_step(self) -> None:
        self._acc = collections.defaultdict(lambda: [0.0, 0.0, 0])
        self._stack = []
        self._pc0 = time.process_time()
        self._h0 = _helpers()
        self._top, self._t0, self._child = "forward", _now(), [0.0, 0.0, 0]

    def mark(self, name: str) -> None:
        """The current top-level phase ends, ``name`` begins."""
        if self._acc is None or self._stack:
            return
        t = _now()
        a = self._acc[self._top]
        for i in range(3):
            a[i] += (t[i] - self._t0[i]) - self._child[i]
        self._top, self._t0, self._child = name, t, [0.0, 0.0, 0]

    def end_step(self) -> None:
        if self._acc is None:
            return
        self.mark("outside")
        self.steps.append({k: list(v) for k, v in self._acc.items()})
        self.step_cpu.append(time.process_time() - self._pc0)
        h = _helpers()
        self.step_helpers.append((h[0] - self._h0[0], h[1] - self._h0[1]))
        self._acc = None

    def wrap(self, name: str, fn: Callable) -> Callable:
        """``fn`` timed as phase ``name`` (nested phases subtracted)."""
        rec = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if rec._acc is None:
                return fn(*args, **kwargs)
            frame = [name, _now(), [0.0, 0.0, 0]]
            rec._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                t = _now()
                rec._stack.pop()
                total = [t[i] - frame[1][i] for i in range(3)]
                a = rec._acc[name]
                for i in range(3):
                    a[i] += total[i] - frame[2][i]
                parent = rec._stack[-1][2] if rec._stack else rec._child
                for i in range(3):
                    parent[i] += total[i]

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        return timed

    def count(self, op: str, read: int, written: int, allocated: int, faults: int) -> None:
        row = self.ops.setdefault(self.phase, {}).setdefault(op, [0, 0, 0, 0])
        row[0] += 1
        row[1] += read + written
        row[2] += allocated
        row[3] += faults


def install(rec: Recorder) -> None:
    """Wrap the functions that do the exchange's parts (those that exist in the
    ddplug tree on the path: a --before tree may lack some)."""
    try:
        from ddplug.context import Context, Request
    except ImportError:
        return
    Context.iallreduce = rec.wrap("start", Context.iallreduce)
    Request.wait = rec.wrap("wait", Request.wait)
    try:
        from ddplug.nn.gradsync import GradientSync
    except ImportError:  # an older tree's layout
        try:
            from ddplug.gradsync import GradientSync  # type: ignore[no-redef]
        except ImportError:
            GradientSync = None  # type: ignore[assignment,misc]
    if GradientSync is not None:
        for hook in ("_on_grad", "_before_grad_hook"):
            if hasattr(GradientSync, hook):
                setattr(GradientSync, hook, rec.wrap("copy-in", getattr(GradientSync, hook)))
        if hasattr(GradientSync, "_before_grad"):  # a factory of per-parameter hooks: wrap what it makes
            make = GradientSync._before_grad

            def before_grad(self: Any, param: Any) -> Callable:
                return rec.wrap("copy-in", make(self, param))

            GradientSync._before_grad = before_grad
        GradientSync.finish = rec.wrap("copy-out", GradientSync.finish)
    try:
        from ddplug.distributed.group import ProcessGroupDdplug
        from ddplug.distributed.work import DdplugWork
    except ImportError:
        return
    ProcessGroupDdplug.allreduce = rec.wrap("start", ProcessGroupDdplug.allreduce)
    DdplugWork.wait = rec.wrap("wait", DdplugWork.wait)


def callback(rec: Recorder, counting_step: int) -> Any:
    """The Lightning callback that cuts steps into phases (its batch indices
    count from 0; step ``counting_step`` also counts operators)."""
    import lightning.pytorch as pl

    class Phases(pl.Callback):
        def __init__(self) -> None:
            self._mode: Any = None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == counting_step:
                self._mode = counter(rec)
                self._mode.__enter__()
            rec.begin_step()

        def on_before_zero_grad(self, trainer: Any, module: Any, optimizer: Any) -> None:
            rec.mark("zero_grad")

        def on_before_backward(self, trainer: Any, module: Any, loss: Any) -> None:
            rec.mark("backward")

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            rec.mark("sync")

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            rec.mark("optimizer")

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            rec.end_step()
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None
                rec.steps.pop()  # the counting step's times include the counting
                rec.step_cpu.pop()
                rec.step_helpers.pop()

    return Phases()


def counter(rec: Recorder) -> Any:
    """A TorchDispatchMode that counts operators on tensors of at least BIG bytes."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def nbytes(t: Any) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            out = func(*args, **kwargs)
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0
            ins = [t for t in tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))[0]
                   if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            read = sum(nbytes(t) for t in ins if nbytes(t) >= BIG)
            ptrs = {t.untyped_storage().data_ptr() for t in ins if t.numel()}
            new = [t for t in outs if nbytes(t) >= BIG and t.numel() and t.untyped_storage().data_ptr() not in ptrs]
            written = sum(nbytes(t) for t in outs if nbytes(t) >= BIG)
            if read or written or faults:
                name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
                if name in ("view", "t", "detach", "reshape", "_unsafe_view", "as_strided", "alias", "expand",
                            "transpose", "permute", "slice", "select", "unsqueeze", "squeeze", "numpy_T"):
                    return out  # no pass over memory
                rec.count(name, read, written, sum(nbytes(t) for t in new), faults)
            return out

    return Count()


# ---- the parent's tables ------------------------------------------------------------------
def summarize(steps: List[Dict[str, list]], step_cpu: List[float], helpers: List[tuple]) -> dict:
    """Median per phase of one rank: wall ms, the main thread's CPU ms and
    faults; and per step: the process's CPU ms, the other threads' CPU ms and
    faults."""
    import statistics

    out: dict = {}
    for name in ORDER:
        vals = [s.get(name, [0.0, 0.0, 0]) for s in steps]
        if not any(v[0] or v[2] for v in vals):
            continue
        out[name] = {"wall_ms": 1e3 * statistics.median(v[0] for v in vals),
                     "cpu_ms": 1e3 * statistics.median(v[1] for v in vals),
                     "faults": statistics.median(v[2] for v in vals)}
    totals = [sum(v[0] for k, v in s.items() if k != "outside") for s in steps]
    out["total"] = {"wall_ms": 1e3 * statistics.median(totals),
                    "cpu_ms": 1e3 * statistics.median(step_cpu) if step_cpu else 0.0,
                    "faults": statistics.median(sum(v[2] for k, v in s.items() if k != "outside") for s in steps),
                    "helpers_cpu_ms": 1e3 * statistics.median(h[0] for h in helpers) if helpers else 0.0,
                    "helpers_faults": statistics.median(h[1] for h in helpers) if helpers else 0}
    return out


def print_tables(model: str, rows: list) -> None:
    """One table per model: a row per configuration and rank, a column per phase
    (wall ms / faults), then the operator counts of the counting step."""
    cols = [c for c in ORDER if any(c in r.get("phases", {}).get(rank, {}) for r in rows
                                       for rank in r.get("phases", {}))]
    print(f"\nphases of a step, {model}: median wall ms per phase (each rank's own clock); per step: the"
          " process's CPU ms (every thread), the main thread's page faults, the other threads' (the plugin's"
          " progress thread, the backend's completion thread) CPU ms and faults\n")
    head = ("| configuration, rank " + "".join(f"| {c:>9} " for c in cols)
            + "| total ms | total cpu | faults | helpers cpu | helper faults |")
    print(head)
    print("|" + "---|" * (len(cols) + 6))
    for r in rows:
        for rank, ph in sorted(r.get("phases", {}).items()):
            cells = "".join(f"| {ph[c]['wall_ms']:9.1f} " if c in ph else f"| {'':>9} " for c in cols)
            t = ph["total"]
            print(f"| {r['config'][:34]}, r{rank} {cells}| {t['wall_ms']:8.1f} | {t['cpu_ms']:9.1f} |"
                  f" {t['faults']:6.0f} | {t.get('helpers_cpu_ms', 0):11.1f} | {t.get('helpers_faults', 0):13.0f} |")
    print(f"\nthread CPU ms per phase (a wait that sleeps costs none) and faults per phase, rank 0\n")
    print("| configuration " + "".join(f"| {c:>14} " for c in cols) + "|")
    print("|" + "---|" * (len(cols) + 1))
    for r in rows:
        ph = r.get("phases", {}).get("0")
        if not ph:
            continue
        cells = "".join(f"| {ph[c]['cpu_ms']:6.1f} {ph[c]['faults']:7.0f} " if c in ph else f"| {'':>14} "
                        for c in cols)
        print(f"| {r['config'][:38]} {cells}|")
    print("\noperators on tensors >= 1 MiB (or that page-faulted) in one step, rank 0, by phase:"
          " calls x op (MiB read+written, MiB newly allocated, page faults)\n")
    for r in rows:
        ops = r.get("ops", {}).get("0")
        if not ops:
            continue
        parts = []
        for phase in ORDER + ["outside"]:
            if phase not in ops:
                continue
            items = sorted(ops[phase].items(), key=lambda kv: -kv[1][1])
            desc = ", ".join(f"{c}x {op} ({rw / 2**20:.0f}, {al / 2**20:.0f}, {pf})" for op, (c, rw, al, pf) in items)
            parts.append(f"{phase}: {desc}")
        print(f"- {r['config']}: " + "; ".join(parts))
