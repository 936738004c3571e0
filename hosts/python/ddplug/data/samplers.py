"""ddplug's samplers for torch DataLoaders, backed by the C samplers.

:class:`DistributedSampler` — an index sampler with the semantics of
``torch.utils.data.DistributedSampler`` (shuffle from seed + epoch, pad by
repetition or drop to equal length per rank) but O(1) memory and O(1) epoch start
(a keyed Feistel permutation in C), the same order on every machine.

:class:`BucketBatchSampler` — a batch sampler over per-sample lengths: samples are
grouped into length buckets, batches are drawn within a bucket, and every rank
yields the same number of batches of exactly ``batch_size`` indices.

With a :class:`~ddplug.context.Context` the sampler is bound to the run: rank and
world size come from the context, the stream is claimed for the plugin (a stream
the user or framework owns is refused with ``SplitConflict``), and while an audit
is open on the stream every delivered index is recorded in it. Without one it is a
standalone sampler for the given ``rank``/``world_size``.

Both support ``set_epoch``, ``state_dict``/``load_state_dict`` (epoch + position:
a resumed sampler continues exactly where it stopped) and ``seek``.

Elastic (the distributed sampler, not exact): the epoch's order is one permutation
of the whole dataset; :meth:`~_Base.commit` marks a step trained (call it after the
optimizer step), and its state (``state_dict()["ddplug_sampler_state"]``: epoch,
seed, N, the cursor and replay list of the committed part, a coverage digest)
resumes on any world size; after :meth:`ddplug.context.Context.shrink`,
:meth:`~_Base.reform` deals the rest of the epoch over the survivors. The bucket
sampler resumes on its own world size only (it forms its global batches of
batch_size x world samples) and refuses a reform. ``abi/src/data/deal.c`` specifies
the dealing.
"""

from __future__ import annotations

import ctypes
import json
from typing import Iterator, Optional, Sequence

import numpy as np
from torch.utils.data import Sampler

from .._c import _capi as S
from .._c._capi import F, take_string
from ..context import Context
from ..errors import check

# Sampler kinds of plugin.h's ddplug_sampler_kind. The layout test checks these
# against the header (tests/python/test_binding.py::test_sampler_kinds).
KIND_DISTRIBUTED = 1
KIND_BUCKET = 2

_CHUNK = 4096


class _CSampler:
    """The C sampler handle and its bookkeeping (shared by both classes)."""

    def __init__(self, desc: S.SamplerOptions, context: Optional[Context], keep: tuple) -> None:
        out = ctypes.c_void_p()
        if context is not None:
            check(F.ddplug_context_sampler_new(context.handle, ctypes.byref(desc), ctypes.byref(out)),
                  f"rank {context.rank}: sampler for stream {desc.stream.decode()!r}")
        else:
            check(F.ddplug_sampler_new(ctypes.byref(desc), ctypes.byref(out)),
                  f"sampler for stream {desc.stream.decode()!r}")
        self._h = out
        self.context = context
        self.stream = desc.stream.decode()
        self._keep = keep  # lengths stay alive for the call only, but be safe
        self._final_length: Optional[int] = None  # len() once closed
        self._final_steps: Optional[int] = None  # steps() once closed

    @property
    def h(self) -> ctypes.c_void_p:
        if not self._h:
            raise ValueError(f"ddplug: the sampler of stream {self.stream!r} was closed (its run ended)")
        return self._h

    @property
    def closed(self) -> bool:
        return not self._h

    def close(self) -> None:
        if self._h and self._final_length is None:
            try:
                self._final_length = self.length()
            except Exception:
                self._final_length = 0
        if self._h and self._final_steps is None:
            try:
                self._final_steps = int(self.info().steps)
            except Exception:
                self._final_steps = 0
        h, self._h = self._h, None
        if h:
            F.ddplug_sampler_free(h)

    def info(self) -> S.SamplerInfo:
        info = S.new(S.SamplerInfo)
        check(F.ddplug_sampler_info_get(self.h, ctypes.byref(info)), "sampler info")
        return info

    def length(self) -> int:
        """Deliveries per epoch; a closed sampler keeps its last answer (frameworks
        still ask the length while tearing down a failed run)."""
        if not self._h and self._final_length is not None:
            return self._final_length
        out = ctypes.c_uint64()
        check(F.ddplug_sampler_length(self.h, ctypes.byref(out)), "sampler length")
        return out.value

    def steps(self) -> int:
        """Batches this rank yields this epoch; a closed sampler keeps its last
        answer (Lightning asks the loader's length while tearing down a failed
        run, and an error there would replace the run's own)."""
        if not self._h and self._final_steps is not None:
            return self._final_steps
        return int(self.info().steps)

    def position(self) -> int:
        out = ctypes.c_uint64()
        check(F.ddplug_sampler_position(self.h, ctypes.byref(out)), "sampler position")
        return out.value

    def set_epoch(self, epoch: int) -> None:
        check(F.ddplug_sampler_set_epoch(self.h, int(epoch)), "sampler set_epoch")

    def seek(self, position: int) -> None:
        check(F.ddplug_sampler_seek(self.h, int(position)), "sampler seek")

    def next_into(self, buf: np.ndarray) -> int:
        n = ctypes.c_uint64()
        check(F.ddplug_sampler_next(self.h, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                    buf.size, ctypes.byref(n)), "sampler next")
        return n.value

    def next_batch_into(self, buf: np.ndarray) -> int:
        n = ctypes.c_uint64()
        check(F.ddplug_sampler_next_batch(self.h, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                          buf.size, ctypes.byref(n)), "sampler next_batch")
        return n.value

    def commit(self, steps: int) -> None:
        check(F.ddplug_sampler_commit(self.h, int(steps)), "sampler commit")

    def state_save(self) -> str:
        out = ctypes.c_void_p()
        check(F.ddplug_sampler_state_save(self.h, ctypes.byref(out)), "sampler state")
        return take_string(out)

    def state_load(self, state: str) -> None:
        check(F.ddplug_sampler_state_load(self.h, state.encode()), f"stream {self.stream!r}: resuming")

    def reform(self, timeout_s: Optional[float]) -> int:
        adopted = ctypes.c_uint64()
        ms = -1 if timeout_s is None else max(1, int(timeout_s * 1000))
        where = f"stream {self.stream!r}: dealing the rest of the epoch over the survivors"
        if self.context is not None:
            with self.context.lock:
                self.context.check(F.ddplug_sampler_reform(self.h, ms, ctypes.byref(adopted)), where)
        else:
            check(F.ddplug_sampler_reform(self.h, ms, ctypes.byref(adopted)), where)
        return adopted.value


