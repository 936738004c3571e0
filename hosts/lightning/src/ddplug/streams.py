"""Data streams: one DataLoader each, split by exactly one owner, audited per epoch.

:class:`DataSplit` turns a user's DataLoader into a ddplug-managed one:

1. resolve the owner (:mod:`ddplug.ownership`) and claim it through the runtime;
2. build the batches this rank consumes:
   ``plugin``    ddplug's :class:`~ddplug.samplers.DistributedSampler` (batched by
                 the loader's batch size) or :class:`~ddplug.samplers.BucketBatchSampler`
                 (config ``sampler.kind`` "bucket"), bound to the run;
   ``user``      the user's rank-aware sampler / batch sampler, untouched;
   ``framework`` the framework's own DistributedSampler (an injector callback);
3. wrap them in a :class:`StreamBatchSampler` that fans ``set_epoch`` out to the
   sampler, the batch sampler and the dataset, records what the rank consumed into
   the epoch's audit, finishes the audit when the epoch's last batch is drawn, and
   saves/restores its epoch and position (``state_dict``), so a resumed run
   continues where it stopped;
4. re-create the DataLoader around it (Lightning's re-instantiation, which keeps
   custom DataLoader subclasses and their arguments), then check that every rank
   has the same number of batches — a mismatch would hang the first collective.

The framework's own sampler injection must be off for managed loaders; the
strategies take care of that.
"""

from __future__ import annotations

import copy
import math
import weakref
from typing import Any, Callable, Iterator, Optional

import numpy as np
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from . import ownership
from .audit import Audit, Report
from .context import Context
from .errors import make, status_code
from .samplers import BucketBatchSampler, DistributedSampler

