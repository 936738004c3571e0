"""Data streams: one DataLoader each, split by exactly one owner, audited per epoch.

:class:`DataSplit` turns a user's DataLoader into a ddplug-managed one:

1. resolve the owner (:mod:`ddplug.data.ownership`: rank-aware samplers, datasets
   already sharded per rank, the config) and claim it through the runtime;
2. build the batches this rank consumes:
   ``plugin``    ddplug's :class:`~ddplug.data.samplers.DistributedSampler` (batched by
                 the loader's batch size) or :class:`~ddplug.data.samplers.BucketBatchSampler`
                 (config ``sampler.kind`` "bucket", or the stream's own
                 ``data_split.streams.<name>.sampler``), bound to the run;
                 evaluation streams (val, test, predict) are split exactly: every
                 sample once, uneven counts per rank;
   ``user``      the user's rank-aware sampler / batch sampler, untouched;
   ``framework`` the framework's own DistributedSampler (an injector callback;
                 its unrepeated form for evaluation streams);
3. wrap them in a :class:`StreamBatchSampler` that fans ``set_epoch`` out to the
   sampler, the batch sampler and the dataset, records what the rank consumed into
   the epoch's audit, finishes the audit when the epoch's last batch is drawn, and
   saves/restores its epoch and position (``state_dict``), so a resumed run
   continues where it stopped;
4. re-create the DataLoader around it (Lightning's re-instantiation, which keeps
   custom DataLoader subclasses and their arguments), then check that every rank
   of a training stream has the same number of batches — a mismatch would hang
   the first collective (evaluation streams run without lockstep).

Elastic. A training stream that ddplug's distributed sampler splits follows one
global cursor: the host commits each optimizer step (:meth:`StreamBatchSampler.commit`),
the checkpoint state carries the cursor and its coverage digest and resumes on any
world size, and after :meth:`~ddplug.context.Context.shrink`
:meth:`StreamBatchSampler.reform` deals the rest of the epoch over the survivors —
the loader's iteration goes on with the new dealing. A stream the user's or the
framework's sampler splits, or ddplug's bucket sampler, resumes on its own world
size only: on another, resuming is refused with the reason (never a silent repeat).

What a user's or the framework's sampler pads or drops must be declared
(:mod:`ddplug.declare`); the audit never infers it from the sampler's length.
Iterable datasets are audited by sample id where the samples carry one
(:mod:`ddplug.data.iterable`).

The framework's own sampler injection must be off for managed loaders; the
strategies take care of that.
"""

from __future__ import annotations

import copy
import json
import math
import time
import warnings
import weakref
from typing import Any, Callable, Iterator, Optional

import numpy as np
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..context import Context
from ..errors import DdplugWarning, make, status_code
from . import declarations as _declare
from . import iterable as _iterable
from . import ownership
from .audit import Audit, Report
from .samplers import BucketBatchSampler, DistributedSampler

TRAIN = "train"
EVALUATION_PREFIXES = ("val", "test", "predict", "eval", "validation")


def is_evaluation(stream: str) -> bool:
    """Whether a stream name is an evaluation stream's (val, test, predict, eval,
    and their numbered forms "val.1" ...)."""
    head = stream.split(".")[0]
    return head in EVALUATION_PREFIXES


class _EpochForward:
    """What ``batch_sampler.sampler`` returns: ``set_epoch`` reaches the stream
    (frameworks call ``dataloader.batch_sampler.sampler.set_epoch``); everything
    else is the stream's underlying index sampler."""

    def __init__(self, stream: "StreamBatchSampler") -> None:
        self._stream = stream

    def set_epoch(self, epoch: int) -> None:
        self._stream.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        target = self._stream.index_sampler
        if target is None:
            raise AttributeError(name)
        return getattr(target, name)

    def __len__(self) -> int:
        target = self._stream.index_sampler
        return len(target) if target is not None else len(self._stream)

    def __iter__(self) -> Iterator[int]:
        target = self._stream.index_sampler
        if target is None:
            raise TypeError("ddplug: this stream has no separate index sampler")
        return iter(target)


class _Batches:
    """Batches of ``batch_size`` from ddplug's index sampler. The last batch is
    handed out only after the sampler ran dry (with ``drop_last`` the tail is drawn
    and dropped), so the sampler has delivered the whole epoch to the audit."""

    def __init__(self, sampler: DistributedSampler, batch_size: int, drop_last: bool) -> None:
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        # a training sampler deals steps (one global cursor; elastic)
        self.elastic = not sampler.exact

    def __len__(self) -> int:
        n = len(self.sampler)
        if self.elastic:  # the steps of the epoch as it is dealt now
            return self.sampler.steps - (1 if self.drop_last and n % self.batch_size else 0)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def iter_from(self, start: int) -> Iterator[list]:
        if self.elastic:
            if start:
                self.sampler.seek(start * self.batch_size)
            for batch in self.sampler.batches(start=not start):
                if self.drop_last and len(batch) < self.batch_size:
                    continue  # drawn (the audit saw it), not trained
                yield batch
            return
        if start:
            self.sampler.seek(start * self.batch_size)
        it = iter(self.sampler)
        total = len(self)
        for i in range(start, total):
            batch = [next(it) for _ in range(min(self.batch_size, len(self.sampler) - i * self.batch_size))]
            if i == total - 1:
                for _ in it:  # drain: the dropped tail was delivered too
                    pass
            yield batch

    def __iter__(self) -> Iterator[list]:
        return self.iter_from(0)


