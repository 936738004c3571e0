"""What the Trainer strategy (:mod:`ddplug.lightning`) and the Fabric strategy
(:mod:`ddplug.fabric`) share, as a mixin placed before Lightning's
``ParallelStrategy`` in their bases: the ranks from the cluster environment, the
context opened with them, the properties every ParallelStrategy has, and the
collectives in Lightning's conventions, and torch.distributed initialised on that
context (backend "ddplug", :mod:`ddplug.distributed`) so that code speaking
torch.distributed — torchmetrics, samplers and WebDataset splitters asking
``dist.get_rank()``, ``dist.barrier()`` in user code — runs on the same run.
Each strategy keeps its own lifecycle methods (their signatures differ between
Trainer and Fabric)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional

import torch
from torch import Tensor

from lightning.fabric.plugins.environments import ClusterEnvironment, LightningEnvironment

from . import _abort, _join
from ._elastic import Elastic, commit_train_streams, gradient_sync_after, run_step
from ._c import _logbridge
from .config import ConfigSource, load
from .distributed import native
from .context import Context
from .data.streams import DataSplit
from .nn import functional
from .nn.gradsync import GradientSync, check_parameters_equal


# Where Lightning keeps rank_zero_only's rank, in the unified package and in the
# standalone ones (pytorch_lightning, lightning_fabric).
_RANK_ZERO_MODULES = ("lightning.fabric.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero",
                      "lightning_fabric.utilities.rank_zero", "pytorch_lightning.utilities.rank_zero")


def _env_int(*names: str) -> Optional[int]:
    for name in names:
        value = os.environ.get(name)
        if value:
            return int(value)
    return None


class MPILauncherEnvironment(ClusterEnvironment):
    """The processes were started by an MPI launcher — ``mpirun``/``mpiexec``
    (Open MPI's ``OMPI_COMM_WORLD_*``, hydra's ``PMI_*``) or ``srun`` with PMI or
    PMIx — read from the launcher's variables, without mpi4py (Lightning's own
    ``MPIEnvironment`` needs it). Ranks and world size are the launcher's, never
    recomputed from devices and nodes; the rendezvous is not the environment's
    business: libddplug learns it through the mpi plugin's bootstrap (or uses
    ``MASTER_ADDR``/``MASTER_PORT`` where they are set). The node's index is the
    one the run found by host identity, once the context is open."""

    def __init__(self) -> None:
        self._rank = _env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK") or 0
        self._size = _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS") or 1
        self._local = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID") or 0
        self._node: Optional[int] = _env_int("SLURM_NODEID")

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0") or 0)

    @staticmethod
    def detect() -> bool:
        env = os.environ
        return bool(env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE")
                    or (env.get("PMIX_RANK") and env.get("SLURM_NTASKS")))

    def world_size(self) -> int:
        return self._size

    def set_world_size(self, size: int) -> None:
        pass  # the launcher's

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        pass  # the launcher's

    def local_rank(self) -> int:
        return self._local

    def node_rank(self) -> int:
        return self._node if self._node is not None else 0

    def learn_node_rank(self, node_rank: int) -> None:
        """The node's index as the run found it (host identity)."""
        self._node = node_rank


def prefer_mpi_launcher(env: Optional[ClusterEnvironment]) -> Optional[ClusterEnvironment]:
    """Lightning's fallback environment (LightningEnvironment, when nothing it
    knows launched the process) replaced by :class:`MPILauncherEnvironment` when
    an MPI launcher did; any other choice stays."""
    if type(env) is LightningEnvironment and MPILauncherEnvironment.detect() \
            and not os.environ.get("LOCAL_RANK"):
        return MPILauncherEnvironment()
    return env


