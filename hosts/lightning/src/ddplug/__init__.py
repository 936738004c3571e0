"""ddplug: data-parallel strategy plugins behind a stable C ABI — the Python host
adapter (ctypes binding of libddplug, no compiled extension).

For Lightning users, one line::

    import ddplug.lightning
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddplug")

``ddplug.fabric.DdplugStrategy`` does the same for Lightning Fabric. The rest of
this package is the binding those strategies are built from: :class:`Context`
(joining a run, collectives), :class:`~ddplug.config.Config`, the samplers, the
audit, and :func:`run_once` / :func:`once`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import Config  # noqa: E402
from .context import Context  # noqa: E402
from .errors import DdplugError  # noqa: E402
from .runonce import RunOnceFailed, once, run_once  # noqa: E402


def __getattr__(name: str):
    # Imported on first use: it needs torch, which the binding alone does not.
    if name == "rank_aware":
        from .ownership import rank_aware

        return rank_aware
    raise AttributeError(f"module 'ddplug' has no attribute {name!r}")


def library_version() -> str:
    """The loaded libddplug's release version ("0.1.0")."""
    from ._api import F

    return F.ddplug_version_string().decode()


def library_path() -> str:
    """Where libddplug was loaded from."""
    from . import _lib

    return _lib.path()


__all__ = [
    "Config",
    "Context",
    "DdplugError",
    "RunOnceFailed",
    "library_path",
    "library_version",
    "once",
    "rank_aware",
    "run_once",
]