class StreamBatchSampler:
    """The batch sampler of a managed DataLoader (see the module doc).

    Attributes:
        name: the stream name ("train", "val", ...).
        owner: "plugin", "user" or "framework".
        decision: the :class:`~ddplug.data.ownership.Decision`.
        reports: the audit reports finished so far.
    """

    def __init__(
        self,
        split: "DataSplit",
        decision: ownership.Decision,
        inner: Any,
        *,
        num_samples: int,
        dataset: Any,
        index_sampler: Any,
        batch_sampler: Any,
        shuffle: bool,
        allowance: _declare.Allowance,
        records: bool,
        evaluation: bool = False,
        global_map: Optional[np.ndarray] = None,
        steps_only: bool = False,
        candidates: tuple = (),
    ) -> None:
        self._split = split
        self.decision = decision
        self.name = decision.stream
        self.owner = decision.owner
        self._inner = inner
        self.num_samples = int(num_samples)
        self._dataset = dataset
        self.index_sampler = index_sampler
        self._user_batch_sampler = batch_sampler
        self._shuffle = bool(shuffle)
        self._allowance = allowance
        self._records = records
        self.evaluation = bool(evaluation)
        self._global_map = global_map
        self._steps_only = bool(steps_only)
        self._candidates = candidates
        self.max_batches = 0  # the largest rank's batches per epoch
        self.audit_seconds = 0.0  # time in this stream's audit calls (begin, finish, report), cumulative
        self.epoch = 0
        self._epoch_set: Optional[int] = None
        self._iterations = 0
        self._epoch_offset = 0  # see set_epoch
        self._resume: Optional[tuple] = None  # (epoch, position)
        self.drawn = 0  # batches drawn this epoch
        self.consumed: Optional[int] = None  # batches consumed this epoch, if the host reports it
        # the host's batch count where this stream's iteration began: a host loop resumed from a
        # checkpoint without ddplug's state (DDP's) counts batches this stream never handed out
        self.consumed_offset = 0
        self._start = 0  # the position this epoch's iteration started at (a resume)
        self._delivering: Optional[weakref.ref] = None  # the DataLoader iterator handing out batches
        self._audit: Optional[Audit] = None
        self.reports: list = []
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)
        self.committed = 0  # steps committed this epoch (a sampler without a cursor)
        self._explicit_commits = False  # the host commits (else the position stands for it)

    # ---- what DataLoader and the frameworks see --------------------------------
    @property
    def sampler(self) -> _EpochForward:
        return _EpochForward(self)

    def __len__(self) -> int:
        """Batches per epoch on this rank; after a restored checkpoint, where the
        framework asks for it (Fabric), the batches left in the resumed epoch."""
        total = len(self._inner)
        if self._resume is not None and self._split.resume_shortens_len:
            if self.elastic:
                return max(0, total - self.index_sampler.committed_steps)
            return max(0, total - self._resume[1])
        return total

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs. Where the framework numbers epochs by
        the loader's iterations in this process (Fabric), a restored checkpoint's
        epoch is added, so a resumed run continues the saved epoch and the ones after it."""
        self._epoch_set = int(epoch) + self._epoch_offset

    # ---- elastic -----------------------------------------------------------------
    @property
    def elastic(self) -> bool:
        """Whether ddplug's distributed sampler deals this stream with one global
        cursor (a training stream the plugin owns)."""
        return isinstance(self._inner, _Batches) and self._inner.elastic

    def commit(self, steps: int = 1) -> None:
        """The host's optimizer step consumed the oldest ``steps`` batches drawn and
        not yet committed (call it after the step was applied)."""
        self._explicit_commits = True
        self._commit(steps)

    def commit_to(self, batches: int) -> None:
        """Commit up to ``batches`` batches of this epoch (the host counts batches:
        a step over accumulated batches commits them all)."""
        self._explicit_commits = True
        self._commit(max(0, int(batches) - self.committed_in_epoch))

    @property
    def committed_in_epoch(self) -> int:
        if self.elastic:
            return self.index_sampler.committed_steps
        return self.committed

    def _commit(self, steps: int) -> None:
        if steps <= 0:
            return
        if self.elastic:
            self.index_sampler.commit(steps)
        elif isinstance(self._inner, BucketBatchSampler):
            self._inner.commit(steps)
            self.committed += steps
        else:
            self.committed += steps

    def reform(self, timeout_s: Optional[float] = None) -> int:
        """After :meth:`Context.shrink`: the rest of this epoch over the survivors
        (collective). Returns the steps committed on this rank's behalf (0 or 1).
        A stream ddplug's distributed sampler does not split cannot go on in place:
        the error says why."""
        if self.elastic:
            return self.index_sampler.reform(timeout_s)
        if isinstance(self.index_sampler, DistributedSampler):  # exact: the pass starts over
            self.index_sampler.reform(timeout_s)
            return 0
        if isinstance(self._inner, BucketBatchSampler):
            return self._inner.reform(timeout_s)  # raises UNSUPPORTED, naming why
        raise make(
            status_code("UNSUPPORTED"),
            f"stream '{self.name}' is split by the {self.owner}'s sampler ({self.decision.line}): the rest of its"
            " epoch cannot be dealt over the survivors; in-place shrink needs ddplug's distributed sampler"
            " for every training stream (owner \"plugin\"), or use restart mode",
            f"rank {self._split.ctx.rank}",
        )

    def state_dict(self) -> dict:
        """Epoch and position (batches consumed this epoch) — saved in checkpoints;
        for an elastic stream also the sampler's cursor state (committed steps; a
        host that never commits commits up to its position here)."""
        state = {
            "ddplug_stream": self.name,
            "owner": self.owner,
            "epoch": self.epoch,
            "position": self.position,
            "world_size": self._split.ctx.world_size,
            "length": len(self._inner),
        }
        if self.elastic and not self.index_sampler._c.closed:
            if not self._explicit_commits:
                self._commit(self.position - self.committed_in_epoch)
            state["ddplug_sampler_state"] = self.index_sampler.state_dict()["ddplug_sampler_state"]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration of epoch ``state['epoch']`` continues where the
        checkpoint's commits ended — over this run's world size for an elastic
        stream; on another world size, a stream without a cursor state is refused
        (its position cannot be dealt over another world) unless ddplug's sampler
        splits it from an older checkpoint (the epoch starts over, as said)."""
        if state.get("ddplug_stream") != self.name:
            self._split.log(
                f"stream '{self.name}': checkpoint position not restored (saved for stream"
                f" {state.get('ddplug_stream')!r}): the epoch starts over"
            )
            return
        saved_world = int(state.get("world_size", -1))
        if self.elastic and "ddplug_sampler_state" in state:
            self.index_sampler.load_state_dict({"ddplug_sampler_state": state["ddplug_sampler_state"]})
            epoch = int(state["ddplug_sampler_state"]["epoch"])
            self._resume = (epoch, 0)
            self._epoch_set = epoch
            if self._split.epochs_count_iterations:
                self._epoch_offset = epoch - self._iterations
            if saved_world != self._split.ctx.world_size:
                cursor = state["ddplug_sampler_state"]
                self._split.log(
                    f"stream '{self.name}': resuming epoch {epoch} at step {cursor['steps']} (cursor"
                    f" {cursor['cursor']} of {cursor['num_samples']}) saved on {saved_world} ranks, on"
                    f" {self._split.ctx.world_size}: {len(self)} batches per rank left this epoch"
                )
            return
        if saved_world != self._split.ctx.world_size:
            if self.elastic:
                self._split.log(
                    f"stream '{self.name}': checkpoint position not restored (saved with {saved_world} ranks"
                    f" by an older ddplug, without the sampler's cursor; this run has"
                    f" {self._split.ctx.world_size}): the epoch starts over"
                )
                return
            what = ("ddplug's bucket sampler (it forms its global batches of batch_size x world samples)"
                    if isinstance(self._inner, BucketBatchSampler) else
                    f"the {self.owner}'s sampler ({self.decision.line})")
            raise make(
                status_code("UNSUPPORTED"),
                f"stream '{self.name}': the checkpoint was saved on {saved_world} ranks (epoch"
                f" {state.get('epoch')}, {state.get('position')} batches in) and this run has"
                f" {self._split.ctx.world_size}; the stream is split by {what}, whose position cannot be"
                f" dealt over another world size: resuming would repeat or skip samples. Resume on"
                f" {saved_world} ranks, or let ddplug's distributed sampler split the stream (its cursor"
                " resumes on any world size)",
                f"rank {self._split.ctx.rank}",
            )
        epoch, pos = int(state["epoch"]), int(state["position"])
        if pos >= len(self._inner):
            epoch, pos = epoch + 1, 0
        self._resume = (epoch, pos)
        self._epoch_set = epoch
        if self._split.epochs_count_iterations:
            self._epoch_offset = epoch - self._iterations

    @property
    def position(self) -> int:
        """Batches consumed this epoch: what the host reported, else what the
        DataLoader's iterator handed to the loop (its workers draw ahead of the
        loop by up to num_workers x prefetch_factor batches), else what was drawn."""
        if self.consumed is not None:
            return self.consumed
        it = self._delivering() if self._delivering is not None else None
        handed = getattr(it, "_num_yielded", None)
        if isinstance(handed, int):
            return min(self._start + handed, self.drawn)
        return self.drawn

    def track(self, loader: DataLoader) -> None:
        """Follow the iterators ``loader`` creates, so that ``position`` counts the
        batches it handed out rather than the ones its workers prefetched."""
        make = loader._get_iterator  # DataLoader.__iter__ calls it (torch/utils/data/dataloader.py)
        ref = weakref.ref(self)

        def _get_iterator() -> Any:
            it = make()
            me = ref()
            if me is not None:
                me._delivering = weakref.ref(it)
            return it

        loader._get_iterator = _get_iterator

    # ---- iteration ---------------------------------------------------------------
    def _next_epoch(self) -> int:
        if self._epoch_set is not None:
            epoch, self._epoch_set = self._epoch_set, None
            return epoch
        source = self._split.epoch_source
        if source is not None:
            return int(source())
        return self._iterations + self._epoch_offset

    def _fan_out_epoch(self, epoch: int) -> None:
        seen = set()
        for obj in (self.index_sampler, self._inner, self._user_batch_sampler, self._dataset):
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            fn = getattr(obj, "set_epoch", None)
            if callable(fn):
                fn(epoch)

    def __iter__(self) -> Iterator[list]:
        epoch = self._next_epoch()
        start = 0
        if self._resume is not None:
            r_epoch, r_pos = self._resume
            self._resume = None
            if r_epoch == epoch:
                start = r_pos
        self.epoch = epoch
        self._iterations += 1
        self.committed = 0
        self._fan_out_epoch(epoch)
        self.drawn, self.consumed, self._start = start, None, start
        self.consumed_offset = 0
        total = len(self._inner)
        self._begin_audit(epoch, total)
        if self.elastic:
            yield from self._iter_elastic(start)
            return
        if isinstance(self._inner, _Batches):
            it = self._inner.iter_from(start)
        else:
            if isinstance(self._inner, BucketBatchSampler) and start:
                self._inner.seek(start)
                it = iter(self._inner)
            else:
                it = iter(self._inner)
                for _ in range(start):  # user/framework samplers: replay into the audit
                    self._record(next(it))
        for i in range(start, total):
            try:
                batch = next(it)
            except StopIteration:
                self._finish_audit()
                return
            self._record(batch)
            self.drawn = i + 1
            if i == total - 1:
                self._finish_audit()
            yield batch

    def _iter_elastic(self, start: int) -> Iterator[list]:
        """The batches of ddplug's elastic sampler until it runs dry: their number
        may change during the epoch (a shrink deals the rest over fewer ranks).
        The epoch's audit finishes when its last batch, as dealt then, is drawn."""
        self.committed = 0
        # batches count in epoch steps: a resumed epoch starts at the steps its
        # checkpoint committed (on whatever world they were dealt)
        base = self.index_sampler.committed_steps if not start else start
        self._start = self.drawn = base
        i = base
        for batch in self._inner.iter_from(start):
            self.drawn = i + 1
            i += 1
            if self.drawn >= len(self._inner):
                self._finish_audit()
            yield batch
        self._finish_audit()

    # ---- audit -------------------------------------------------------------------
    def _begin_audit(self, epoch: int, total: int) -> None:
        t0 = time.perf_counter()
        try:
            self._begin_audit_timed(epoch, total)
        finally:
            self.audit_seconds += time.perf_counter() - t0

    def _begin_audit_timed(self, epoch: int, total: int) -> None:
        if self._audit is not None:
            self._split.log(
                f"stream '{self.name}': audit of epoch {self._audit.epoch} abandoned (the epoch ended"
                f" before its last batch)"
            )
            self._audit.free()
            self._audit = None
        if not self._split.should_audit(self, max(total, self.max_batches)):
            return
        a = self._allowance
        padding = _declare.padding_for_epoch(self._candidates, epoch, a.padding)
        self._audit = Audit(self._split.ctx, self.name, self.num_samples, epoch, shuffle=self._shuffle,
                            evaluation=self.evaluation, allowed_padding=padding, allowed_missing=a.dropped,
                            local_dropped=a.local_dropped, steps_only=self._steps_only)
        if a.dropped_indices is not None and a.dropped_indices.size and not self.evaluation:
            self._audit.declare_dropped(a.dropped_indices)

    def _record(self, batch: Any) -> None:
        if self._audit is not None and self._records:
            idx = _indices(batch)
            if self._steps_only:
                idx = idx[:0]
            elif self._global_map is not None:
                inside = (idx >= 0) & (idx < self._global_map.size)
                idx = np.where(inside, self._global_map[np.clip(idx, 0, max(0, self._global_map.size - 1))], -1)
            self._audit.record(idx)

    def _finish_audit(self) -> None:
        audit, self._audit = self._audit, None
        if audit is None:
            return
        t0 = time.perf_counter()
        try:
            self._finish_audit_timed(audit)
        finally:
            self.audit_seconds += time.perf_counter() - t0

    def _finish_audit_timed(self, audit: Audit) -> None:
        try:
            report = audit.finish()
        except Exception as exc:  # AuditFailed carries the report
            report = getattr(exc, "report", None)
            if report is not None:
                self.reports.append(report)
                self._split.on_report(self, report)
            raise self._split.explain(self, exc) from None
        self.reports.append(report)
        self._split.on_report(self, report)

    def close(self) -> None:
        if self._audit is not None:
            self._audit.free()
            self._audit = None
        for obj in (self.index_sampler, self._inner):
            if isinstance(obj, (DistributedSampler, BucketBatchSampler)):
                obj.close()


