"""The ``ddplug`` strategy for ``lightning.pytorch.Trainer``::

    import ddplug.lightning                      # registers strategy="ddplug"
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddplug")   # config from DDPLUG_CONFIG
    trainer = Trainer(devices=2, strategy=ddplug.lightning.DdplugStrategy(config="ddplug.json"))

Ranks come from Lightning's cluster environment and are passed to ddplug as
they are; collectives, gradients and the data split go through the run's
context, and torch.distributed is initialised on it (backend "ddplug"). What
the strategy does beyond DDPStrategy (one split owner per DataLoader, the
audit, run-once ``prepare_data``, synchronized batch norm, stream positions in
checkpoints, exact evaluation) is described in the package's README
(hosts/python/README.md). ``strategy="ddplug"`` by name needs ``import
ddplug.lightning`` first (or ``import ddplug`` after Lightning is imported):
Lightning reads no entry points for strategies.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Callable, Generator, Optional, Union

import torch
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn

from . import _torchdist
from ._strategy import STOP_GRACE_S, DdplugParallel, tolerant_launch
from .config import ConfigSource
from .data.audit import Report
from .data.streams import DataSplit, StreamBatchSampler
from .data import ledger
from .nn import syncbn as _syncbn
from .nn.gradsync import GradientSync, broadcast_module
from .runonce import once

log = logging.getLogger(__name__)


class DdplugSyncBatchNorm(LayerSync):
    """``Trainer(sync_batchnorm=True)`` under the ddplug strategy: every batch-norm
    layer becomes :class:`ddplug.nn.syncbn.SyncBatchNorm` (statistics over every rank
    through ddplug), and back to its original class in :meth:`revert`. The strategy
    puts it in place of Lightning's ``TorchSyncBatchNorm``, whose
    ``torch.nn.SyncBatchNorm`` needs torch.distributed."""

    @override
    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        return _syncbn.convert_sync_batchnorm(model)

    @override
    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        return _syncbn.revert_sync_batchnorm(model)


class _TolerantLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher (``python train.py`` with devices=N) whose observer lets
    the survivors of a lost rank go on (elastic.on_peer_lost = "shrink"), or stop
    on their own before it terminates them (``_strategy.STOP_GRACE_S``), instead of
    SIGKILLing every rank at its next poll."""

    stop_grace_s: Optional[float] = STOP_GRACE_S

    @override
    def launch(self, function: Callable, *args: Any, trainer: Optional["pl.Trainer"] = None, **kwargs: Any) -> Any:
        return tolerant_launch(self, function, *args, **kwargs)


