"""Synchronized batch normalization through the run's ddplug context.

``torch.nn.SyncBatchNorm`` needs an initialized ``torch.distributed`` process group
(the strategies initialise one on their run unless ``torch_distributed=False``) and
GPU tensors: on CPU tensors it refuses, and without a process group it silently
behaves like ``BatchNorm`` (every rank normalizes with its own batch statistics and
its running statistics drift apart). :class:`SyncBatchNorm` computes the statistics
over the batches of every rank through the run's context instead, on any device and
with or without torch.distributed, with ``torch.nn.SyncBatchNorm``'s semantics:

* forward (training): each rank gathers every rank's (count, mean, biased variance)
  per channel (one allgather of 2C+1 values; ranks may hold different batch sizes,
  an empty batch included) and normalizes with the combined mean and variance; the
  running statistics are updated from them (unbiased variance over the total count),
  so they stay equal on every rank;
* backward: the per-channel sums of ``dy`` and ``dy * (x - mean)`` are all-reduced
  (one allreduce of 2C values) to form the input gradient; the weight and bias
  gradients stay local (the gradient sync averages them like any parameter's);
* evaluation, or a world of one, or no run: plain ``F.batch_norm``.

The module finds the context with :func:`ddplug.context.current` (the strategy's),
so it holds no handle and can be copied and pickled. Every rank must run the same
training-mode forwards and backwards (each is a collective), as with torch's.

The Trainer strategy applies it for ``Trainer(sync_batchnorm=True)`` and replaces
``torch.nn.SyncBatchNorm`` layers a model brings; the Fabric strategy replaces
``torch.nn.SyncBatchNorm`` layers in ``fabric.setup`` (the way Fabric users ask for
synchronized batch norm: ``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)``).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ..context import Context, current
from . import functional


class _SyncBatchNormFunction(torch.autograd.Function):
    """The statistics and the input gradient over every rank (see the module doc)."""

    @staticmethod
    def forward(  # type: ignore[override]
        fctx: Any, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
        running_mean: Optional[Tensor], running_var: Optional[Tensor], eps: float, momentum: float,
        ctx: Context,
    ) -> Tensor:
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        sdt = torch.promote_types(x.dtype, torch.float32)  # statistics in at least float32
        n = x.numel() // c if c else 0
        local = torch.zeros(2 * c + 1, dtype=sdt, device=x.device)
        local[0] = n
        if n > 0:
            var, mean = torch.var_mean(x.to(sdt), dim=dims, correction=0)
            local[1: c + 1] = mean
            local[c + 1:] = var
        every = functional.all_gather(ctx, local)
        counts, means, variances = every[:, :1], every[:, 1: c + 1], every[:, c + 1:]
        total = int(counts.sum().item())
        if total <= 1:
            raise ValueError(
                f"ddplug SyncBatchNorm: expected more than 1 value per channel when training, got {total} over"
                f" {ctx.world_size} ranks (input of shape {tuple(x.shape)} on rank {ctx.rank})"
            )
        w = counts / total
        mean = (w * means).sum(0)
        var = (w * (variances + (means - mean) ** 2)).sum(0)  # biased, over every rank's batch
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * (total / (total - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        y = (x.to(sdt) - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            y = y * weight.to(sdt).view(shape)
        if bias is not None:
            y = y + bias.to(sdt).view(shape)
        fctx.save_for_backward(x, weight, mean, invstd)
        fctx.total = total
        fctx.ddplug = ctx
        return y.to(x.dtype)

    @staticmethod
    def backward(fctx: Any, dy: Tensor) -> Any:  # type: ignore[override]
        x, weight, mean, invstd = fctx.saved_tensors
        need_x, need_w, need_b = fctx.needs_input_grad[:3]
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        sdt = mean.dtype
        dyf = dy.to(sdt)
        xmu = x.to(sdt) - mean.view(shape)
        sum_dy = dyf.sum(dims)
        sum_dy_xmu = (dyf * xmu).sum(dims)
        grad_w = (sum_dy_xmu * invstd).to(weight.dtype) if need_w and weight is not None else None
        grad_b = sum_dy.to(weight.dtype) if need_b and weight is not None else None
        grad_x = None
        if need_x:  # every rank has the same graph, so every rank joins this allreduce
            both = functional.reduce(fctx.ddplug, torch.cat([sum_dy, sum_dy_xmu]), "sum")
            mean_dy = both[:c] / fctx.total
            mean_dy_xmu = both[c:] / fctx.total
            scale = invstd if weight is None else invstd * weight.to(sdt)
            grad_x = (dyf - mean_dy.view(shape) - xmu * (invstd * invstd * mean_dy_xmu).view(shape)) * scale.view(shape)
            grad_x = grad_x.to(x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of every rank of the ddplug run (see the
    module doc). Arguments as ``torch.nn.SyncBatchNorm`` (no ``process_group``: the
    whole run). Input of 2 or more dimensions, channels in dimension 1."""

    _ddplug_original: Optional[type] = None  # the class convert_sync_batchnorm replaced

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"ddplug SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        # What torch.nn.SyncBatchNorm.forward decides, except where the world comes from.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        ctx = current() if bn_training and self.training else None
        if ctx is None or ctx.closed or ctx.world_size < 2:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor,
                                self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean, running_var, self.eps,
                                            factor, ctx)


