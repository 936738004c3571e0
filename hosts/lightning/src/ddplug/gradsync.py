"""Gradient synchronization without torch.distributed: bucketed, asynchronous
allreduce started during backward, the way DDP's reducer does it.

* Parameters are grouped into flat buckets in reverse registration order (the
  order in which backward usually produces their gradients), per device and
  dtype: the first bucket holds ``first_bucket_mb`` (small, so communication
  starts early), the others ``bucket_mb`` (config "gradients").
* A post-accumulate-grad hook on every parameter copies its gradient into its
  bucket slot and makes ``param.grad`` a view of that slot (later steps then
  accumulate in place, no copy). A parameter at least as large as the bucket it
  would join gets a bucket of its own and skips the copy: its own gradient is
  reduced in place. When every gradient of a bucket is in, the bucket's allreduce starts
  asynchronously (``ddplug_iallreduce``) while backward goes on. Buckets are
  started strictly in order, so every rank issues the same collectives in the
  same order.
* :meth:`GradientSync.finish` — called after backward, before the optimizer
  step — starts what is left (parameters that got no gradient contribute zeros),
  waits for every bucket and averages when "gradients.average" is true (op "avg"
  when the plugin has it, else sum then divide).
* :meth:`GradientSync.no_sync` suspends all of it (gradient accumulation: only the
  last micro-batch synchronizes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional

import torch

from .context import Context, Request

MIB = 1 << 20


@dataclass
class _Slot:
    param: torch.nn.Parameter
    bucket: "_Bucket"
    offset: int
    numel: int
    ready: bool = False


@dataclass
class _Bucket:
    index: int
    flat: Optional[torch.Tensor]  # None for a single-parameter bucket (reduced in place)
    slots: List[_Slot] = field(default_factory=list)
    pending: int = 0
    request: Optional[Request] = None
    work: Optional[torch.Tensor] = None  # what is being reduced this round

    @property
    def solo(self) -> bool:
        return self.flat is None

    def view(self, slot: _Slot) -> torch.Tensor:
        assert self.flat is not None
        return self.flat[slot.offset: slot.offset + slot.numel].view(slot.param.shape)

    @property
    def nbytes(self) -> int:
        p = self.slots[0].param
        return sum(s.numel for s in self.slots) * p.element_size()


def check_parameters_equal(ctx: Context, params: Iterable[torch.nn.Parameter], step: int,
                           buffers: Iterable[torch.Tensor] = ()) -> None:
    """Collective: raise :class:`~ddplug.errors.ParametersDiffer` on every rank,
    naming the ranks whose parameters (and ``buffers``: the running statistics of
    synchronized batch norm, equal on every rank by construction) differ from rank
    0's (config "checks.param_sync_every"). Other buffers are not compared: they may
    differ between ranks by design (a plain BatchNorm's statistics of its own
    batches). Compares per-tensor fingerprints (sum and sum of squares in float64),
    so it costs one pass over the tensors and one small allgather."""
    import numpy as np

    from .errors import ParametersDiffer, status_code

    with torch.no_grad():
        fp = [float(v) for p in params for v in (p.double().sum(), p.double().pow(2).sum())]
        nparams = len(fp)
        fp += [float(v) for b in buffers for v in (b.double().sum(), b.double().pow(2).sum())]
    mine = np.asarray(fp, dtype=np.float64)
    every = np.empty(mine.size * ctx.world_size, dtype=np.float64)
    ctx.allgather(mine, every)
    every = every.reshape(ctx.world_size, mine.size)
    scale = np.maximum(np.abs(every[0]), 1.0)
    off = np.abs(every - every[0]) > 1e-6 * scale
    differ = [r for r in range(1, ctx.world_size) if np.any(off[r])]
    if differ:
        ranks = ", ".join(str(r) for r in differ)
        what = []
        if np.any(off[:, :nparams]):
            what.append("parameters")
        if np.any(off[:, nparams:]):
            what.append("synchronized BatchNorm running statistics")
        raise ParametersDiffer(
            status_code("MISMATCH"), "MISMATCH", "collectives differ across ranks",
            f"{' and '.join(what)} differ across ranks after step {step}: rank(s) {ranks} disagree with rank 0"
            " (checks.param_sync_every). Something changed them outside the synchronized step (a"
            " rank-dependent update, a layer that is not synchronized, different initialization after setup).",
            f"rank {ctx.rank}",
        )


def broadcast_module(ctx: Context, module: torch.nn.Module, root: int = 0, chunk_mb: float = 64) -> None:
    """Make every rank's parameters and buffers equal to ``root``'s: flattened per
    device and dtype, in chunks of at most ``chunk_mb``."""
    tensors = [t for t in list(module.parameters()) + list(module.buffers())]
    groups: dict = {}
    seen = set()
    for t in tensors:
        if id(t) in seen or t.numel() == 0:
            continue
        seen.add(id(t))
        groups.setdefault((t.device, t.dtype), []).append(t)
    limit = int(chunk_mb * MIB)
    with torch.no_grad():
        for group in groups.values():
            chunk: list = []
            size = 0
            for t in group + [None]:
                if t is not None and (size == 0 or size + t.numel() * t.element_size() <= limit):
                    chunk.append(t)
                    size += t.numel() * t.element_size()
                    continue
                if chunk:
                    flat = torch.cat([c.detach().reshape(-1) for c in chunk])
                    ctx.broadcast(flat, root)
                    off = 0
                    for c in chunk:
                        c.copy_(flat[off: off + c.numel()].view_as(c))
                        off += c.numel()
                chunk, size = ([t], t.numel() * t.element_size()) if t is not None else ([], 0)


class GradientSync:
    """Bucketed asynchronous gradient allreduce for ``params`` (see module doc).

    Args:
        ctx: the run's context.
        params: the parameters to synchronize (those with requires_grad).
        bucket_mb: bucket size in MiB (config gradients.bucket_mb).
        first_bucket_mb: size of the first bucket (gradients.first_bucket_mb).
        average: divide the summed gradients by the world size.
        use_avg_op: reduce with the plugin's "avg" op instead of sum + divide.
    """

    def __init__(
        self,
        ctx: Context,
        params: Iterable[torch.nn.Parameter],
        *,
        bucket_mb: float = 25.0,
        first_bucket_mb: float = 1.0,
        average: bool = True,
        use_avg_op: bool = False,
    ) -> None:
        self.ctx = ctx
        self.average = bool(average)
        self.op = "avg" if (average and use_avg_op) else "sum"
        unique: list = []
        seen = set()
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        self.buckets = _make_buckets(unique, int(first_bucket_mb * MIB), int(bucket_mb * MIB))
        self._slots = {id(s.param): s for b in self.buckets for s in b.slots}
        self._hooks: list = []
        self._next = 0  # next bucket to start
        self._round = False  # a backward pass contributed since the last finish
        self.enabled = True
        self.syncs = 0  # finished rounds (for tests and logs)

    @property
    def num_params(self) -> int:
        return len(self._slots)

    def bucket_sizes(self) -> list:
        """Bytes per bucket, in the order they are started."""
        return [b.nbytes for b in self.buckets]

    # ---- hooks -------------------------------------------------------------------
    def attach(self) -> None:
        if self._hooks:
            return
        for slot in self._slots.values():
            self._hooks.append(slot.param.register_post_accumulate_grad_hook(self._on_grad))

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside the block; nothing is communicated."""
        prev, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = prev

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.enabled:
            return
        slot = self._slots[id(param)]
        if slot.ready:  # a second backward before finish: close the first round
            self.finish()
        self._round = True
        grad = param.grad
        if grad is None:
            return
        if grad.is_sparse:
            raise RuntimeError("ddplug: sparse gradients are not supported by the gradient sync")
        if slot.bucket.solo:
            if not grad.is_contiguous():
                param.grad = grad = grad.contiguous()
            slot.bucket.work = grad
        else:
            view = slot.bucket.view(slot)
            if grad.data_ptr() != view.data_ptr() or grad.stride() != view.stride():
                view.copy_(grad)
                param.grad = view
        slot.ready = True
        slot.bucket.pending -= 1
        if slot.bucket.pending == 0:
            self._start_ready()

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        if bucket.solo:
            if bucket.work is None:  # no gradient this round: contribute zeros
                slot = bucket.slots[0]
                bucket.work = torch.zeros_like(slot.param, memory_format=torch.contiguous_format)
        else:
            bucket.work = bucket.flat
        bucket.request = self.ctx.iallreduce(bucket.work, self.op)

    # ---- completion ----------------------------------------------------------------
    def finish(self) -> None:
        """Start what is left, wait for every bucket, average. Call after backward
        and before the optimizer step. No-op when disabled (no_sync)."""
        if not self.enabled:
            return
        missing: list = []
        for bucket in self.buckets[self._next:]:
            for slot in bucket.slots:
                if not slot.ready:
                    if not bucket.solo:
                        bucket.view(slot).zero_()
                    missing.append(slot)
            bucket.pending = 0
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            req, bucket.request = bucket.request, None
            if req is not None:
                req.wait()
            if self.average and self.op == "sum" and bucket.work is not None:
                bucket.work.div_(self.ctx.world_size)
        for slot in missing:
            reduced = slot.bucket.work if slot.bucket.solo else slot.bucket.view(slot)
            if slot.param.grad is None and bool(reduced.any()):
                slot.param.grad = reduced  # another rank produced a gradient
            elif slot.param.grad is not None and slot.param.grad.data_ptr() != reduced.data_ptr():
                slot.param.grad.copy_(reduced)
        self._reset()
        self.syncs += 1

    def _reset(self) -> None:
        self._next = 0
        self._round = False
        for bucket in self.buckets:
            bucket.pending = len(bucket.slots)
            if bucket.solo:
                bucket.work = None
            for slot in bucket.slots:
                slot.ready = False

    def abandon(self) -> None:
        """Forget a round that will not finish (an exception mid-step). Started
        requests are left to the context's abort."""
        for bucket in self.buckets:
            bucket.request = None
        self._reset()


