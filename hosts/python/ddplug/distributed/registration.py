"""Registering the torch.distributed backend ``"ddplug"`` when ``ddplug`` is
imported, without importing torch for that.

``import ddplug`` must stay cheap and work without torch (the binding alone
needs only ctypes). So: if torch.distributed is already imported, the backend
is registered at once; otherwise a finder on ``sys.meta_path`` waits for
``torch.distributed`` to be imported (by anyone, in any order) and registers
the backend right after that module ran. Registration itself touches only
``torch.distributed.Backend``; the backend's code is imported when torch
first creates a ``"ddplug"`` group.
"""

from __future__ import annotations

import importlib.abc
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
        _registered = True
        return True


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
