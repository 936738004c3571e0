"""Registered memory: host tensors the plugin's collectives reach from every rank
of the node without staging them (``ddplug_mem_alloc``; for the cpu plugin, pages
of the node's shared memory, so a peer reduces straight from such a tensor and
writes its result straight into it).

:func:`empty` gives a 1-D CPU tensor in registered memory — or, where there is
none (a plugin without it, a CUDA tensor, registered memory exhausted), an
ordinary zeroed tensor: the caller never has to care, every collective accepts
both. The memory is released when the last tensor viewing it is garbage
collected; tensors still alive when the context closes — or when its group is
re-formed after a lost rank (a new generation) — keep a private copy of their last
contents (the plugin's promise), so a forgotten view never faults.
:func:`reach` says how the collectives reach a tensor.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from typing import Any, Optional

from ._c._buffers import torch_dtype_name
from ._c._capi import F
from .context import CAP_REGISTERED_MEMORY
from .errors import status_code

_log = logging.getLogger("ddplug")

# ddplug_mem_reach's answers, plugin.h (tests/python/test_binding.py compares them)
REACH_STAGED, REACH_SINGLE_COPY, REACH_REGISTERED = 0, 1, 2
REACH_NAMES = {REACH_STAGED: "staged", REACH_SINGLE_COPY: "single_copy", REACH_REGISTERED: "registered"}


def _free(ctx_ref: "weakref.ref", ptr: int, generation: int = 0) -> None:
    ctx = ctx_ref()
    if ctx is None or ctx.closed or getattr(ctx, "generation", 0) != generation:
        return  # the plugin released it with the group (a private copy stays)
    F.ddplug_mem_free(ctx.handle, ptr)


def empty(ctx: Any, numel: int, dtype: Any, device: Any = "cpu") -> Any:
    """A zero-filled 1-D tensor of ``numel`` elements of ``dtype``, in registered
    memory when the context's plugin has it (see the module doc), else ordinary."""
    import torch

    device = torch.device(device)
    if device.type != "cpu" or numel <= 0 or not _has_registered(ctx):
        return torch.zeros(max(numel, 0), dtype=dtype, device=device)
    elsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = numel * elsize
    ptr = ctypes.c_void_p()
    st = F.ddplug_mem_alloc(ctx.handle, nbytes, ctypes.byref(ptr))
    if st != 0:
        if st in (status_code("NO_MEMORY"), status_code("UNSUPPORTED")):
            _log.debug("ddplug: %d bytes of %s in ordinary memory: %s", nbytes, torch_dtype_name(dtype),
                       ctx.error())
            return torch.zeros(numel, dtype=dtype)
        ctx.check(st, f"registered memory for {numel} x {torch_dtype_name(dtype)}")
    raw = (ctypes.c_char * nbytes).from_address(ptr.value)
    weakref.finalize(raw, _free, weakref.ref(ctx), ptr.value, getattr(ctx, "generation", 0))
    t = torch.frombuffer(raw, dtype=dtype, count=numel)
    t.zero_()
    return t


def reach(ctx: Any, tensor: Any) -> str:
    """How the context's collectives reach ``tensor``'s memory: "registered",
    "single_copy" (reduced in place through the kernel) or "staged"."""
    if tensor.device.type != "cpu" or tensor.numel() == 0 or ctx.closed:
        return "staged"
    out = ctypes.c_int(0)
    nbytes = tensor.numel() * tensor.element_size()
    ctx.check(F.ddplug_mem_reach(ctx.handle, ctypes.c_void_p(tensor.data_ptr()), nbytes,
                                  ctypes.byref(out)), "mem_reach")
    return REACH_NAMES.get(out.value, "staged")


def _has_registered(ctx: Any) -> bool:
    return bool(ctx.plugin.get("caps", 0) & CAP_REGISTERED_MEMORY)


def shares_memory(a: Optional[Any], b: Optional[Any]) -> bool:
    """Whether two tensors view the same storage."""
    if a is None or b is None:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
