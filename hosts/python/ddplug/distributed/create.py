"""What torch calls to create a ``"ddplug"`` process group
(``Backend.register_backend("ddplug", create, extended_api=True)``).

The group needs a ddplug context whose rank and world size are the group's:

* **the default group, in a process that already joined a ddplug run** (the
  Lightning/Fabric strategies and :func:`ddplug.torch.init` open the context
  first, then initialise torch.distributed): that context is reused, so torch
  and the strategy share one run, one set of timeouts and one failure path;
* **otherwise** (``init_process_group(backend="ddplug")`` in a plain script,
  Lightning's own ``DDPStrategy(process_group_backend="ddplug")``, and every
  ``new_group``): the group opens its own context, with the world torch gives
  (rank, world size) and ddplug's config (``DDPLUG_CONFIG``). Rank 0 serves
  ddplug's rendezvous store on a free port and tells the others where through
  the store torch handed to the backend, so nothing but torch's own
  ``MASTER_ADDR``/``MASTER_PORT`` (or ``init_method``, or ``store=``) has to be
  set. (A port is picked by binding port 0 and released before libddplug
  binds it; another process taking it in between fails rank 0's open with a
  clear error.) The collective timeout is torch's: the ``timeout=`` given,
  else the config's ``timeouts.collective_s`` where set, else torch's default
  for CPU backends (30 minutes); a dead peer is still found at once
  (liveness), not by the timeout. Without a plugin named in the config, a process that
  sees a CUDA device uses ``nccl``, else the config's default (``cpu``).

A context the backend opened is the process's current one (``ddplug.run_once``
works), is closed by ``destroy_process_group`` or at exit, and an uncaught
exception on this rank aborts the run on every rank (``sys.excepthook``), so
the others' collectives raise this rank's error instead of waiting.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
import threading
import weakref
from typing import Any, Optional

import torch

from .._abort import abort_on_uncaught_exception
from .._join import plugin_for
from ..config import load
from ..context import Context, current, set_current
from ..errors import DdplugError, make, status_code
from . import errors as _errors
from .group import ProcessGroupDdplug

_KEY = "ddplug/rendezvous"
_opens: dict = {}  # group name -> times this process created a group of that name
_opens_lock = threading.Lock()


def create(opts: Any, backend_options: Any = None) -> ProcessGroupDdplug:
    """torch's creator function (extended API: a ``_DistributedBackendOptions``)."""
    store = opts.store
    rank, size = int(opts.group_rank), int(opts.group_size)
    members = list(getattr(opts, "global_ranks_in_group", []) or [])
    default = not members
    ctx = current()
    if default and ctx is not None and not ctx.closed:
        if (ctx.rank, ctx.world_size) != (rank, size):
            raise _errors.invalid(
                f"init_process_group(rank={rank}, world_size={size}) disagrees with the ddplug run this process"
                f" joined (rank {ctx.rank} of {ctx.world_size}); initialise torch.distributed with the run's ranks",
                f"rank {ctx.rank}")
        return ProcessGroupDdplug(ctx, owned=False)
    parent = current() if not default else None
    foreign = _foreign_strategy() if default else None
    ctx = open_for_group(store, rank, size, opts.timeout, members, parent, str(getattr(opts, "group_id", "")))
    if foreign and rank == 0:
        from .._c import _logbridge

        _logbridge.report(
            f"ddplug: the torch.distributed backend \"ddplug\" runs under {foreign}, not ddplug's strategy:"
            " Lightning splits the data itself (its DistributedSampler, around any sampler the loader has) and"
            " ddplug's data-split ownership and audit are off; for them, use strategy=\"ddplug\"")
    pg = ProcessGroupDdplug(ctx, owned=True)
    if default and current() is None:
        set_current(ctx)
    atexit.register(_close_at_exit, weakref.ref(pg))
    abort_on_uncaught_exception(ctx, rank)
    return pg


