"""Elastic in place, for the adapters (Lightning's Trainer and Fabric strategies,
:mod:`ddplug.torch`): what a survivor does when a rank is lost in the middle of a
step, with ``"elastic": {"on_peer_lost": "shrink"}`` in the config.

A step's collective (the gradient allreduce, a synced metric) raises
:class:`~ddplug.errors.PeerLost`; the adapter catches it around the step and calls
:meth:`Elastic.recover`, which

1. re-forms the group over the survivors (:meth:`Context.shrink`: a new
   generation, ranks renumbered in the order of their previous ranks);
2. deals the rest of every stream's epoch over them
   (:meth:`StreamBatchSampler.reform`): each survivor keeps the batches it drew,
   the lost ranks' unfinished batches are dealt first;
3. re-initialises torch.distributed's default group on the new world, where the
   strategy initialised it;
4. takes the parameters and optimizer state of a survivor that completed the
   step when this one's allreduce failed (its batch was in that allreduce: the
   step is committed on its behalf), and verifies that every survivor holds the
   same parameters (the parameter check of ``checks.param_sync_every``);
5. says what changed: one warning line (who left, how many remain, the train
   stream's batches per rank and global batch size), and the same as a dict the
   Trainer strategy logs as metrics.

The adapter then redoes the step in flight among the survivors — the closure
recomputes its loss and gradients on the same batch — unless it was committed on
this rank's behalf. Loss scaling: each rank's loss is the mean over its own batch
and the gradients are averaged over the ranks taking part (``gradients.average``),
so the redone step's gradient is the mean over the survivors' batches: the global
batch shrinks from W·B to W'·B samples and the learning rate is not rescaled.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from .context import Context
from .errors import PeerLost


class Elastic:
    """The in-place shrink of one adapter's run (see the module doc).

    Args:
        ctx: the run's context.
        streams: returns the adapter's managed streams ({name: StreamBatchSampler}).
        log: where the warning line goes (rank 0 prints it).
        torch_distributed: returns whether the adapter initialised
            torch.distributed's default group on ``ctx`` (then it is re-created).
    """

    def __init__(self, ctx: Context, *, streams: Callable[[], dict], log: Callable[[str], None],
                 torch_distributed: Callable[[], bool] = lambda: False) -> None:
        self.ctx = ctx
        self._streams = streams
        self._log = log
        self._torch_distributed = torch_distributed
        self.enabled = str(ctx.config.get("elastic.on_peer_lost", "stop")) == "shrink"
        self.events: list = []  # one dict per membership change

    def recoverable(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a lost rank this run re-forms after."""
        return self.enabled and isinstance(exc, PeerLost) and not self.ctx.closed

    def train_streams(self) -> list:
        return [s for name, s in sorted(self._streams().items()) if not s.evaluation]

    def recover(self, exc: BaseException, *, modules: Iterable[torch.nn.Module] = (),
                optimizers: Iterable[Any] = (), buffers: Callable[[], Iterable[torch.Tensor]] = lambda: (),
                step: int = 0) -> int:
        """Re-form, re-deal, make the replicas equal (see the module doc). Returns
        how many steps were committed on this rank's behalf (0: redo the step).
        Raises the re-formation's error, chained to ``exc``, when the run cannot go
        on (the store's rank lost, fewer ranks than elastic.min_world_size)."""
        ctx = self.ctx
        committed = {s.name: s.committed_in_epoch for s in self.train_streams()}
        previous = ctx.world_size
        try:
            m = ctx.shrink()
        except Exception as err:
            raise err from exc
        adopted = 0
        for name, stream in sorted(self._streams().items()):
            got = stream.reform()
            if not stream.evaluation:
                adopted = max(adopted, int(got))
        if self._torch_distributed():
            from . import distributed as ddist

            ddist.destroy_for_context(ctx)
            ddist.init_from_context(ctx, timeout_s=None)
        modules, optimizers = list(modules), list(optimizers)
        self._equalize(adopted, modules, optimizers)
        from .nn.gradsync import check_parameters_equal

        params = [p for mod in modules for p in mod.parameters()]
        if params:
            check_parameters_equal(ctx, params, step, buffers())
        event = self._describe(m, previous, committed, adopted)
        self.events.append(event)
        return adopted

    def _equalize(self, adopted: int, modules: list, optimizers: list) -> None:
        """A survivor one step behind takes the parameters and optimizer state of
        the first survivor that completed the step."""
        import numpy as np

        flags = np.empty(self.ctx.world_size, dtype=np.int64)
        self.ctx.allgather(np.array([adopted], dtype=np.int64), flags)
        if not flags.any():
            return  # every survivor is at the same step: the replicas are equal
        src = int(np.flatnonzero(flags == 0)[0]) if (flags == 0).any() else 0
        from .nn.gradsync import broadcast_module

        for mod in modules:
            broadcast_module(self.ctx, mod, root=src)
        for opt in optimizers:
            state = self.ctx.broadcast_object(opt.state_dict() if self.ctx.rank == src else None, src)
            if self.ctx.rank != src:
                opt.load_state_dict(state)

    def _describe(self, m: dict, previous: int, committed: dict, adopted: int) -> dict:
        world = m["world_size"]
        event = {"generation": m["generation"], "lost": m["lost"], "lost_count": m["lost_count"],
                 "previous_world_size": previous, "world_size": world, "rank": m["rank"],
                 "committed_before": committed, "adopted": adopted}
        parts = []
        for s in self.train_streams():
            batch = int(s.batch_size or 1)
            event.setdefault("batches_per_rank", len(s))
            event.setdefault("global_batch_size", world * batch)
            parts.append(f"stream '{s.name}': {len(s)} batches per rank this epoch, global batch"
                         f" {world * batch} ({world} x {batch})")
        self._log(f"WARNING: lost rank{'s' if m['lost_count'] != 1 else ''} {m['lost']} of {previous}:"
                  f" {world} rank{'s' if world != 1 else ''} remain (generation {m['generation']})"
                  + ("; " + "; ".join(parts) if parts else ""))
        return event

    @staticmethod
    def metrics(event: dict) -> dict:
        """An event as logger metrics (the Trainer strategy logs them)."""
        out = {"ddplug/world_size": float(event["world_size"]),
               "ddplug/lost_ranks": float(event["lost_count"]),
               "ddplug/generation": float(event["generation"])}
        if "batches_per_rank" in event:
            out["ddplug/batches_per_rank"] = float(event["batches_per_rank"])
            out["ddplug/global_batch_size"] = float(event["global_batch_size"])
        return out


