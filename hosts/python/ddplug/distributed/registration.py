"""Registering the torch.distributed backend ``"ddplug"`` when ``ddplug`` is
imported, without importing torch for that.

``import ddplug`` must stay cheap and work without torch (the binding alone
needs only ctypes). So: if torch.distributed is already imported, the backend
is registered at once; otherwise a finder on ``sys.meta_path`` waits for
``torch.distributed`` to be imported (by anyone, in any order) and registers
the backend right after that module ran. Registration itself touches only
``torch.distributed.Backend`` and, for jobs an MPI launcher started, the
``env://`` rendezvous (below); the backend's code is imported when torch
first creates a ``"ddplug"`` group.

``mpirun -n 2 python -c "import ddplug, torch.distributed as dist;
dist.init_process_group('ddplug')"`` sets none of ``env://``'s ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, where torch's handler would
fail. Only in that case (an MPI launcher's variables, no ``MASTER_ADDR``, no
``RANK``) the wrapped handler joins the ddplug run itself — the world from the
launcher, rank 0's store address and a per-run secret over MPI (the mpi
plugin's bootstrap) — and gives torch a TCPStore that rank 0 serves on a free
port, published through ddplug's store; the ``"ddplug"`` group then runs on
that run. Every other ``env://`` rendezvous is torch's, untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import threading
from typing import Any, Optional

NAME = "ddplug"
_TARGET = "torch.distributed"
_lock = threading.Lock()
_registered = False


def _create(opts: Any, backend_options: Any = None) -> Any:
    from .create import create

    return create(opts, backend_options)


def register() -> bool:
    """Register the backend with torch.distributed now (idempotent). False when
    this torch has no distributed support."""
    global _registered
    with _lock:
        if _registered:
            return True
        import torch.distributed as dist

        if not dist.is_available():
            return False
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
        _wrap_env_rendezvous()
        _registered = True
        return True


def _mpi_launched_without_rendezvous() -> bool:
    env = os.environ
    launched = env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or env.get("PMIX_RANK")
    return bool(launched) and not env.get("MASTER_ADDR") and not env.get("RANK")


_store_opens = 0


def _mpi_rendezvous(url: str, timeout: Any) -> Any:
    """env:// for a job an MPI launcher started: (store, rank, world size) of
    the ddplug run this process joins (or joined)."""
    global _store_opens
    import datetime

    import torch
    import torch.distributed as dist

    from .._join import open_run
    from ..context import current

    ctx = current()
    if ctx is None or ctx.closed:
        ctx = open_run(None, device=None, framework=f"torch.distributed {torch.__version__} (env:// under"
                       " an MPI launcher)")
    rank, size = ctx.rank, ctx.world_size
    _store_opens += 1
    key = f"torch-env-store/{_store_opens}"
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 1800.0
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, size, True, timeout=datetime.timedelta(seconds=seconds),
                              wait_for_workers=False)
        ctx.store.set(key, str(store.port).encode())
    else:
        port = int(ctx.store.get(key, seconds).decode())
        store = dist.TCPStore(ctx.master_addr, port, size, False,
                              timeout=datetime.timedelta(seconds=seconds))
    yield (store, rank, size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// under an MPI launcher")


def _wrap_env_rendezvous() -> None:
    """torch's env:// handler, except under an MPI launcher that set none of
    its variables (the module doc)."""
    try:  # the module (torch.distributed.rendezvous the attribute is its function)
        module = importlib.import_module("torch.distributed.rendezvous")
    except Exception:  # pragma: no cover - a torch without rendezvous handlers
        return
    handlers = getattr(module, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None or getattr(original, "_ddplug_wrapped", False):
        return

    def env_handler(url: str, timeout: Any = None, **kwargs: Any) -> Any:
        if _mpi_launched_without_rendezvous():
            return _mpi_rendezvous(url, timeout)
        return original(url, timeout=timeout, **kwargs) if timeout is not None else original(url, **kwargs)

    env_handler._ddplug_wrapped = True  # type: ignore[attr-defined]
    handlers["env"] = env_handler


def is_registered() -> bool:
    return _registered


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:  # get_filename, get_resource_reader, ...
        return getattr(self._inner, name)

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        try:
            register()
        except Exception:  # never break torch's import; dist.init_process_group("ddplug") will say it is unknown
            pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname != _TARGET:
            return None
        _uninstall()
        spec = None
        for finder in list(sys.meta_path):  # whoever would have found it (also editable installs)
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


_finder = _Finder()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def install() -> None:
    """Register now if torch.distributed is imported, else as soon as it is."""
    mod = sys.modules.get(_TARGET)
    if mod is not None and hasattr(mod, "Backend"):
        try:
            register()
        except Exception:
            pass
        return
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