class DdplugStrategy(DdplugParallel, ParallelStrategy):
    """Multi-process data parallelism through libddplug (see the module doc).

    Args:
        config: a path, JSON text, dict or :class:`ddplug.config.Config`; None reads
            ``DDPLUG_CONFIG`` (JSON text or a path), else the defaults.
        accelerator, parallel_devices, cluster_environment, checkpoint_io,
        precision_plugin: as for every Lightning ParallelStrategy.
        timeout_s: rendezvous timeout override (seconds).
        torch_distributed: initialise torch.distributed with the backend
            "ddplug" on the run's context (default True; None reads the
            config's "torch_distributed" where the library knows that key).
    """

    strategy_name = "ddplug"

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[list] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        timeout_s: Optional[float] = None,
        torch_distributed: Optional[bool] = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._ddplug_init(config, timeout_s, torch_distributed)
        self._trainer: Optional["pl.Trainer"] = None
        self._user_use_distributed_sampler: Optional[bool] = None
        self._stream_counters: dict = {}
        self._runs = 0
        self._prepare_data_patched: Optional[tuple] = None
        self._guarded_sources: list = []
        self._bn_converted = False
        self._ckpt_states: Optional[dict] = None  # stream positions of a loaded checkpoint
        self._offset_epoch: Optional[tuple] = None  # the train stream's epoch its consumed_offset is for

    # ------------------------------------------------------------------ properties
    # root_device, num_nodes, num_processes, context, streams: DdplugParallel.

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict:
        """Global ranks, for users who build their own rank-aware samplers."""
        return self.rank_kwargs

    @property
    def is_distributed(self) -> bool:
        """True: Lightning then syncs ``self.log(..., sync_dist=True)`` through
        :meth:`reduce` (lightning/pytorch/core/module.py reads it through the
        accelerator connector, accelerator_connector.py)."""
        return True

    # ------------------------------------------------------------------ lifecycle
    @override
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        self._secret_for_launched_ranks()  # the ranks the launcher starts inherit a per-run secret
        self._launcher = _TolerantLauncher(self.cluster_environment, self.num_processes, self.num_nodes)
        self._launcher.stop_grace_s = None if self._elastic_wanted() else STOP_GRACE_S

    def set_world_ranks(self) -> None:
        """Global rank and world size from node rank, local rank and processes per
        node, as DDPStrategy does; called by the accelerator connector."""
        self._assign_world_ranks()

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        reset_seed()
        self.set_world_ranks()
        self._runs += 1
        self._open_context(f"lightning {pl.__version__}")
        self._patch_prepare_data()

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        assert self.accelerator is not None
        assert self._ctx is not None
        self.accelerator.setup(trainer)
        self._trainer = trainer
        self._take_over_sampler_injection(trainer)
        if self._data is not None:
            self._data.close()  # the previous run's loaders
        self._data = DataSplit(
            self._ctx, "lightning",
            log=self._log_rank_zero,
            epoch_source=lambda: trainer.fit_loop.epoch_progress.current.processed,
            on_report=self._on_audit_report,
            should_audit=self._should_audit,
        )
        if self._ckpt_states is not None:
            self._data.restore(self._ckpt_states)
            self._ckpt_states = None
        self._guard_dataloader_hooks(trainer)
        trainer_fn = trainer.state.fn
        if (trainer_fn == TrainerFn.FITTING and self._elastic is not None and self._elastic.enabled
                and trainer.accumulate_grad_batches > 1):
            raise ValueError(
                f"ddplug: elastic.on_peer_lost = \"shrink\" redoes the step in flight from its batch when a rank"
                f" is lost; with accumulate_grad_batches={trainer.accumulate_grad_batches} the earlier"
                " micro-batches' gradients are gone by then. Use accumulate_grad_batches=1, or restart mode"
                " (on_peer_lost \"stop\" under ddplug run --max-restarts or torchrun --max-restarts, resuming"
                " with ckpt_path=\"last\")")
        assert self.model is not None
        if trainer_fn == TrainerFn.FITTING:
            self._sync_batchnorm()
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        broadcast_module(self._ctx, self.model)
        if trainer_fn == TrainerFn.FITTING:
            self._grad_sync = GradientSync.from_context(self._ctx, self.model.parameters())
            self._grad_sync.attach()
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer_fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Resolve, claim and install the split owner of one loader (Lightning calls
        this for every train/val/test/predict loader right after its own — here
        disabled — sampler injection, data_connector.py)."""
        trainer = self._trainer
        if trainer is None or self._data is None:
            return dataloader
        stage = trainer.state.stage
        prefix = stage.dataloader_prefix if stage is not None else "data"
        index = self._stream_counters.get(prefix, 0)
        self._stream_counters[prefix] = index + 1
        name = prefix if index == 0 else f"{prefix}.{index}"
        rewrap = None
        if stage == RunningStage.PREDICTING:
            # Predict re-creates the loader even with injection off, wrapping its batch
            # sampler to track indices (pytorch/utilities/data.py); keep that.
            from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper

            rewrap = _IndexBatchSamplerWrapper
        note = ""
        if self._user_use_distributed_sampler is False:
            # shown only where ddplug splits (a rank-aware loader keeps its own split either way)
            note = ("; Trainer(use_distributed_sampler=False) does not keep this loader whole under ddplug: it is"
                    " not rank-aware, so ddplug's sampler splits it; to keep it as it is, declare it"
                    f" ddplug.rank_aware(...) or set data_split.streams.{name}.owner = \"user\"")
        return self._data.prepare(
            dataloader, name,
            framework_sampler=lambda dl, evaluation=False: self._lightning_sampler(dl, stage, evaluation),
            rewrap=rewrap,
            training=stage == RunningStage.TRAINING if stage is not None else None,
            note=note,
        )

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Tell the train stream how many batches the loop consumed (its checkpoint
        position), which the DataLoader's prefetching would otherwise overstate."""
        if self._data is None:
            return
        train = [s for n, s in self._data.streams.items() if n == "train" or n.startswith("train.")]
        if len(train) == 1:
            stream = train[0]
            if self._offset_epoch != (id(stream), stream.epoch, stream._iterations):
                # the epoch's first batch here: the loop's count minus what the stream committed
                # (0 unless the loop resumed a checkpoint without ddplug's state)
                self._offset_epoch = (id(stream), stream.epoch, stream._iterations)
                stream.consumed_offset = max(0, batch_idx - stream.committed_in_epoch) if stream.elastic else 0
            stream.consumed = batch_idx + 1

    @override
    def pre_backward(self, closure_loss: Tensor) -> None:
        self._finish_pending_sync()  # a previous backward's round that nobody finished

    @override
    def post_backward(self, closure_loss: Tensor) -> None:
        """Every gradient bucket is reduced before backward returns to the loop."""
        if self._grad_sync is not None:
            self._grad_sync.finish()

    @contextmanager
    @override
    def block_backward_sync(self) -> Generator:
        """No gradient communication inside (gradient accumulation: Lightning
        blocks every micro-batch but the last, loops/optimization/automatic.py)."""
        if self._grad_sync is None:
            yield None
            return
        with self._grad_sync.no_sync():
            yield None

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: Optional[Union["pl.LightningModule", torch.nn.Module]] = None,
        **kwargs: Any,
    ) -> Any:
        """The step; with in-place shrink, a rank lost during it makes the survivors
        re-form and redo it: the closure zeroes the gradients and recomputes the
        loss on the same batch (ddplug._elastic). The training streams commit the
        step's batches."""
        self._finish_pending_sync()  # gradients from a backward outside Lightning's
        module = self.lightning_module
        assert module is not None
        out, _ = self._run_elastic(
            lambda: ParallelStrategy.optimizer_step(self, optimizer, closure, model, **kwargs),
            modules=lambda: [self.lightning_module], optimizers=self.optimizers,
            buffers=lambda: _syncbn.synced_buffers(self.lightning_module))
        self._commit_train_streams()
        self._after_optimizer_step(module.parameters(), _syncbn.synced_buffers(module))
        return out

    def _after_membership_change(self, event: dict, modules: Callable[[], Any]) -> None:
        """Besides ranks and gradient sync: the loop's batch count of the epoch
        follows the new dealing, and the loggers get the change as metrics."""
        super()._after_membership_change(event, modules)
        trainer = self._trainer
        if trainer is None:
            return
        train = [s for n, s in self.streams.items() if not s.evaluation]
        if len(train) == 1:
            total = len(train[0])
            trainer.fit_loop.max_batches = total
            fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
            if fetcher is not None and getattr(fetcher, "length", None) is not None:
                fetcher.length = total
                fetcher.done = fetcher.fetched >= total
                # the loop took the batch in flight for the epoch's last one
                trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = fetcher.done
        from ._elastic import Elastic

        for logger in trainer.loggers:
            logger.log_metrics(Elastic.metrics(event), step=trainer.global_step)

    # ------------------------------------------------------------------ collectives
    # reduce, all_gather and broadcast: the mixin's (DdplugParallel).
    @override
    def barrier(self, name: Optional[str] = None) -> None:
        if name and name.endswith("_dataloader()"):
            # Lightning requests a stage's loaders, then calls this barrier, then
            # processes them: restart the stream numbering of that stage.
            self._stream_counters.pop(name[: -len("_dataloader()")], None)
        DdplugParallel.barrier(self, name)

    # ------------------------------------------------------------------ checkpoints
    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        """The streams' epochs and positions go under ``checkpoint["ddplug"]``, a key
        other strategies ignore (a stateful loader in Lightning's loop state would
        make ``strategy="ddp"`` refuse the checkpoint)."""
        if self._data is not None and self._data.streams:
            checkpoint["ddplug"] = {"version": 1, "streams": self._data.states()}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        if self.is_global_zero:
            ledger.note(filepath, "global_step", int(checkpoint.get("global_step", 0) or 0),
                        epoch=int(checkpoint.get("epoch", 0) or 0))

    @override
    def load_checkpoint(self, checkpoint_path: Any, **kwargs: Any) -> dict:
        """Keep the checkpoint's stream positions for the loaders set up next; a
        checkpoint from another strategy has none: its epoch starts at its first
        batch."""
        checkpoint = super().load_checkpoint(checkpoint_path, **kwargs)
        older = _ledger_newer(checkpoint_path, checkpoint)
        if older:
            self._log_rank_zero(f"WARNING: {older}")
        saved = checkpoint.get("ddplug") if isinstance(checkpoint, dict) else None
        if isinstance(saved, dict) and isinstance(saved.get("streams"), dict):
            self._ckpt_states = dict(saved["streams"])
            if self._data is not None:  # loaded after setup (restore_checkpoint_after_setup)
                self._data.restore(self._ckpt_states)
                self._ckpt_states = None
        else:
            self._ckpt_states = None
            self._log_rank_zero(f"checkpoint {checkpoint_path} holds no ddplug stream positions (saved by"
                                " another strategy): a resumed epoch starts at its first batch")
        return checkpoint

    # ------------------------------------------------------------------ registration, teardown
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "ddplug", cls, description="ddplug: data-parallel strategy plugins (config from DDPLUG_CONFIG)",
            override=True,
        )

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Abort the run everywhere so the other ranks fail now instead of waiting
        for a collective timeout (not for errors every rank raises by itself)."""
        self._abort_for(exception)

    @override
    def teardown(self) -> None:
        if self._grad_sync is not None:
            self._grad_sync.detach()
            self._grad_sync = None
        # The loaders stay usable until the next run or close(): Lightning's loops
        # still ask their length after the strategy's teardown (trainer.py).
        self._restore_sampler_injection()
        self._unpatch_prepare_data()
        self._unguard_dataloader_hooks()
        if self._bn_converted and self.model is not None:
            # the model leaves with the layer classes it came with (DDPStrategy.teardown
            # reverts its layer sync too, ddp.py)
            self.model = _syncbn.revert_sync_batchnorm(self.model)
            self._bn_converted = False
        aborted = self._ctx is not None and self._ctx.aborted
        super().teardown()
        if aborted and self._ctx is not None:
            try:
                self._ctx.close()
            except Exception as exc:  # the abort is the error that matters
                log.debug("ddplug: close after abort: %s", exc)
            self._ctx = None

    # ------------------------------------------------------------------ helpers
    def _sync_batchnorm(self) -> None:
        """``sync_batchnorm=True`` (Lightning's TorchSyncBatchNorm) becomes ddplug's
        layer sync; another LayerSync plugin is applied as given; torch.nn.SyncBatchNorm
        layers left in the model (the user's own, or from such a plugin) are replaced
        too: torch's refuses CPU tensors, and normalizes per rank, silently, without
        torch.distributed (torch_distributed=False)."""
        assert self.model is not None
        if type(self._layer_sync) is TorchSyncBatchNorm:
            self._layer_sync = DdplugSyncBatchNorm()
        if self._layer_sync is not None:
            self.model = self._layer_sync.apply(self.model)
        torch_sync = [n for n, m in self.model.named_modules() if isinstance(m, torch.nn.SyncBatchNorm)]
        if torch_sync:
            self.model = _syncbn.convert_sync_batchnorm(self.model, only_torch_sync=True)
            shown = ", ".join(n or "(the model)" for n in torch_sync[:5]) + (" ..." if len(torch_sync) > 5 else "")
            self._log_rank_zero(f"{len(torch_sync)} torch.nn.SyncBatchNorm layer(s) ({shown}) synchronize"
                                " through ddplug (torch's needs GPU tensors and torch.distributed)")
        self._bn_converted = _syncbn.has_sync_batchnorm(self.model)
        if self._bn_converted and isinstance(self._layer_sync, DdplugSyncBatchNorm):
            self._log_rank_zero("sync_batchnorm: batch norm statistics over every rank, through ddplug")

    def _guard_dataloader_hooks(self, trainer: "pl.Trainer") -> None:
        """Turn torch's "default process group has not been initialized" from a
        ``*_dataloader()`` hook (a sampler asking torch.distributed for its ranks)
        into an error naming the sampler and the arguments to pass."""
        self._unguard_dataloader_hooks()
        loops = (trainer.fit_loop, trainer.fit_loop.epoch_loop.val_loop, trainer.validate_loop,
                 trainer.test_loop, trainer.predict_loop)
        for loop in loops:
            source = getattr(loop, "_data_source", None)
            if source is None or "dataloader" in vars(source):
                continue
            self._guarded_sources.append(source)
            source.dataloader = self._guarded(source)

    def _guarded(self, source: Any) -> Callable[[], Any]:
        request = source.dataloader

        def dataloader() -> Any:
            try:
                return request()
            except (ValueError, RuntimeError) as exc:
                err = _torchdist.explain(exc, source.name, rank=self.global_rank, world_size=self.world_size,
                                         rank_source="self.trainer")
                if err is None:
                    raise
                raise err from exc

        return dataloader

    def _unguard_dataloader_hooks(self) -> None:
        for source in self._guarded_sources:
            vars(source).pop("dataloader", None)
        self._guarded_sources = []

    def _take_over_sampler_injection(self, trainer: "pl.Trainer") -> None:
        conn = trainer._accelerator_connector
        if self._user_use_distributed_sampler is None:
            self._user_use_distributed_sampler = conn.use_distributed_sampler
        conn.use_distributed_sampler = False

    def _restore_sampler_injection(self) -> None:
        if self._trainer is not None and self._user_use_distributed_sampler is not None:
            self._trainer._accelerator_connector.use_distributed_sampler = self._user_use_distributed_sampler
        self._user_use_distributed_sampler = None

    def _lightning_sampler(self, dataloader: Any, stage: Optional[RunningStage], evaluation: bool = False) -> Any:
        """Lightning's own DistributedSampler for a loader (owner "framework"); for
        an evaluation stream its unrepeated form (the one it uses for predict), so
        evaluation stays exact."""
        from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
        from lightning.pytorch.utilities.data import _is_dataloader_shuffled

        trainer = self._trainer
        assert trainer is not None
        shuffle = True if stage == RunningStage.TRAINING else _is_dataloader_shuffled(dataloader)
        mode = RunningStage.PREDICTING if evaluation else stage
        return _get_distributed_sampler(dataloader, shuffle, overfit_batches=trainer.overfit_batches,
                                        mode=mode, **self.distributed_sampler_kwargs)

    def _should_audit(self, stream: StreamBatchSampler, total: int) -> bool:
        trainer = self._trainer
        if trainer is None:
            return True
        if trainer.sanity_checking:
            return False
        from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches

        prefix = stream.name.split(".")[0]
        limit = getattr(trainer, f"limit_{prefix}_batches", 1.0)
        stage = {"train": RunningStage.TRAINING, "val": RunningStage.VALIDATING,
                 "test": RunningStage.TESTING, "predict": RunningStage.PREDICTING}.get(prefix)
        if stage is None:
            return True
        used = _parse_num_batches(stage, total, limit)
        if used < total:
            self._log_rank_zero(f"stream '{stream.name}': audit skipped: {used} of {total} batches per epoch"
                                f" are used (limit_{prefix}_batches)")
            return False
        return True

    def _on_audit_report(self, stream: StreamBatchSampler, report: Report) -> None:
        if self.global_rank == 0:
            self._print(report.text or report.summary)
            keys = [k for k in report.repeated_keys if k is not None]
            if keys:
                self._print(f"  repeated sample keys: {', '.join(str(k) for k in keys[:8])}")
        trainer = self._trainer
        if trainer is not None and report.verdict != "SKIPPED":
            for logger in trainer.loggers:
                logger.log_metrics(report.metrics(), step=trainer.global_step)

    def _patch_prepare_data(self) -> None:
        """Run prepare_data through run-once (node or global scope per
        prepare_data_per_node) so the other ranks wait for it and see its failure."""
        module = self.lightning_module
        trainer = getattr(module, "_trainer", None) if module is not None else None
        if trainer is None or self._ctx is None:
            return
        connector = trainer._data_connector
        if self._prepare_data_patched is None:
            self._prepare_data_patched = (connector, connector.__dict__.get("prepare_data"))
        run = self._runs
        ctx = self._ctx

        def prepare_data() -> None:
            # Lightning's rule (data_connector.py), with the barrier made real.
            from lightning.pytorch.trainer import call
            from lightning.pytorch.utilities.model_helpers import is_overridden

            for kind, obj in (("datamodule", trainer.datamodule), ("module", trainer.lightning_module)):
                if obj is None or not is_overridden("prepare_data", obj):
                    continue
                scope = "node" if obj.prepare_data_per_node else "global"
                with once(f"lightning/prepare_data/{kind}/{run}", scope, context=ctx) as runner:
                    if runner:
                        if kind == "datamodule":
                            call._call_lightning_datamodule_hook(trainer, "prepare_data")
                        else:
                            call._call_lightning_module_hook(trainer, "prepare_data")

        connector.prepare_data = prepare_data

    def _unpatch_prepare_data(self) -> None:
        if self._prepare_data_patched is None:
            return
        connector, original = self._prepare_data_patched
        if original is None:
            connector.__dict__.pop("prepare_data", None)
        else:
            connector.prepare_data = original
        self._prepare_data_patched = None


def _ledger_newer(filepath: Any, checkpoint: Any) -> str:
    """A sentence when the directory's ledger (ddplug.data.ledger) names a newer
    checkpoint than this one."""
    if not isinstance(checkpoint, dict):
        return ""
    step = int(checkpoint.get("global_step", 0) or 0)
    last = ledger.newer(filepath, "global_step", step)
    if last is None:
        return ""
    return (f"resuming from {filepath} (epoch {checkpoint.get('epoch')}, step {step}), but {last.get('path')}"
            f" (epoch {last.get('epoch')}, step {last.get('global_step')}) was saved after it: the"
            f" {int(last['global_step']) - step} steps between are trained again — resume from the last"
            " checkpoint (ckpt_path=\"last\") unless that is what you want")


DdplugStrategy.register_strategies(StrategyRegistry)

__all__ = ["DdplugStrategy", "DdplugSyncBatchNorm"]