def _declare_target(stream: Any) -> Any:
    """The object a user would declare padding or dropping on."""
    for name in ("_user_batch_sampler", "index_sampler", "_dataset"):
        obj = getattr(stream, name, None)
        if obj is not None and not isinstance(obj, (DistributedSampler, BucketBatchSampler)):
            return obj
    return None


class _IterableStream:
    """What the strategies' hooks need of a stream read from an iterable dataset."""

    def __init__(self, name: str, decision: Optional[ownership.Decision] = None, ids: Any = None) -> None:
        self.name = name
        self.decision = decision
        self.owner = decision.owner if decision is not None else "user"
        self.reports = ids.reports if ids is not None else []


def _indices(batch: Any) -> np.ndarray:
    if isinstance(batch, np.ndarray):
        return batch.astype(np.int64, copy=False).reshape(-1)
    if hasattr(batch, "tolist"):  # a tensor
        batch = batch.tolist()
    if isinstance(batch, int):
        return np.asarray([batch], dtype=np.int64)
    return np.asarray(list(batch), dtype=np.int64).reshape(-1)


def _shuffled(obj: Any) -> bool:
    if obj is None:
        return False
    if isinstance(obj, RandomSampler):
        return True
    value = getattr(obj, "shuffle", None)
    return bool(value) if isinstance(value, bool) else False


