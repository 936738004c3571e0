"""The native module ``ddplug_torchfast`` (hosts/python/native/), loaded once:
a CPython extension built against the torch of the build's interpreter, beside
libddplug (``build/lib``). It holds the torch.distributed backend's fast path
(:mod:`ddplug.distributed.native` attaches it) and the gradient pool
(:func:`grad_pool`, used by :mod:`ddplug.nn.gradsync`).

Used when it was built for this very torch (its version, commit and C++ ABI,
written beside it at build time, must be the running torch's: a C++ extension
is tied to one torch build), and ``DDPLUG_TORCH_NATIVE`` is not ``0``;
:func:`status` says whether it is on, and why not.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any, Optional

_log = logging.getLogger("ddplug")

NAME = "ddplug_torchfast"
ENV = "DDPLUG_TORCH_NATIVE"

_lock = threading.Lock()
_tried = False
_module: Optional[Any] = None
_why = "not loaded yet"

# The library functions the backend's fast path calls, in Fast's order.
FUNCTIONS = ("ddplug_allreduce", "ddplug_broadcast", "ddplug_isend", "ddplug_irecv", "ddplug_request_wait",
             "ddplug_request_test", "ddplug_request_free", "ddplug_request_source")


def load() -> Optional[Any]:
    """The module, or None when it is off (:func:`status` says why)."""
    global _tried, _module, _why
    with _lock:
        if _tried:
            return _module
        _tried = True
        if os.environ.get(ENV, "1").strip() == "0":
            _why = f"off ({ENV}=0)"
            return None
        import torch

        from ._c import _capi

        lib = Path(_capi.path())
        if not lib.is_absolute():  # a soname the dynamic loader found: no directory to look in
            _why = f"libddplug was loaded as {lib}, from no directory of ddplug's (the Python methods serve every call)"
            return None
        where = lib.parent
        path = next((where / f"{NAME}{s}" for s in importlib.machinery.EXTENSION_SUFFIXES
                     if (where / f"{NAME}{s}").is_file()), None)
        if path is None:
            _why = f"not built beside {where} (the Python methods serve every call)"
            return None
        stamp = where / f"{NAME}.torch-version"
        built_for = stamp.read_text().strip() if stamp.is_file() else "an unknown torch"
        if built_for != _torch_stamp(torch):
            _why = (f"{path.name} was built for torch {built_for}, this is torch {_torch_stamp(torch)}:"
                    " rebuild ddplug (cmake --build) to use it")
            _log.info("ddplug: the backend's native fast path is off: %s", _why)
            return None
        try:
            spec = importlib.util.spec_from_file_location(NAME, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as exc:  # a broken build: the Python methods still work
            _why = f"{path} does not load: {exc}"
            _log.warning("ddplug: the backend's native fast path is off: %s", _why)
            return None
        _module, _why = mod, f"on ({path})"
        return mod


def _torch_stamp(torch: Any) -> str:
    """The torch build a C++ extension is tied to: version, commit, C++ ABI
    (hosts/python/native/torch_build_flags.py writes the same at build time)."""
    return f"{torch.__version__} {torch.version.git_version} cxx11abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def status() -> str:
    """Whether the native module is on, and why not when it is off."""
    load()
    return _why


def addresses(names: tuple) -> tuple:
    """The addresses of these libddplug functions in the library the binding
    loaded (the native module calls that one copy)."""
    from ._c._capi import F

    return tuple(ctypes.cast(getattr(F, name), ctypes.c_void_p).value for name in names)


def grad_pool(ctx: Any, sizes: tuple, cap_bytes: int) -> Optional[Any]:
    """A ``GradPool`` (hosts/python/native/gradpool.cpp) for ``ctx``: from now
    on, torch's CPU allocations of exactly one of ``sizes`` bytes made inside a
    backward pass are served from ``ctx``'s registered memory, at most
    ``cap_bytes`` of it, and recycled by size. None (nothing changed) when the
    native module is off or torch's allocator cannot be wrapped. The caller
    retires the pool before the context closes (``pool.retire(free_blocks)``)."""
    mod = load()
    if mod is None or not hasattr(mod, "GradPool"):
        return None
    alloc, free = addresses(("ddplug_mem_alloc", "ddplug_mem_free"))
    try:
        return mod.GradPool(ctx.handle.value, alloc, free, tuple(int(s) for s in sizes), int(cap_bytes))
    except Exception as exc:  # gradients stay in ordinary memory
        _log.info("ddplug: gradients stay in ordinary memory: %s", exc)
        return None


__all__ = ["ENV", "FUNCTIONS", "addresses", "grad_pool", "load", "status"]
