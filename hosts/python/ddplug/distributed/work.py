"""Work objects of the ddplug backend: asynchronous ddplug requests behind
torch's ``Work`` interface, and the thread that completes their futures.

A :class:`DdplugWork` holds the ddplug requests of one torch collective (one
for most; several for the composed and coalesced ones), in the order they were
started, and what to do once they all completed (copy a staged result into the
caller's tensors). Whoever sees the completion first finishes it, exactly once,
under the group's lock: ``wait`` (blocks, at most its timeout),
``is_completed`` (never blocks) or, for works whose future was asked for, the
group's completion thread.

Why a thread: torch's own callers — DDP's reducer, ``fut.then(...)`` — wait on
the ``torch.futures.Future`` from C++ and never call back into the backend, so
something must notice that the request finished and complete the future. The
thread exists only once a future was asked for; it polls the oldest such work
with ``ddplug_request_test`` (never blocks), backing off from 20 µs to 1 ms between
polls, and sleeps when no future is pending. It takes the group's lock for
each poll only, because libddplug allows one thread at a time in a context's
collectives (ddplug.h): a wait that held it across a blocking call would keep
DDP's backward from starting its next bucket.

Requests complete in the order they were started (ddplug.h), so the oldest
pending future is the only one worth polling.
"""

from __future__ import annotations

import collections
import ctypes
import datetime
import threading
import time
from typing import Any, Callable, List, Optional

import torch
from torch._C._distributed_c10d import Work
from torch.futures import Future

from .._c._capi import F
from ..errors import status_code
from . import errors as _errors

_wait = F.ddplug_request_wait
_test = F.ddplug_request_test
_free = F.ddplug_request_free

_TIMEOUT = status_code("TIMEOUT")

_POLL_MIN_S = 20e-6
_POLL_MAX_S = 1e-3


def timeout_ms(timeout: Any) -> int:
    """torch's ``timeout`` argument as ddplug milliseconds: a timedelta of 0 (the
    default of ``Work.wait``), a negative one (torch's "unset") or None mean
    the configured collective timeout (-1 = DDPLUG_TIMEOUT_DEFAULT)."""
    if timeout is None:
        return -1
    if isinstance(timeout, datetime.timedelta):
        ms = int(timeout.total_seconds() * 1000)
    else:
        ms = int(timeout)
    return ms if ms > 0 else -1