def _dataset_lengths(dataset: Any) -> Any:
    for name in ("ddplug_lengths", "lengths", "sizes"):
        value = getattr(dataset, name, None)
        if callable(value):
            value = value()
        if value is not None:
            return value
    return None


def _rebuild(loader: DataLoader, batch_sampler: Any) -> DataLoader:
    """The same DataLoader (class, dataset, workers, collate_fn, ...) with
    ``batch_sampler`` — Lightning's re-instantiation (the one its sampler injection
    uses), with the batching arguments replaced wherever they were passed."""
    data = _lightning_data_utilities()
    if data is None:  # plain PyTorch (ddplug.torch) without Lightning installed
        return _rebuild_plain(loader, batch_sampler)
    _get_dataloader_init_args_and_kwargs = data._get_dataloader_init_args_and_kwargs
    _reinstantiate_wrapped_cls = data._reinstantiate_wrapped_cls

    probe = copy.copy(loader)
    object.__setattr__(probe, "batch_sampler", None)  # resolve as a plain loader
    args, kwargs = _get_dataloader_init_args_and_kwargs(probe, None)
    names = tuple(getattr(loader, "__pl_saved_arg_names", ()))
    args = list(args)
    for key, value in (("batch_sampler", batch_sampler), ("sampler", None), ("shuffle", None),
                       ("batch_size", 1), ("drop_last", False)):
        if key in names:  # passed positionally: replace it there, never twice
            args[names.index(key)] = value
            kwargs.pop(key, None)
        else:
            kwargs[key] = value
    return _reinstantiate_wrapped_cls(loader, *args, **kwargs)