TRAIN = "train"


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

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def iter_from(self, start: int) -> Iterator[list]:
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
        decision: the :class:`~ddplug.ownership.Decision`.
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
        allowed: tuple,
        records: bool,
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
        self._allowed = allowed
        self._records = records
        self.epoch = 0
        self._epoch_set: Optional[int] = None
        self._iterations = 0
        self._epoch_offset = 0  # see set_epoch
        self._resume: Optional[tuple] = None  # (epoch, position)
        self.drawn = 0  # batches drawn this epoch
        self.consumed: Optional[int] = None  # batches consumed this epoch, if the host reports it
        self._start = 0  # the position this epoch's iteration started at (a resume)
        self._delivering: Optional[weakref.ref] = None  # the DataLoader iterator handing out batches
        self._audit: Optional[Audit] = None
        self.reports: list = []
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)

    # ---- what DataLoader and the frameworks see --------------------------------
    @property
    def sampler(self) -> _EpochForward:
        return _EpochForward(self)

    def __len__(self) -> int:
        return len(self._inner)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs. Where the framework numbers epochs by
        the loader's iterations in this process (Fabric), a restored checkpoint's
        epoch is added, so a resumed run continues the saved epoch and the ones after it."""
        self._epoch_set = int(epoch) + self._epoch_offset

    def state_dict(self) -> dict:
        """Epoch and position (batches consumed this epoch) — saved in checkpoints."""
        return {
            "ddplug_stream": self.name,
            "owner": self.owner,
            "epoch": self.epoch,
            "position": self.position,
            "world_size": self._split.ctx.world_size,
            "length": len(self),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration of epoch ``state['epoch']`` starts at its
        saved position. A different world size or stream starts the epoch over."""
        if state.get("ddplug_stream") != self.name or int(state.get("world_size", -1)) != self._split.ctx.world_size:
            self._split.log(
                f"stream '{self.name}': checkpoint position not restored (saved for stream"
                f" {state.get('ddplug_stream')!r} with {state.get('world_size')} ranks; this run has"
                f" {self._split.ctx.world_size}): the epoch starts over"
            )
            return
        epoch, pos = int(state["epoch"]), int(state["position"])
        if pos >= len(self):
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
        self._fan_out_epoch(epoch)
        self.drawn, self.consumed, self._start = start, None, start
        total = len(self)
        self._begin_audit(epoch, total)
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

    # ---- audit -------------------------------------------------------------------
    def _begin_audit(self, epoch: int, total: int) -> None:
        if self._audit is not None:
            self._split.log(
                f"stream '{self.name}': audit of epoch {self._audit.epoch} abandoned (the epoch ended"
                f" before its last batch)"
            )
            self._audit.free()
            self._audit = None
        if not self._split.should_audit(self, total):
            return
        padding, missing = self._allowed
        self._audit = Audit(self._split.ctx, self.name, self.num_samples, epoch, shuffle=self._shuffle,
                            allowed_padding=padding, allowed_missing=missing)

    def _record(self, batch: Any) -> None:
        if self._audit is not None and self._records:
            self._audit.record(_indices(batch))

    def _finish_audit(self) -> None:
        audit, self._audit = self._audit, None
        if audit is None:
            return
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
    try:
        from lightning.fabric.utilities.data import _get_dataloader_init_args_and_kwargs
    except ImportError:  # plain PyTorch (ddplug.torch) without Lightning installed
        return _rebuild_plain(loader, batch_sampler)

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
    from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls

    return _reinstantiate_wrapped_cls(loader, *args, **kwargs)


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
    ) -> None:
        self.ctx = ctx
        self.epochs_count_iterations = bool(epochs_count_iterations)
        self.framework = framework
        self.log = log
        self.epoch_source = epoch_source
        self._on_report = on_report
        self._should_audit = should_audit
        self.streams: dict = {}
        ctx.on_close(self.close)  # its samplers must go before the context
        cfg = ctx.config
        try:
            self.settings = cfg.to_dict()
            self.origin = cfg.origin
        finally:
            cfg.close()

    # ---- hooks -------------------------------------------------------------------
    def on_report(self, stream: StreamBatchSampler, report: Report) -> None:
        if self._on_report is not None:
            self._on_report(stream, report)

    def should_audit(self, stream: StreamBatchSampler, total: int) -> bool:
        return True if self._should_audit is None else bool(self._should_audit(stream, total))

    def explain(self, stream: StreamBatchSampler, exc: BaseException) -> BaseException:
        """Add what the adapter knows (owner, who decided) to an audit failure."""
        d = stream.decision
        hint = f"\n  {d.line}"
        if d.owner == "user" and "no partitioning" in str(exc):
            hint += (
                "\n  The stream is owned by the user, but its sampler gives every rank the same samples."
                " Make the sampler rank-aware (num_replicas/rank), or let ddplug split it:"
                f" data_split.streams.{d.stream}.owner = \"plugin\" (or \"auto\")."
            )
        elif "double partitioning" in str(exc):
            hint += "\n  Two layers split this stream; keep one owner (see data_split.owner)."
        try:
            exc.args = (f"{exc}{hint}",)
        except Exception:
            pass
        return exc

    # ---- the work ----------------------------------------------------------------
    def sampler_settings(self, stream: str, training: Optional[bool] = None) -> dict:
        """The config's "sampler" settings for a stream; evaluation streams (by
        name, or ``training=False``) are never shuffled nor cut."""
        s = dict(self.settings.get("sampler", {}))
        if training is None:
            training = stream == TRAIN or stream.startswith(TRAIN + ".")
        if not training:
            s["shuffle"] = False  # evaluation order does not matter; keep it stable
            s["drop_last"] = False
        return s

    def prepare(
        self,
        loader: Any,
        stream: str,
        *,
        framework_sampler: Optional[Callable[[DataLoader], Any]] = None,
        rewrap: Optional[Callable[[Any], Any]] = None,
        training: Optional[bool] = None,
    ) -> Any:
        """The managed version of ``loader`` for ``stream`` (see the module doc).

        framework_sampler: builds the framework's own DistributedSampler for
            ``loader`` (needed when the config forces owner "framework").
        rewrap: re-applies a framework wrapper to the new batch sampler (Lightning's
            predict index tracking).
        training: whether the stream is shuffled like a training stream (None:
            by name, "train" and "train.N" are)."""
        if not isinstance(loader, DataLoader):
            decision = ownership.Decision(stream, "user", f"{type(loader).__name__} is not a DataLoader:"
                                          " it must split by itself", None, None)
            ownership.claim(self.ctx, decision, self._claimant())
            self.log(decision.line)
            return loader
        iterable = isinstance(loader.dataset, IterableDataset)
        decision = ownership.resolve(self.settings, loader, stream, iterable=iterable, origin=self.origin)
        if iterable:
            if decision.owner != "user":
                raise ValueError(
                    f"ddplug: stream '{stream}' reads an IterableDataset, which only the dataset itself can split;"
                    f" owner {decision.owner} ({decision.forced_by}) is impossible: set it to \"user\""
                )
            ownership.claim(self.ctx, decision, self._claimant())
            self.log(decision.line + " — no audit: an iterable stream has no sampler indices to record")
            return loader

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
        ws = self.ctx.world_size

        ownership.claim(self.ctx, decision, self._claimant())
        index_sampler: Any = None
        user_bs: Any = None
        records = True
        used = ""  # which of ddplug's samplers splits, for the log line
        if decision.owner == "plugin":
            settings = self.sampler_settings(stream, training)
            if settings.get("kind") == "bucket":
                inner = self._bucket(loader, stream, settings)
                used = "ddplug's length-bucketed batch sampler; "
            else:
                used = "ddplug's distributed sampler; "
                index_sampler = DistributedSampler(
                    n, context=self.ctx, stream=stream, shuffle=bool(settings.get("shuffle", True)),
                    seed=int(settings.get("seed", 0)), drop_last=bool(settings.get("drop_last", False)),
                    batch_size=batch_size)
                inner = _Batches(index_sampler, batch_size, loader_drop_last)
            shuffle, allowed, records = False, (0, 0), False  # the bound sampler declares and records
        elif decision.owner == "framework":
            if framework_sampler is None:
                raise ValueError(f"ddplug: stream '{stream}': owner \"framework\" needs the framework's sampler")
            index_sampler = framework_sampler(loader)
            inner = BatchSampler(index_sampler, batch_size, loader_drop_last)
            shuffle = _shuffled(index_sampler)
            allowed = _allowances(n, ws, index_sampler, inner)
        else:  # user
            user_bs = inner_bs if type(inner_bs) is not BatchSampler else None
            index_sampler = getattr(inner_bs, "sampler", None)
            inner = inner_bs
            shuffle = _shuffled(decision.aware_obj) or _shuffled(index_sampler)
            allowed = _allowances(n, ws, decision.aware_obj if decision.aware_where != "dataset" else None, inner)

        stream_bs = StreamBatchSampler(
            self, decision, inner, num_samples=n, dataset=loader.dataset, index_sampler=index_sampler,
            batch_sampler=user_bs, shuffle=shuffle, allowed=allowed, records=records)
        new_loader = _rebuild(loader, rewrap(stream_bs) if rewrap is not None else stream_bs)
        new_loader.state_dict = stream_bs.state_dict  # Lightning saves "stateful" loaders in checkpoints
        stream_bs.track(new_loader)
        new_loader.load_state_dict = stream_bs.load_state_dict
        self._check_even(stream_bs)
        old = self.streams.get(stream)
        if old is not None and old is not stream_bs:
            old.close()
        self.streams[stream] = stream_bs
        self.log(f"{decision.line}; {used}{len(stream_bs)} batches per epoch per rank")
        return new_loader

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

    def _check_even(self, stream: StreamBatchSampler) -> None:
        """Every rank must have the same number of batches (else the run hangs at
        the first collective of the longer ranks' extra steps)."""
        mine = np.array([len(stream)], dtype=np.int64)
        every = np.empty(self.ctx.world_size, dtype=np.int64)
        self.ctx.allgather(mine, every)
        if int(every.min()) != int(every.max()):
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


def _allowances(n: int, world_size: int, declared: Any, inner: Any) -> tuple:
    """(allowed padding, allowed missing) for a stream whose sampler ddplug did not
    build: from what the sampler declares (total_size) or from its length."""
    override = getattr(declared, "ddplug_audit_allowance", None)
    if override is not None:
        return int(override[0]), int(override[1])
    per_rank = None
    if isinstance(inner, BatchSampler):
        try:
            length = len(inner.sampler)
            per_rank = (length // inner.batch_size) * inner.batch_size if inner.drop_last else length
        except TypeError:
            per_rank = None
    if per_rank is None:
        total = getattr(declared, "total_size", None)
        if isinstance(total, int):
            return max(0, total - n), max(0, n - total)
        return 0, 0
    if per_rank >= n and world_size > 1:
        return 0, 0  # every rank reads the whole dataset: nothing to allow, let the audit say so
    total = per_rank * world_size
    return max(0, total - n), max(0, n - total)
