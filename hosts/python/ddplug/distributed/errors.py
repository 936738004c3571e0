"""torch's exception types carrying ddplug's sentence.

Code written for torch.distributed catches torch's types: ``DistBackendError``
for a failed collective, ``DistStoreError`` for a rendezvous that timed out,
``DistNetworkError`` for a peer that could not be reached. Every error the
ddplug backend raises is one of those *and* the matching :mod:`ddplug.errors`
class (``except ddplug.PeerLost`` works too), with ddplug's detail sentence as
its message: which rank, which collective (sequence number), what to do.
"""

from __future__ import annotations

import functools
from typing import Optional

from torch.distributed import DistBackendError, DistNetworkError, DistStoreError

from .. import errors as _errors
from ..errors import DdplugError


@functools.lru_cache(maxsize=None)
def _combined(torch_cls: type, ddplug_cls: type) -> type:
    """The class deriving from both (cached: one class per pair, so that
    ``except`` clauses and ``isinstance`` keep working across calls)."""
    name = ddplug_cls.__name__ if ddplug_cls is not DdplugError else "DdplugBackendError"
    return type(name, (torch_cls, ddplug_cls), {
        "__module__": "ddplug.distributed",
        "__init__": ddplug_cls.__init__,
        "__doc__": f"{torch_cls.__name__} raised by the ddplug backend ({ddplug_cls.__name__}).",
    })


def backend_error(err: DdplugError) -> DdplugError:
    """``err`` as a ``DistBackendError`` (a collective or its Work failed)."""
    return _retype(err, DistBackendError)


def open_error(err: DdplugError) -> DdplugError:
    """``err`` raised while joining the run: a rendezvous that timed out is a
    ``DistStoreError``, an unreachable or lost peer a ``DistNetworkError``;
    configuration and argument errors keep their own (ValueError) classes."""
    if err.name == "TIMEOUT":
        return _retype(err, DistStoreError)
    if err.name in ("PEER_LOST", "SYSTEM", "ABORTED"):
        return _retype(err, DistNetworkError)
    return err


def _retype(err: DdplugError, torch_cls: type) -> DdplugError:
    if isinstance(err, torch_cls):
        return err
    cls = _combined(torch_cls, type(err))
    try:
        out = cls.__new__(cls)
    except TypeError:  # the layout of an OSError subclass (ddplug.Timeout is a TimeoutError)
        out = OSError.__new__(cls)
    out.__dict__.update(err.__dict__)
    out.args = err.args
    return out


def with_timeout_hint(err: DdplugError, hint: str) -> DdplugError:
    """``err`` (a TIMEOUT) saying "timed out", with ``hint`` (where the time
    limit comes from) appended once."""
    text = str(err)
    tail = f" [{err.name}]"
    if text.endswith(tail):
        text = text[: -len(tail)]
    if "timeout=" in text:
        return err
    if "timed out" not in text:
        text = "timed out: " + text
    return _errors.make(err.status, text + hint, "")


def make(status: int, detail: str, where: str) -> DdplugError:
    """A ``DistBackendError`` for a failed ddplug status."""
    return backend_error(_errors.make(status, detail, where))


def unsupported(detail: str, where: str) -> DdplugError:
    """An operation ddplug cannot do (raised before anything is started, on the
    rank that asked; every rank asking the same raises the same)."""
    return make(_errors.status_code("UNSUPPORTED"), detail, where)


def invalid(detail: str, where: str) -> DdplugError:
    """A call whose arguments torch accepts but that are wrong for the group."""
    return make(_errors.status_code("INVALID_ARGUMENT"), detail, where)


def timeout_of_wait(detail: str, where: Optional[str] = None) -> DdplugError:
    """``Work.wait(timeout)`` expired; the collective is still pending."""
    return make(_errors.status_code("TIMEOUT"), detail, where or "")
