"""The backend's native fast path: ``ddplug_torchfast`` (hosts/python/native/
torchfast.cpp), a CPython extension built against the torch of the build's
interpreter, beside libddplug (``build/lib``).

It answers a group's hottest calls without running Python: ``all_reduce`` and
``broadcast`` that torch waits for at once, ``send``, ``recv`` and ``recv``
from any rank, each of one dense contiguous CPU tensor; everything else, and
every failure, goes to the group's Python methods (group.py), which remain the
one definition of the backend. :func:`attach` gives a group those methods.

Used when it was built for this very torch (its version, commit and C++ ABI,
written beside it at build time, must be the running torch's: a C++
extension is tied to one torch build), and ``DDPLUG_TORCH_NATIVE`` is not
``0``; a group whose class overrides one of those methods keeps its own.
:func:`attach_context` gives a ddplug Context used with torch its own
``allreduce`` the same way. Otherwise the group
runs its Python methods, with the same results; :func:`status` says which and
why.
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

# The library functions the fast path calls, in Fast's order.
_FUNCTIONS = ("ddplug_allreduce", "ddplug_broadcast", "ddplug_isend", "ddplug_irecv", "ddplug_request_wait",
              "ddplug_request_test", "ddplug_request_free", "ddplug_request_source")


def _load() -> Optional[Any]:
    global _tried, _module, _why
    with _lock:
        if _tried:
            return _module
        _tried = True
        if os.environ.get(ENV, "1").strip() == "0":
            _why = f"off ({ENV}=0)"
            return None
        import torch

        from .._c import _capi

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
    """Whether the fast path is on, and why not when it is off."""
    _load()
    return _why


def attach(group: Any, fallbacks: tuple, dtypes: dict, ops: dict, host_ok: bool) -> bool:
    """Give ``group`` (a ProcessGroupDdplug) the native ``allreduce``,
    ``broadcast``, ``send``, ``recv`` and ``recv_anysource`` as instance
    attributes, each falling back to the matching function of ``fallbacks``
    (the class's own, in that order). ``dtypes``: torch dtype -> ddplug dtype
    code; ``ops``: (int(RedOpType), dtype) -> ddplug op code, for the pairs the
    plugin takes. False (and nothing changed) when the fast path is off."""
    mod = _load()
    if mod is None:
        return False
    from .._c._capi import F

    fns = tuple(ctypes.cast(getattr(F, name), ctypes.c_void_p).value for name in _FUNCTIONS)
    try:
        fast = mod.Fast(group, group.context, fallbacks, fns, dtypes, ops, host_ok)
    except Exception as exc:  # the group still works, on its Python methods
        _log.warning("ddplug: the backend's native fast path is off for %r: %s", group, exc)
        return False
    for name in ("allreduce", "broadcast", "send", "recv", "recv_anysource"):
        setattr(group, name, fast.method(name))
    return True


def attach_context(ctx: Any) -> bool:
    """Give ``ctx`` (a ddplug Context used with torch) the native
    ``allreduce(x, op="sum", out=None)`` as an instance attribute: a dense
    contiguous CPU ``torch.Tensor`` reduced in place without running Python,
    everything else (other buffers, ``out``, an unknown op, a failure's words)
    through the class's own method. Once per context; a class that overrides
    ``allreduce`` keeps its own. False (and nothing changed) when the fast path
    is off."""
    from ..context import Context

    if "allreduce" in vars(ctx) or type(ctx).allreduce is not Context.allreduce:
        return "allreduce" in vars(ctx)
    mod = _load()
    if mod is None:
        return False
    from .._c import _buffers, _names
    from .._c._capi import F
    fns = tuple(ctypes.cast(getattr(F, name), ctypes.c_void_p).value for name in _FUNCTIONS)
    try:
        ctx.allreduce = mod.context_allreduce(ctx, Context.allreduce, fns, dict(_buffers.torch_dtype_codes()),
                                              dict(_names.ops()))
    except Exception as exc:  # the context still works, on its Python method
        _log.warning("ddplug: the native fast path is off for %r: %s", ctx, exc)
        return False
    return True


__all__ = ["ENV", "attach", "attach_context", "status"]
