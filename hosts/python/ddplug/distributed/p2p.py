"""Point-to-point on the ddplug backend: ``send``, ``recv`` (from a rank or any
rank), ``isend``, ``irecv``, ``batch_isend_irecv`` and tags, through libddplug's
``ddplug_isend`` / ``ddplug_irecv`` (host ABI 1.1; plugin ABI 1.4's
``p2p_start``).

torch calls :class:`~.group.ProcessGroupDdplug`'s ``send`` / ``recv`` /
``recv_anysource``; each starts one ddplug request and returns a
:class:`P2PWork` (``dist.send`` and ``dist.recv`` wait for it at once).
``batch_isend_irecv`` starts them one after the other (torch's path for a
backend without its own coalescing), which is safe: sends and receives never
wait for each other to start, and the nccl plugin launches the ones started
back to back as one NCCL group.

A tensor the plugin takes as it is (contiguous, on memory the plugin accepts)
is sent from and received into in place; any other is staged: a contiguous
copy is sent, a receive lands in a staging tensor copied back on completion.
Which plugin does what (plugins/cpu/README.md, plugins/nccl/README.md): the
cpu plugin matches tags and receives from any source; nccl takes tag 0 only
and a named source, refusing the rest with ``Unsupported`` before anything
starts. A plugin without point-to-point refuses every call the same way.
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional

import torch

from .._c._capi import F
from . import errors as _errors
from .work import DdplugWork

_isend = F.ddplug_isend
_irecv = F.ddplug_irecv
_source = F.ddplug_request_source

ANY_SOURCE = -1


class P2PWork(DdplugWork):
    """A send or receive: a :class:`~.work.DdplugWork` whose ``source_rank()``
    names the sender of a completed receive (the rank ``recv`` from any source
    matched)."""

    def __init__(self, group: Any, req: ctypes.c_void_p, outputs: List[torch.Tensor], finish: Any,
                 what: Any, keep: tuple, receive: bool) -> None:
        super().__init__(group, [req], outputs, finish, what, keep)
        self._receive = receive
        self._src: Optional[int] = None

    def _succeed(self) -> None:
        if self._receive and self._reqs:
            rank = ctypes.c_int(-1)
            if _source(self._reqs[0], ctypes.byref(rank)) == 0:
                self._src = rank.value
        super()._succeed()

    def source_rank(self) -> int:  # type: ignore[override]
        self.wait()
        if self._src is None:
            raise RuntimeError(f"ddplug: {self.what} is a send; only a receive has a source rank")
        return self._src

    _source_rank = source_rank


def start(group: Any, op: str, tensors: List[torch.Tensor], peer: int, tag: int) -> P2PWork:
    """Start ``op`` ("send" or "recv") of the one tensor in ``tensors`` with ``peer``
    (a rank of the group; -1 receives from any rank) and ``tag``."""
    t = group._one(tensors, op)
    receive = op == "recv"
    if peer != ANY_SOURCE:
        group._root(peer, op)
    if t.layout != torch.strided:
        raise _errors.unsupported(f"{op}: a {t.layout} tensor; send the dense tensor (.to_dense()) or its"
                                  " indices and values", group._where())
    what = describe(op, t, peer, tag)
    if receive:
        w = group._workable(t, what, copy_in=False)
        finish = None
        if w is not t:
            def finish() -> None:
                with torch.no_grad():
                    t.copy_(w.view(t.shape))
    else:
        w = group._workable(t, what)
        finish = None
    dt = group._dtype(w, what)
    h = group._handle()
    req = ctypes.c_void_p()
    fn = _irecv if receive else _isend
    with group.lock:
        if group._orphans:
            group._reap()
        st = fn(h, w.data_ptr(), w.numel(), dt, peer, tag, group._stream(w), ctypes.byref(req))
    if st:
        raise group.error_for(st, what)
    return group._track(P2PWork(group, req, [t], finish, what, (w,), receive))


def describe(op: str, t: torch.Tensor, peer: int, tag: int) -> Any:
    """How errors name a send or receive (a callable: only a failure formats it)."""
    where = "from any rank" if peer == ANY_SOURCE else f"{'from' if op == 'recv' else 'to'} rank {peer}"

    def what() -> str:
        return f"{op}({t.numel()} x {str(t.dtype).replace('torch.', '')} on {t.device}, {where}, tag {tag})"

    return what


def adopt(group: Any, req: int, t: torch.Tensor, receive: bool, peer: int, tag: int, src: int,
          status: int = 0) -> P2PWork:
    """A send or receive the native fast path started (.native), handed to
    Python: ``req`` its pending or failed request (the work owns it from now
    on), or 0 for one that completed (a receive from ``src``). ``status``: the
    failure the request already ended with (the native start's test saw it, and
    the context's error sentence is its own now, under the lock): worded here,
    raised by ``wait`` as a failed wait would have."""
    op = "recv" if receive else "send"
    w = P2PWork(group, ctypes.c_void_p(req), [t], None, describe(op, t, peer, tag), (t,), receive)
    if not req:
        w._reqs, w._done, w._src = [], True, (src if receive else None)
    elif status:
        w._fail(group.error_for(status, w._what))
    return w


__all__ = ["ANY_SOURCE", "P2PWork", "adopt", "describe", "start"]
