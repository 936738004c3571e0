"""How tensors and arrays cross into C: pointer, element count, ddplug dtype code,
memory kind and stream. torch tensors and numpy arrays are supported; both must be
contiguous. ``torch.bool`` travels as ``uint8`` (same size, and sum/max/min keep
meaning for 0/1 values).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

from . import _names

# torch / numpy dtype name -> ddplug dtype name (ddplug codes come from the library).
_DTYPE_ALIASES = {"bool": "uint8"}


@dataclass(slots=True)
class Buffer:
    ptr: int
    count: int
    dtype: int  # ddplug dtype code
    device: str  # "cpu" or "cuda"
    device_index: Optional[int]
    owner: Any  # the tensor/array, kept alive while C uses ptr

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"


def dtype_code(name: str) -> int:
    name = _DTYPE_ALIASES.get(name, name)
    codes = _names.dtypes()
    if name not in codes:
        raise TypeError(
            f"ddplug: dtype {name} has no ddplug equivalent (supported: {', '.join(sorted(codes))})"
        )
    return codes[name]


def torch_dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


@functools.lru_cache(maxsize=None)
def torch_dtype_codes() -> dict:
    """{torch dtype: ddplug dtype code} for every torch dtype with a ddplug
    equivalent: the library's dtypes by name, and the aliases above."""
    import torch

    codes = _names.dtypes()
    out = {}
    for name in list(codes) + list(_DTYPE_ALIASES):
        d = getattr(torch, name, None)
        code = codes.get(_DTYPE_ALIASES.get(name, name))
        if isinstance(d, torch.dtype) and code is not None:
            out[d] = code
    return out


def of(x: Any) -> Buffer:
    """A :class:`Buffer` describing tensor/array ``x`` (which must be contiguous)."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not x.is_contiguous():
            raise ValueError("ddplug: collectives need contiguous tensors (call .contiguous())")
        # On the hot path of small collectives: a CPU tensor skips x.device (its
        # .type makes a new string every call) and the dtype's name.
        code = torch_dtype_codes().get(x.dtype)
        if code is None:
            code = dtype_code(torch_dtype_name(x.dtype))  # raises, naming the dtype
        if x.is_cpu:
            return Buffer(x.data_ptr(), x.numel(), code, "cpu", None, x)
        dev = x.device
        return Buffer(x.data_ptr(), x.numel(), code, dev.type, dev.index, x)
    if mod.startswith("numpy"):
        if not x.flags["C_CONTIGUOUS"]:
            raise ValueError("ddplug: collectives need C-contiguous arrays (numpy.ascontiguousarray)")
        return Buffer(x.ctypes.data, x.size, dtype_code(str(x.dtype)), "cpu", None, x)
    raise TypeError(f"ddplug: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def stream_of(buf: Buffer) -> Optional[int]:
    """The current CUDA stream (as an integer handle) for a CUDA buffer, else None."""
    if not buf.is_cuda:
        return None
    import torch

    return torch.cuda.current_stream(buf.device_index).cuda_stream