def _make_buckets(params: list, first_bytes: int, bytes_: int) -> list:
    """Reverse-order buckets per (device, dtype). A parameter at least as large as
    the bucket being filled gets a bucket of its own (reduced in place, no copy);
    what was collected before it becomes a bucket first, so order is kept."""
    open_: dict = {}
    closed: list = []
    cap = max(1, first_bytes)

    def close(key: tuple) -> None:
        nonlocal cap
        closed.append(open_.pop(key)[0])
        cap = max(1, bytes_)

    for p in reversed(params):
        key = (p.device, p.dtype)
        size = p.numel() * p.element_size()
        if size >= cap:
            if key in open_:
                close(key)
            open_[key] = ([p], [size])
            close(key)
            continue
        group = open_.setdefault(key, ([], [0]))
        group[0].append(p)
        group[1][0] += size
        if group[1][0] >= cap:
            close(key)
    closed += [g[0] for g in open_.values()]
    buckets = []
    for i, members in enumerate(closed):
        total = sum(p.numel() for p in members)
        flat = None if len(members) == 1 else torch.zeros(total, dtype=members[0].dtype, device=members[0].device)
        bucket = _Bucket(i, flat)
        off = 0
        for p in members:
            bucket.slots.append(_Slot(p, bucket, off, p.numel()))
            off += p.numel()
        bucket.pending = len(bucket.slots)
        buckets.append(bucket)
    return buckets


