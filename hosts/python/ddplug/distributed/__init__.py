"""ddplug as a torch.distributed backend: ``backend="ddplug"``.

    import ddplug                              # registers the backend
    import torch.distributed as dist
    dist.init_process_group("ddplug")          # torchrun (env://), or store=/rank=/world_size=,
                                               # or init_method="tcp://..." / "file://..."

Every ``torch.distributed`` call on such a group runs on ddplug: its collective
timeout, its failure propagation (a rank that dies or aborts is named on every
survivor), its mismatch checks where the plugin has them. Libraries that speak
torch.distributed — torchmetrics, ``torch.nn.SyncBatchNorm``, torch's
``DistributedDataParallel``, samplers and WebDataset splitters that ask
``dist.get_rank()`` — work unchanged. The Lightning and Fabric strategies and
:func:`ddplug.torch.init` initialise it themselves, on the context they opened.

Collectives: ``all_reduce`` (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR),
``broadcast``, ``all_gather``, ``all_gather_into_tensor``, ``barrier`` are
ddplug's own; ``reduce``, ``reduce_scatter``, ``reduce_scatter_tensor``,
``gather``, ``scatter``, ``all_to_all``/``all_to_all_single`` and the coalesced
forms are composed from them (each at a cost stated in
:mod:`ddplug.distributed.group`); the object collectives
(``all_gather_object``, ``broadcast_object_list``, ...) go through those.
``send``/``recv``, ``ReduceOp.BXOR``/``PREMUL_SUM`` and dtypes ddplug has no
equivalent for are refused with an error naming the operation and what to use
instead. ``new_group`` works: every subgroup is its own ddplug run (its own
rendezvous through torch's store), on the default group's plugin.

torch's ``DistributedDataParallel``: ``model.register_comm_hook(None,
ddplug.distributed.allreduce_hook)`` moves its gradient buckets into the
plugin's registered memory and reduces them there in place
(:mod:`ddplug.distributed.hooks`).

Work objects are ddplug requests: ``wait(timeout)``, ``is_completed()``,
``get_future()``. Errors are torch's own types — ``DistBackendError`` for
collectives, ``DistStoreError``/``DistNetworkError`` while joining — that are
also the matching :mod:`ddplug.errors` class (``ddplug.PeerLost``,
``ddplug.Aborted``, ``ddplug.Timeout``, ...), carrying ddplug's sentence.

CUDA tensors: in a process that sees a GPU (and whose config names no
plugin) the group runs on the ``nccl`` plugin, on the current CUDA stream;
CPU tensors are staged through the GPU there. A ``cpu``-plugin group stages
CUDA tensors through the CPU.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from ..context import Context
from .registration import NAME as BACKEND
from .registration import is_registered, register

__all__ = [
    "BACKEND",
    "allreduce_hook",
    "ProcessGroupDdplug",
    "context_of",
    "destroy_for_context",
    "init_from_context",
    "is_ddplug_group",
    "is_registered",
    "register",
]


def __getattr__(name: str) -> Any:
    if name == "ProcessGroupDdplug":
        from .group import ProcessGroupDdplug

        return ProcessGroupDdplug
    if name == "allreduce_hook":
        from .hooks import allreduce_hook

        return allreduce_hook
    raise AttributeError(f"module 'ddplug.distributed' has no attribute {name!r}")


def is_ddplug_group(group: Any = None) -> bool:
    """Whether ``group`` (None: the default group) is served by ddplug."""
    import torch.distributed as dist

    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return False
        group = dist.group.WORLD
    from .group import ProcessGroupDdplug

    return isinstance(group, ProcessGroupDdplug)


def context_of(group: Any = None) -> Optional[Context]:
    """The ddplug context serving ``group`` (None: the default group), or None."""
    import torch.distributed as dist

    if not is_ddplug_group(group):
        return None
    return (group if group is not None else dist.group.WORLD).context


def init_from_context(ctx: Context, *, timeout_s: Optional[float] = None) -> bool:
    """Initialise torch.distributed's default group on ``ctx`` (the ranks of
    the run ``ctx`` joined; the group reuses the context). Collective: every
    rank calls it. False when torch.distributed was already initialised: a
    ddplug group on this context is left as it is; another backend's group is
    left too (the caller says so)."""
    import datetime

    import torch.distributed as dist

    if not register():
        return False
    if dist.is_initialized():
        return False
    store = _torch_store(ctx, timeout_s)
    kwargs: dict = {}
    if timeout_s:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(BACKEND, store=store, rank=ctx.rank, world_size=ctx.world_size, **kwargs)
    return True


def destroy_for_context(ctx: Context) -> bool:
    """Destroy torch.distributed's default group if it is served by ``ctx``
    (before ``ctx`` closes). Collective. Whether it did."""
    import torch.distributed as dist

    if context_of() is not ctx:
        return False
    dist.destroy_process_group()
    return True


_torch_stores: "weakref.WeakKeyDictionary[Context, int]" = weakref.WeakKeyDictionary()


def _torch_store(ctx: Context, timeout_s: Optional[float]) -> Any:
    """torch's own store for the default group (torch keeps using it: gloo
    subgroups, ``_store_based_barrier``, libraries that ask for it): a TCPStore
    that rank 0 serves on a free port, announced to the others through
    ddplug's store; they reach it at the run's master address. One rank: an
    in-process HashStore."""
    import datetime

    import torch.distributed as dist

    if ctx.world_size == 1:
        return dist.HashStore()
    n = _torch_stores[ctx] = _torch_stores.get(ctx, 0) + 1  # a new key for each init on this run
    key = f"torch_store/{n}"
    wait = datetime.timedelta(seconds=timeout_s or 300)
    if ctx.rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, None, True, timeout=wait, wait_for_workers=False)
        ctx.store.set(key, str(store.port).encode())
        return store
    host = ctx.master_addr or "127.0.0.1"
    port = int(ctx.store.get(key, wait.total_seconds()).decode())
    return dist.TCPStore(host, port, None, False, timeout=wait)