class _Base(Sampler):
    """Epoch/position bookkeeping common to both samplers."""

    _c: _CSampler

    def __init__(self, stream: str, shuffle: bool, seed: int, drop_last: bool) -> None:
        self.stream_name = stream
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self._stream_b = stream.encode()
        self.epoch = 0
        self._resume: Optional[int] = None  # position to start the next iteration at
        self._dirty = False  # an iteration consumed something since the last epoch start

    def _desc(self, kind: int, num_samples: int, context: Optional[Context], rank: Optional[int],
              num_replicas: Optional[int], **fields) -> S.SamplerOptions:
        """Sampler options with the fields both kinds share (rank/world 0 with a
        context: the context's)."""
        return S.new(
            S.SamplerOptions, kind=kind, rank=int(rank or 0),
            world_size=int(num_replicas or (0 if context is not None else 1)),
            shuffle=int(self.shuffle), drop_last=int(self.drop_last), seed=self.seed,
            num_samples=int(num_samples), stream=self._stream_b, **fields)

    @property
    def stream(self) -> str:
        return S.text(self._c.info().stream)

    @property
    def rank(self) -> int:
        return self._c.info().rank

    @property
    def num_replicas(self) -> int:
        return self._c.info().world_size

    @property
    def position(self) -> int:
        """Indices (distributed) or batches (bucket) consumed this epoch."""
        return self._c.position()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at position 0 (O(1))."""
        self.epoch = int(epoch)
        self._c.set_epoch(self.epoch)
        self._dirty = False

    def seek(self, position: int) -> None:
        """Make the next delivery the ``position``-th of this epoch."""
        self._c.seek(position)
        self._resume = int(position)

    def __len__(self) -> int:
        return self._c.length()

    @property
    def steps(self) -> int:
        """Batches this rank yields this epoch, as it is dealt now."""
        return self._c.steps()

    @property
    def committed_steps(self) -> int:
        """The epoch's steps committed so far (before a resume or shrink too)."""
        return int(self._c.info().committed)

    def commit(self, steps: int = 1) -> None:
        """Mark the oldest ``steps`` delivered batches trained (after the optimizer
        step): the checkpoint's cursor and the re-dealing after a shrink follow
        the commits."""
        self._c.commit(steps)

    def reform(self, timeout_s: Optional[float] = None) -> int:
        """After :meth:`Context.shrink`: deal the rest of the epoch over the survivors
        (collective; every survivor calls it for the same samplers in the same
        order). Returns how many steps were committed on this rank's behalf (0 or
        1: its step in flight completed elsewhere, so the host takes the other
        ranks' parameters instead of redoing it)."""
        return self._c.reform(timeout_s)

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "position": self.position, "num_replicas": self.num_replicas}
        state["ddplug_sampler_state"] = json.loads(self._c.state_save())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue where the state was saved: the next iteration resumes. A state
        with ``ddplug_sampler_state`` resumes the distributed sampler on any world
        size (the bucket sampler on its own; another seed or dataset is refused,
        naming both); an older one only on the same world size."""
        if "ddplug_sampler_state" in state:
            self._c.state_load(json.dumps(state["ddplug_sampler_state"]))
            self.epoch = int(state["ddplug_sampler_state"]["epoch"])
            self._resume = self._c.position()
            return
        if int(state.get("num_replicas", self.num_replicas)) != self.num_replicas:
            raise ValueError(
                f"ddplug: sampler state was saved with {state.get('num_replicas')} ranks, this run has"
                f" {self.num_replicas}: positions do not carry over; start the epoch over instead"
            )
        self.set_epoch(int(state["epoch"]))
        self.seek(int(state["position"]))

    def _begin(self) -> None:
        """Called when an iteration starts: restart the epoch unless resuming."""
        if self._resume is not None:
            self._resume = None
        elif self._dirty:
            self._c.set_epoch(self.epoch)
        self._dirty = True

    def close(self) -> None:
        """Release the C sampler (before the context is closed)."""
        self._c.close()

    def __del__(self) -> None:  # pragma: no cover
        c = getattr(self, "_c", None)
        if c is not None and not c.closed:
            ctx = c.context
            if ctx is None or not ctx.closed:
                c.close()


class DistributedSampler(_Base):
    """Index sampler: this rank's share of ``range(num_samples)`` each epoch.

    Args:
        num_samples: N (dataset length).
        context: bind to a run (rank/world from it, ownership, audit); else
            ``rank``/``num_replicas`` give the share.
        stream: the data stream's name ("train", "val", ...).
        shuffle, seed, drop_last: as torch's DistributedSampler.
        batch_size: optional; the audit then counts one step per batch.
        exact: every sample exactly once per epoch, no padding (an evaluation
            stream): the ranks' lengths differ by at most one.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        context: Optional[Context] = None,
        stream: str = "train",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        num_replicas: Optional[int] = None,
        batch_size: int = 0,
        exact: bool = False,
    ) -> None:
        super().__init__(stream, shuffle, seed, drop_last)
        self.exact = bool(exact)
        desc = self._desc(KIND_DISTRIBUTED, num_samples, context, rank, num_replicas, batch_size=int(batch_size),
                          exact=int(self.exact))
        self._c = _CSampler(desc, context, ())

    def __iter__(self) -> Iterator[int]:
        self._begin()
        buf = np.empty(_CHUNK, dtype=np.int64)
        while True:
            n = self._c.next_into(buf)
            if n == 0:
                return
            yield from buf[:n].tolist()

    def batches(self, start: bool = True) -> Iterator[list]:
        """This rank's batches, one step each (``ddplug_sampler_next_batch``): the
        iteration elastic hosts use, so that their steps are the sampler's.
        ``start=False`` continues the current iteration (after a reform)."""
        if start:
            self._begin()
        cap = max(1, int(self._c.info().batch_size) or 1)
        buf = np.empty(cap, dtype=np.int64)
        while True:
            n = self._c.next_batch_into(buf)
            if n == 0:
                return
            yield buf[:n].tolist()


