"""ddplug for plain-PyTorch trainers (no Lightning), which call torch.distributed
themselves::

    import ddplug.torch as dt

    ctx = dt.init()                     # the run, and torch.distributed (backend "ddplug") on it
    loader = dt.prepare_dataloader(DataLoader(ds, batch_size=32, shuffle=True))   # one split owner, audited
    model = torch.nn.parallel.DistributedDataParallel(model)                      # torch's DDP over ddplug
    dt.run_once(download, scope="node")  # one process per node downloads, the others wait
    dt.shutdown()

Each function's doc says what it does; "Plain PyTorch: ddplug.torch" in the
package's README (hosts/python/README.md) shows them together. Gradients go
through torch's own DistributedDataParallel: the strategies' bucketed gradient
sync was not measurably faster than DDP over the ddplug backend
(bench/torch_backend_perf.py).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from . import context as _context
from ._c import _logbridge
from .config import ConfigSource
from .context import Context
from .data.streams import DataSplit
from .runonce import RunOnceFailed, once, run_once

__all__ = ["RunOnceFailed", "context", "init", "once", "prepare_dataloader", "run_once", "shutdown"]

_split: Optional[DataSplit] = None
_opened: Optional[Context] = None  # the context init() opened (and shutdown() closes)


def init(config: ConfigSource = None, *, timeout_s: Optional[float] = None, device: Any = None,
         torch_distributed: Optional[bool] = None) -> Context:
    """Join the run and initialise torch.distributed on it (collective: every
    rank calls it). Idempotent: a second call returns the same context.

    The world is discovered (explicit config > torchrun > Lightning's launcher >
    SLURM > one process); the context becomes the process's current run, and an
    uncaught exception on this rank aborts it on every rank. A script that
    called ``torch.distributed.init_process_group(backend="ddplug")`` first
    gets the run that group opened.

    Args:
        config: a path, JSON text, dict or :class:`ddplug.Config`; None reads
            ``DDPLUG_CONFIG``, else the defaults.
        timeout_s: rendezvous timeout override (seconds).
        device: the device this rank trains on; a CUDA device (or None in a
            process that sees a GPU) selects the ``nccl`` plugin unless the
            config names one.
        torch_distributed: initialise torch.distributed's default group with the
            backend "ddplug" on this context; None (the default) follows the
            config's "torch_distributed" key (default true).
    """
    global _opened
    ctx = _context.current()
    if ctx is None or ctx.closed:
        import torch.distributed as dist

        from . import distributed as ddist

        existing = ddist.context_of() if dist.is_available() and dist.is_initialized() else None
        if existing is not None:
            ctx = existing  # init_process_group(backend="ddplug") came first: reuse its run
            _context.set_current(ctx)
        else:
            ctx = _open(config, timeout_s, device)
            _opened = ctx
    if torch_distributed is None:
        torch_distributed = bool(ctx.config.get("torch_distributed", True))
    if torch_distributed:
        from . import distributed as ddist

        ddist.init_from_context(ctx, timeout_s=None)
    return ctx


def _open(config: ConfigSource, timeout_s: Optional[float], device: Any) -> Context:
    from . import _join
    from ._abort import abort_on_uncaught_exception

    dev = torch.device(device) if device is not None else None
    if dev is None and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        dev = torch.device("cuda")
    ctx = _join.open_run(config, device=dev, framework=f"pytorch {torch.__version__}", timeout_s=timeout_s,
                            at_exit=_close_at_exit)
    abort_on_uncaught_exception(ctx, ctx.rank)
    if ctx.rank == 0:
        p = ctx.plugin
        _logbridge.report(f"ddplug: plugin {p['name']} {p['version']}, {ctx.world_size} ranks on {ctx.num_nodes}"
                          " node(s)")
    return ctx


def context() -> Context:
    """The run this process joined (:func:`init`)."""
    ctx = _context.current()
    if ctx is None or ctx.closed:
        raise RuntimeError("ddplug.torch: no run joined yet: call ddplug.torch.init() on every rank first")
    return ctx


def prepare_dataloader(loader: Any, stream: str = "train", *, training: Optional[bool] = None) -> Any:
    """The loader with exactly one split owner for ``stream`` (collective: every
    rank prepares its loaders in the same order): a sampler or batch sampler
    that is already rank-aware (a ``DistributedSampler``, one exposing
    ``num_replicas``/``rank``) keeps the split, else ddplug's sampler splits
    (the ``data_split`` config decides otherwise). The owner is claimed and
    agreed by every rank, every rank must have the same number of batches, and
    each epoch is audited from what this rank consumed. ``set_epoch`` on
    ``loader.sampler`` reaches ddplug's sampler and the user's (else each pass
    over the loader is the next epoch). A loader over an ``IterableDataset``
    splits itself (WebDataset's ``split_by_node`` reads torch.distributed): it
    is returned as it is.

    Args:
        loader: a ``torch.utils.data.DataLoader`` (other iterables are user-owned
            and returned as they are).
        stream: the stream's name ("train", "val", ...): owners, audits and
            ``data_split.streams.<name>`` in the config refer to it.
        training: shuffle and pad/drop like a training stream (None: streams
            named "train" or "train.N" do; evaluation streams are exact).
    """
    global _split
    ctx = context()
    if _split is None or _split.ctx is not ctx:
        _split = DataSplit(ctx, "pytorch", log=_log_rank_zero, on_report=_on_report)
    managed = _split.prepare(loader, stream, framework_sampler=_torch_sampler, training=training)
    if managed is not loader and isinstance(managed, DataLoader):
        stream_bs = managed.batch_sampler
        # plain-PyTorch loops call loader.sampler.set_epoch(epoch): reach the stream
        object.__setattr__(managed, "sampler", stream_bs.sampler)
    return managed


def _torch_sampler(loader: DataLoader) -> Any:
    """torch's DistributedSampler for a loader (owner "framework")."""
    ctx = context()
    return DistributedSampler(loader.dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                              shuffle=isinstance(getattr(loader, "sampler", None), RandomSampler))


def _log_rank_zero(line: str) -> None:
    ctx = _context.current()
    if ctx is None or ctx.rank == 0:
        _logbridge.report(f"ddplug: {line}")


def _on_report(stream: Any, report: Any) -> None:
    ctx = _context.current()
    if ctx is None or ctx.rank == 0:
        _logbridge.report(report.text or report.summary)


def shutdown() -> None:
    """Destroy torch.distributed's ddplug group and leave the run (collective).
    Idempotent; also done at interpreter exit."""
    global _split, _opened
    ctx = _context.current()
    if ctx is None or ctx.closed:
        return
    from . import distributed as ddist

    ddist.destroy_for_context(ctx)
    _split = None
    if _opened is ctx:
        _opened = None
        ctx.close()


def _close_at_exit(ctx: Context) -> None:
    try:
        if not ctx.closed:
            from . import distributed as ddist

            try:
                ddist.destroy_for_context(ctx)
            except Exception:
                pass
            ctx.close()
    except Exception:  # pragma: no cover - best effort at interpreter exit
        pass
