"""A communication hook for torch's DDP on the ddplug backend: DDP's gradient
buckets moved into ddplug's registered memory, and reduced there in place.

    model = DistributedDataParallel(model, gradient_as_bucket_view=True)
    model.register_comm_hook(None, ddplug.distributed.allreduce_hook)

    # Lightning (either spelling) registers DDPStrategy's ddp_comm_hook on CUDA
    # only; on CPU register it from a callback:
    class DdplugHook(Callback):
        def on_fit_start(self, trainer, module):
            trainer.strategy.model.register_comm_hook(None, ddplug.distributed.allreduce_hook)
    Trainer(strategy=DDPStrategy(process_group_backend="ddplug", gradient_as_bucket_view=True),
            callbacks=[DdplugHook()])

Without a hook, DDP's reducer allocates its buckets in torch's memory, and a
backend has no way to supply that memory: the cpu plugin then reduces each
bucket through its shared-memory pipeline (a copy into shared memory and a copy
out of it). :func:`allreduce_hook` moves each bucket's storage into a block of
the plugin's registered memory the first time it sees the bucket (one copy; the
same storage, so the reducer's bucket, its views and every ``.grad`` that is a
bucket view follow, as with torch's own ``share_memory_()``), then reduces it
in place every step with op ``avg``: the mean folded into the reduction's last
pass, and nothing staged. A bucket the reducer re-allocates (its rebuild after
the first step) is moved at its first allreduce, and the old one's block goes
back to the plugin.

Results: the mean is the sum divided by the world size once, as
``strategy="ddplug"``'s gradient sync computes it. DDP without a hook
multiplies every gradient by 1/world size first, then sums; torch's own
``allreduce_hook`` divides first. For world sizes that are powers of two both
give the same bits (scaling by a power of two is exact; subnormal gradients
aside); for others they may differ in the last bit.

``state`` is the process group, as for torch's default hooks: None is the
default group, so a model wrapped with ``DistributedDataParallel(...,
process_group=pg)`` registers the hook with ``pg`` as its state. Under
``DDP.join()`` the mean divides by the group's size, as torch's own hook does
(hook-less DDP divides by the ranks still joined). On a group that ddplug does
not serve, for CUDA buckets and for sparse ones (``nn.Embedding(sparse=True)``)
it is torch's ``allreduce_hook``. The buckets stay in ordinary memory (and the
hook still reduces them; the reason is logged once) when the native module is
off, when the plugin has no registered memory
(``ddplug.registered_memory.reach``), with ``DDPLUG_GRAD_POOL=0``, when the
plugin's registered memory is used up (``registered_bytes``), and after the
group is re-formed (an elastic shrink: a bucket moved before stays where it
is). When the run closes, a bucket still alive keeps its values (the plugin
leaves a private copy in its place).
"""

# No "from __future__ import annotations": DDP checks the hook's annotations
# (dist.GradBucket, torch.futures.Future[torch.Tensor]) as objects.
import logging
import os
import threading
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _native
from .. import registered_memory as _registered

_log = logging.getLogger("ddplug")

POOL_ENV = "DDPLUG_GRAD_POOL"  # the gradient sync's switch too: "0" keeps buckets in ordinary memory
_CAP = 1 << 62  # the plugin's registered_bytes is the limit


class _Buckets:
    """One context's pool of adopted buckets (a GradPool that serves no
    allocation of its own: it only adopts)."""

    def __init__(self, ctx: Any) -> None:
        self.generation = getattr(ctx, "generation", 0)
        pool = _native.grad_pool(ctx, (), _CAP)
        self.pool = pool if pool is not None and hasattr(pool, "adopt") else None  # an older native build
        self.moved = 0
        self.kept: set = set()  # the addresses of buckets left in ordinary memory
        self.told = False


_lock = threading.Lock()
_states: "weakref.WeakKeyDictionary[Any, _Buckets]" = weakref.WeakKeyDictionary()

_WHY = {
    0: "its memory is not torch's CPU allocator's",
    3: "the plugin gave no block of registered memory (raise plugin_options registered_bytes)",
    4: "it was moved into an earlier group's memory (the group was re-formed)",
}


def _buckets(ctx: Any) -> Optional[_Buckets]:
    with _lock:
        st = _states.get(ctx)
        if st is not None and st.generation != getattr(ctx, "generation", 0):
            # re-formed (shrink): the old blocks are ordinary memory now
            if st.pool is not None:
                st.pool.retire(False)
            st = None
        if st is None:
            if ctx.closed or not _registered._has_registered(ctx) or os.environ.get(POOL_ENV, "1").strip() == "0":
                return None
            st = _states[ctx] = _Buckets(ctx)
            if st.pool is not None:
                ctx.on_close(st.pool.forget)
        return st if st.pool is not None else None


def adopt(ctx: Any, tensor: torch.Tensor) -> bool:
    """Move ``tensor``'s whole storage into ``ctx``'s registered memory, in
    place (module doc). Whether it is registered memory now. Only for memory
    that torch alone holds: a raw pointer taken earlier (a numpy view) would
    keep the old, freed address."""
    st = _buckets(ctx)
    if st is None:
        return False
    try:
        r = st.pool.adopt(tensor)
    except Exception as exc:  # the bucket stays where it is; the allreduce still runs
        r, why = -1, str(exc)
    else:
        why = _WHY.get(r, "")
    if r == 1:
        st.moved += 1
        _log.debug("ddplug: a DDP bucket of %d bytes moved into registered memory", tensor.untyped_storage().nbytes())
    elif r != 2:
        st.kept.add(tensor.untyped_storage().data_ptr())
        if not st.told:
            st.told = True
            _log.info("ddplug: a DDP bucket of %d bytes stays in ordinary memory (reduced there, staged): %s",
                      tensor.untyped_storage().nbytes(), why)
    return r in (1, 2)


def stats(ctx: Any) -> dict:
    """``{"moved", "kept", **pool stats}`` for ``ctx``'s adopted buckets ({} when
    none): buckets moved, buckets left in ordinary memory."""
    with _lock:
        st = _states.get(ctx)
    if st is None or st.pool is None:
        return {}
    return {"moved": st.moved, "kept": len(st.kept), **st.pool.stats()}


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's mean over the group, reduced in
    place in ddplug's registered memory (module doc). ``state``: the process
    group, or None for the default group."""
    from . import is_ddplug_group

    group = state if state is not None else dist.group.WORLD
    buf = bucket.buffer()
    if not is_ddplug_group(group) or not buf.is_cpu or buf.layout is not torch.strided:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.allreduce_hook(state, bucket)
    adopt(group.context, buf)
    fut = dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group, async_op=True).get_future()
    return fut.then(_first)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    return fut.value()[0]
