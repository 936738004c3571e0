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
(bench/torch_backend_perf.py). DDP keeps torch's semantics: a lost rank ends the
run. A loop that goes on in place when a rank is lost (``"elastic": {"on_peer_lost":
"shrink"}``) uses :func:`prepare_model` (ddplug's gradient sync instead of DDP)
and :func:`step`::

    model = dt.prepare_model(model)
    for batch in loader:
        def closure():
            optimizer.zero_grad()
            loss = loss_fn(model(batch))
            loss.backward()
            return loss
        dt.step(optimizer, closure)          # redone among the survivors if a rank is lost

:func:`state_dict` / :func:`load_state_dict` carry every managed loader's epoch and
cursor: a checkpoint resumes on any world size (restart mode: ``ddplug run
--max-restarts``, ``torchrun --max-restarts``). :func:`save` / :func:`load` do the
same around ``torch.save`` / ``torch.load`` and also name a resume from an older
checkpoint than the newest one saved beside it.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from . import context as _context
from ._c import _logbridge
from ._elastic import Elastic, commit_train_streams, gradient_sync_after, run_step
from .config import ConfigSource
from .context import Context
from .data import ledger
from .distributed import native
from .data.streams import DataSplit
from .runonce import RunOnceFailed, once, run_once

__all__ = ["RunOnceFailed", "context", "init", "load", "load_state_dict", "membership_changes", "once",
           "prepare_dataloader", "prepare_model", "run_once", "save", "shutdown", "state_dict", "step"]

_split: Optional[DataSplit] = None
_models: list = []  # weak references to the modules prepare_model synchronizes
_sync: Any = None  # their GradientSync
_elastic: Optional[Elastic] = None
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
    native.attach_context(ctx)  # its own allreduce in C++
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
        _split = DataSplit(ctx, "pytorch", log=_log_rank_zero, on_report=_on_report, loader_state_dict=True)
    managed = _split.prepare(loader, stream, framework_sampler=_torch_sampler, training=training)
    if managed is not loader and isinstance(managed, DataLoader):
        stream_bs = managed.batch_sampler
        # plain-PyTorch loops call loader.sampler.set_epoch(epoch): reach the stream
        object.__setattr__(managed, "sampler", stream_bs.sampler)
    return managed


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Every rank's parameters and buffers from rank 0, and its gradients
    synchronized through ddplug (bucketed allreduce started during backward,
    finished by :func:`step`) instead of torch's DistributedDataParallel — the form
    that goes on in place when a rank is lost. Returns ``model`` itself (not
    wrapped). Collective."""
    global _sync
    from .nn.gradsync import broadcast_module

    ctx = context()
    broadcast_module(ctx, model)
    _models[:] = [r for r in _models if r() is not None] + [weakref.ref(model)]
    params = [p for r in _models if r() is not None for p in r().parameters() if p.requires_grad]
    _sync = gradient_sync_after(ctx, _sync, params)
    return model


def step(optimizer: Any, closure: Any) -> Any:
    """One training step of a loop over :func:`prepare_model`'s model:
    ``closure()`` zeroes the gradients, computes the loss and calls backward; the
    gradients are synchronized; ``optimizer.step()``; the training loaders commit
    the step's batches (their checkpoint cursor). With ``"elastic": {"on_peer_lost":
    "shrink"}``, a rank lost during the step makes the survivors re-form the group,
    deal the rest of the epoch among themselves, and run the closure again on the
    same batch (the gradient is then the mean over the survivors' batches; the
    learning rate is not rescaled) — or take the other ranks' parameters when this
    rank's step completed elsewhere. One warning line says who was lost, how many
    remain and the new batches per rank. Returns the closure's result (None for a
    step taken as done)."""
    global _elastic
    ctx = context()
    if _elastic is None or _elastic.ctx is not ctx:
        _elastic = Elastic(ctx, streams=lambda: dict(_split.streams) if _split is not None else {},
                           log=_log_rank_zero, torch_distributed=_owns_torch_distributed)

    def attempt() -> Any:
        result = closure()
        if _sync is not None and _sync.round_open:
            _sync.finish()
        return result

    def after_change(event: dict) -> None:
        global _sync
        if _sync is not None:
            params = [p for r in _models if r() is not None for p in r().parameters() if p.requires_grad]
            _sync = gradient_sync_after(ctx, _sync, params)

    models = lambda: [r() for r in _models if r() is not None]  # noqa: E731
    out, adopted = run_step(_elastic, attempt, modules=models, optimizers=[optimizer], after_change=after_change)
    if not adopted:
        optimizer.step()
    if _split is not None:
        commit_train_streams(_split.streams)
    return out


def membership_changes() -> list:
    """One dict per in-place shrink so far (who was lost, the new world size, the
    train stream's batches per rank and global batch size)."""
    return list(_elastic.events) if _elastic is not None else []


def state_dict() -> dict:
    """Every managed loader's epoch and cursor (committed steps), for a checkpoint:
    it resumes on any world size (:func:`load_state_dict`)."""
    return {"version": 1, "streams": _split.states() if _split is not None else {}}


def load_state_dict(state: dict) -> None:
    """Resume the loaders prepared so far and those prepared later from
    :func:`state_dict`'s dict: each continues its epoch where the checkpoint's
    commits ended, over this run's world size; a seed or dataset other than the
    checkpoint's is refused, naming both."""
    global _split
    ctx = context()
    if _split is None or _split.ctx is not ctx:
        _split = DataSplit(ctx, "pytorch", log=_log_rank_zero, on_report=_on_report, loader_state_dict=True)
    _split.restore(dict(state.get("streams", {})))


def save(obj: dict, f: Any, **kwargs: Any) -> None:
    """``torch.save`` of ``obj`` (a dict: the model's and optimizer's state, ...) with
    :func:`state_dict` added under ``"ddplug"``, written by rank 0 only (the others
    return at once), atomically (a temporary file, then a rename). Beside it, the
    directory's ledger (``ddplug-checkpoints.json``) records it as the newest
    checkpoint, so that :func:`load` names a resume from an older one. ``kwargs`` go
    to ``torch.save``."""
    ctx = context()
    if ctx.rank != 0:
        return
    if not isinstance(obj, dict):
        raise TypeError(f"ddplug.torch.save: obj must be a dict (the checkpoint's parts), got "
                        f"{type(obj).__name__}")
    ours = state_dict()
    if not isinstance(f, (str, os.PathLike)):  # a buffer: no file, no ledger
        torch.save({**obj, "ddplug": ours}, f, **kwargs)
        return
    newest = ledger.last(f)
    serial = int(newest.get("save", 0) or 0) + 1 if newest is not None else 1
    ours["save"] = serial
    tmp = f"{os.fspath(f)}.{os.getpid()}.tmp"
    torch.save({**obj, "ddplug": ours}, tmp, **kwargs)
    os.replace(tmp, f)
    ledger.note(f, "save", serial, epoch=ours["streams"].get("train", {}).get("epoch"))


def load(f: Any, **kwargs: Any) -> dict:
    """``torch.load`` of a checkpoint :func:`save` wrote (every rank reads it;
    ``kwargs`` go to ``torch.load``), then :func:`load_state_dict` of its ``"ddplug"``
    part: the loaders resume where it was saved, on any world size. A checkpoint
    older than the newest one saved beside it is named in a warning (the steps
    between are trained again). Returns the whole dict."""
    state = torch.load(f, **kwargs)
    ours = state.get("ddplug") if isinstance(state, dict) else None
    if not isinstance(ours, dict):
        raise ValueError(f"ddplug.torch.load: {f} holds no \"ddplug\" part: it was not written by "
                         "ddplug.torch.save (load it with torch.load and pass your own "
                         "ddplug.torch.state_dict() part to load_state_dict)")
    serial = int(ours.get("save", 0) or 0)
    later = ledger.newer(f, "save", serial) if isinstance(f, (str, os.PathLike)) and serial else None
    if later is not None:
        _log_rank_zero(f"WARNING: resuming from {f} (save {serial}), but {later.get('path')} (save "
                       f"{later.get('save')}, epoch {later.get('epoch')}) was saved after it: what was "
                       "trained between is trained again — load the newest checkpoint unless that is "
                       "what you want")
    load_state_dict(ours)
    return state


def _owns_torch_distributed() -> bool:
    import torch.distributed as dist

    from . import distributed as ddist

    return dist.is_available() and dist.is_initialized() and ddist.context_of() is _context.current()


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
    _release_models()
    if _opened is ctx:
        _opened = None
        ctx.close()


def _release_models() -> None:
    global _sync, _elastic
    if _sync is not None:
        _sync.detach()
    _sync = None
    _models.clear()
    _elastic = None


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