def run_step(el: Optional[Elastic], attempt: Callable[[], Any], *,
             modules: Callable[[], Iterable[torch.nn.Module]], optimizers: Iterable[Any],
             buffers: Callable[[], Iterable[torch.Tensor]] = lambda: (), step: int = 0,
             after_change: Callable[[dict], None] = lambda event: None) -> tuple:
    """Run one step (``attempt``); when a rank is lost during it and ``el`` re-forms
    after it, recover (:meth:`Elastic.recover`), let the adapter follow the new
    world (``after_change(event)``), then redo the step among the survivors — or,
    when it was committed on this rank's behalf, take it as done. Returns
    (attempt's result, or None when taken as done; steps adopted)."""
    while True:
        try:
            return attempt(), 0
        except Exception as exc:
            if el is None or not el.recoverable(exc):
                raise
            adopted = el.recover(exc, modules=list(modules()), optimizers=optimizers, buffers=buffers, step=step)
            after_change(el.events[-1])
            if adopted:
                return None, adopted


def commit_train_streams(streams: dict) -> None:
    """An optimizer step is done: every training stream commits the batches it
    handed to the loop (what the host reported consumed, else its position)."""
    for stream in streams.values():
        if not stream.evaluation:
            stream.commit_to(stream.consumed - stream.consumed_offset if stream.consumed is not None
                             else stream.position)


def gradient_sync_after(ctx: Context, old: Optional[Any], params: Iterable[torch.nn.Parameter]) -> Any:
    """The gradient sync of a re-formed group: the old one's pending round is
    forgotten and its buckets (registered memory of the previous group) released,
    then a new one is attached to the same parameters."""
    from .nn.gradsync import GradientSync

    if old is not None:
        old.abandon()
        old.detach()
    sync = GradientSync.from_context(ctx, params)
    sync.attach()
    return sync
