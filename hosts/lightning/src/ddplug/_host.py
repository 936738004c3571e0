"""What the Lightning Trainer strategy and the Fabric strategy share: opening the
run's context with the world Lightning decided, tensor collectives in Lightning's
conventions, and the gradient sync configured from the config.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any, Optional, Union

import torch
from torch import Tensor

from . import _names
from .config import ConfigSource, load
from .context import Context, set_current
from .gradsync import GradientSync

# Plugin capability bits (common.h DDPLUG_CAP_*), checked against the header by
# tests/python/test_binding.py::test_header_constants.
CAP_HOST_MEMORY = 1 << 0
CAP_DEVICE_MEMORY = 1 << 1


def config_names_plugin(source: ConfigSource) -> bool:
    """Whether the user's config explicitly names a plugin (then a CUDA run does
    not switch to "nccl" by itself)."""
    if source is None:
        source = os.environ.get("DDPLUG_CONFIG") or None
        if source is None:
            return False
    if isinstance(source, dict):
        return "plugin" in source
    text: Optional[str] = None
    if isinstance(source, str) and source.lstrip().startswith("{"):
        text = source
    elif isinstance(source, (str, os.PathLike)):
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return False  # ddplug_config_load_file reports it
    else:  # a Config
        return True
    try:
        data = json.loads(text)
    except ValueError:
        return False  # the library reports the syntax error with line and column
    return isinstance(data, dict) and "plugin" in data


def open_context(
    source: ConfigSource,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    main_address: Optional[str],
    main_port: Optional[int],
    device: torch.device,
    framework: str,
    timeout_s: Optional[float] = None,
) -> Context:
    """Join the run with the world Lightning's cluster environment decided, passed
    to ddplug explicitly (config "world"), so both agree on every rank."""
    cfg = load(source)
    try:
        overrides: dict = {
            "world": {
                "rank": rank,
                "world_size": world_size,
                "local_rank": local_rank,
                "local_world_size": local_world_size,
                "node_rank": node_rank,
            }
        }
        host_id = cfg.get("world.host_id")
        if host_id:
            overrides["world"]["host_id"] = host_id
        if world_size > 1:
            if cfg.get("rendezvous.addr") is None and main_address:
                overrides["rendezvous.addr"] = main_address
            if cfg.get("rendezvous.port") is None and main_port and not _torchrun_agent_store(main_port):
                overrides["rendezvous.port"] = int(main_port)
        merged = cfg.with_overrides(overrides)
    finally:
        cfg.close()
    plugin = None
    if device.type == "cuda" and not config_names_plugin(source):
        plugin = "nccl"
    try:
        ctx = Context(merged, plugin=plugin, framework=framework, timeout_s=timeout_s)
    finally:
        merged.close()
    set_current(ctx)
    atexit.register(_close_at_exit, ctx)
    return ctx


def _torchrun_agent_store(port: Any) -> bool:
    """Whether ``port`` is torchrun's own store (torch >= 2.4 serves its agent's
    TCPStore on MASTER_PORT and says so with TORCHELASTIC_USE_AGENT_STORE). Then
    the port is left to libddplug, whose rank 0 serves on a free port and
    publishes it in torchrun's store (abi/src/rendezvous.c)."""
    flag = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "")
    return flag in ("True", "true", "1") and str(port) == os.environ.get("MASTER_PORT")


def _close_at_exit(ctx: Context) -> None:
    try:
        ctx.close()
    except Exception:  # pragma: no cover - best effort at interpreter exit
        pass


def raised_everywhere(exc: BaseException) -> bool:
    """Whether every rank raises ``exc`` by itself (a collective verdict: a failed
    audit, a split conflict found by agreement, a run-once failure, the parameter
    check, a sampler that needs torch.distributed), so aborting the run would
    only replace the other ranks' clear error with "aborted"."""
    from .errors import AuditFailed, ParametersDiffer, SplitConflict, TorchDistributedNotInitialized
    from .runonce import RunOnceFailed

    return isinstance(exc, (AuditFailed, ParametersDiffer, SplitConflict, RunOnceFailed,
                            TorchDistributedNotInitialized))


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


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, tensor: Tensor, ctx: Context) -> Tensor:  # type: ignore[override]
        fctx.ddplug = ctx
        work = _staged(ctx, tensor)
        out = torch.empty((ctx.world_size,) + tuple(work.shape), dtype=work.dtype, device=work.device)
        ctx.allgather(work, out)
        return out.to(tensor.device)

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
        return _AllGather.forward(_Dummy(), tensor, ctx)


class _Dummy:
    pass


def gradient_sync(ctx: Context, params: Any) -> GradientSync:
    """A :class:`GradientSync` configured by the context's "gradients" settings."""
    cfg = ctx.config
    try:
        g = cfg.get("gradients", {}) or {}
    finally:
        cfg.close()
    ops = _names.ops()
    use_avg = bool(ctx.plugin["op_mask"] & (1 << ops["avg"]))
    return GradientSync(
        ctx, params,
        bucket_mb=float(g.get("bucket_mb", 25)),
        first_bucket_mb=float(g.get("first_bucket_mb", 1)),
        average=bool(g.get("average", True)),
        use_avg_op=use_avg,
    )
