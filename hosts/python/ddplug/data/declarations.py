"""Declaring what a sampler pads and drops, so that the audit can tell it from a
broken split.

The audit counts a sample delivered twice in an epoch (padding) and a sample never
delivered (dropping) as violations unless they are declared — padding and dropping
separately — and it never infers them from a sampler's own length (a sampler whose
length agrees with its own bug would switch the check off). What counts as
declared for a stream ddplug did not split:

* :func:`declare` on the sampler, batch sampler or dataset::

      sampler = DistributedBucketSampler(ds, batch_size, boundaries, ...)
      ddplug.declare(sampler, padding=sampler.total_size - kept,
                     dropped=lambda i: not lo < ds.lengths[i] <= hi)

  ``padding``: how many deliveries per epoch repeat a sample, all ranks together
  (an int, or a callable of the epoch). ``dropped``: the samples left out on
  purpose — a count, the indices, or a predicate over the index (evaluated once
  per stream, identically on every rank). The indices form is exact: the audit
  then checks that precisely those are missing.
* torch's own ``DistributedSampler`` (not a subclass that changes ``__iter__``):
  its documented padding ``world·ceil(N/world) - N``, or with ``drop_last`` its
  dropped ``N - world·floor(N/world)``;
* any other rank-aware sampler: torch's padding rule, at most
  ``G·ceil(N/G) - N`` repeats per epoch (G: the run's world size) — what every
  sampler that pads like DistributedSampler (GPT-SoVITS' bucket sampler, most
  rank-aware samplers) repeats, derived from N and G, never from the sampler's
  own length; more than that needs :func:`declare`;
* a batching that drops its last partial batch (``drop_last=True``): each rank's
  remainder, fewer than the batch size.

Evaluation streams (val, test, predict) declare nothing: they must deliver every
sample exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
from torch.utils.data import BatchSampler, DistributedSampler

_ATTR = "__ddplug_declared__"
_KEY_ATTR = "__ddplug_key__"

Dropped = Union[int, Sequence[int], Callable[[int], bool], None]


@dataclass
class Declaration:
    """What one object declares (see :func:`declare`)."""

    padding: Union[int, Callable[[int], int], None] = None
    dropped: Dropped = None

    def padding_for(self, epoch: int) -> int:
        p = self.padding(epoch) if callable(self.padding) else self.padding
        return int(p or 0)


def declare(obj: Any, *, padding: Union[int, Callable[[int], int], None] = None,
            dropped: Dropped = None, key: Any = None) -> Any:
    """Declare what ``obj`` (a sampler, batch sampler or dataset) pads and drops per
    epoch, all ranks together; returns ``obj``. See the module doc. ``key``: for
    an iterable dataset, where each batch carries its sample ids (a field name or
    a function of the batch; :mod:`ddplug.data.iterable`)."""
    if key is not None:
        setattr(obj, _KEY_ATTR, key)
        if padding is None and dropped is None:
            return obj
    if padding is not None and not callable(padding) and int(padding) < 0:
        raise ValueError(f"ddplug.declare: padding must be >= 0, got {padding}")
    if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped < 0:
        raise ValueError(f"ddplug.declare: dropped must be >= 0, got {dropped}")
    try:
        setattr(obj, _ATTR, Declaration(padding, dropped))
    except AttributeError:  # __slots__
        raise TypeError(f"ddplug.declare: cannot mark {type(obj).__name__} (no instance attributes)") from None
    return obj


def declared(obj: Any) -> Optional[Declaration]:
    """The declaration made on ``obj``, or None."""
    return getattr(obj, _ATTR, None) if obj is not None else None


def declared_key(obj: Any) -> Any:
    """Where the batches of ``obj`` (an iterable dataset) carry their sample ids,
    as declared with ``declare(obj, key=...)``, or None."""
    return getattr(obj, _KEY_ATTR, None)


def inherit(source: Any, target: Any) -> None:
    """What was declared on ``source`` (key, padding and dropping) holds for
    ``target`` too (a shard of it)."""
    for attr in (_KEY_ATTR, _ATTR):
        value = getattr(source, attr, None)
        if value is not None:
            setattr(target, attr, value)


@dataclass
class Allowance:
    """What a stream's audit is told, per epoch."""

    padding: int = 0
    dropped: int = 0  # a count, all ranks together
    dropped_indices: Optional[np.ndarray] = None  # the exact set (int64), or None
    local_dropped: int = 0  # this rank's drop_last remainder
    source: str = ""  # what declared it, for messages

    def describe(self) -> str:
        parts = []
        if self.padding:
            parts.append(f"padding {self.padding}")
        n = self.dropped + (len(self.dropped_indices) if self.dropped_indices is not None else 0)
        if n:
            parts.append(f"dropped {n}")
        return f"{', '.join(parts)} ({self.source})" if parts else "nothing"


def _torch_padding(sampler: DistributedSampler, n: int) -> tuple:
    """torch's DistributedSampler's own padding and dropping, by its documented
    rule from N and its world (not from its length)."""
    world = int(sampler.num_replicas)
    if getattr(sampler, "drop_last", False):
        return 0, n - world * (n // world)
    return world * -(-n // world) - n, 0


def _dropped_set(dropped: Dropped, n: int) -> tuple:
    """(count, indices or None) of a declaration's ``dropped``."""
    if dropped is None:
        return 0, None
    if isinstance(dropped, (int, np.integer)) and not isinstance(dropped, bool):
        return int(dropped), None
    if callable(dropped):
        idx = np.fromiter((i for i in range(n) if dropped(i)), dtype=np.int64)
        return 0, idx
    return 0, np.unique(np.asarray(list(dropped), dtype=np.int64))


def allowance(n: int, candidates: Sequence[Any], batching: Any, *, evaluation: bool,
              world: int = 1) -> Allowance:
    """The declarations of a stream ddplug did not split: the first explicit
    :func:`declare` among ``candidates`` (sampler, batch sampler, dataset), else a
    plain torch DistributedSampler's documented padding, else torch's padding
    rule for ``world`` ranks (``world·ceil(N/world) - N`` repeats); plus the
    drop_last remainder of ``batching`` (a BatchSampler with drop_last) on this
    rank."""
    if evaluation:
        return Allowance(source="an evaluation stream declares nothing")
    out = Allowance()
    for obj in candidates:
        d = declared(obj)
        if d is not None:
            out.padding = d.padding_for(0)
            out.dropped, out.dropped_indices = _dropped_set(d.dropped, n)
            out.source = f"declared on {type(obj).__name__}"
            break
    else:
        for obj in candidates:
            if isinstance(obj, DistributedSampler) and type(obj).__iter__ is DistributedSampler.__iter__:
                out.padding, out.dropped = _torch_padding(obj, n)
                out.source = f"torch's {type(obj).__name__} (N = {n}, {obj.num_replicas} ranks)"
                break
        else:
            out.padding = world * -(-n // world) - n if world > 1 else 0
            out.source = (f"torch's padding rule: at most {world}·ceil({n}/{world}) - {n} = {out.padding} repeats"
                          f" (N = {n}, {world} ranks)")
    if isinstance(batching, BatchSampler) and batching.drop_last:
        try:
            out.local_dropped = len(batching.sampler) % int(batching.batch_size)
        except TypeError:  # a sampler without a length: nothing is assumed
            out.local_dropped = 0
    return out


def padding_for_epoch(candidates: Sequence[Any], epoch: int, default: int) -> int:
    """The declared padding of ``epoch`` (a callable declaration may vary it)."""
    for obj in candidates:
        d = declared(obj)
        if d is not None:
            return d.padding_for(epoch)
    return default
