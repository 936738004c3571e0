"""What the strategies (Lightning Trainer, Fabric) and the torch.distributed
backend need from the run: opening it with the world the framework decided and
the plugin its device calls for, tensor collectives in Lightning's conventions,
the gradient sync configured from the config, and which errors every rank
raised by itself.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from ._c import _names
from .config import Config, ConfigSource, load
from .context import Context, set_current
from .nn.gradsync import GradientSync

# Plugin capability bits (common.h DDPLUG_CAP_*), checked against the header by
# tests/python/test_binding.py::test_header_constants.
CAP_HOST_MEMORY = 1 << 0
CAP_DEVICE_MEMORY = 1 << 1


def plugin_for(cfg: Config, device: Optional[torch.device]) -> Optional[str]:
    """The plugin a process on ``device`` runs: "nccl" for a CUDA device unless the
    config chooses one, else None (the config's)."""
    cuda = device is not None and device.type == "cuda"
    return "nccl" if cuda and not cfg.is_set("plugin") else None


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
    """Join the run with the world the framework's cluster environment decided,
    handed to libddplug as it is (ddplug_open_options.world), so both agree on
    every rank. The rendezvous address and port serve where the config names
    none; under torchrun's agent store libddplug recognises MASTER_PORT as the
    agent's and finds its own port (run/torchrun.c)."""
    world = {"rank": rank, "world_size": world_size, "local_rank": local_rank,
             "local_world_size": local_world_size, "node_rank": node_rank}
    if world_size > 1:
        world.update(master_addr=main_address or "", master_port=int(main_port or 0))
    return open_run(source, device=device, framework=framework, timeout_s=timeout_s, world=world)


def open_run(source: ConfigSource, *, device: Optional[torch.device], framework: str,
             timeout_s: Optional[float] = None, world: Optional[dict] = None,
             at_exit: Optional[Callable[[Context], None]] = None) -> Context:
    """Join the run (the world given, or discovered by libddplug when None) on
    the plugin for ``device``; the process's current context from now on,
    closed at interpreter exit unless closed before (``at_exit(ctx)`` instead,
    when given)."""
    cfg = load(source)
    try:
        ctx = Context(cfg, plugin=plugin_for(cfg, device), framework=framework, timeout_s=timeout_s,
                      world=world)
    finally:
        cfg.close()
    set_current(ctx)
    atexit.register(at_exit or _close_at_exit, ctx)
    return ctx


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


def abort_for(ctx: Optional[Context], rank: int, exc: BaseException) -> None:
    """Abort the run everywhere with this rank's error, so the other ranks fail
    now instead of waiting for a collective timeout; not when the run is closed
    or aborted already, nor for errors every rank raises by itself."""
    if ctx is not None and not ctx.closed and not ctx._aborted and not raised_everywhere(exc):
        ctx.abort(f"rank {rank}: {type(exc).__name__}: {exc}"[:1000])


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