class DdplugWork(Work):
    """One torch collective on ddplug (see the module doc).

    ``wait(timeout)`` blocks at most ``timeout`` (a ``datetime.timedelta``; 0,
    the default, means the configured collective timeout) and raises the
    collective's failure as torch's ``DistBackendError`` carrying ddplug's
    sentence. A wait whose own timeout expires raises too, but the collective
    stays pending and can be waited again. ``is_completed()`` never blocks
    (a failed collective is completed; ``wait`` then raises).
    ``get_future()`` completes with the output tensors (a list), or with the
    failure.
    """

    def __init__(self, group: Any, reqs: List[ctypes.c_void_p], outputs: List[torch.Tensor],
                 finish: Optional[Callable[[], None]], what: Any, keep: tuple = ()) -> None:
        super().__init__()
        self._group = group
        self._reqs = reqs
        self._outputs = outputs
        self._finish = finish
        self._what = what  # str, or a callable that makes it (only needed on failure)
        self._keep = keep
        self._exc: Optional[BaseException] = None
        self._fut: Optional[Future] = None
        self._fut_set = False
        self._done = not reqs

    # ---- torch's Work interface ------------------------------------------------
    def wait(self, timeout: Any = None) -> bool:  # type: ignore[override]
        if not self._done:
            self.settle(timeout_ms(timeout))
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:  # type: ignore[override]
        if not self._done:
            self.settle(None)
        return self._done

    def is_success(self) -> bool:  # type: ignore[override]
        return self.is_completed() and self._exc is None

    def exception(self) -> Optional[BaseException]:  # type: ignore[override]
        return self._exc

    def result(self) -> List[torch.Tensor]:  # type: ignore[override]
        return list(self._outputs)

    def synchronize(self) -> None:  # type: ignore[override]
        self.wait()

    def block_current_stream(self) -> None:  # type: ignore[override]
        self.wait()

    def source_rank(self) -> int:  # type: ignore[override]
        raise RuntimeError("ddplug: source_rank() is only meaningful for recv, which ddplug does not do")

    def get_future(self) -> Future:  # type: ignore[override]
        with self._group.lock:
            if self._fut is None:
                devices = sorted({t.device for t in self._outputs if t.device.type == "cuda"}, key=str)
                self._fut = Future(devices=devices) if devices else Future()
                if not self._done:
                    self._group.watch(self)
                    return self._fut
            fut = self._take_future()
        if fut is not None:
            self._complete_future(fut)
        return self._fut

    # ---- completion ---------------------------------------------------------------
    @property
    def what(self) -> str:
        w = self._what
        return w() if callable(w) else str(w)

    def settle(self, ms: Optional[int]) -> bool:
        """Finish this work if its requests completed: ``ms`` None polls (never
        blocks), else waits at most ``ms`` (-1: the collective timeout). A
        failure is stored (``wait`` raises it); a wait whose own timeout expired
        raises here and leaves the work pending. Whether it is done."""
        fut = None
        with self._group.lock:
            if not self._done:
                self._advance(ms)
            fut = self._take_future()
        if fut is not None:
            self._complete_future(fut)
        return self._done

    def _advance(self, ms: Optional[int]) -> None:
        done_ = ctypes.c_int(0)
        for req in self._reqs:
            if ms is None:
                st = _test(req, ctypes.byref(done_))
                if st == 0 and not done_.value:
                    return
            else:
                st = self._waited(req, _wait(req, ms), ms)
            if st:
                self._fail(self._group.error_for(st, self._what))
                return
        self._succeed()

    def _waited(self, req: Any, st: int, ms: int) -> int:
        """``req``'s status after a wait of at most ``ms`` returned ``st``: 0 when
        a TIMEOUT was the wait's and the request completed meanwhile; raises
        when the wait's own timeout expired with the request still pending
        (the run goes on; the work can be waited again)."""
        if st == _TIMEOUT:
            done_ = ctypes.c_int(0)
            if _test(req, ctypes.byref(done_)) == 0:
                if done_.value:
                    return 0
                raise _errors.timeout_of_wait(
                    f"{self.what} timed out after {ms / 1000:.3f} s in Work.wait (its own timeout); it is"
                    " still pending: wait again, or let the group's timeout end it (timeout= of"
                    " init_process_group, or timeouts.collective_s)", f"rank {self._group.rank()}")
        return st

    def waited(self, st: int, ms: int) -> bool:
        """``wait`` of a one-request work whose request a native wait (.native)
        of at most ``ms`` already waited for, returning ``st`` (not OK)."""
        fut = None
        with self._group.lock:
            if not self._done:
                st = self._waited(self._reqs[0], st, ms)
                if st:
                    self._fail(self._group.error_for(st, self._what))
                else:
                    self._succeed()
            fut = self._take_future()
        if fut is not None:
            self._complete_future(fut)
        return self.wait()

    @classmethod
    def merge(cls, group: Any, works: list, what: str) -> "DdplugWork":
        """One work for several: their requests in order, their finishes in
        order; the merged work owns them from now on."""
        reqs, outs, finishes, keep = [], [], [], []
        for w in works:
            reqs += w._reqs
            outs += w._outputs
            if w._finish is not None:
                finishes.append(w._finish)
            keep.append(w._keep)
            w._reqs, w._finish, w._done = [], None, True
        return cls(group, reqs, outs, chained(finishes), what, tuple(keep))

    def _succeed(self) -> None:
        for r in self._reqs:
            _free(r)
        self._reqs = []
        self._keep = ()
        finish, self._finish = self._finish, None
        try:
            if finish is not None:
                finish()
        except BaseException as exc:  # a copy that failed: the collective failed here
            self._exc = exc
        self._done = True

    def _fail(self, exc: BaseException) -> None:
        for r in self._reqs:
            _free(r)  # final failure (or a failed run): nothing left to complete
        self._reqs = []
        self._keep = ()
        self._finish = None
        self._exc = exc
        self._done = True

    def _take_future(self) -> Optional[Future]:
        """The future to complete now (once), or None."""
        if self._fut is None or self._fut_set or not self._done:
            return None
        self._fut_set = True
        return self._fut

    def _complete_future(self, fut: Future) -> None:
        """Outside the lock: callbacks may start collectives."""
        if self._exc is not None:
            fut.set_exception(self._exc)
        else:
            fut.set_result(self._outputs)

    def __del__(self) -> None:
        # A work dropped while pending: its requests must not be freed (that
        # would abort the run); the group releases them once they completed.
        reqs = getattr(self, "_reqs", None)
        if reqs and not getattr(self, "_done", True):
            self._group.release_when_complete(reqs, self._keep)


def done(group: Any, outputs: List[torch.Tensor]) -> DdplugWork:
    """A work that already completed (a blocking fast path)."""
    return DdplugWork(group, [], outputs, None, "")


def chained(finishes: list) -> Optional[Callable[[], None]]:
    """One finish that runs ``finishes`` (None entries left out) in order;
    None when nothing is left."""
    fns = [f for f in finishes if f is not None]
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def finish() -> None:
        for f in fns:
            f()

    return finish


class Progress:
    """The completion thread of one group (see the module doc)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"ddplug-progress-{group.rank()}", daemon=True)
        self._thread.start()

    def add(self, work: DdplugWork) -> None:
        with self._cv:
            self._queue.append(work)
            self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        delay = _POLL_MIN_S
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                work = self._queue[0]
            if work._done or work.settle(None):
                with self._cv:
                    if self._queue and self._queue[0] is work:
                        self._queue.popleft()
                delay = _POLL_MIN_S
                continue
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)


__all__ = ["DdplugWork", "Progress", "chained", "done", "timeout_ms"]