class DdplugParallel:
    """Mixin: needs ``parallel_devices``, ``cluster_environment``, ``local_rank``,
    ``node_rank``, ``global_rank`` and ``world_size`` from ParallelStrategy."""

    parallel_devices: Any
    local_rank: int
    node_rank: int
    global_rank: int
    world_size: int

    def _ddplug_init(self, config: ConfigSource, timeout_s: Optional[float],
                     torch_distributed: Optional[bool] = None) -> None:
        self._config_source = config
        self._timeout_s = timeout_s
        self._torch_distributed = torch_distributed
        self._torch_dist_ours = False
        self._num_nodes = 1
        self._ctx: Optional[Context] = None
        self._grad_sync: Optional[GradientSync] = None
        self._data: Optional[DataSplit] = None
        self._optimizer_steps = 0
        self._elastic: Optional[Elastic] = None

    # ---- properties every ParallelStrategy has -------------------------------
    @property
    def cluster_environment(self) -> Optional[ClusterEnvironment]:
        """Lightning's choice, except that a process an MPI launcher started
        gets :class:`MPILauncherEnvironment` where Lightning would fall back to
        its own (no mpi4py needed)."""
        return self.__dict__.get("_ddplug_cluster_env")

    @cluster_environment.setter
    def cluster_environment(self, env: Optional[ClusterEnvironment]) -> None:
        self.__dict__["_ddplug_cluster_env"] = prefer_mpi_launcher(env)

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        devices = self.parallel_devices
        if self.local_rank >= len(devices) and all(d.type == "cpu" for d in devices):
            return devices[0]  # an MPI launcher's ranks on one CPU device each
        return devices[self.local_rank]

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
    def rank_kwargs(self) -> dict:
        """{"num_replicas", "rank"} with global ranks, for a user's own rank-aware
        sampler."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def context(self) -> Optional[Context]:
        """The ddplug context of this run (None before setup_environment)."""
        return self._ctx

    @property
    def gradient_sync(self) -> Optional[GradientSync]:
        """The gradient sync of the model (Trainer) or module (Fabric) set up
        for training; None before."""
        return self._grad_sync

    @property
    def streams(self) -> dict:
        """{stream name: StreamBatchSampler} of the managed DataLoaders."""
        return dict(self._data.streams) if self._data is not None else {}

    # ---- the launcher's secret ---------------------------------------------------
    def _secret_for_launched_ranks(self) -> None:
        """Before Lightning's (or Fabric's) launcher starts this node's other
        ranks from this process: put a fresh per-run secret in the config's
        ``rendezvous.secret_env`` variable (DDPLUG_SECRET) unless one is set, so
        the children inherit it and the rendezvous store refuses outsiders (a
        local process could otherwise forge an abort). Not with several nodes:
        each node's launcher would make its own — set the same secret on every
        node (README, "Secrets"); nor when something else starts the processes
        (torchrun, SLURM: they bring their own environment)."""
        env = self.cluster_environment
        if env is None or env.creates_processes_externally or self.num_nodes > 1 or self.num_processes < 2:
            return
        import os
        import secrets

        from .config import load

        cfg = load(self._config_source)
        try:
            var = cfg.get("rendezvous.secret_env", "DDPLUG_SECRET") or "DDPLUG_SECRET"
        finally:
            cfg.close()
        if not os.environ.get(var):
            os.environ[var] = secrets.token_hex(32)

    # ---- ranks and the context -------------------------------------------------
    def _assign_world_ranks(self) -> None:
        """Global rank and world size from node rank, local rank and processes per
        node, as Lightning's DDPStrategy does; every rank_zero_only learns it."""
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        from lightning_utilities.core.rank_zero import rank_zero_only as utils_rz

        utils_rz.rank = self.global_rank
        for spelling in _RANK_ZERO_MODULES:  # both spellings of Lightning, where imported
            mod = sys.modules.get(spelling)
            if mod is not None:
                mod.rank_zero_only.rank = self.global_rank

    def _open_context(self, framework: str) -> Context:
        """Join the run (once; later runs of the same strategy reuse it)."""
        env = self.cluster_environment
        if self._ctx is None or self._ctx.closed:
            self._ctx = self._join_run(env, framework)
            native.attach_context(self._ctx)  # its own allreduce (metrics, sync_dist) in C++
            if self.global_rank == 0:
                p = self._ctx.plugin
                self._print(
                    f"ddplug: plugin {p['name']} {p['version']} (plugin ABI {_abi(p['plugin_abi_version'])}),"
                    f" {self.world_size} ranks on {self._ctx.num_nodes} node(s), library {_lib_version()}"
                )
            self._init_torch_distributed()
            self._elastic = Elastic(self._ctx, streams=lambda: self.streams, log=self._log_rank_zero,
                                    torch_distributed=lambda: self._torch_dist_ours)
        return self._ctx

    def _join_run(self, env: Any, framework: str) -> Context:
        if isinstance(env, MPILauncherEnvironment) or (
                type(env).__name__ == "MPIEnvironment" and MPILauncherEnvironment.detect()):
            # The launcher's world, as libddplug discovers it; the rendezvous
            # through the mpi plugin's bootstrap unless MASTER_ADDR is set.
            # (Lightning's own MPIEnvironment, chosen where mpi4py is installed,
            # gives the same ranks: the same world.)
            ctx = _join.open_run(self._config_source, device=self.root_device, framework=framework,
                                 timeout_s=self._timeout_s)
            if isinstance(env, MPILauncherEnvironment):
                env.learn_node_rank(ctx.node_rank)
            return ctx
        many = self.world_size > 1
        return _join.open_context(
            self._config_source,
            rank=self.global_rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            local_world_size=self.num_processes,
            node_rank=self.node_rank,
            main_address=getattr(env, "main_address", None) if many else None,
            main_port=getattr(env, "main_port", None) if many else None,
            device=self.root_device,
            framework=framework,
            timeout_s=self._timeout_s,
        )

    def _wants_torch_distributed(self) -> bool:
        """The strategy's ``torch_distributed`` argument, else the config's
        "torch_distributed" key (default true)."""
        if self._torch_distributed is not None:
            return bool(self._torch_distributed)
        assert self._ctx is not None
        return bool(self._ctx.config.get("torch_distributed", True))

    def _init_torch_distributed(self) -> None:
        """torch.distributed's default group on this run's context (collective)."""
        ctx = self._ctx
        assert ctx is not None
        if not self._wants_torch_distributed():
            self._log_rank_zero("torch.distributed is left uninitialised (torch_distributed=False): code that asks"
                                " it for ranks or collectives fails; pass ranks from the strategy instead")
            return
        import torch.distributed as dist

        from . import distributed as ddist

        if dist.is_available() and dist.is_initialized():
            if ddist.context_of() is not ctx:
                self._log_rank_zero(f"torch.distributed was already initialised (backend {dist.get_backend()}):"
                                    " left as it is; torch.distributed calls do not go through this run")
            return
        self._torch_dist_ours = ddist.init_from_context(ctx, timeout_s=None)
        if self._torch_dist_ours:
            self._log_rank_zero(f"torch.distributed initialised with backend \"ddplug\" on this run ({ctx.world_size}"
                                " ranks): torch.distributed calls (torchmetrics, samplers, dist.barrier) go through"
                                " ddplug")

    def _destroy_torch_distributed(self) -> None:
        ctx = self._ctx
        if self._torch_dist_ours and ctx is not None and not ctx.closed:
            from . import distributed as ddist

            ddist.destroy_for_context(ctx)
        self._torch_dist_ours = False

    def _abort_for(self, exception: BaseException) -> None:
        """Abort the run everywhere so the other ranks fail now, with this rank's
        error, instead of waiting for a collective timeout (not for errors every
        rank raises by itself)."""
        _abort.abort_for(self._ctx, self.global_rank, exception)

    def _live(self) -> Optional[Context]:
        ctx = self._ctx
        return ctx if ctx is not None and not ctx.closed else None

    # ---- collectives in Lightning's conventions (Trainer and Fabric alike) ------
    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Any = "mean") -> Any:
        """In place, like DDPStrategy.reduce: "mean"/"avg" averages, "sum" sums,
        ReduceOp values map to ddplug's ops. Non-tensors come back unchanged.
        (Fabric calls it all_reduce.)"""
        ctx = self._live()
        if not isinstance(tensor, Tensor) or ctx is None:
            return tensor
        return functional.reduce(ctx, tensor, reduce_op)

    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """Shape (world_size, *tensor.shape), rank order."""
        ctx = self._live()
        if ctx is None:
            return tensor.unsqueeze(0)
        return functional.all_gather(ctx, tensor, sync_grads)

    def barrier(self, name: Optional[str] = None) -> None:
        ctx = self._live()
        if ctx is not None:
            ctx.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        ctx = self._live()
        return obj if ctx is None else ctx.broadcast_object(obj, src)

    def _finish_pending_sync(self) -> None:
        """Finish a gradient round a backward outside the framework's started."""
        gs = self._grad_sync
        if gs is not None and gs.enabled and gs.round_open:
            gs.finish()

    def _after_optimizer_step(self, params: Any, buffers: Any = ()) -> None:
        """Every "checks.param_sync_every" optimizer steps: check that every rank
        holds the same parameters and synchronized buffers (collective)."""
        self._optimizer_steps += 1
        ctx = self._live()
        if ctx is None:
            return
        every = getattr(self, "_param_sync_every", None)
        if every is None:
            every = self._param_sync_every = int(ctx.config.get("checks.param_sync_every", 0) or 0)
        if every > 0 and self._optimizer_steps % every == 0:
            check_parameters_equal(ctx, params, self._optimizer_steps, buffers)

    # ---- elastic in place (ddplug._elastic) ----------------------------------------
    @property
    def membership_changes(self) -> list:
        """One dict per in-place shrink so far (who was lost, the new world size,
        the train stream's batches per rank and global batch size)."""
        return list(self._elastic.events) if self._elastic is not None else []

    def _elastic_wanted(self) -> bool:
        """Whether the config (before the run is joined) asks for in-place shrink."""
        try:
            cfg = load(self._config_source)
        except Exception:  # the run's open reports a bad config
            return False
        try:
            return str(cfg.get("elastic.on_peer_lost", "stop")) == "shrink"
        finally:
            cfg.close()

    def _run_elastic(self, attempt: Callable[[], Any], *, modules: Callable[[], Iterable[torch.nn.Module]],
                     optimizers: Iterable[Any], buffers: Callable[[], Iterable[Tensor]] = lambda: ()) -> tuple:
        """Run one step; a rank lost during it (shrink mode) makes the survivors
        re-form and redo it, or take it as done (ddplug._elastic.run_step)."""
        return run_step(self._elastic, attempt, modules=modules, optimizers=optimizers, buffers=buffers,
                        step=self._optimizer_steps,
                        after_change=lambda event: self._after_membership_change(event, modules))

    def _after_membership_change(self, event: dict, modules: Callable[[], Iterable[torch.nn.Module]]) -> None:
        """The strategy follows the re-formed world: ranks, the gradient sync."""
        ctx = self._ctx
        assert ctx is not None
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(ctx.rank)
            self.cluster_environment.set_world_size(ctx.world_size)
        from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rz
        from lightning_utilities.core.rank_zero import rank_zero_only as utils_rz

        fabric_rz.rank = utils_rz.rank = ctx.rank
        pl_rz = sys.modules.get("lightning.pytorch.utilities.rank_zero")
        if pl_rz is not None:
            pl_rz.rank_zero_only.rank = ctx.rank
        if self._grad_sync is not None:
            params = [p for m in modules() for p in m.parameters() if p.requires_grad]
            self._grad_sync = gradient_sync_after(ctx, self._grad_sync, params)

    def _commit_train_streams(self) -> None:
        """The optimizer step is done: the training streams commit its batches."""
        if self._data is not None:
            commit_train_streams(self._data.streams)

    def close(self) -> None:
        """Leave the run now (else at interpreter exit, so that several runs of one
        Trainer/Fabric share the context); the managed loaders' samplers are
        released with it."""
        if self._ctx is not None:
            self._destroy_torch_distributed()
            self._ctx.close()
            self._ctx = None
        self._data = None

    # ---- output -------------------------------------------------------------------
    def _log_rank_zero(self, line: str) -> None:
        if self.global_rank == 0:
            self._print(f"ddplug: {line}")

    @staticmethod
    def _print(text: str) -> None:
        _logbridge.report(text)  # the "ddplug" logger (stdout unless logging is configured)


