"""The ``ddplug`` strategy for Lightning Fabric.

    import ddplug.fabric
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddplug")          # DDPLUG_CONFIG
    fabric = Fabric(devices=2, strategy=ddplug.fabric.DdplugStrategy(config="ddplug.json"))

Same machinery as :mod:`ddplug.lightning`: ranks from Fabric's cluster
environment passed to ddplug explicitly, collectives and gradient allreduce through
libddplug, and one split owner per DataLoader set up with
``fabric.setup_dataloaders`` (claimed, agreed, audited per epoch).

Fabric injects its DistributedSampler only when the strategy has
``distributed_sampler_kwargs`` (lightning/fabric/fabric.py); this strategy
returns None there so ddplug is the only layer that decides — ranks for a user's
own rank-aware sampler are in :attr:`DdplugStrategy.rank_kwargs`.

Synchronized batch norm: Fabric's way of asking for it,
``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`` before ``fabric.setup``,
needs torch.distributed; ``setup_module`` replaces those layers by
:class:`ddplug.nn.syncbn.SyncBatchNorm` (statistics over every rank through ddplug).

Streams are named "train" (the first loader), then "loader1", "loader2", ...; name
one yourself with :func:`name_stream` before ``setup_dataloaders``. Streams named
val, test, predict or eval (and a loader that neither shuffles nor is the first)
are evaluation streams, split exactly: every sample once, uneven counts per rank.
After ``fabric.load`` restores a stream mid-epoch, ``len(loader)`` is the number of
batches left in that epoch.

Elastic: every optimizer step commits the training streams' batches (their cursor
goes into ``fabric.save``'s loader state and resumes on any world size). With
``"elastic": {"on_peer_lost": "shrink"}``, a loop that runs its steps through
:meth:`DdplugStrategy.step` goes on in place when a rank is lost::

    def closure():
        optimizer.zero_grad()
        loss = model(batch).mean()
        fabric.backward(loss)
        return loss
    fabric.strategy.step(optimizer, closure)   # instead of closure(); optimizer.step()
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

from torch import Tensor
from torch.nn import Module, SyncBatchNorm
from torch.utils.data import DataLoader, RandomSampler
from typing_extensions import override

import lightning.fabric as lf
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl

from ._abort import abort_on_uncaught_exception
from ._strategy import STOP_GRACE_S, DdplugParallel, tolerant_launch
from .config import ConfigSource
from .data.audit import Report
from .data.streams import DataSplit, StreamBatchSampler
from .nn import syncbn as _syncbn
from .nn.gradsync import GradientSync, broadcast_module

_STREAM_ATTR = "ddplug_stream"


def name_stream(loader: DataLoader, name: str) -> DataLoader:
    """Give ``loader`` a stream name (used by ``setup_dataloaders``); a name the
    library refuses is a ValueError now, not at setup."""
    from .data.ownership import check_stream_name

    setattr(loader, _STREAM_ATTR, check_stream_name(name))
    return loader


class _DdplugBackwardSyncControl(_BackwardSyncControl):
    def __init__(self, strategy: "DdplugStrategy") -> None:
        self._strategy = strategy

    @override
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager:
        """Gradients accumulate locally inside the block (fabric.no_backward_sync)."""
        gs = self._strategy.gradient_sync
        if not enabled or gs is None:
            return nullcontext()
        return gs.no_sync()


class _TolerantLauncher(_SubprocessScriptLauncher):
    """Fabric's launcher (``python train.py`` with devices=N) whose observer lets
    the survivors of a lost rank go on (elastic.on_peer_lost = "shrink"), or stop
    on their own before it terminates them (``_strategy.STOP_GRACE_S``), instead of
    SIGKILLing every rank at its next poll."""

    stop_grace_s: Optional[float] = STOP_GRACE_S

    @override
    def launch(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return tolerant_launch(self, function, *args, **kwargs)


class DdplugStrategy(DdplugParallel, ParallelStrategy):
    """Multi-process data parallelism for Fabric through libddplug.

    Args:
        config: a path, JSON text, dict or Config; None reads ``DDPLUG_CONFIG``.
        accelerator, parallel_devices, cluster_environment, checkpoint_io,
        precision: as for every Fabric ParallelStrategy.
        timeout_s: rendezvous timeout override (seconds).
        torch_distributed: initialise torch.distributed with the backend
            "ddplug" on the run's context (default True; None reads the
            config's "torch_distributed" where the library knows that key).
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
        torch_distributed: Optional[bool] = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
        )
        self._ddplug_init(config, timeout_s, torch_distributed)
        self._loaders = 0
        self._modules: list = []  # weak references to the modules set up (their synced buffers)
        self._backward_sync_control = _DdplugBackwardSyncControl(self)

    # ------------------------------------------------------------------ properties
    # root_device, num_nodes, num_processes, rank_kwargs, context, streams:
    # DdplugParallel.

    @property
    @override
    def distributed_sampler_kwargs(self) -> None:  # type: ignore[override]
        """None: Fabric must not inject its DistributedSampler (see module doc)."""
        return None

    # ------------------------------------------------------------------ lifecycle
    @override
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        self._secret_for_launched_ranks()  # the ranks the launcher starts inherit a per-run secret
        self._launcher = _TolerantLauncher(self.cluster_environment, self.num_processes, self.num_nodes)
        self._launcher.stop_grace_s = None if self._elastic_wanted() else STOP_GRACE_S

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._assign_world_ranks()
        if self._ctx is None or self._ctx.closed:
            ctx = self._open_context(f"lightning.fabric {lf.__version__}")
            # Fabric's loader calls set_epoch(number of its iterations) (wrappers.py)
            self._data = DataSplit(ctx, "fabric", log=self._log_rank_zero, on_report=self._on_audit_report,
                                   epochs_count_iterations=True, resume_shortens_len=True,
                                   loader_state_dict=True)
        # Fabric has no exception hook for strategies (the Trainer calls
        # on_exception): an error that ends this rank's script aborts the run
        # from sys.excepthook, so the other ranks stop at their next collective
        # with this rank's error instead of waiting for the collective timeout.
        assert self._ctx is not None
        abort_on_uncaught_exception(self._ctx, self.global_rank)

    @override
    def setup_module(self, module: Module) -> Module:
        """Parameters and buffers from rank 0; gradient hooks installed (the module
        is not wrapped); torch.nn.SyncBatchNorm layers synchronize through ddplug."""
        assert self._ctx is not None
        torch_sync = [n for n, m in module.named_modules() if isinstance(m, SyncBatchNorm)]
        if torch_sync:
            module = _syncbn.convert_sync_batchnorm(module, only_torch_sync=True)
            self._log_rank_zero(f"{len(torch_sync)} torch.nn.SyncBatchNorm layer(s) synchronize through ddplug"
                                " (torch's needs GPU tensors and torch.distributed)")
        self._modules = [r for r in self._modules if r() is not None] + [weakref.ref(module)]
        broadcast_module(self._ctx, module)
        if any(p.requires_grad for p in module.parameters()):
            if self._grad_sync is not None:
                self._grad_sync.detach()
            self._grad_sync = GradientSync.from_context(self._ctx, module.parameters())
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
        return self._data.prepare(dataloader, name, framework_sampler=self._fabric_sampler,
                                  training=_trains(name, dataloader))

    @override
    def backward(self, tensor: Tensor, module: Optional[Module], *args: Any, **kwargs: Any) -> None:
        """Backward, then every gradient bucket reduced before returning."""
        super().backward(tensor, module, *args, **kwargs)
        if self._grad_sync is not None:
            self._grad_sync.finish()

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        self._finish_pending_sync()  # a plain loss.backward() instead of fabric.backward()
        out = super().optimizer_step(optimizer, **kwargs)
        self._commit_train_streams()
        self._after_optimizer_step((p for g in optimizer.param_groups for p in g["params"]),
                                   (b for r in self._modules if r() is not None for b in _syncbn.synced_buffers(r())))
        return out

    def step(self, optimizer: Any, closure: Any) -> Any:
        """One training step that survives a lost rank (``"elastic": {"on_peer_lost":
        "shrink"}``): ``closure()`` zeroes the gradients, computes the loss and calls
        ``fabric.backward``; then ``optimizer.step()``. When a rank is lost during
        it, the survivors re-form the group, deal the rest of the epoch among
        themselves and run the closure again on the same batch (the gradient is then
        the mean over the survivors' batches); a rank whose step completed elsewhere
        takes the others' parameters instead. Returns the closure's result (None
        for a step taken as done). Without shrink it is ``closure()`` then
        ``optimizer.step()``."""

        def attempt() -> Any:
            result = closure()
            self._finish_pending_sync()
            return result

        out, adopted = self._run_elastic(
            attempt, modules=lambda: [r() for r in self._modules if r() is not None], optimizers=[optimizer],
            buffers=lambda: [b for r in self._modules if r() is not None for b in _syncbn.synced_buffers(r())])
        if adopted:
            self._commit_train_streams()
        else:
            optimizer.step()
        return out

    # ------------------------------------------------------------------ collectives
    # all_gather, barrier and broadcast: the mixin's (DdplugParallel); Fabric's
    # name for the mixin's reduce:
    all_reduce = DdplugParallel.reduce

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

    # ------------------------------------------------------------------ helpers
    def _fabric_sampler(self, dataloader: DataLoader, evaluation: bool = False) -> Any:
        """Fabric's own sampler choice, for owner "framework"; for an evaluation
        stream the unrepeated DistributedSampler (every sample once), as the
        Trainer uses for predict."""
        if evaluation:
            from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

            return UnrepeatedDistributedSampler(dataloader.dataset, shuffle=False, **self.rank_kwargs)
        from lightning.fabric import Fabric

        return Fabric._get_distributed_sampler(dataloader, **self.rank_kwargs)

    def _on_audit_report(self, stream: StreamBatchSampler, report: Report) -> None:
        if self.global_rank == 0:
            self._print(report.text or report.summary)


def _trains(name: str, dataloader: DataLoader) -> bool:
    """A Fabric stream trains (lockstep, padded to equal lengths) unless it is named
    as an evaluation stream (val, test, predict, eval: :func:`name_stream`), or it
    neither shuffles nor is the first ("train") loader."""
    from .data.streams import is_evaluation

    if is_evaluation(name):
        return False
    if name == "train" or name.startswith("train."):
        return True
    return isinstance(getattr(dataloader, "sampler", None), RandomSampler)


DdplugStrategy.register_strategies(STRATEGY_REGISTRY)

__all__ = ["DdplugStrategy", "name_stream"]

