"""run-once: work (a download, a preprocessing pass) that exactly one process per
scope performs while the others wait for its outcome through the rendezvous store.

``scope="global"``: rank 0 runs it; ``scope="node"``: the first local rank of every
node. There is no collective barrier: waiters block on a store key for as long as
the runner lives — it heartbeats through the store; ``timeouts.run_once_s`` (default
0: no limit) or ``timeout_s`` bound the wait — so ranks may arrive minutes apart
(slow shared file systems, long downloads), and a runner that dies is noticed at
once (its store connection drops), one that hangs within about 5 s of its last
heartbeat, instead of leaving everyone hanging. If the work raises, the runner
re-raises and every waiter raises :class:`RunOnceFailed` carrying the original
exception's type, message and traceback text.

Names identify the work within a run: a name that already completed returns its
recorded outcome immediately (once per run).

    ddplug.run_once(download, scope="node")          # returns download()'s value everywhere

    with ddplug.once("tokenize", scope="global") as runner:
        if runner:
            build_cache()          # only rank 0; the others wait at the `with`
    cache = load_cache()           # everyone, after the cache exists
"""

from __future__ import annotations

import base64
import ctypes
import pickle
import re
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from ._c._capi import F, take_string
from .context import Context, current
from .errors import DdplugError, make, status_code

# ddplug_scope values of ddplug.h's "Run once" section. The layout test checks
# them against the header (tests/python/test_binding.py::test_header_constants).
SCOPE_GLOBAL = 1
SCOPE_NODE = 2
_SCOPES = {"global": SCOPE_GLOBAL, "node": SCOPE_NODE}

_RESULT_MAX = 256 * 1024  # pickled result shared through the store
_MESSAGE_MAX = 64 * 1024  # failure text (traceback) shared through the store
_OK_PREFIX = "ok:"


class RunOnceFailed(RuntimeError):
    """The run-once work failed on its runner. ``runner_text`` is the runner's
    exception type, message and traceback as the runner formatted them."""

    def __init__(self, name: str, scope: str, runner_text: str, rank: int) -> None:
        self.name = name
        self.scope = scope
        self.runner_text = runner_text
        super().__init__(
            f"run_once {name!r} (scope {scope}) failed on its runner; seen from rank {rank}.\n"
            f"Runner's error:\n{runner_text}"
        )


def _context(context: Optional[Context]) -> Context:
    ctx = context if context is not None else current()
    if ctx is None:
        raise RuntimeError(
            "ddplug.run_once needs a run: call it inside a Lightning/Fabric run that uses the ddplug"
            " strategy (e.g. in prepare_data or setup), or pass context=ddplug.Context(...)"
        )
    return ctx


def _check_name(name: str) -> str:
    if not name or len(name) > 160 or not re.fullmatch(r"[\x21-\x7e]+", name):
        raise ValueError(
            f"ddplug: run_once name {name!r} must be 1 to 160 printable ASCII characters without spaces"
        )
    return name


def _begin(ctx: Context, name: str, scope: str, timeout_s: Optional[float]) -> tuple:
    runner = ctypes.c_int(0)
    msg = ctypes.c_void_p()
    ms = -1 if timeout_s is None else int(timeout_s * 1000)
    st = F.ddplug_run_once_begin(ctx.handle, name.encode(), _SCOPES[scope], ms,
                                 ctypes.byref(runner), ctypes.byref(msg))
    text = take_string(msg)
    return st, bool(runner.value), text


def _end(ctx: Context, name: str, scope: str, ok: bool, message: str) -> None:
    data = message.encode("utf-8", "replace")
    st = F.ddplug_run_once_end(ctx.handle, name.encode(), _SCOPES[scope],
                               0 if ok else status_code("ABORTED"), data)
    if st != 0:
        raise make(st, where=f"rank {ctx.rank}: run_once {name!r} end")


