"""Iterable datasets (streaming): a rank × worker sharding helper, and the audit of
samples by id.

An ``IterableDataset`` has no indices for ddplug's sampler to split: it must split
itself across ranks and DataLoader workers. :func:`shard` does that for any
iterable — item ``k`` goes to the consumer ``k mod (world·workers)`` — and
:class:`IdAudit` checks each epoch that no sample was delivered twice, on one
rank or across ranks and workers, from the ids the samples carry:

* a field name of each (collated) batch, declared with ``ddplug.declare(dataset,
  key="__key__")``, or a position in a tuple batch (``key=0``) — a WebDataset
  pipeline's ``"__key__"`` is found without a declaration, also where a
  ``to_tuple("__key__", ...)`` moved it into a position;
* or a function of the batch returning its ids: ``ddplug.declare(dataset,
  key=lambda batch: batch["path"])``.

Ids are ints or anything with a stable ``str`` (hashed to 64 bits the same way in
every process). The audit is exact up to ``data_split.audit_exact_max`` ids, and
beyond follows a hash-chosen subset (ddplug.h, "Samples identified by id", states
its error bound). For a :func:`shard` of a source with a length, the audit also
checks that that many distinct ids came (nothing lost); for other iterables it
checks repeats only. A pass ends when the loader is exhausted or has handed out
``len(loader)`` batches. A stream whose samples carry no id is not audited: a
warning says so.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Optional, Union

from torch.utils.data import IterableDataset, get_worker_info

from ..context import Context, current
from .audit import Audit, Report, sample_id
from .declarations import declared_key, inherit

KEY_FIELD = "__key__"  # WebDataset's per-sample key

_KEYS_KEPT = 1 << 16  # keys remembered per pass, to name repeated ids in reports

Key = Union[str, int, Callable[[Any], Any]]


def shard(source: Any, *, context: Optional[Context] = None, rank: Optional[int] = None,
          world_size: Optional[int] = None) -> "Shard":
    """``source``'s items for this rank and DataLoader worker only: item ``k`` (in
    the source's order, the same on every rank) goes to consumer
    ``k mod (world_size · workers)``, consumer ``rank · workers + worker``. Every
    item reaches exactly one consumer per pass; ranks get counts that differ by at
    most one per worker. Declarations made on ``source`` (:func:`ddplug.declare`)
    hold for the shard.

    Args:
        source: any iterable (a streaming dataset, a generator factory's result
            is consumed once: pass a re-iterable).
        context / rank, world_size: whose share (default: the current run's).
    """
    return Shard(source, context=context, rank=rank, world_size=world_size)


class Shard(IterableDataset):
    """The ``IterableDataset`` :func:`shard` returns: ``source``'s share of
    ``rank`` (``len`` where the source has one)."""

    def __init__(self, source: Any, *, context: Optional[Context] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None) -> None:
        super().__init__()
        if rank is None or world_size is None:
            ctx = context if context is not None else current()
            if ctx is None:
                raise RuntimeError(
                    "ddplug.shard needs the ranks: call it inside a run (after the strategy set up), or pass"
                    " rank= and world_size= (e.g. self.trainer.global_rank and self.trainer.world_size)"
                )
            rank, world_size = ctx.rank, ctx.world_size
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"ddplug.shard: rank {rank} is not in a world of {world_size}")
        self.source = source
        self.rank, self.world_size = int(rank), int(world_size)
        inherit(source, self)  # declarations made on the source hold for its shards

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        consumers = self.world_size * workers
        me = self.rank * workers + worker
        return itertools.islice(iter(self.source), me, None, consumers)

    def __len__(self) -> int:
        n = len(self.source)  # type: ignore[arg-type]
        return n // self.world_size + (self.rank < n % self.world_size)


def key_of(dataset: Any) -> Optional[Key]:
    """The declared key, else where a WebDataset pipeline's ``"__key__"`` ends up
    (see :func:`webdataset_key`), else None."""
    key = declared_key(dataset)
    if key is not None:
        return key
    if is_webdataset(dataset):
        return webdataset_key(dataset)[0]
    return None


def is_webdataset(dataset: Any) -> bool:
    return type(dataset).__module__.split(".")[0] == "webdataset"


def webdataset_key(dataset: Any) -> "tuple[Optional[Key], str]":
    """Where a WebDataset pipeline's samples carry ``"__key__"`` at its end, and
    why not when they do not: a field of the sample dict, or a position after a
    ``to_tuple`` that names it. A ``to_tuple`` without it drops it (None). Stages
    ddplug cannot see into (a ``map`` of a function) are assumed to keep it; if a
    batch then lacks it, the audit says so and stops (:meth:`IdAudit.record`)."""
    key: Optional[Key] = KEY_FIELD
    for stage in getattr(dataset, "pipeline", None) or []:
        f = getattr(stage, "f", None)
        if getattr(f, "__name__", "") != "_to_tuple" or key != KEY_FIELD:
            continue
        fields = [str(a).split(";") for a in getattr(stage, "args", ())]
        where = [i for i, names in enumerate(fields) if KEY_FIELD in names]
        if not where:
            args = ", ".join(repr(a) for a in stage.args)
            return None, (f"its WebDataset pipeline's to_tuple({args}) drops \"{KEY_FIELD}\": name it there"
                          f" (to_tuple(\"{KEY_FIELD}\", {args})) and the audit finds it")
        key = where[0]
    return key, ""


def batch_ids(batch: Any, key: Key) -> list:
    """The ids in one (collated) batch."""
    if callable(key):
        ids = key(batch)
    elif isinstance(key, int):
        ids = batch[key]
    elif isinstance(batch, dict):
        ids = batch[key]
    else:
        ids = getattr(batch, key)
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, (str, bytes, int)):
        return [ids]
    return list(ids)


class IdAudit:
    """Audits each pass over a loader of an iterable dataset by sample id: begins
    when an iterator is created, records every batch's ids, finishes (collective)
    when the iterator is exhausted. Installed on the loader by :meth:`attach`."""

    def __init__(self, ctx: Context, stream: str, key: Key, expected: int, *,
                 evaluation: bool, should_audit: Callable[[], bool],
                 on_report: Callable[[Report], None], explain: Callable[[BaseException], BaseException],
                 declared: bool = True, warn: Optional[Callable[[str], None]] = None) -> None:
        self.ctx, self.stream, self.key, self.expected = ctx, stream, key, int(expected)
        self.evaluation = evaluation
        self.declared = declared  # False: found by ddplug (WebDataset), may be wrong
        self.stopped = False
        # This pass's audit was begun on every rank with a key ddplug found itself:
        # its finish first agrees whether any rank stopped (a rank that never got a
        # batch cannot see the missing key, and would wait alone in the finish).
        self._agree = False
        self._warn = warn
        self._should_audit = should_audit
        self._on_report = on_report
        self._explain = explain
        self.epoch = 0
        self.reports: list = []
        self.batches: Optional[int] = None
        self._audit: Optional[Audit] = None
        self._keys: dict = {}

    def attach(self, loader: Any) -> None:
        make = loader._get_iterator  # DataLoader.__iter__ calls it
        audit = self
        try:  # frameworks stop at len(loader) batches without asking for one more
            self.batches: Optional[int] = len(loader)
        except TypeError:
            self.batches = None

        def _get_iterator() -> Any:
            return _Recording(make(), audit)

        loader._get_iterator = _get_iterator

    def begin(self) -> None:
        if self._audit is not None:
            self._audit.free()  # the previous pass ended early: not audited
        self._audit = None
        self._keys: dict = {}
        self._agree = False
        if not self.stopped and self._should_audit():
            self._audit = Audit(self.ctx, self.stream, self.expected, self.epoch, by_id=True,
                                evaluation=self.evaluation)
            self._agree = not self.declared and self.ctx.world_size > 1
        self.epoch += 1

    def record(self, batch: Any) -> None:
        if self._audit is not None:
            try:
                keys = batch_ids(batch, self.key)
            except (KeyError, IndexError, AttributeError, TypeError) as exc:
                self._no_ids(batch, exc)
                return
            ids = [sample_id(k) for k in keys]  # hashed once: record_ids keeps ints as they are
            self._audit.record_ids(ids)
            for i, k in zip(ids, keys):
                if len(self._keys) >= _KEYS_KEPT:
                    break
                self._keys.setdefault(i, k)

    def _no_ids(self, batch: Any, exc: BaseException) -> None:
        where = (f"key {self.key!r}" if not callable(self.key) else "the key function") + \
            f" finds no ids in a batch ({type(batch).__name__}: {type(exc).__name__}: {exc})"
        if self.declared:
            raise ValueError(f"ddplug: stream '{self.stream}': the declared {where}; declare where each batch"
                             " carries its sample ids (ddplug.declare(dataset, key=<field, position or"
                             " function of a batch>))") from None
        # Found by ddplug, not declared: a pipeline stage it cannot see into moved
        # the key. Every rank runs the same pipeline, so every rank stops here.
        self.stopped = True
        self._audit.free()
        self._audit = None
        if self._warn is not None:
            self._warn(f"stream '{self.stream}': not audited from here on: WebDataset's {where}; keep"
                       f" \"{KEY_FIELD}\" in the samples or declare where the ids are"
                       " (ddplug.declare(dataset, key=<field, position or function of a batch>))")

    def _name_examples(self, report: Report) -> None:
        """The keys behind the example ids this rank delivered itself."""
        report.repeated_keys = [self._keys.get(i & 0xFFFFFFFFFFFFFFFF) for i in report.repeated_examples]

    def _someone_stopped(self) -> bool:
        """Collective (every rank that began this pass's audit): whether any rank
        found no ids. Ranks that saw ids then drop their audit as well."""
        import numpy as np

        flag = np.array([1 if self.stopped else 0], dtype=np.int32)
        self.ctx.allreduce(flag, op="max")
        if int(flag[0]) and not self.stopped:
            self.stopped = True
            if self._audit is not None:
                self._audit.free()
                self._audit = None
            if self._warn is not None:
                self._warn(f"stream '{self.stream}': not audited from here on: another rank's batches"
                           f" carry no \"{KEY_FIELD}\" (its warning names the stage); keep it in the"
                           " samples or declare where the ids are (ddplug.declare(dataset, key=...))")
        return bool(flag[0])

    def finish(self) -> None:
        agree, self._agree = self._agree, False
        if agree and self._someone_stopped():
            return
        audit, self._audit = self._audit, None
        if audit is None:
            return
        try:
            report = audit.finish()
        except Exception as exc:
            report = getattr(exc, "report", None)
            if report is not None:
                self._name_examples(report)
                self.reports.append(report)
                self._on_report(report)
            raise self._explain(exc) from None
        self._name_examples(report)
        self.reports.append(report)
        self._on_report(report)

    def close(self) -> None:
        if self._audit is not None:
            self._audit.free()
            self._audit = None


class _Recording:
    """A DataLoader iterator that records each batch's ids and finishes the audit
    when it is exhausted. Everything else is the wrapped iterator's."""

    def __init__(self, it: Any, audit: IdAudit) -> None:
        self._it = it
        self._audit = audit
        self._handed = 0
        audit.begin()

    def __iter__(self) -> "_Recording":
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self._audit.finish()
            raise
        self._audit.record(batch)
        self._handed += 1
        if self._audit.batches is not None and self._handed == self._audit.batches:
            self._audit.finish()  # the loader's last batch: frameworks ask no further
        return batch

    def __len__(self) -> int:
        return len(self._it)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:  # persistent workers
        self._it._reset(loader, first_iter)
        self._handed = 0
        self._audit.begin()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


__all__ = ["IdAudit", "KEY_FIELD", "Shard", "batch_ids", "key_of", "shard"]