class BucketBatchSampler(_Base):
    """Batch sampler over per-sample ``lengths``: equal number of batches of exactly
    ``batch_size`` indices on every rank, each batch from one length bucket.

    Args:
        lengths: per-sample lengths (sequence of ints, N of them).
        batch_size: samples per batch on each rank.
        boundaries: ascending bucket upper bounds (plus one bucket for longer
            samples); or None with ``num_buckets`` quantile buckets.
        context, stream, shuffle, seed, drop_last, rank, num_replicas: as
            :class:`DistributedSampler` (drop_last: cut instead of pad).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        boundaries: Optional[Sequence[int]] = None,
        num_buckets: int = 8,
        context: Optional[Context] = None,
        stream: str = "train",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        num_replicas: Optional[int] = None,
    ) -> None:
        super().__init__(stream, shuffle, seed, drop_last)
        self.batch_size = int(batch_size)
        lens = np.ascontiguousarray(np.asarray(lengths, dtype=np.int64))
        bounds = None if boundaries is None else np.ascontiguousarray(np.asarray(boundaries, dtype=np.int64))
        p64 = ctypes.POINTER(ctypes.c_int64)
        desc = self._desc(
            KIND_BUCKET, lens.size, context, rank, num_replicas,
            lengths=lens.ctypes.data_as(p64),
            boundaries=bounds.ctypes.data_as(p64) if bounds is not None else None,
            num_boundaries=0 if bounds is None else int(bounds.size),
            num_buckets=0 if bounds is not None else int(num_buckets),
            batch_size=self.batch_size,
        )
        self._c = _CSampler(desc, context, (lens, bounds))
        self.num_samples = int(lens.size)

    def __iter__(self) -> Iterator[list]:
        self._begin()
        buf = np.empty(self.batch_size, dtype=np.int64)
        while True:
            n = self._c.next_into(buf)
            if n == 0:
                return
            yield buf[:n].tolist()