# How long the survivors of a rank that exited with an error get to end on
# their own (ddplug fails their calls within milliseconds of the loss; they
# then raise, run their exception callbacks and write their logs) before the
# launching rank terminates every rank, as Lightning's observer does at once.
STOP_GRACE_S = 60.0


class _TolerantObserver(threading.Thread):
    """Lightning's ``_ChildProcessObserver`` polls the launched ranks every 5 s and
    SIGKILLs all of them, the launching rank 0 included, as soon as one exits with
    a non-zero code: whether rank 0 got to report the loss first was a race with
    that poll. This observer says which rank left, then:

    * with in-place shrink (``stop_grace_s`` None), lets the survivors go on;
    * otherwise gives the survivors ``stop_grace_s`` to end on their own, and only
      then terminates every rank, rank 0 included, as Lightning does.

    It stops once every child has exited."""

    def __init__(self, children: list, stop_grace_s: Optional[float], sleep_period: float = 5.0) -> None:
        super().__init__(daemon=True, name="ddplug-child-observer")
        self._children = children
        self._grace = stop_grace_s
        self._sleep_period = sleep_period
        self._told: set = set()
        self._deadline: Optional[float] = None

    def run(self) -> None:
        while True:
            time.sleep(self._sleep_period if self._deadline is None else 0.5)
            for i, proc in enumerate(self._children):
                if proc.poll() not in (None, 0) and i not in self._told:
                    self._told.add(i)
                    then = ("the survivors re-form the group (elastic.on_peer_lost = shrink); the others are"
                            " left running" if self._grace is None else
                            f"the survivors stop with its loss; a rank still running in {self._grace:.0f} s is"
                            " terminated")
                    logging.getLogger("ddplug").warning("ddplug: launched rank %d (pid %d) exited with %d: %s",
                                                        i + 1, proc.pid, proc.returncode, then)
                    if self._grace is not None and self._deadline is None:
                        self._deadline = time.monotonic() + self._grace
            if all(proc.returncode is not None for proc in self._children) and self._deadline is None:
                return
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._terminate_all()
                return

    def _terminate_all(self) -> None:
        logging.getLogger("ddplug").error(
            "ddplug: %.0f s after a launched rank exited with an error, this run is still going: terminating"
            " every rank (SIGKILL), as Lightning's launcher does", self._grace)
        for proc in self._children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def tolerant_launch(launcher: Any, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``_SubprocessScriptLauncher.launch`` with :class:`_TolerantObserver` in place
    of Lightning's observer (the launcher subclasses of the strategies call it;
    ``launcher.stop_grace_s``: None with in-place shrink, else STOP_GRACE_S)."""
    from lightning.fabric.utilities.distributed import _set_num_threads_if_needed

    launcher.cluster_environment.validate_settings(num_devices=launcher.num_processes,
                                                   num_nodes=launcher.num_nodes)
    if not launcher.cluster_environment.creates_processes_externally:
        launcher._call_children_scripts()
        _TolerantObserver(launcher.procs, getattr(launcher, "stop_grace_s", STOP_GRACE_S)).start()
    _set_num_threads_if_needed(num_processes=launcher.num_processes)
    return function(*args, **kwargs)


def _abi(v: int) -> str:
    return f"{v >> 16}.{v & 0xFFFF}"


def _lib_version() -> str:
    from ._c._capi import F

    return f"{F.ddplug_version_string().decode()} (host ABI {_abi(F.ddplug_abi_version())})"
