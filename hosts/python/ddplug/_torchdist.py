"""What to say when user code asks ``torch.distributed`` for its ranks while the
strategy was told to leave it uninitialised.

The strategies initialise ``torch.distributed`` on their run (backend "ddplug"),
so samplers written for DDP that take their ranks from it when ``num_replicas`` /
``rank`` are not given (``torch.utils.data.DistributedSampler``, GPT-SoVITS' bucket
sampler: ``dist.get_world_size()``, ``dist.get_rank()``) just work. With
``torch_distributed=False`` no process group is initialized, and torch raises
"Default process group has not been initialized" there. Answering those calls from
ddplug instead (patching ``torch.distributed``) would make ``get_rank()`` work and
the next ``dist.all_reduce`` fail, or make library code believe a process group
exists; so the Trainer strategy stops with an error that names the sampler and the
line, and says which arguments to pass — after which ddplug sees a rank-aware
sampler and leaves the split to it.
"""

from __future__ import annotations

import os
from typing import Optional

from .errors import TorchDistributedNotInitialized, status_code

_TORCH_DIST = os.sep + os.path.join("torch", "distributed") + os.sep


def _frames(exc: BaseException) -> list:
    out = []
    tb = exc.__traceback__
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def is_uninitialized_torch_distributed(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's "no default process group" error."""
    if not isinstance(exc, (ValueError, RuntimeError)):
        return False
    text = str(exc)
    return "process group has not been initialized" in text or "init_process_group" in text


def _where(frame, lineno: int) -> str:
    code = frame.f_code
    owner = frame.f_locals.get("self")
    name = f"{type(owner).__name__}.{code.co_name}" if owner is not None else code.co_name
    return f"{name} ({os.path.basename(code.co_filename)}:{lineno})"


def explain(exc: BaseException, hook: str, *, rank: int, world_size: int,
            rank_source: str) -> Optional[TorchDistributedNotInitialized]:
    """The actionable error for ``exc`` raised inside ``hook`` (e.g.
    "train_dataloader"), or None when ``exc`` is something else.

    rank_source: how the user gets the ranks there ("self.trainer")."""
    if not is_uninitialized_torch_distributed(exc):
        return None
    frames = _frames(exc)
    first = next((i for i, (f, _) in enumerate(frames) if _TORCH_DIST in f.f_code.co_filename), None)
    if first is None:
        return None
    called = f"torch.distributed.{frames[first][0].f_code.co_name}()"
    culprit = _where(*frames[first - 1]) if first > 0 else "a function"
    in_hook = next((f"{os.path.basename(f.f_code.co_filename)}:{n}" for f, n in reversed(frames[:first])
                    if f.f_code.co_name == hook), None)
    detail = (
        f"{hook}(){f' ({in_hook})' if in_hook else ''}: {culprit} called {called}, but the ddplug strategy"
        " runs without torch.distributed here (torch_distributed=False: no process group is initialized;"
        " ranks and collectives go through ddplug). Pass the ranks to the sampler explicitly: num_replicas="
        f"{rank_source}.world_size, rank={rank_source}.global_rank (here {world_size} and {rank}), or"
        f" **{rank_source}.distributed_sampler_kwargs. ddplug then sees a rank-aware sampler and lets it split"
        " the data (owner user)."
    )
    return TorchDistributedNotInitialized(status_code("UNSUPPORTED"), "UNSUPPORTED", "not supported", detail,
                                          f"rank {rank}")
