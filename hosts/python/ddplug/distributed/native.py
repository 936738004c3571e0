"""The backend's native fast path: ``ddplug_torchfast`` (hosts/python/native/
torchfast.cpp), a CPython extension built against the torch of the build's
interpreter, beside libddplug (``build/lib``).

It answers a group's hottest calls without running Python: ``all_reduce`` and
``broadcast`` that torch waits for at once, ``send``, ``recv`` and ``recv``
from any rank, each of one dense contiguous CPU tensor; everything else, and
every failure, goes to the group's Python methods (group.py), which remain the
one definition of the backend. :func:`attach` gives a group those methods.

Used when the native module is on (:mod:`ddplug._native`: built for this very
torch, and ``DDPLUG_TORCH_NATIVE`` is not ``0``); a group whose class
overrides one of those methods keeps its own. :func:`attach_context` gives a
ddplug Context used with torch its own ``allreduce`` the same way. Otherwise
the group runs its Python methods, with the same results; :func:`status` says
which and why.
"""

from __future__ import annotations

import logging
from typing import Any

from .._native import ENV, FUNCTIONS, addresses, load, status

_log = logging.getLogger("ddplug")


def attach(group: Any, fallbacks: tuple, dtypes: dict, ops: dict, host_ok: bool) -> bool:
    """Give ``group`` (a ProcessGroupDdplug) the native ``allreduce``,
    ``broadcast``, ``send``, ``recv`` and ``recv_anysource`` as instance
    attributes, each falling back to the matching function of ``fallbacks``
    (the class's own, in that order). ``dtypes``: torch dtype -> ddplug dtype
    code; ``ops``: (int(RedOpType), dtype) -> ddplug op code, for the pairs the
    plugin takes. False (and nothing changed) when the fast path is off."""
    mod = load()
    if mod is None:
        return False
    try:
        fast = mod.Fast(group, group.context, fallbacks, addresses(FUNCTIONS), dtypes, ops, host_ok)
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
    mod = load()
    if mod is None:
        return False
    from .._c import _buffers, _names

    try:
        ctx.allreduce = mod.context_allreduce(ctx, Context.allreduce, addresses(FUNCTIONS), dict(_buffers.torch_dtype_codes()),
                                              dict(_names.ops()))
    except Exception as exc:  # the context still works, on its Python method
        _log.warning("ddplug: the native fast path is off for %r: %s", ctx, exc)
        return False
    return True


__all__ = ["ENV", "attach", "attach_context", "status"]
