"""Who splits a data stream: finding rank-aware samplers and resolving the owner.

A sampler or batch sampler is *rank-aware* — it already gives each rank its own
share — when it is a ``torch.utils.data.DistributedSampler`` (or subclass), when it
exposes ``num_replicas``, ``rank`` or ``world_size`` (the duck-typed convention of
GPT-SoVITS', VITS' and most hand-written distributed samplers), or when the user
declared it with :func:`rank_aware`. Resolution (``data_split.owner`` "auto"):
rank-aware → ``user``; otherwise → ``plugin`` (ddplug's sampler replaces the
loader's). The config forces an owner with ``data_split.streams.<name>.owner`` or
``data_split.owner``. The decision is claimed through the runtime
(``ddplug_split_claim``: a second, different claim is a ``SplitConflict`` naming
both claimants) and agreed by every rank (``ddplug_split_agree``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional

from torch.utils.data import BatchSampler, DistributedSampler

from . import _names
from ._api import F
from .context import Context

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

    @property
    def line(self) -> str:
        how = f"forced by {self.forced_by}" if self.forced_by else "auto"
        return f"stream '{self.stream}': owner {self.owner} ({how}: {self.reason})"


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


def forced_owner(settings: dict, stream: str, origin: str = "the config") -> tuple:
    """(owner or None, the config key that forces it) from the effective config
    ``settings``: ``data_split.streams.<stream>.owner``, else
    ``data_split.owner``; "auto" forces nothing. (Read from the config, not from
    ``ddplug_split_owner``, which also reports earlier claims.)"""
    split = settings.get("data_split", {}) or {}
    per_stream = (split.get("streams", {}) or {}).get(stream, {}) or {}
    owner = per_stream.get("owner")
    if owner and owner != "auto":
        return owner, f"data_split.streams.{stream}.owner in {origin}"
    if per_stream.get("owner") == "auto":
        return None, None
    owner = split.get("owner")
    if owner and owner != "auto":
        return owner, f"data_split.owner in {origin}"
    return None, None


def claimed_owner(ctx: Context, stream: str) -> tuple:
    """(owner name or None, claimant) as the runtime sees it now."""
    owner = ctypes.c_int(0)
    who = ctypes.create_string_buffer(512)
    ctx._check(F.ddplug_split_owner(ctx.handle, stream.encode(), ctypes.byref(owner), who, len(who)),
               f"split owner of '{stream}'")
    if owner.value == 0:
        return None, None
    return _names.owner_name(owner.value), who.value.decode("utf-8", "replace")


def resolve(settings: dict, loader: Any, stream: str, *, iterable: bool = False,
            origin: str = "the config") -> Decision:
    """Decide the owner of ``loader``'s stream (not yet claimed) from the loader
    and the effective config ``settings``."""
    forced, by = forced_owner(settings, stream, origin)
    where, obj, why = find_rank_aware(loader)
    if iterable:
        reason = "an IterableDataset: it must split itself across ranks (no sampler to replace)" + _torch_dist_ranks()
        return Decision(stream, forced or "user", reason, by, "dataset", getattr(loader, "dataset", None))
    if forced == "user":
        reason = f"{where} {type(obj).__name__}: {why}" if obj is not None else \
            "no rank-aware sampler found: the dataset or sampler must split by itself"
        return Decision(stream, "user", reason, by, where, obj)
    if forced == "plugin":
        reason = "ddplug's sampler replaces the loader's"
        if obj is not None:
            reason += f" (the rank-aware {where} {type(obj).__name__} is set aside)"
        return Decision(stream, "plugin", reason, by, None)
    if forced == "framework":
        return Decision(stream, "framework", "the framework's DistributedSampler splits", by, None)
    if obj is not None:
        return Decision(stream, "user", f"{where} {type(obj).__name__}: {why}", None, where, obj)
    return Decision(stream, "plugin", "no rank-aware sampler: ddplug's sampler splits", None, None)


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
    ctx._check(F.ddplug_split_claim(ctx.handle, decision.stream.encode(), code,
                                    f"{claimant}: {decision.reason}"[:480].encode()),
               f"claim of stream '{decision.stream}' for {decision.owner}")
    ms = -1 if timeout_s is None else int(timeout_s * 1000)
    ctx._check(F.ddplug_split_agree(ctx.handle, decision.stream.encode(), ms),
               f"agreement on the owner of stream '{decision.stream}'")
