"""The ``ddplug`` strategy for Lightning Fabric.

    import ddplug.fabric
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddplug")          # DDPLUG_CONFIG
    fabric = Fabric(devices=2, strategy=ddplug.fabric.DdplugStrategy(config="ddplug.json"))

Same machinery as :mod:`ddplug.lightning`: ranks from Fabric's cluster
environment passed to ddplug explicitly, collectives and gradient allreduce through
libddplug, and one split owner per DataLoader set up with
``fabric.setup_dataloaders`` (claimed, agreed, audited per epoch).

Fabric injects its DistributedSampler only when the strategy has
``distributed_sampler_kwargs`` (lightning/fabric/fabric.py:1169-1174); this strategy
returns None there so ddplug is the only layer that decides — ranks for a user's
own rank-aware sampler are in :attr:`DdplugStrategy.rank_kwargs`.

Streams are named "train" (the first loader), then "loader1", "loader2", ...; name
one yourself with :func:`name_stream` before ``setup_dataloaders``. A loader that
shuffles (RandomSampler) is split with the config's shuffle; others keep order.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional, Union

import torch
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.nn import Module
from torch.utils.data import DataLoader, RandomSampler
from typing_extensions import override

import lightning.fabric as lf
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import TBroadcast, _BackwardSyncControl
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.fabric.utilities.rank_zero import rank_zero_only

from . import _host
from .audit import Report
from .config import ConfigSource
from .context import Context
from .gradsync import GradientSync, broadcast_module
from .streams import DataSplit, StreamBatchSampler

_STREAM_ATTR = "ddplug_stream"


def name_stream(loader: DataLoader, name: str) -> DataLoader:
    """Give ``loader`` a stream name (used by ``setup_dataloaders``)."""
    setattr(loader, _STREAM_ATTR, name)
    return loader


class _DdplugBackwardSyncControl(_BackwardSyncControl):
    def __init__(self, strategy: "DdplugStrategy") -> None:
        self._strategy = strategy

    @override
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager:
        """Gradients accumulate locally inside the block (fabric.no_backward_sync)."""
        gs = self._strategy._grad_sync
        if not enabled or gs is None:
            return nullcontext()
        return gs.no_sync()


class DdplugStrategy(ParallelStrategy):
    """Multi-process data parallelism for Fabric through libddplug.

    Args:
        config: a path, JSON text, dict or Config; None reads ``DDPLUG_CONFIG``.
        accelerator, parallel_devices, cluster_environment, checkpoint_io,
        precision: as for every Fabric ParallelStrategy.
        timeout_s: rendezvous timeout override (seconds).
    """

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[list] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision: Optional[Precision] = None,
        timeout_s: Optional[float] = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
        )
        self._config_source = config
        self._timeout_s = timeout_s
        self._num_nodes = 1
        self._ctx: Optional[Context] = None
        self._grad_sync: Optional[GradientSync] = None
        self._data: Optional[DataSplit] = None
        self._loaders = 0
        self._backward_sync_control = _DdplugBackwardSyncControl(self)

    # ------------------------------------------------------------------ properties
    @property
    @override
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    @override
    def distributed_sampler_kwargs(self) -> None:  # type: ignore[override]
        """None: Fabric must not inject its DistributedSampler (see module doc)."""
        return None

    @property
    def rank_kwargs(self) -> dict:
        """{"num_replicas", "rank"} (global) for a user's own rank-aware sampler."""
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    @property
    def context(self) -> Optional[Context]:
        return self._ctx

    @property
    def streams(self) -> dict:
        return dict(self._data.streams) if self._data is not None else {}

    # ------------------------------------------------------------------ lifecycle
    @override
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def _set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._set_world_ranks()
        if self._ctx is None or self._ctx.closed:
            env = self.cluster_environment
            self._ctx = _host.open_context(
                self._config_source,
                rank=self.global_rank,
                world_size=self.world_size,
                local_rank=self.local_rank,
                local_world_size=self.num_processes,
                node_rank=self.node_rank,
                main_address=getattr(env, "main_address", None) if self.world_size > 1 else None,
                main_port=getattr(env, "main_port", None) if self.world_size > 1 else None,
                device=self.root_device,
                framework=f"lightning.fabric {lf.__version__}",
                timeout_s=self._timeout_s,
            )
            self._data = DataSplit(self._ctx, "fabric", log=self._log_rank_zero, on_report=self._on_audit_report)
            if self.global_rank == 0:
                p = self._ctx.plugin
                self._print(f"ddplug: plugin {p['name']} {p['version']}, {self.world_size} ranks on"
                            f" {self._ctx.num_nodes} node(s)")

    @override
    def setup_module(self, module: Module) -> Module:
        """Parameters and buffers from rank 0; gradient hooks installed (the module
        is not wrapped)."""
        assert self._ctx is not None
        broadcast_module(self._ctx, module)
        if any(p.requires_grad for p in module.parameters()):
            if self._grad_sync is not None:
                self._grad_sync.detach()
            self._grad_sync = _host.gradient_sync(self._ctx, module.parameters())
            self._grad_sync.attach()
        return module

    @override
    def module_to_device(self, module: Module) -> None:
        module.to(self.root_device)

    @override
    def process_dataloader(self, dataloader: DataLoader) -> DataLoader:
        assert self._data is not None
        name = getattr(dataloader, _STREAM_ATTR, None)
        if name is None:
            name = "train" if self._loaders == 0 else f"loader{self._loaders}"
        self._loaders += 1
        training = isinstance(getattr(dataloader, "sampler", None), RandomSampler)
        return self._data.prepare(dataloader, name, framework_sampler=self._fabric_sampler, training=training)

    @override
    def backward(self, tensor: Tensor, module: Optional[Module], *args: Any, **kwargs: Any) -> None:
        """Backward, then every gradient bucket reduced before returning."""
        super().backward(tensor, module, *args, **kwargs)
        if self._grad_sync is not None:
            self._grad_sync.finish()

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        gs = self._grad_sync
        if gs is not None and gs.enabled and gs._round:
            gs.finish()  # a plain loss.backward() instead of fabric.backward()
        return super().optimizer_step(optimizer, **kwargs)

    # ------------------------------------------------------------------ collectives
    @override
    def all_reduce(
        self, tensor: Union[Tensor, Any], group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Union[Tensor, Any]:
        if not isinstance(tensor, Tensor) or self._ctx is None or self._ctx.closed:
            return tensor
        return _host.reduce(self._ctx, tensor, reduce_op)

    @override
    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        if self._ctx is None or self._ctx.closed:
            return tensor.unsqueeze(0)
        return _host.all_gather(self._ctx, tensor, sync_grads)

    @override
    def barrier(self, name: Optional[str] = None) -> None:
        if self._ctx is not None and not self._ctx.closed:
            self._ctx.barrier()

    @override
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        if self._ctx is None or self._ctx.closed:
            return obj
        return self._ctx.broadcast_object(obj, src)

    # ------------------------------------------------------------------ registration, teardown
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "ddplug", cls, description="ddplug: data-parallel strategy plugins (config from DDPLUG_CONFIG)",
            override=True,
        )

    @override
    def teardown(self) -> None:
        if self._grad_sync is not None:
            self._grad_sync.detach()
            self._grad_sync = None
        super().teardown()

    def close(self) -> None:
        """Leave the run now (else at interpreter exit)."""
        if self._ctx is not None:
            self._ctx.close()  # releases the loaders' samplers first
            self._ctx = None
        self._data = None

    # ------------------------------------------------------------------ helpers
    def _fabric_sampler(self, dataloader: DataLoader) -> Any:
        """Fabric's own sampler choice, for owner "framework" (fabric.py:1176-1182)."""
        from lightning.fabric import Fabric

        return Fabric._get_distributed_sampler(dataloader, **self.rank_kwargs)

    def _on_audit_report(self, stream: StreamBatchSampler, report: Report) -> None:
        if self.global_rank == 0:
            self._print(report.text or report.summary)

    def _log_rank_zero(self, line: str) -> None:
        if self.global_rank == 0:
            self._print(f"ddplug: {line}")

    @staticmethod
    def _print(text: str) -> None:
        print(text, file=sys.stdout, flush=True)


DdplugStrategy.register_strategies(STRATEGY_REGISTRY)

__all__ = ["DdplugStrategy", "name_stream"]

