"""Gradient synchronization through the run's context: bucketed, asynchronous
allreduce started during backward, the way DDP's reducer does it — with the
gradients living in their buckets (DDP's ``gradient_as_bucket_view``).

* Parameters are grouped into flat buckets per device and dtype, in the order
  backward produces their gradients: first in reverse registration order (the
  usual order), and from the second step on in the order rank 0 observed in the
  first backward (broadcast to every rank, so all ranks build the same buckets).
  The first bucket holds ``first_bucket_mb`` (small, so communication starts
  early), the others ``bucket_mb`` (config "gradients").
* A bucket's memory is *registered* where the plugin has registered memory
  (:mod:`ddplug.registered_memory`; the cpu plugin's shared memory): its allreduce then
  reduces straight from every rank's bucket into every rank's bucket, nothing is
  staged. Each ``param.grad`` becomes a view of its bucket slot, so gradients
  accumulate in the bucket and it is reduced in place, with no copy in either
  direction. A gradient that arrives as a new tensor (the first step, after
  ``zero_grad(set_to_none=True)``) is copied into its slot once, and the view
  replaces it.
* A parameter of at least 1 MiB (``SOLO_BYTES``), or at least as large as the
  bucket it would join, gets a bucket of its own: its gradient is reduced where
  it lies, no copy at all. Where the native module is built and the plugin has
  registered memory, backward allocates such gradients in registered memory
  in the first place (hosts/python/native/gradpool.cpp: torch's CPU allocator
  serves allocations of exactly those sizes from a pool of registered blocks,
  recycled from step to step): a new tensor every step (``set_to_none=True``,
  Lightning's default) is then reduced in place without staging and without
  fresh page faults. Without the pool, only when its gradient persists from
  step to step (``zero_grad(set_to_none=False)``, accumulation across steps)
  and the plugin would stage it is it copied once into a registered bucket of
  its own, which holds it from then on; a new tensor every step is better
  reduced in place than copied first (measured: see ``SOLO_BYTES``).
* An optimizer or user code that *replaces* ``param.grad`` (assigns another
  tensor while a view is installed) is noticed when the next gradient arrives;
  that parameter then takes the copy path for good: copied into its slot,
  reduced, and copied back into whatever tensor ``.grad`` is, never rebound
  (logged once at debug level). ``gradient_as_bucket_view=False`` makes every
  parameter take that path.
* When every gradient of a bucket is in, the bucket's allreduce starts
  asynchronously (``ddplug_iallreduce``) while backward goes on; buckets start
  strictly in order, so every rank issues the same collectives in the same order.
  Whether a helper thread progresses them during backward or the caller does at
  :meth:`GradientSync.finish` is the plugin's choice (the cpu plugin's
  ``progress_thread``, decided by measurement: plugins/cpu/README.md).
* :meth:`GradientSync.finish` — called after backward, before the optimizer step —
  starts what is left (a parameter that got no gradient contributes what its
  ``.grad`` holds, zeros when it is None), waits for every bucket and averages
  when "gradients.average" is true (op "avg" when the plugin has it, else sum
  then divide).
* :meth:`GradientSync.no_sync` suspends all of it (gradient accumulation: only the
  last micro-batch synchronizes).
* :meth:`GradientSync.detach` (the strategies' teardown) turns the gradients back
  into ordinary tensors and releases the buckets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, List, Optional

import torch

from .. import registered_memory as _registered
from .._c import _names
from ..context import Context, Request

log = logging.getLogger(__name__)

MIB = 1 << 20
# A parameter of at least this many bytes gets a bucket of its own (its allreduce
# then costs far more than starting one). A gradient that arrives as a new tensor
# is reduced where it lies: copying it into a registered bucket first costs more
# than the plugin saves by reaching it directly (bench/lightning_step.py, embedding:
# 31.8 ms above the floor against 21.0 ms in place, on the project's CI machine).
SOLO_BYTES = 1 * MIB
# A gradient with a bucket of its own, of at least this many bytes, is born in
# registered memory when the native module is there (_start_pool): it is
# then reduced in place without staging, and its memory is recycled from step
# to step instead of freshly page-faulted.
POOL_MIN_BYTES = 64 * 1024
POOL_ENV = "DDPLUG_GRAD_POOL"  # "0": no pool (gradients in ordinary memory, as without the native module)


@dataclass
class _Slot:
    param: torch.nn.Parameter
    bucket: "_Bucket"
    offset: int
    numel: int
    index: int  # the parameter's position in the GradientSync's parameter list
    ready: bool = False
    copy: bool = False  # the copy path: its .grad was replaced (or views are off)
    warned: bool = False
    installed: bool = False  # .grad was its bucket view when the last round finished
    check: bool = False  # the next backward looks whether .grad was replaced since
    persists: bool = False  # .grad was still there when the next backward began


@dataclass
class _Bucket:
    index: int
    solo: bool  # one parameter at least as large as the bucket: reduced in place when it can be
    slots: List[_Slot] = field(default_factory=list)
    flat: Optional[torch.Tensor] = None  # the bucket's memory (a solo bucket's only once needed)
    pending: int = 0
    request: Optional[Request] = None
    work: Optional[torch.Tensor] = None  # what is being reduced this round
    # a solo bucket's contribution when its parameter has no gradient: kept
    # from round to round while no rank sends one (not handed out as .grad)
    zeros: Optional[torch.Tensor] = None

    def view(self, slot: _Slot) -> torch.Tensor:
        assert self.flat is not None
        return self.flat[slot.offset: slot.offset + slot.numel].view(slot.param.shape)

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)

    @property
    def nbytes(self) -> int:
        return self.numel * self.slots[0].param.element_size()


def _is_view(grad: Optional[torch.Tensor], view: torch.Tensor) -> bool:
    return grad is not None and grad.data_ptr() == view.data_ptr() and grad.stride() == view.stride() \
        and grad.shape == view.shape


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

    from ..errors import ParametersDiffer, status_code

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
        gradient_as_bucket_view: make each ``param.grad`` a view of its bucket
            (default); False copies every gradient into its bucket and the result
            back (the reference path).
        registered: allocate buckets in the plugin's registered memory where it
            has some (default).
        follow_backward_order: rebuild the buckets once, after the first step, in
            the order rank 0's first backward produced the gradients (default).
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
        gradient_as_bucket_view: bool = True,
        registered: bool = True,
        follow_backward_order: bool = True,
    ) -> None:
        self.ctx = ctx
        self.average = bool(average)
        self.op = "avg" if (average and use_avg_op) else "sum"
        self.bucket_view = bool(gradient_as_bucket_view)
        self.registered = bool(registered)
        self._first_bytes = int(first_bucket_mb * MIB)
        self._bytes = int(bucket_mb * MIB)
        self._solo_bytes = SOLO_BYTES
        unique: list = []
        seen = set()
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        self.params = unique
        self._index = {id(p): i for i, p in enumerate(unique)}
        self.buckets: list = []
        self._slots: dict = {}
        self._plan(list(reversed(unique)))
        self._order: Optional[list] = [] if follow_backward_order else None  # first backward's order
        self.rebuilt = False
        self._hooks: list = []
        self._next = 0  # next bucket to start
        self._round = False  # a backward pass contributed since the last finish
        self._abandoned: list = []  # requests of a round that will not finish (keep their buffers)
        self.enabled = True
        self.syncs = 0  # finished rounds (for tests and logs)
        self._pool: Optional[Any] = None  # the native GradPool of its large gradients (attach)
        self._pool_generation = 0
        ref = weakref.ref(self)
        pools: list = []  # the gradient pools it made: the context forgets them as it closes
        self._pools_made = pools
        ctx.on_close(lambda: (ref() is not None and ref().release(), [p.forget() for p in pools]))

    @classmethod
    def from_context(cls, ctx: Context, params: Iterable[torch.nn.Parameter]) -> "GradientSync":
        """A GradientSync for ``params`` configured by the context's "gradients"
        settings (averaging with the plugin's "avg" op where it has one)."""
        g = ctx.config.get("gradients", {}) or {}
        use_avg = bool(ctx.plugin["op_mask"] & (1 << _names.ops()["avg"]))
        return cls(
            ctx, params,
            bucket_mb=float(g.get("bucket_mb", 25)),
            first_bucket_mb=float(g.get("first_bucket_mb", 1)),
            average=bool(g.get("average", True)),
            use_avg_op=use_avg,
        )

    @property
    def round_open(self) -> bool:
        """Whether a backward pass contributed gradients since the last
        :meth:`finish` (a round that only ``finish`` completes)."""
        return self._round

    @property
    def num_params(self) -> int:
        return len(self._slots)

    def bucket_sizes(self) -> list:
        """Bytes per bucket, in the order they are started."""
        return [b.nbytes for b in self.buckets]

    def bucket_memory(self) -> list:
        """How the collectives reach each bucket's memory now ("registered",
        "single_copy", "staged"; for a solo bucket reduced where its gradient
        lies "in place: " and how they reach that gradient, or "in place" while
        it has none), in the order buckets are started."""
        out = []
        for b in self.buckets:
            if b.flat is not None:
                out.append(_registered.reach(self.ctx, b.flat))
                continue
            g = b.slots[0].param.grad
            out.append("in place" if g is None else f"in place: {_registered.reach(self.ctx, g)}")
        return out

    def pool_stats(self) -> Optional[dict]:
        """The gradient pool's counters (``served``, ``reused``, ``refused``,
        ``bytes``, ``free_bytes``, ``blocks_in_use``, ``active``), or None when
        there is no pool (see the module doc)."""
        return None if self._pool is None else self._pool.stats()

    def _start_pool(self) -> None:
        """From now on, backward's gradients of the solo buckets' sizes are born
        in registered memory (the module doc), at most twice their bytes."""
        if self._pool is not None or not self.registered or self.ctx.closed \
                or not _registered._has_registered(self.ctx) or os.environ.get(POOL_ENV, "1").strip() == "0":
            return
        sizes = [s.numel * s.param.element_size() for b in self.buckets if b.solo for s in b.slots
                 if s.param.device.type == "cpu"]
        sizes = [n for n in sizes if n >= POOL_MIN_BYTES]
        if not sizes:
            return
        from .. import _native

        self._pool = _native.grad_pool(self.ctx, tuple(sorted(set(sizes))), 2 * sum(sizes))
        self._pool_generation = getattr(self.ctx, "generation", 0)
        if self._pool is not None:
            self._pools_made.append(self._pool)

    # ---- buckets -----------------------------------------------------------------
    def _alloc(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        if self.registered:
            return _registered.empty(self.ctx, numel, like.dtype, like.device)
        return torch.zeros(numel, dtype=like.dtype, device=like.device)

    def _plan(self, order: list) -> None:
        """Buckets for parameters in the order their gradients are expected."""
        self.buckets = _make_buckets(order, self._first_bytes, self._bytes, self._solo_bytes)
        for b in self.buckets:
            if not b.solo:
                b.flat = self._alloc(b.numel, b.slots[0].param)
            for s in b.slots:
                s.index = self._index[id(s.param)]
        old = self._slots
        self._slots = {id(s.param): s for b in self.buckets for s in b.slots}
        for key, s in self._slots.items():  # what was learnt about a parameter stays
            if key in old:
                s.copy, s.warned = old[key].copy, old[key].warned

    # ---- hooks -------------------------------------------------------------------
    def attach(self) -> None:
        if self._hooks:
            return
        if not self.buckets or any(not b.solo and b.flat is None for b in self.buckets):
            self._plan([s.param for b in self.buckets for s in b.slots] or list(reversed(self.params)))
        for p in self.params:
            self._hooks.append(p.register_hook(self._before_grad(p)))
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._start_pool()

    def detach(self) -> None:
        """Remove the hooks and release the buckets (the gradients become ordinary
        tensors with the same values)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.release()

    def release(self) -> None:
        """Give every gradient that views a bucket its own memory, and drop the
        buckets (registered memory is freed once nothing views it), and the
        gradient pool's blocks."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
        for b in self.buckets:
            b.zeros = None
            if b.flat is None:
                for s in b.slots:
                    g = s.param.grad
                    if pool is not None and g is not None and pool.holds(g.untyped_storage().data_ptr()):
                        s.param.grad = g.clone()  # its block goes back to the plugin (the pool is stopped)
                continue
            for s in b.slots:
                g = s.param.grad
                if g is not None and _registered.shares_memory(g, b.flat):
                    s.param.grad = g.clone()
                s.installed = False
            b.flat = None
            b.work = None
        g = None  # the last gradient looked at: its block too, while the context is this group's
        if pool is not None:  # its free blocks back to the plugin while they are this group's
            pool.retire(not self.ctx.closed and getattr(self.ctx, "generation", 0) == self._pool_generation)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside the block; nothing is communicated."""
        prev, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = prev

    def _before_grad(self, param: torch.Tensor) -> Callable:
        """A hook that runs before a gradient is accumulated into ``param.grad``
        (also inside no_sync). A second backward into a parameter whose bucket is
        already being reduced finishes that round first (else the accumulation
        would write into a bucket in flight). At the first backward after a
        round, it sees whether someone replaced the view that round left in
        ``.grad`` (None is fine: zero_grad(set_to_none=True))."""
        pid = id(param)

        def hook(grad: torch.Tensor) -> None:
            slot = self._slots.get(pid)
            if slot is not None and slot.ready and self.enabled:
                self.finish()
                slot = self._slots.get(pid)
            if slot is None or not slot.check:
                return None
            slot.check = False
            slot.persists = param.grad is not None
            if not slot.installed or slot.copy or not self.bucket_view:
                return None
            g, b = param.grad, slot.bucket
            if g is not None and (b.flat is None or not _is_view(g, b.view(slot))):
                slot.copy = True  # an optimizer (or the user) assigned another tensor
                if not slot.warned:
                    slot.warned = True
                    log.debug("ddplug: the gradient of parameter #%d %s was replaced outside the gradient"
                              " sync (its .grad no longer views its bucket): from now on it is copied into"
                              " its bucket and the reduced result back into its .grad", slot.index,
                              tuple(param.shape))
            return None

        return hook

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.enabled:
            return
        slot = self._slots[id(param)]
        if slot.ready:  # a second backward before finish: close the first round
            self.finish()
            slot = self._slots[id(param)]  # the buckets may have been rebuilt
        self._round = True
        if self._order is not None and not self.rebuilt:
            self._order.append(slot.index)
        grad = param.grad  # set: torch runs this hook after accumulating into .grad
        if grad.is_sparse:
            raise RuntimeError("ddplug: sparse gradients are not supported by the gradient sync")
        bucket = slot.bucket
        if bucket.solo:
            self._solo_ready(slot, grad)
        else:
            view = bucket.view(slot)
            if not _is_view(grad, view):
                view.copy_(grad)
                if self.bucket_view and not slot.copy:
                    param.grad = view
        slot.ready = True
        bucket.pending -= 1
        if bucket.pending == 0:
            self._start_ready()

    def _solo_ready(self, slot: _Slot, grad: torch.Tensor) -> None:
        """A parameter with a bucket of its own: reduce its gradient where it lies,
        unless it persists from step to step and would be staged: then it moves
        once into registered memory of its own."""
        bucket, param = slot.bucket, slot.param
        if bucket.flat is not None and _is_view(grad, bucket.view(slot)):
            bucket.work = bucket.flat
            return
        if not grad.is_contiguous():
            param.grad = grad = grad.contiguous()
        if (slot.persists and self.bucket_view and not slot.copy and self.registered
                and grad.device.type == "cpu" and _registered.reach(self.ctx, grad) == "staged"):
            if bucket.flat is None:
                bucket.flat = self._alloc(slot.numel, param)
            if _registered.reach(self.ctx, bucket.flat) == "registered":
                view = bucket.view(slot)
                view.copy_(grad)
                param.grad = view
                bucket.work = bucket.flat
                return
        bucket.work = grad  # in place, the user's tensor

    def _start_ready(self) -> None:
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._start(self.buckets[self._next])
            self._next += 1

    def _start(self, bucket: _Bucket) -> None:
        if bucket.solo:
            if bucket.work is None:  # no gradient this round: contribute what .grad holds, or zeros
                g = bucket.slots[0].param.grad
                if g is not None:
                    bucket.work = g.contiguous().clone()
                elif bucket.zeros is not None:  # the last round's, no rank had a gradient then either
                    bucket.work, bucket.zeros = bucket.zeros.zero_(), None
                else:
                    bucket.work = torch.zeros_like(bucket.slots[0].param, memory_format=torch.contiguous_format)
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
                        view, g = bucket.view(slot), slot.param.grad
                        if g is None:
                            view.zero_()
                        elif not _is_view(g, view):
                            view.copy_(g)
                    missing.append(slot)
            bucket.pending = 0
            self._start(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            req, bucket.request = bucket.request, None
            if req is not None:
                req.wait()
            if self.average and self.op == "sum":  # _start gave every bucket its work above
                bucket.work.div_(self.ctx.world_size)
        for slot in missing:
            b = slot.bucket
            reduced = b.work if b.solo else b.view(slot)
            g = slot.param.grad
            if g is None:
                if bool(reduced.any()):
                    slot.param.grad = reduced  # another rank produced a gradient
                elif b.solo:
                    b.zeros = reduced  # nobody did: the next such round reuses the buffer
            elif not _is_view(g, reduced):
                g.copy_(reduced)
        handled = {id(s) for s in missing}
        # One pass over every slot: the copy path's result back into .grad, and
        # each slot's state for the next round (what _reset does, and whether
        # .grad is its bucket view now).
        self._next, self._round = 0, False
        for b in self.buckets:
            b.pending = len(b.slots)
            if b.solo:
                b.work = None
            for slot in b.slots:
                g = slot.param.grad
                view = b.view(slot) if b.flat is not None else None
                if view is not None and not b.solo and g is not None and id(slot) not in handled \
                        and not _is_view(g, view):
                    g.copy_(view)
                slot.installed = view is not None and _is_view(g, view)
                slot.ready = False
                slot.check = True
        self.syncs += 1
        if self._order is not None and not self.rebuilt:
            self._follow_backward_order()

    def _follow_backward_order(self) -> None:
        """Collective, once: rebuild the buckets in the order rank 0's first
        backward produced gradients (every rank uses rank 0's order)."""
        import numpy as np

        seen = dict.fromkeys(self._order or [])
        order = list(seen) + [i for i in range(len(self.params) - 1, -1, -1) if i not in seen]
        arr = np.asarray(order, dtype=np.int64)
        if self.ctx.world_size > 1:
            self.ctx.broadcast(arr, 0)
        self.rebuilt = True
        self._order = None
        current = [s.index for b in self.buckets for s in b.slots]
        if arr.tolist() == current:
            return
        old = self.buckets
        grads = {}
        for b in old:
            for s in b.slots:
                g = s.param.grad
                if g is not None and b.flat is not None and _is_view(g, b.view(s)):
                    grads[id(s.param)] = g  # installed views move to the new buckets
        self._plan([self.params[i] for i in arr.tolist()])
        for b in self.buckets:  # new slots: their views, and their state for the next round
            for s in b.slots:
                g = grads.get(id(s.param))
                if g is not None:
                    if b.flat is None:
                        s.param.grad = g.clone()
                    else:
                        view = b.view(s)
                        view.copy_(g)
                        s.param.grad = view
                s.installed = b.flat is not None and _is_view(s.param.grad, b.view(s))
                s.check = True
        # The old buckets and their slots refer to each other: only the cyclic
        # collector would free them, and with them the old buckets' registered
        # memory (still allocated when the context closes, the plugin warns).
        for b in old:
            b.flat = b.work = b.request = b.zeros = None
        log.debug("ddplug: gradient buckets now follow the backward order (%d buckets)", len(self.buckets))

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
        requests are left to the context's abort; their buffers stay referenced."""
        for bucket in self.buckets:
            if bucket.request is not None:
                self._abandoned.append(bucket.request)
            bucket.request = None
        self._reset()


def _make_buckets(params: list, first_bytes: int, bytes_: int, solo_bytes: int) -> list:
    """Buckets per (device, dtype) for parameters in the order their gradients are
    expected. A parameter of at least solo_bytes, or at least as large as the
    bucket being filled, gets a bucket of its own; what was collected before it
    becomes a bucket first, so order is kept."""
    open_: dict = {}
    closed: list = []
    cap = max(1, first_bytes)

    def close(key: tuple) -> None:
        nonlocal cap
        closed.append(open_.pop(key)[0])
        cap = max(1, bytes_)

    for p in params:
        key = (p.device, p.dtype)
        size = p.numel() * p.element_size()
        if size >= min(cap, solo_bytes):
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
        bucket = _Bucket(i, solo=len(members) == 1)
        off = 0
        for p in members:
            bucket.slots.append(_Slot(p, bucket, off, p.numel(), -1))
            off += p.numel()
        bucket.pending = len(bucket.slots)
        buckets.append(bucket)
    return buckets
