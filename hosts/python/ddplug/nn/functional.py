"""Collectives on tensors in Lightning's conventions, for the strategies and
:class:`~ddplug.nn.syncbn.SyncBatchNorm`: :func:`reduce` (in place, Lightning's
reduce ops) and :func:`all_gather` (every rank's tensor stacked, optionally
differentiable). A tensor in memory the plugin cannot take is staged through
the memory it takes.
"""

from __future__ import annotations

from typing import Any, Union

import torch
from torch import Tensor

from .._c import _names
from ..context import CAP_DEVICE_MEMORY, CAP_HOST_MEMORY, Context


def _op_name(reduce_op: Any) -> str:
    if reduce_op is None:
        return "sum"
    if isinstance(reduce_op, str):
        name = reduce_op.lower()
    else:  # torch.distributed.ReduceOp or its RedOpType
        name = str(getattr(reduce_op, "name", reduce_op)).split(".")[-1].lower()
    name = {"mean": "avg", "product": "prod", "band": "band", "bor": "bor"}.get(name, name)
    if name not in _names.ops():
        raise ValueError(f"ddplug: reduce op {reduce_op!r} is not supported (one of {', '.join(_names.ops())})")
    return name


def _staged(ctx: Context, tensor: Tensor) -> Tensor:
    """A contiguous tensor the plugin can read (staged through host or device
    memory when the plugin cannot take the tensor's memory)."""
    caps = ctx.plugin["caps"]
    t = tensor.contiguous()
    if t.device.type == "cuda" and not caps & CAP_DEVICE_MEMORY:
        return t.cpu()
    if t.device.type == "cpu" and not caps & CAP_HOST_MEMORY and torch.cuda.is_available():
        return t.cuda()
    return t


def reduce(ctx: Context, tensor: Tensor, reduce_op: Union[str, Any, None] = "mean") -> Tensor:
    """In-place allreduce with Lightning's semantics; returns ``tensor``. "mean" of
    an integer tensor leaves the truncated mean in ``tensor`` (as Lightning's gloo
    path does) but returns the exact mean as a float tensor: Lightning divides two
    synced sums for a mean-reduced metric (the values, and the batch sizes, an
    integer tensor), and with uneven per-rank counts — exact evaluation — the
    truncated batch size would bias it."""
    op = _op_name(reduce_op)
    work = _staged(ctx, tensor)
    exact = None
    if op == "avg" and not work.is_floating_point():
        ctx.allreduce(work, "sum")
        exact = work.double() / ctx.world_size
        work.copy_(torch.div(work, ctx.world_size, rounding_mode="trunc"))
    else:
        ctx.allreduce(work, op)
    if work.data_ptr() != tensor.data_ptr():
        with torch.no_grad():
            tensor.copy_(work.view_as(tensor))
    if exact is not None:
        return exact.to(torch.get_default_dtype()).view_as(tensor).to(tensor.device)
    return tensor


def _gathered(ctx: Context, tensor: Tensor) -> Tensor:
    """Every rank's ``tensor``, stacked (no autograd)."""
    work = _staged(ctx, tensor)
    out = torch.empty((ctx.world_size,) + tuple(work.shape), dtype=work.dtype, device=work.device)
    ctx.allgather(work, out)
    return out.to(tensor.device)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, tensor: Tensor, ctx: Context) -> Tensor:  # type: ignore[override]
        fctx.ddplug = ctx
        return _gathered(ctx, tensor)

    @staticmethod
    def backward(fctx: Any, grad: Tensor) -> Any:  # type: ignore[override]
        ctx: Context = fctx.ddplug
        work = _staged(ctx, grad)
        ctx.allreduce(work, "sum")
        return work[ctx.rank].to(grad.device), None


def all_gather(ctx: Context, tensor: Tensor, sync_grads: bool = False) -> Tensor:
    """Every rank's ``tensor`` stacked: shape (world_size, *tensor.shape); with
    ``sync_grads`` differentiable (the backward sums the gradients over ranks)."""
    if sync_grads:
        return _AllGather.apply(tensor, ctx)
    with torch.no_grad():
        return _gathered(ctx, tensor)


__all__ = ["all_gather", "reduce"]