def _replace(module: torch.nn.Module, new: torch.nn.Module) -> torch.nn.Module:
    """``new`` takes ``module``'s parameters and buffers (the same objects, so an
    optimizer built before keeps working), mode and qconfig."""
    if module.affine:
        with torch.no_grad():
            new.weight = module.weight
            new.bias = module.bias
    new.running_mean = module.running_mean
    new.running_var = module.running_var
    new.num_batches_tracked = module.num_batches_tracked
    new.training = module.training
    if hasattr(module, "qconfig"):
        new.qconfig = module.qconfig
    return new


def convert_sync_batchnorm(module: torch.nn.Module, only_torch_sync: bool = False) -> torch.nn.Module:
    """Replace every batch-norm layer of ``module`` (``torch.nn.modules.batchnorm._BatchNorm``:
    BatchNorm1d/2d/3d, torch's SyncBatchNorm; with ``only_torch_sync`` only
    ``torch.nn.SyncBatchNorm``) by :class:`SyncBatchNorm`, keeping its parameters and
    buffers. Returns the converted module (``module`` itself unless it is such a
    layer); :func:`revert_sync_batchnorm` restores the original classes."""
    out = module
    wanted = torch.nn.SyncBatchNorm if only_torch_sync else _BatchNorm
    if isinstance(module, wanted) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
        _replace(module, out)
        out._ddplug_original = type(module)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, only_torch_sync))
    return out


def revert_sync_batchnorm(module: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`convert_sync_batchnorm`: each :class:`SyncBatchNorm` becomes its
    original class again (BatchNorm1d, ... or torch's SyncBatchNorm) with the same
    parameters and buffers."""
    out = module
    if isinstance(module, SyncBatchNorm):
        cls = module._ddplug_original or torch.nn.SyncBatchNorm
        try:
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        except TypeError:  # a subclass with its own constructor: the generic N-d batch norm
            out = _BatchNormXd(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
        _replace(module, out)
    for name, child in module.named_children():
        out.add_module(name, revert_sync_batchnorm(child))
    return out


def has_sync_batchnorm(module: torch.nn.Module) -> bool:
    return any(isinstance(m, SyncBatchNorm) for m in module.modules())


def synced_buffers(module: torch.nn.Module) -> Iterator[Tensor]:
    """The running statistics of ``module``'s :class:`SyncBatchNorm` layers: equal on
    every rank by construction (the parameter check compares them; other buffers
    may differ between ranks by design)."""
    for m in module.modules():
        if isinstance(m, SyncBatchNorm) and m.track_running_stats:
            for t in (m.running_mean, m.running_var):
                if t is not None:
                    yield t


class _BatchNormXd(_BatchNorm):
    def _check_input_dim(self, input: Tensor) -> None:
        return


__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "revert_sync_batchnorm", "synced_buffers"]