def open_for_group(store: Any, rank: int, size: int, timeout: Optional[datetime.timedelta], members: list,
                   parent: Optional[Context], group: str = "") -> Context:
    """Open a context for a group of ``size`` ranks, meeting through ``store``:
    torch's world as ddplug_open_options.world; the rendezvous exchanged through
    torch's store (a subgroup, or a config that names no port) overriding the
    config's; torch's own timeout, where the user gave one, as the collective
    timeout. The config itself is used as loaded."""
    cfg = load(None)
    try:
        rendezvous = None
        if size == 1:
            rendezvous = ("127.0.0.1", -1)
        elif members or not cfg.is_set("rendezvous.port"):
            addr = cfg.get_str("rendezvous.addr") if cfg.is_set("rendezvous.addr") else None
            rendezvous = _exchange(store, rank, addr, group)
        coll_s = _collective_timeout_s(timeout, cfg)
        if parent is not None and not parent.closed:
            plugin = parent.plugin["path"] or parent.plugin["name"]  # a subgroup runs on its parent's plugin
        else:
            plugin = plugin_for(cfg, torch.device("cuda") if _cuda_visible() else None)
        who = f"torch.distributed {torch.__version__}" + (f" (subgroup of ranks {members})" if members else "")
        try:
            return Context(cfg, plugin=plugin, framework=who, world={"rank": rank, "world_size": size},
                           rendezvous=rendezvous, collective_timeout_s=coll_s)
        except DdplugError as exc:
            raise _errors.open_error(exc) from None
    finally:
        cfg.close()


def _collective_timeout_s(timeout: Optional[datetime.timedelta], cfg: Any) -> Optional[float]:
    """The group's collective timeout, as torch means it: the ``timeout=`` the
    user gave init_process_group / new_group (0 is 0: every wait times out at
    once — ddplug's shortest, 1 ms); without one (torch passes its default),
    the config's ``timeouts.collective_s`` where the config sets it, else
    torch's default for CPU backends (30 minutes). None: the config's."""
    from torch.distributed.constants import default_pg_timeout

    if timeout is not None and timeout != default_pg_timeout:
        return max(timeout.total_seconds(), 0.001)
    if cfg.is_set("timeouts.collective_s"):
        return None
    return default_pg_timeout.total_seconds()


def _foreign_strategy() -> Optional[str]:
    """The Lightning strategy (not ddplug's) initialising torch.distributed
    with backend "ddplug" — DDPStrategy(process_group_backend="ddplug") —
    found among the callers' frames; None otherwise."""
    f = sys._getframe(1)
    for _ in range(48):
        if f is None:
            break
        obj = f.f_locals.get("self")
        mod = type(obj).__module__ if obj is not None else ""
        if mod.split(".")[0] in _LIGHTNING and ".strategies" in mod:
            return f"Lightning's {type(obj).__name__} ({mod})"
        f = f.f_back
    return None


_LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")


def _cuda_visible() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # pragma: no cover - a broken CUDA install
        return False


def _exchange(store: Any, rank: int, addr: Optional[str], group: str) -> tuple:
    """Rank 0 picks a free port and publishes "addr:port" in torch's store (the
    group's prefix of it); the others read it (waiting at most the store's
    timeout). The key counts this process's groups of that name, so a group
    created again (destroy, then init) never reads the previous address."""
    with _opens_lock:
        n = _opens[group] = _opens.get(group, 0) + 1
    key = f"{_KEY}/{n}"
    if rank == 0:
        host = addr or _advertised_address(store)
        port = _free_port()
        store.set(key, f"{host}:{port}")
        return host, port
    try:
        value = store.get(key).decode()
    except Exception as exc:
        raise _errors.open_error(make(
            status_code("TIMEOUT"),
            f"rank {rank} did not learn where rank 0 serves ddplug's rendezvous store (key '{key}' of torch's"
            f" store): is rank 0 running? did it fail before init_process_group? ({exc})", f"rank {rank}")) from None
    host, _, port = value.rpartition(":")
    return host, int(port)


def _advertised_address(store: Any) -> str:
    """Where the other ranks reach rank 0: MASTER_ADDR, else the host of torch's
    TCPStore, else this host's name (FileStore on a shared file system)."""
    env = os.environ.get("MASTER_ADDR")
    if env:
        return env
    s = store
    for _ in range(8):
        host = getattr(s, "host", None)
        if isinstance(host, str) and host:
            return host
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _close_at_exit(ref: Any) -> None:
    pg = ref()
    if pg is None:
        return
    try:
        pg.shutdown()
    except Exception:  # pragma: no cover - best effort at interpreter exit
        pass


__all__ = ["create", "open_for_group"]