def _lightning_data_utilities() -> Any:
    """Lightning Fabric's data utilities, from whichever spelling is imported
    (lightning.fabric, or the standalone lightning_fabric), else the first that
    imports; None without Lightning."""
    import importlib
    import sys

    names = ("lightning.fabric.utilities.data", "lightning_fabric.utilities.data")
    for name in names:
        if name in sys.modules:
            return sys.modules[name]
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def _rebuild_plain(loader: DataLoader, batch_sampler: Any) -> DataLoader:
    """Without Lightning: a plain DataLoader rebuilt from its public attributes
    (a subclass, whose constructor may take other arguments, cannot be)."""
    if type(loader) is not DataLoader:
        raise TypeError(
            f"ddplug: cannot re-create a {type(loader).__name__} (a DataLoader subclass) without Lightning's"
            " re-instantiation; pass a torch.utils.data.DataLoader, or install lightning"
        )
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                  multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
                  persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device)
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, batch_sampler=batch_sampler, **kwargs)


class DataSplit:
    """Prepares a framework's DataLoaders for one run (see the module doc).

    Args:
        ctx: the run's context.
        framework: "lightning" / "fabric" (claimants and messages).
        log: where decisions and reports go (a callable taking a line).
        epoch_source: returns the current epoch when a loader is iterated and
            nobody called set_epoch (None: count iterations).
        epochs_count_iterations: the framework's set_epoch numbers a loader's
            iterations in this process (Fabric), so a restored checkpoint shifts it.
        resume_shortens_len: after a restored position, ``len(loader)`` reports
            the batches left in the resumed epoch (Fabric's loops use it; the
            Trainer counts the resumed epoch's batches itself).
        loader_state_dict: the loaders get ``state_dict`` (Fabric saves a loader
            in ``fabric.save`` state through it). The Trainer keeps it off: a
            stateful loader in a checkpoint breaks resuming it under another
            strategy; its strategy stores the positions under "ddplug" instead.
        on_report: called with (stream, report) after every finished audit.
        should_audit: (stream, batches this epoch) -> bool; False skips the
            epoch's audit (e.g. a sanity check or limit_*_batches).
    """

    def __init__(
        self,
        ctx: Context,
        framework: str,
        *,
        log: Callable[[str], None],
        epoch_source: Optional[Callable[[], int]] = None,
        on_report: Optional[Callable[[StreamBatchSampler, Report], None]] = None,
        should_audit: Optional[Callable[[StreamBatchSampler, int], bool]] = None,
        epochs_count_iterations: bool = False,
        resume_shortens_len: bool = False,
        loader_state_dict: bool = False,
    ) -> None:
        self.ctx = ctx
        self.epochs_count_iterations = bool(epochs_count_iterations)
        self.resume_shortens_len = bool(resume_shortens_len)
        self.loader_state_dict = bool(loader_state_dict)
        self.iterables: dict = {}
        self._pending: dict = {}
        self.framework = framework
        self.log = log
        self.epoch_source = epoch_source
        self._on_report = on_report
        self._should_audit = should_audit
        self.streams: dict = {}
        ctx.on_close(self.close)  # its samplers must go before the context
        cfg = ctx.config
        self.settings = cfg.to_dict()
        self.origin = cfg.origin

    # ---- hooks -------------------------------------------------------------------
    def on_report(self, stream: StreamBatchSampler, report: Report) -> None:
        if self._on_report is not None:
            self._on_report(stream, report)

    def should_audit(self, stream: StreamBatchSampler, total: int) -> bool:
        return True if self._should_audit is None else bool(self._should_audit(stream, total))

    def explain(self, stream: Any, exc: BaseException) -> BaseException:
        """Add what the adapter knows (owner, who decided, how to declare) to an
        audit failure."""
        d = stream.decision
        text = str(exc)
        hint = f"\n  {d.line}" if d is not None else ""
        obj = _declare_target(stream)
        if d is not None and d.owner == "user" and "no partitioning" in text:
            hint += (
                "\n  The stream is owned by the user, but its sampler gives every rank the same samples."
                " Make the sampler rank-aware (num_replicas/rank), or let ddplug split it:"
                f" data_split.streams.{d.stream}.owner = \"plugin\"."
            )
        elif "double partitioning" in text:
            hint += "\n  Two layers split this stream; keep one owner (see data_split.owner)."
        report = getattr(exc, "report", None)
        keys = [k for k in getattr(report, "repeated_keys", []) or [] if k is not None]
        if keys:
            hint += f"\n  Repeated sample keys: {', '.join(str(k) for k in keys[:8])}"
        if not getattr(stream, "evaluation", False) and obj is not None and (
                "missing samples" in text or "repeated samples" in text):
            report = getattr(exc, "report", None)
            parts = []
            if report is not None and "MISSING" in report.violations:
                parts.append(f"dropped=<the {report.missing} indices it leaves out, a predicate, or a count>")
            if report is not None and "OVERLAP" in report.violations:
                parts.append(f"padding={report.repeats}")
            if parts:
                hint += (
                    f"\n  If {type(obj).__name__} pads or drops on purpose, declare it:"
                    f" ddplug.declare(<the {type(obj).__name__}>, {', '.join(parts)})"
                    " — see the README's \"Declaring padding and dropping\"."
                )
        try:
            exc.args = (f"{exc}{hint}",)
        except Exception:
            pass
        return exc

    # ---- the work ----------------------------------------------------------------
    def sampler_settings(self, stream: str, training: Optional[bool] = None) -> dict:
        """ddplug's sampler settings for a stream: the top-level "sampler", each key
        of the stream's own ``data_split.streams.<name>.sampler`` overriding it.
        An evaluation stream (by name, or ``training=False``) is split exactly:
        the top-level sampler does not apply to it (no bucketing, shuffling,
        padding or dropping), and its own settings may not ask for bucketing or
        drop_last (ValueError naming the key)."""
        own = dict(((self.settings.get("data_split", {}) or {}).get("streams", {}) or {})
                   .get(stream, {}).get("sampler", {}) or {})
        if training is None:
            training = not is_evaluation(stream)
        if training:
            s = dict(self.settings.get("sampler", {}))
            bucket = dict(s.get("bucket", {}))
            bucket.update(own.pop("bucket", {}) or {})
            s.update(own)
            s["bucket"] = bucket
            s["exact"] = False
            return s
        for key, bad in (("kind", "bucket"), ("drop_last", True)):
            if own.get(key) == bad:
                raise ValueError(
                    f"ddplug: stream '{stream}' is an evaluation stream, split exactly (every sample once,"
                    f" uneven counts per rank); data_split.streams.{stream}.sampler.{key} = {json.dumps(bad)}"
                    f" in {self.origin} would pad or drop it: remove that setting"
                )
        return {"kind": "distributed", "shuffle": bool(own.get("shuffle", False)),
                "seed": int(own.get("seed", self.settings.get("sampler", {}).get("seed", 0))),
                "drop_last": False, "exact": True, "bucket": {}}

    def restore(self, states: dict) -> None:
        """Positions to resume from, by stream name (a checkpoint's ddplug states):
        applied to streams prepared from now on, and to those already prepared."""
        self._pending = dict(states or {})
        for name, stream in self.streams.items():
            st = self._pending.pop(name, None)
            if st is not None:
                stream.load_state_dict(st)

    def states(self) -> dict:
        """Every stream's position, for a checkpoint."""
        return {name: s.state_dict() for name, s in self.streams.items()}

    def prepare(
        self,
        loader: Any,
        stream: str,
        *,
        framework_sampler: Optional[Callable[..., Any]] = None,
        rewrap: Optional[Callable[[Any], Any]] = None,
        training: Optional[bool] = None,
        note: str = "",
    ) -> Any:
        """The managed version of ``loader`` for ``stream`` (see the module doc).

        framework_sampler: builds the framework's own DistributedSampler for
            ``loader`` (needed when the config forces owner "framework"); called
            with ``evaluation=True`` for an evaluation stream.
        rewrap: re-applies a framework wrapper to the new batch sampler (Lightning's
            predict index tracking).
        training: whether the stream trains (in lockstep, shuffled, padded to equal
            lengths) or evaluates (exact); None: by name (val, test, predict, eval
            evaluate).
        note: appended to the owner line of a stream ddplug splits (what a framework
        setting means there)."""
        ownership.check_stream_name(stream)
        if training is None:
            training = not is_evaluation(stream)
        evaluation = not training
        if not isinstance(loader, DataLoader):
            decision = ownership.Decision(stream, "user", f"{type(loader).__name__} is not a DataLoader:"
                                          " it must split by itself", None, None, note=note)
            ownership.claim(self.ctx, decision, self._claimant())
            self.warn(f"{decision.line} — not audited: ddplug sees no indices or ids of a"
                      f" {type(loader).__name__}")
            return loader
        iterable = isinstance(loader.dataset, IterableDataset)
        per_rank = None if iterable else ownership.compare_datasets(self.ctx, loader.dataset)
        decision = ownership.resolve(self.ctx, loader, stream, iterable=iterable, per_rank=per_rank)
        decision.note = note if decision.owner == "plugin" else ""
        ownership.check_sampler_ranks(self.ctx, decision)
        if iterable:
            return self._prepare_iterable(loader, decision, evaluation)

        old_bs = loader.batch_sampler
        inner_bs = getattr(old_bs, "_batch_sampler", old_bs)  # unwrap Lightning's predict wrapper
        if inner_bs is None:
            raise ValueError(
                f"ddplug: stream '{stream}': DataLoader(batch_size=None) (no automatic batching) is not"
                " supported; give it a batch_size or a batch_sampler"
            )
        n = len(loader.dataset)
        batch_size = getattr(inner_bs, "batch_size", None) or 1
        loader_drop_last = bool(getattr(inner_bs, "drop_last", False))

        ownership.claim(self.ctx, decision, self._claimant())
        index_sampler: Any = None
        user_bs: Any = None
        records = True
        global_map, steps_only, audit_n = None, False, n
        candidates: tuple = ()
        used = ""  # which of ddplug's samplers splits, for the log line
        if decision.owner == "plugin":
            settings = self.sampler_settings(stream, training)
            if settings.get("kind") == "bucket":
                inner = self._bucket(loader, stream, settings)
                used = "ddplug's length-bucketed batch sampler; "
            else:
                used = "ddplug's distributed sampler (exact: every sample once); " if settings["exact"] \
                    else "ddplug's distributed sampler; "
                index_sampler = DistributedSampler(
                    n, context=self.ctx, stream=stream, shuffle=bool(settings.get("shuffle", True)),
                    seed=int(settings.get("seed", 0)), drop_last=bool(settings.get("drop_last", False)),
                    batch_size=batch_size, exact=bool(settings["exact"]))
                inner = _Batches(index_sampler, batch_size, loader_drop_last and training)
            # the bound sampler declares and records (the tail a drop_last batching
            # drops is drawn from it all the same: nothing goes missing)
            shuffle, allowance, records = False, _declare.Allowance(), False
        elif decision.owner == "framework":
            if framework_sampler is None:
                raise ValueError(f"ddplug: stream '{stream}': owner \"framework\" needs the framework's sampler")
            index_sampler = framework_sampler(loader, evaluation=evaluation)
            inner = BatchSampler(index_sampler, batch_size, loader_drop_last)
            shuffle = _shuffled(index_sampler)
            candidates = (index_sampler, loader.dataset)
            allowance = _declare.allowance(n, candidates, inner, evaluation=evaluation,
                                               world=self.ctx.world_size)
        else:  # user
            user_bs = inner_bs if type(inner_bs) is not BatchSampler else None
            index_sampler = getattr(inner_bs, "sampler", None)
            inner = inner_bs
            shuffle = _shuffled(decision.aware_obj) or _shuffled(index_sampler)
            candidates = tuple(o for o in (user_bs, index_sampler, loader.dataset) if o is not None)
            allowance = _declare.allowance(n, candidates, inner, evaluation=evaluation,
                                               world=self.ctx.world_size)
            if decision.per_rank is not None:
                if decision.per_rank.global_map is not None:
                    global_map, audit_n = decision.per_rank.global_map, decision.per_rank.global_n
                else:
                    steps_only, audit_n = True, 0  # no common N: the ranks' lengths differ
                    self.warn(
                        f"stream '{stream}': the dataset differs across ranks ({decision.per_rank.why}) and"
                        " ddplug cannot map its indices to one index space (only chains of Subsets over the"
                        " same dataset map): the audit checks steps and order, not which samples were seen"
                    )

        stream_bs = StreamBatchSampler(
            self, decision, inner, num_samples=audit_n, dataset=loader.dataset, index_sampler=index_sampler,
            batch_sampler=user_bs, shuffle=shuffle, allowance=allowance, records=records,
            evaluation=evaluation, global_map=global_map, steps_only=steps_only, candidates=candidates)
        new_loader = _rebuild(loader, rewrap(stream_bs) if rewrap is not None else stream_bs)
        new_loader.load_state_dict = stream_bs.load_state_dict
        if self.loader_state_dict:  # Fabric saves loaders that have state_dict
            new_loader.state_dict = stream_bs.state_dict
        stream_bs.track(new_loader)
        self._gather_lengths(stream_bs, training)
        old = self.streams.get(stream)
        if old is not None and old is not stream_bs:
            old.close()
        self.streams[stream] = stream_bs
        pending = self._pending.pop(stream, None)
        if pending is not None:
            stream_bs.load_state_dict(pending)
        declared = f"; declared {allowance.describe()}" if allowance.source and not evaluation else ""
        mapped = f"; audited in the {audit_n} indices of the whole dataset" if global_map is not None else ""
        self.log(f"{decision.line}; {used}{len(stream_bs)} batches per epoch per rank{declared}{mapped}")
        return new_loader

    def _prepare_iterable(self, loader: DataLoader, decision: ownership.Decision, evaluation: bool) -> Any:
        stream = decision.stream
        if decision.owner != "user":
            raise ValueError(
                f"ddplug: stream '{stream}' reads an IterableDataset, which only the dataset itself can split;"
                f" owner {decision.owner} ({decision.forced_by}) is impossible: set it to \"user\""
                " (ddplug.shard(dataset) splits any iterable by rank and DataLoader worker)"
            )
        ownership.claim(self.ctx, decision, self._claimant())
        key = _iterable.key_of(loader.dataset)
        declared = _declare.declared_key(loader.dataset) is not None
        if key is None:
            why = "its samples carry no id"
            if _iterable.is_webdataset(loader.dataset):
                why = _iterable.webdataset_key(loader.dataset)[1]
            self.warn(
                f"{decision.line} — not audited: {why}. Or declare where the ids are"
                f" (ddplug.declare(dataset, key=\"<field>\"), a position in a tuple batch, or a function of a"
                f" batch; WebDataset's \"{_iterable.KEY_FIELD}\" is found by itself) to have each epoch checked"
                " for repeated samples"
            )
            return loader
        expected = 0  # the whole stream's distinct samples, where known
        if isinstance(loader.dataset, _iterable.Shard):
            try:
                expected = len(loader.dataset.source)
            except TypeError:
                expected = 0
        ids = _iterable.IdAudit(
            self.ctx, stream, key, expected, evaluation=evaluation,
            should_audit=lambda: self.should_audit(_IterableStream(stream), -1),
            on_report=lambda r: self.on_report(_IterableStream(stream, decision, ids), r),
            explain=lambda exc: self.explain(_IterableStream(stream, decision, ids), exc),
            declared=declared, warn=self.warn)
        ids.attach(loader)
        self.iterables[stream] = ids
        what = f"{expected} ids expected" if expected else "repeats only: how many samples the stream has is unknown"
        self.log(f"{decision.line}; audited by sample id ({what})")
        return loader

    def _claimant(self) -> str:
        return f"{self.framework} adapter (rank {self.ctx.rank})"

    def _bucket(self, loader: DataLoader, stream: str, settings: dict) -> BucketBatchSampler:
        lengths = _dataset_lengths(loader.dataset)
        if lengths is None:
            raise ValueError(
                f"ddplug: stream '{stream}': sampler.kind \"bucket\" needs per-sample lengths; give the dataset"
                " a `lengths` attribute (a sequence of ints, one per sample) or a `ddplug_lengths()` method"
            )
        b = settings.get("bucket", {})
        return BucketBatchSampler(
            lengths, int(b.get("batch_size", 8)), boundaries=b.get("boundaries"),
            num_buckets=int(b.get("num_buckets", 8)), context=self.ctx, stream=stream,
            shuffle=bool(settings.get("shuffle", True)), seed=int(settings.get("seed", 0)),
            drop_last=b.get("pad", "repeat") == "drop")

    def warn(self, line: str) -> None:
        """A warning, printed once (rank 0) and sent to Python's warnings."""
        if self.ctx.rank == 0:
            warnings.warn(f"ddplug: {line}", DdplugWarning, stacklevel=3)
        self.log(f"WARNING: {line}")

    def _gather_lengths(self, stream: StreamBatchSampler, training: bool) -> None:
        """Every rank's batches per epoch (collective). A training stream must have
        the same number on every rank (else the run hangs at the first collective
        of the longer ranks' extra steps); an evaluation stream keeps the largest,
        so that every rank decides alike whether an epoch is audited."""
        mine = np.array([len(stream._inner)], dtype=np.int64)
        every = np.empty(self.ctx.world_size, dtype=np.int64)
        self.ctx.allgather(mine, every)
        stream.max_batches = int(every.max())
        if training and int(every.min()) != int(every.max()):
            counts = ", ".join(f"rank {r}: {int(c)}" for r, c in enumerate(every))
            lo = int(np.argmin(every))
            raise make(
                status_code("AUDIT_FAILED"),
                f"uneven batches: rank {lo} has {int(every[lo])} steps, others {int(every.max())} (will hang)"
                f" — stream '{stream.name}' ({counts}); {stream.decision.line}",
                f"rank {self.ctx.rank}",
            )

    def close(self) -> None:
        for s in self.streams.values():
            s.close()
        self.streams.clear()
        for ids in self.iterables.values():
            ids.close()
        self.iterables.clear()
