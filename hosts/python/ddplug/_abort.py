"""Aborting the run for one rank's error, so that the other ranks fail now,
with this rank's error, instead of waiting for a collective timeout: which
errors abort (not those every rank raises by itself), and the
``sys.excepthook`` that aborts when an exception ends the script.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import Any, Optional

from .context import Context
from .errors import AuditFailed, ParametersDiffer, SplitConflict, TorchDistributedNotInitialized
from .runonce import RunOnceFailed

log = logging.getLogger(__name__)


def raised_everywhere(exc: BaseException) -> bool:
    """Whether every rank raises ``exc`` by itself (a collective verdict: a failed
    audit, a split conflict found by agreement, a run-once failure, the parameter
    check, a sampler that needs torch.distributed), so aborting the run would
    only replace the other ranks' clear error with "aborted"."""
    return isinstance(exc, (AuditFailed, ParametersDiffer, SplitConflict, RunOnceFailed,
                            TorchDistributedNotInitialized))


def abort_for(ctx: Optional[Context], rank: int, exc: BaseException) -> None:
    """Abort the run everywhere with this rank's error, so the other ranks fail
    now instead of waiting for a collective timeout; not when the run is closed
    or aborted already, nor for errors every rank raises by itself."""
    if ctx is not None and not ctx.closed and not ctx.aborted and not raised_everywhere(exc):
        ctx.abort(f"rank {rank}: {type(exc).__name__}: {exc}"[:1000])


_hooked: "weakref.WeakSet[Context]" = weakref.WeakSet()


def abort_on_uncaught_exception(ctx: Context, rank: int) -> None:
    """An exception that ends this rank's script aborts the run from
    ``sys.excepthook`` (chained to the previous hook), so the other ranks' next
    or pending collective raises this rank's error instead of waiting for the
    collective timeout. Once per context."""
    if ctx in _hooked:
        return
    _hooked.add(ctx)
    ref = weakref.ref(ctx)
    previous = sys.excepthook

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        try:
            abort_for(ref(), rank, exc)
        except Exception as err:  # never hide the user's error behind ours
            log.debug("ddplug: abort from the exception hook failed: %s", err)
        previous(exc_type, exc, tb)

    sys.excepthook = hook