def _waiter_outcome(ctx: Context, name: str, scope: str, st: int, text: str) -> Any:
    """Turn a waiter's begin result into a value or an exception."""
    if st == 0:
        if text.startswith(_OK_PREFIX):
            return pickle.loads(base64.b64decode(text[len(_OK_PREFIX):]))
        return None
    err = make(st, where=f"rank {ctx.rank}: run_once {name!r} ({scope})")
    if err.name == "ABORTED" and text:
        raise RunOnceFailed(name, scope, text, ctx.rank)
    raise err


@contextmanager
def once(name: str, scope: str = "global", *, context: Optional[Context] = None,
         timeout_s: Optional[float] = None) -> Iterator[bool]:
    """Context manager: the runner enters at once (yields True) and its block's
    outcome is published when it leaves; every other process of the scope waits
    at entry until then (yields False), or raises :class:`RunOnceFailed` if the
    runner's block raised. A name that already completed in this run yields
    False to everyone."""
    if scope not in _SCOPES:
        raise ValueError(f"ddplug: run_once scope must be 'global' or 'node', got {scope!r}")
    ctx = _context(context)
    _check_name(name)
    st, runner, text = _begin(ctx, name, scope, timeout_s)
    if not runner:
        _waiter_outcome(ctx, name, scope, st, text)
        yield False
        return
    if st != 0:
        raise make(st, where=f"rank {ctx.rank}: run_once {name!r} begin")
    try:
        yield True
    except BaseException as exc:
        _end(ctx, name, scope, False, _format_failure(exc))
        raise
    _end(ctx, name, scope, True, "")


def run_once(fn: Callable[[], Any], scope: str = "global", *, name: Optional[str] = None,
             context: Optional[Context] = None, timeout_s: Optional[float] = None) -> Any:
    """Run ``fn()`` on exactly one process of ``scope``; every process of the scope
    returns its result (pickled through the store, at most 256 KiB) or raises.

    On the runner, an exception from ``fn`` propagates unchanged; on the others it
    becomes :class:`RunOnceFailed` with the runner's traceback text. A result that
    cannot be pickled or is too large fails the run-once everywhere with a message
    saying so (return a path instead)."""
    if scope not in _SCOPES:
        raise ValueError(f"ddplug: run_once scope must be 'global' or 'node', got {scope!r}")
    ctx = _context(context)
    name = _check_name(name or _default_name(fn))
    st, runner, text = _begin(ctx, name, scope, timeout_s)
    if not runner:
        return _waiter_outcome(ctx, name, scope, st, text)
    if st != 0:
        raise make(st, where=f"rank {ctx.rank}: run_once {name!r} begin")
    try:
        result = fn()
        payload = _encode_result(result, name)
    except BaseException as exc:
        _end(ctx, name, scope, False, _format_failure(exc))
        raise
    _end(ctx, name, scope, True, payload)
    return result


def _default_name(fn: Callable) -> str:
    qual = getattr(fn, "__qualname__", None) or type(fn).__name__
    mod = getattr(fn, "__module__", "") or ""
    return re.sub(r"[^\x21-\x7e]", "_", f"{mod}.{qual}" if mod else qual)[:160]


def _encode_result(result: Any, name: str) -> str:
    if result is None:
        return ""
    try:
        raw = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"ddplug: run_once {name!r} returned a {type(result).__name__} that cannot be pickled ({exc});"
            " return something picklable (e.g. a path) so the other ranks can receive it"
        ) from exc
    if len(raw) > _RESULT_MAX:
        raise ValueError(
            f"ddplug: run_once {name!r} returned {len(raw)} pickled bytes; at most {_RESULT_MAX} travel"
            " through the store: write the data to a file and return its path"
        )
    return _OK_PREFIX + base64.b64encode(raw).decode()


def _format_failure(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) > _MESSAGE_MAX:
        text = text[: _MESSAGE_MAX // 4] + "\n... (traceback truncated) ...\n" + text[-_MESSAGE_MAX // 2:]
    return text


__all__ = ["once", "run_once", "RunOnceFailed", "DdplugError"]
