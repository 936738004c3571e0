"""Joining a run from an adapter: with the world the framework decided (or the
one libddplug discovers), on the plugin the process's device calls for; the
context becomes the process's current one and is closed at interpreter exit.
"""

from __future__ import annotations

import atexit
from typing import TYPE_CHECKING, Callable, Optional

from .config import Config, ConfigSource, load
from .context import Context, set_current

if TYPE_CHECKING:
    import torch


def plugin_for(cfg: Config, device: Optional["torch.device"]) -> Optional[str]:
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
    device: "torch.device",
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


def open_run(source: ConfigSource, *, device: Optional["torch.device"], framework: str,
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
