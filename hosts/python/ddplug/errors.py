"""Errors: every failing libddplug call becomes a :class:`DdplugError` carrying the
status code, its name (``TIMEOUT``), the library's short message and the detail
sentence (rank, key, FILE:LINE:COLUMN, sequence number, what to do).

Status codes are never hand-copied: :func:`status_code` and :func:`status_names`
read the table from the library (``ddplug_status_name``), and each name maps to a
subclass below (unknown names map to :class:`DdplugError` itself).
"""

from __future__ import annotations

import functools
from typing import Optional


class DdplugError(RuntimeError):
    """A libddplug call failed.

    Attributes:
        status: the numeric status code.
        name: its name without prefix (``"TIMEOUT"``).
        detail: the library's detail sentence.
    """

    def __init__(self, status: int, name: str, message: str, detail: str, where: str = "") -> None:
        self.status = status
        self.name = name
        self.detail = detail
        head = f"{where}: " if where else ""
        text = detail if detail else message
        super().__init__(f"{head}{text} [{name}]")


class DdplugWarning(UserWarning):
    """A problem ddplug found that does not stop the run (e.g. a data stream it
    cannot audit)."""


class InvalidArgument(DdplugError, ValueError):
    pass


class ConfigError(DdplugError, ValueError):
    pass


class NotFound(DdplugError, LookupError):
    pass


class AbiMismatch(DdplugError):
    pass


class Unsupported(DdplugError):
    pass


class Timeout(DdplugError, TimeoutError):
    pass


class PeerLost(DdplugError):
    pass


class Mismatch(DdplugError):
    pass


class ParametersDiffer(Mismatch):
    """The parameter check (config "checks.param_sync_every") found ranks whose
    parameters differ from rank 0's; raised on every rank."""


class Aborted(DdplugError):
    pass


class TorchDistributedNotInitialized(Unsupported):
    """User code asked ``torch.distributed`` for ranks (a sampler built without
    ``num_replicas``/``rank``) in a run whose strategy leaves it uninitialised
    (``torch_distributed=False``); raised by the Trainer strategy with the
    culprit's name and what to pass instead. Every rank raises it by itself."""


class SplitConflict(DdplugError):
    pass


class AuditFailed(DdplugError):
    pass


class SystemFailure(DdplugError, OSError):
    pass


class InternalError(DdplugError):
    pass


class NoMemory(DdplugError, MemoryError):
    pass


_CLASS_BY_NAME = {
    "INVALID_ARGUMENT": InvalidArgument,
    "CONFIG": ConfigError,
    "NOT_FOUND": NotFound,
    "ABI_MISMATCH": AbiMismatch,
    "UNSUPPORTED": Unsupported,
    "TIMEOUT": Timeout,
    "PEER_LOST": PeerLost,
    "MISMATCH": Mismatch,
    "ABORTED": Aborted,
    "SPLIT_CONFLICT": SplitConflict,
    "AUDIT_FAILED": AuditFailed,
    "SYSTEM": SystemFailure,
    "INTERNAL": InternalError,
    "NO_MEMORY": NoMemory,
}


@functools.lru_cache(maxsize=None)
def status_names() -> dict:
    """{code: name} for every status the library knows (read from the library)."""
    from ._c._capi import F

    out = {}
    code = 0
    while True:
        name = F.ddplug_status_name(code).decode()
        if name == "UNKNOWN":
            break
        out[code] = name
        code += 1
    return out


@functools.lru_cache(maxsize=None)
def status_code(name: str) -> int:
    """The code of the status called ``name`` (``"TIMEOUT"``)."""
    for code, n in status_names().items():
        if n == name:
            return code
    raise KeyError(f"ddplug: the library has no status named {name!r}")


def class_for(name: str) -> type:
    return _CLASS_BY_NAME.get(name, DdplugError)


def make(status: int, detail: Optional[str] = None, where: str = "") -> DdplugError:
    """The exception for ``status``; detail defaults to this thread's last error."""
    from ._c._capi import F

    name = F.ddplug_status_name(status).decode()
    message = F.ddplug_strerror(status).decode()
    if detail is None:
        detail = (F.ddplug_last_error() or b"").decode("utf-8", "replace")
    return class_for(name)(status, name, message, detail, where)


def check(status: int, where: str = "", detail: Optional[str] = None) -> None:
    """Raise the matching :class:`DdplugError` unless ``status`` is OK (0)."""
    if status != 0:
        raise make(status, detail, where)
