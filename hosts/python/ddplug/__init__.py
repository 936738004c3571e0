"""ddplug: data-parallel strategy plugins behind a stable C ABI — the Python host
adapter (ctypes binding of libddplug, no compiled extension).

For Lightning users, one line::

    import ddplug.lightning
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddplug")

``ddplug.fabric.DdplugStrategy`` does the same for Lightning Fabric, and
``ddplug.pytorch_lightning`` / ``ddplug.lightning_fabric`` for the standalone
packages; ``strategy="ddplug"`` works in all four after ``import ddplug``. The rest of
this package is the binding those strategies are built from: :class:`Context`
(joining a run, collectives), :class:`~ddplug.config.Config`, the samplers, the
audit and what a sampler declares to it (:func:`declare`), :func:`shard` for
iterable datasets, :class:`SyncBatchNorm`, and :func:`run_once` / :func:`once`.

Errors: every failing library call raises a :class:`DdplugError` subclass named
after its status (``ddplug.Timeout``, ``ddplug.PeerLost``, ``ddplug.Aborted``,
``ddplug.AuditFailed``, ...; the same classes as in :mod:`ddplug.errors`).
"""

from __future__ import annotations

__version__ = "0.2.0"

from .config import Config  # noqa: E402
from .context import Context  # noqa: E402
from .errors import (  # noqa: E402
    AbiMismatch,
    Aborted,
    AuditFailed,
    ConfigError,
    DdplugError,
    DdplugWarning,
    InternalError,
    InvalidArgument,
    Mismatch,
    NoMemory,
    NotFound,
    ParametersDiffer,
    PeerLost,
    SplitConflict,
    SystemFailure,
    Timeout,
    TorchDistributedNotInitialized,
    Unsupported,
)
from .distributed.registration import install as _install_backend  # noqa: E402
from .runonce import RunOnceFailed, once, run_once  # noqa: E402

_install_backend()  # the torch.distributed backend "ddplug" (see ddplug.distributed)


def __getattr__(name: str):
    # Imported on first use: they need torch, which the binding alone does not.
    if name == "rank_aware":
        from .data.ownership import rank_aware

        return rank_aware
    if name == "declare":
        from .data.declarations import declare

        return declare
    if name == "shard":
        from .data.iterable import shard

        return shard
    if name == "SyncBatchNorm":
        from .nn.syncbn import SyncBatchNorm

        return SyncBatchNorm
    raise AttributeError(f"module 'ddplug' has no attribute {name!r}")


def library_version() -> str:
    """The loaded libddplug's release version ("0.2.0")."""
    from ._c._capi import F

    return F.ddplug_version_string().decode()


def library_path() -> str:
    """Where libddplug was loaded from."""
    from ._c import _capi

    return _capi.path()


__all__ = [
    "AbiMismatch",
    "Aborted",
    "AuditFailed",
    "Config",
    "ConfigError",
    "Context",
    "DdplugError",
    "DdplugWarning",
    "InternalError",
    "InvalidArgument",
    "Mismatch",
    "NoMemory",
    "NotFound",
    "ParametersDiffer",
    "PeerLost",
    "RunOnceFailed",
    "SplitConflict",
    "SyncBatchNorm",
    "SystemFailure",
    "Timeout",
    "TorchDistributedNotInitialized",
    "Unsupported",
    "library_path",
    "library_version",
    "declare",
    "once",
    "rank_aware",
    "run_once",
    "shard",
]


def _register_with_lightning() -> None:
    """``strategy="ddplug"`` by name in every spelling of Lightning
    (lightning.pytorch, pytorch_lightning, lightning.fabric, lightning_fabric):
    Lightning resolves strategy names from its registries and reads no entry
    points for them, so ``import ddplug`` registers (see :mod:`ddplug._flavours`:
    at once where Lightning is imported, else as soon as it is)."""
    try:
        from . import _flavours

        _flavours.install()
    except Exception:  # a broken Lightning install must not break the binding
        pass


_register_with_lightning()
