"""Who splits a data stream: finding rank-aware samplers and per-rank datasets,
and resolving the owner — the one place the host adapters decide it.

A sampler or batch sampler is *rank-aware* — it already gives each rank its own
share — when it is a ``torch.utils.data.DistributedSampler`` (or subclass), when it
exposes ``num_replicas``, ``rank`` or ``world_size`` (the duck-typed convention of
GPT-SoVITS', VITS' and most hand-written distributed samplers), or when the user
declared it with :func:`rank_aware`. A *dataset* is rank-aware when its length or
identity differs across ranks — it was sharded per rank before it reached the
loader (``Subset(ds, range(rank, N, world))``, Hugging Face's
``split_dataset_by_node``): :func:`compare_datasets` finds that at claim time,
before the first step, through one allgather of a cheap fingerprint (length, the
index set of a ``Subset`` chain, a Hugging Face dataset's ``_fingerprint``). Where
every rank's dataset is a ``Subset`` chain over the same root, its indices map to
the root's, and the audit checks coverage there.

Resolution (``data_split.owner`` "auto"): rank-aware → ``user``; otherwise →
``plugin`` (ddplug's sampler replaces the loader's). The config forces an owner
with ``data_split.streams.<name>.owner`` or ``data_split.owner``: the library
answers which (``ddplug_split_forced_owner``), so the rule lives in one place. The
decision is claimed through the runtime (``ddplug_split_claim``: a second,
different claim is a ``SplitConflict`` naming both claimants) and agreed by every
rank (``ddplug_split_agree``).
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from torch.utils.data import BatchSampler, DistributedSampler, Subset

from .._c import _names
from .._c._capi import F
from ..context import Context
from ..errors import check

_DECLARED = "__ddplug_rank_aware__"
_RANK_ATTRS = ("num_replicas", "rank", "world_size")


def rank_aware(obj: Any, aware: bool = True) -> Any:
    """Declare ``obj`` (a sampler, batch sampler or dataset) rank-aware (or, with
    ``aware=False``, not rank-aware even though it has rank-like attributes).
    Returns ``obj`` so it can wrap a constructor call."""
    try:
        setattr(obj, _DECLARED, bool(aware))
    except AttributeError:  # __slots__ objects
        raise TypeError(f"ddplug: cannot mark {type(obj).__name__} (no instance attributes)") from None
    return obj


def why_rank_aware(obj: Any) -> Optional[str]:
    """Why ``obj`` counts as rank-aware, or None if it does not."""
    if obj is None:
        return None
    declared = getattr(obj, _DECLARED, None)
    if declared is not None:
        return "declared rank-aware" if declared else None
    if isinstance(obj, DistributedSampler):
        return f"a DistributedSampler (num_replicas={obj.num_replicas}, rank={obj.rank})"
    found = [a for a in _RANK_ATTRS if _has_plain_attr(obj, a)]
    if found:
        shown = ", ".join(f"{a}={getattr(obj, a)!r}" for a in found)
        return f"exposes {shown}"
    return None


def _has_plain_attr(obj: Any, name: str) -> bool:
    try:
        value = getattr(obj, name)
    except Exception:
        return False
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class Decision:
    """The owner of one stream and why."""

    stream: str
    owner: str  # "plugin" | "user" | "framework"
    reason: str  # shown in logs and conflicts
    forced_by: Optional[str]  # config key that forced it, or None (auto)
    aware_where: Optional[str]  # "sampler" / "batch_sampler" / ... for a user-owned stream
    aware_obj: Any = None
    per_rank: Optional["PerRank"] = None  # the dataset differs across ranks
    note: str = ""  # appended to the line (e.g. what a framework setting does here)

    @property
    def line(self) -> str:
        how = f"forced by {self.forced_by}" if self.forced_by else "auto"
        return f"stream '{self.stream}': owner {self.owner} ({how}: {self.reason}){self.note}"


def check_stream_name(stream: str) -> str:
    """``stream`` if it is a valid stream name (the library's one rule), else
    ValueError naming the character and what is allowed."""
    status = F.ddplug_stream_name_check(stream.encode("utf-8", "surrogatepass"))
    if status != 0:
        raise ValueError(f"ddplug: {(F.ddplug_last_error() or b'').decode('utf-8', 'replace')}")
    return stream


@dataclass
class PerRank:
    """A dataset that differs across ranks (sharded per rank), and what the audit
    can do with it."""

    why: str  # "len 500 on rank 0, 501 on rank 1" / "a different Subset on each rank"
    global_map: Optional[np.ndarray]  # this rank's local -> global index, or None
    global_n: int  # N of the global index space (0 when there is none)


def _subset_chain(dataset: Any) -> tuple:
    """(local -> root index map or None, root length, root) of a chain of
    ``Subset``s, possibly ending in a Hugging Face dataset with an indices mapping
    (``.shard()``/``.select()``: its rows of the underlying table); (None, -1,
    dataset) otherwise."""
    mapping: Optional[np.ndarray] = None
    d = dataset
    for _ in range(64):
        if isinstance(d, Subset):
            idx = np.asarray(d.indices, dtype=np.int64).reshape(-1)
            mapping = idx if mapping is None else idx[mapping]
            d = d.dataset
            continue
        hf_indices = getattr(d, "_indices", None)
        table = getattr(d, "_data", None)
        if hf_indices is not None and hasattr(d, "_fingerprint") and hasattr(hf_indices, "column") \
                and hasattr(table, "num_rows"):
            try:  # datasets.Dataset: an indices table over its data table
                idx = np.asarray(hf_indices.column(0).to_numpy(), dtype=np.int64)
            except Exception:
                break
            mapping = idx if mapping is None else idx[mapping]
            return mapping, int(table.num_rows), d
        break
    if mapping is None:
        return None, -1, d
    try:
        return mapping, len(d), d
    except TypeError:
        return None, -1, d


def _fingerprint(dataset: Any) -> tuple:
    """[length, identity hash, root length, root type hash] and the index map."""
    try:
        n = len(dataset)
    except TypeError:
        n = -1
    mapping, root_n, root = _subset_chain(dataset)
    h = hashlib.blake2b(digest_size=8)
    h.update(type(dataset).__qualname__.encode())
    fp = getattr(dataset, "_fingerprint", None)  # Hugging Face datasets
    if isinstance(fp, str):
        h.update(fp.encode())
    if mapping is not None:
        h.update(np.ascontiguousarray(mapping).tobytes())
    root_type = int.from_bytes(hashlib.blake2b(type(root).__qualname__.encode(), digest_size=7).digest(),
                               "little")
    ident = int.from_bytes(h.digest(), "little") >> 1
    return [n, ident, root_n, root_type], mapping


def compare_datasets(ctx: Context, dataset: Any) -> Optional[PerRank]:
    """Collective (every rank, same order): None when the dataset is the same on
    every rank (by length and fingerprint), else how it differs and, where every
    rank's is a Subset chain over the same root, this rank's map to the root."""
    mine, mapping = _fingerprint(dataset)
    every = np.empty(4 * ctx.world_size, dtype=np.int64)
    ctx.allgather(np.asarray(mine, dtype=np.int64), every)
    rows = every.reshape(ctx.world_size, 4)
    if (rows == rows[0]).all():
        return None
    lens = rows[:, 0]
    if int(lens.min()) != int(lens.max()):
        shown = ", ".join(f"{int(v)} on rank {r}" for r, v in enumerate(lens[:4]))
        why = f"its length differs across ranks (len {shown}{', ...' if len(lens) > 4 else ''})"
    else:
        what = "a Subset" if mapping is not None else f"a {type(dataset).__name__}"
        why = f"it is {what} of {int(lens[0])} samples with a different identity on each rank"
    mappable = bool((rows[:, 2] >= 0).all() and (rows[:, 2] == rows[0, 2]).all() and (rows[:, 3] == rows[0, 3]).all())
    if mappable and mapping is not None:
        return PerRank(why, mapping, int(rows[0, 2]))
    return PerRank(why, None, 0)


def find_rank_aware(loader: Any) -> tuple:
    """(where, object, why) of the first rank-aware object of a DataLoader, looking
    at its batch sampler, its sampler and the batch sampler's sampler; or
    (None, None, None)."""
    bs = getattr(loader, "batch_sampler", None)
    bs = getattr(bs, "_batch_sampler", bs)  # Lightning's predict _IndexBatchSamplerWrapper
    places = []
    if bs is not None and type(bs) is not BatchSampler:
        places.append(("batch_sampler", bs))
    places.append(("sampler", getattr(loader, "sampler", None)))
    inner = getattr(bs, "sampler", None) if bs is not None else None
    if inner is not None and inner is not getattr(loader, "sampler", None):
        places.append(("batch_sampler.sampler", inner))
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and getattr(dataset, _DECLARED, None):
        places.append(("dataset", dataset))
    for where, obj in places:
        why = why_rank_aware(obj)
        if why:
            return where, obj, why
    return None, None, None


def forced_owner(ctx: Context, stream: str) -> tuple:
    """(owner name or None, the config key that forces it): the library's answer
    (``ddplug_split_forced_owner``) from the run's config —
    ``data_split.streams.<stream>.owner``, else ``data_split.owner``; "auto"
    forces nothing. (Not ``ddplug_split_owner``, which also reports claims.)"""
    owner = ctypes.c_int(0)
    by = ctypes.create_string_buffer(512)
    check(F.ddplug_split_forced_owner(F.ddplug_context_config(ctx.handle), stream.encode(),
                                      ctypes.byref(owner), by, len(by)),
          f"rank {ctx.rank}: forced owner of stream '{stream}'")
    if owner.value == 0:
        return None, None
    return _names.owner_name(owner.value), by.value.decode("utf-8", "replace")


def claimed_owner(ctx: Context, stream: str) -> tuple:
    """(owner name or None, claimant) as the runtime sees it now."""
    owner = ctypes.c_int(0)
    who = ctypes.create_string_buffer(512)
    ctx.check(F.ddplug_split_owner(ctx.handle, stream.encode(), ctypes.byref(owner), who, len(who)),
               f"split owner of '{stream}'")
    if owner.value == 0:
        return None, None
    return _names.owner_name(owner.value), who.value.decode("utf-8", "replace")


def resolve(ctx: Context, loader: Any, stream: str, *, iterable: bool = False,
            per_rank: Optional[PerRank] = None) -> Decision:
    """Decide the owner of ``loader``'s stream (not yet claimed) from the loader,
    what :func:`compare_datasets` found (``per_rank``) and the run's config."""
    forced, by = forced_owner(ctx, stream)
    where, obj, why = find_rank_aware(loader)
    dataset = getattr(loader, "dataset", None)
    if iterable:
        reason = "an IterableDataset: it must split itself across ranks (no sampler to replace)" + _torch_dist_ranks()
        return Decision(stream, forced or "user", reason, by, "dataset", dataset)
    if where is None and per_rank is not None:
        where, obj, why = "dataset", dataset, f"already sharded per rank: {per_rank.why}"
    if forced == "user":
        reason = f"{where} {type(obj).__name__}: {why}" if obj is not None else \
            "no rank-aware sampler found: the dataset or sampler must split by itself"
        return Decision(stream, "user", reason, by, where, obj, per_rank)
    if forced == "plugin":
        reason = "ddplug's sampler replaces the loader's"
        if obj is not None:
            reason += f" (the rank-aware {where} {type(obj).__name__} is set aside)"
        return Decision(stream, "plugin", reason, by, None)
    if forced == "framework":
        return Decision(stream, "framework", "the framework's DistributedSampler splits", by, None)
    if obj is not None:
        return Decision(stream, "user", f"{where} {type(obj).__name__}: {why}", None, where, obj, per_rank)
    return Decision(stream, "plugin", "no rank-aware sampler: ddplug's sampler splits", None, None)


def check_sampler_ranks(ctx: Context, decision: Decision) -> None:
    """Stop a user-owned stream whose rank-aware sampler says another world or
    another rank than the run (GPT-SoVITS' bucket sampler takes num_replicas=1,
    rank=0 when it sees no CUDA), before the first step: such a split repeats or
    leaves out samples on every rank, which the audit would find only after a
    whole epoch. InvalidArgument naming what the sampler says and what the run is."""
    obj = decision.aware_obj
    if decision.owner != "user" or obj is None or decision.aware_where == "dataset":
        return
    if getattr(obj, _DECLARED, None) is not None:  # declared rank-aware by the user: their call
        return
    world, rank = ctx.world_size, ctx.rank
    said = {a: getattr(obj, a) for a in _RANK_ATTRS if _has_plain_attr(obj, a)}
    wrong = [a for a, v in said.items() if v != (rank if a == "rank" else world)]
    if not wrong:
        return
    from ..errors import make, status_code

    shown = ", ".join(f"{a}={v}" for a, v in said.items())
    raise make(status_code("INVALID_ARGUMENT"),
               f"the {decision.aware_where} {type(obj).__name__} says {shown}, but this run has {world} ranks and"
               f" this process is rank {rank}: that split repeats or leaves out samples on every rank. Build it"
               f" with num_replicas={world}, rank={rank} (torch.distributed.get_world_size() and get_rank(), or the"
               " strategy's distributed_sampler_kwargs), or leave it out and let ddplug split the loader",
               f"ddplug: stream '{decision.stream}'")


def _torch_dist_ranks() -> str:
    """What a dataset that reads torch.distributed (WebDataset's split_by_node)
    learns there, for the owner line."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (f"; torch.distributed says rank {dist.get_rank()} of {dist.get_world_size()}"
                    f" (backend {dist.get_backend()})")
    except Exception:  # pragma: no cover - the owner line must not fail
        pass
    return "; torch.distributed is not initialised: a splitter reading it sees rank 0 of 1"


def claim(ctx: Context, decision: Decision, claimant: str, timeout_s: Optional[float] = None) -> None:
    """Claim the decided owner through the runtime, then agree with every rank."""
    code = _names.owners()[decision.owner]
    ctx.check(F.ddplug_split_claim(ctx.handle, decision.stream.encode(), code,
                                    f"{claimant}: {decision.reason}"[:480].encode()),
               f"claim of stream '{decision.stream}' for {decision.owner}")
    ms = -1 if timeout_s is None else int(timeout_s * 1000)
    ctx.check(F.ddplug_split_agree(ctx.handle, decision.stream.encode(), ms),
               f"agreement on the owner of stream '{decision.stream}'")
