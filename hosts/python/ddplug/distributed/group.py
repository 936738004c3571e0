"""``ProcessGroupDdplug``: a torch.distributed process group whose collectives
are ddplug's.

torch calls these methods from its ``torch.distributed`` functions (Python)
and from C++ (DDP's reducer, ``_broadcast_coalesced``) through the Python
``ProcessGroup`` trampoline; each returns a :class:`~.work.DdplugWork`.

What ddplug does natively (one ddplug request each): ``all_reduce``,
``broadcast``, ``all_gather`` / ``all_gather_into_tensor`` (equal sizes) and
``barrier``. What is composed from those, and what that costs compared with a
backend that has the operation (S = the tensor's bytes, n = ranks):

==========================  ====================================================
``reduce``                  an allreduce (non-destination ranks reduce a copy,
                            so their tensor is unchanged): every rank receives
                            the result, not only ``dst``
``reduce_scatter`` and      an allreduce of the whole input (n·S of output's
``reduce_scatter_tensor``   size; about twice a reduce-scatter's traffic) plus
                            a copy of the input and of this rank's part
``gather``                  an allgather: every rank receives every part, not
                            only ``dst`` (n times the traffic on the others)
``scatter``                 a broadcast of all parts from ``src``: every rank
                            receives n parts and keeps its own
``all_gather`` with         one broadcast per rank (n collectives)
uneven sizes
``all_to_all_single`` and   a small allgather of the split sizes (only when
``all_to_all``              they are given), then an allgather of every rank's
                            whole input, padded to the longest: each rank
                            receives n times what it keeps
coalesced forms             one request per tensor, one Work for all of them
==========================  ====================================================

Point-to-point (``send``, ``recv`` from a rank or any rank, ``isend``,
``irecv``, ``batch_isend_irecv``, tags) goes through the plugin's own sends
and receives (:mod:`.p2p`).

Refused, before anything starts, with an error naming the operation and what
to use instead (never a wrong result): point-to-point on a plugin without it,
tags other than 0 and receives from any rank on nccl, ``ReduceOp.BXOR`` and
``ReduceOp.PREMUL_SUM``, bitwise ops a plugin lacks (nccl has no BOR/BAND),
dtypes ddplug has no equivalent for (e.g. int16, float8), several tensors per
process, tensors on devices other than CPU and CUDA, ``split_group``.

Memory: a tensor the plugin takes as it is (contiguous, in memory the plugin
accepts: the cpu plugin takes CPU memory, nccl CUDA and host memory) is used
in place; any other (non-contiguous, or CUDA memory on a CPU plugin) is copied
into a contiguous staging tensor and the result copied back on completion.
CUDA tensors run on the current CUDA stream.

Thread safety: every call into the group's ddplug context holds the context's
lock (libddplug allows one thread at a time in a context's collectives).
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any, Callable, List, Optional, Sequence

import torch
from torch._C._distributed_c10d import AllreduceOptions, ProcessGroup
from torch.distributed import ReduceOp
from torch.distributed.constants import default_pg_timeout

from .._c import _buffers, _names
from .._c._capi import F
from ..context import CAP_DEVICE_MEMORY, CAP_HOST_MEMORY, Context
from ..errors import DdplugError, status_code
from . import errors as _errors
from . import native as _native
from . import p2p as _p2p
from .work import DdplugWork, Progress, chained, done

_RedOpType = ReduceOp.RedOpType
_log = logging.getLogger("ddplug")

_iallreduce = F.ddplug_iallreduce
_allreduce = F.ddplug_allreduce
_ibroadcast = F.ddplug_ibroadcast
_broadcast = F.ddplug_broadcast
_iallgather = F.ddplug_iallgather
_ibarrier = F.ddplug_ibarrier
_barrier = F.ddplug_barrier
_test = F.ddplug_request_test
_wait = F.ddplug_request_wait
_free = F.ddplug_request_free

_TIMEOUT = status_code("TIMEOUT")
# What every timeout says, once: where the time limit comes from.
_TIMEOUT_HINT = ("; raise the timeout with timeout= (init_process_group, new_group or the call itself; torch's"
                 " default for CPU backends is 30 min) or, outside torch.distributed, timeouts.collective_s in"
                 " ddplug's config")


_INTEGER = {torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool}

# torch ReduceOp -> ddplug op name; None: refused (see _refused_op).
_OP_NAMES = {
    _RedOpType.SUM: "sum", _RedOpType.AVG: "avg", _RedOpType.PRODUCT: "prod",
    _RedOpType.MIN: "min", _RedOpType.MAX: "max", _RedOpType.BAND: "band",
    _RedOpType.BOR: "bor", _RedOpType.BXOR: None, _RedOpType.PREMUL_SUM: None,
}
# bool tensors: SUM is a logical or, PRODUCT a logical and (as torch's NCCL does).
_BOOL_OPS = {"sum": "max", "prod": "min", "min": "min", "max": "max", "band": "band", "bor": "bor"}

_AR, _BC, _AG, _BAR = 0, 1, 2, 3
_SUM = ReduceOp.SUM
_DEFAULT_ALLREDUCE = AllreduceOptions()


def _op_label(op: Any) -> str:
    return f"ReduceOp.{getattr(op, 'name', op)}"


class ProcessGroupDdplug(ProcessGroup):
    """A torch.distributed process group served by one ddplug context.

    Created by torch through ``init_process_group(backend="ddplug")`` and
    ``new_group(..., backend="ddplug")`` (see :mod:`ddplug.distributed`).

    Args:
        ctx: the ddplug context (rank and world size equal the group's).
        owned: whether the group closes ``ctx`` on ``shutdown`` (True when
            the backend opened it; False when it reuses the context of a
            strategy or of :func:`ddplug.torch.init`, which close it).
    """

    def __init__(self, ctx: Context, *, owned: bool) -> None:
        super().__init__(ctx.rank, ctx.world_size)
        self._ctx = ctx
        self._owned = owned
        self.lock = ctx.lock  # the context's: held around every call into its collectives
        self._ws = ctx.world_size
        self._me = ctx.rank
        self._plugin = ctx.plugin["name"]
        caps = int(ctx.plugin["caps"])
        self._host_ok = bool(caps & CAP_HOST_MEMORY)
        self._dev_ok = bool(caps & CAP_DEVICE_MEMORY)
        self._op_mask = int(ctx.plugin["op_mask"])
        self._dtype_mask = int(ctx.plugin["dtype_mask"])
        # torch dtype -> ddplug code, for the dtypes this plugin takes (bool as uint8)
        self._dtypes = {d: c for d, c in _buffers.torch_dtype_codes().items() if self._dtype_mask & (1 << c)}
        self._ops: dict = {}  # (RedOpType, is_bool) -> ddplug op code
        sum_code = _names.ops()["sum"]
        self._sum = sum_code if self._op_mask & (1 << sum_code) else 0
        # What a collective that torch waits for at once (asyncOp false) returns:
        # it already completed, and torch only calls wait() on it.
        self._done = done(self, [])
        self._orphans: list = []
        self._progress_thread: Optional[Progress] = None
        self._coalescing: Optional[list] = None
        self._closed = False
        self._monitored = 0  # monitored barriers so far (each its own keys in the store)
        # torch's Python asks group.rank() and group.size() in every send, receive
        # and collective; the base class's pybind methods cost about 1.5 us each on
        # a Python subclass (0.25 on torch's own groups). A group's rank and size
        # never change: instance attributes answer them from Python ints (torch's
        # C++ reads the base's own fields, which are the same).
        self.rank = self._me.__index__  # type: ignore[method-assign]
        self.size = self._ws.__index__  # type: ignore[method-assign]
        self._attach_native()

    # ---- identity ---------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "ddplug"

    def name(self) -> str:  # type: ignore[override]
        return "ddplug"

    # torch names every group (pg.group_name, group_desc); the base class keeps the
    # names in its per-device backends, which a Python group does not have
    def setGroupName(self, name: str) -> None:  # noqa: N802 (torch's name)
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return getattr(self, "_group_desc", "")

    @property
    def context(self) -> Context:
        """The ddplug context serving this group."""
        return self._ctx

    def __repr__(self) -> str:
        return f"ProcessGroupDdplug(rank={self._me}, size={self._ws}, plugin={self._plugin!r})"

    # ---- collectives ddplug does natively -------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> DdplugWork:
        # The hot path of small collectives (metrics, loss logging): every
        # attribute read here was measured (bench/torch_backend_perf.py --profile).
        if len(tensors) != 1:
            raise self._several("all_reduce")
        t = tensors[0]
        if opts is None:
            opts = _DEFAULT_ALLREDUCE
        ro = opts.reduceOp
        dtype = t.dtype
        dt = self._dtypes.get(dtype)
        if ro == _SUM and dt is not None and dtype is not torch.bool and self._sum:
            op = self._sum
        else:
            op = self._op_code(ro.op, dtype, "all_reduce")
        h = self._ctx.handle_if_open
        if h and dt and t.is_contiguous() and ((t.is_cpu and self._host_ok) or (t.is_cuda and self._dev_ok)):
            p = t.data_ptr()
            stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
            if not opts.asyncOp:
                # torch waits at once: the blocking call (one crossing into C, no request)
                with self.lock:
                    st = _allreduce(h, p, p, t.numel(), dt, op, stream)
                if st:
                    raise self.error_for(st, lambda: _describe("all_reduce", t, ro.op))
                return self._done
            req = ctypes.c_void_p()
            with self.lock:
                if self._orphans:
                    self._reap()
                st = _iallreduce(h, p, p, t.numel(), dt, op, stream, ctypes.byref(req))
            if st:
                raise self.error_for(st, lambda: _describe("all_reduce", t, ro.op))
            return self._track(DdplugWork(self, [req], [t], None, lambda: _describe("all_reduce", t, ro.op), (t,)))
        if t.layout is torch.sparse_coo:
            return self._sparse_allreduce(t, ro.op)
        w = self._workable(t, "all_reduce")
        return self._issue(lambda: _describe("all_reduce", t, ro.op), [(_AR, w, op)], [t], _copy_back(t, w), (w,))

    def _sparse_allreduce(self, t: torch.Tensor, red: Any) -> DdplugWork:
        """A sparse COO tensor, summed as gloo does: every rank's indices and
        values are gathered (padded to the largest count of entries), the
        concatenation is coalesced (duplicates added), and the result replaces
        the tensor's contents. Other reductions are refused, as by gloo."""
        if red != _RedOpType.SUM:
            raise _errors.unsupported(
                f"all_reduce of a sparse tensor with {_op_label(red)}: only ReduceOp.SUM is defined for sparse"
                " tensors (as with gloo); use .to_dense() for the other reductions", self._where())
        ws = self._ws
        src = t.coalesce() if not t.is_coalesced() else t
        idx, val = src.indices(), src.values()
        nnz = torch.tensor([idx.size(1)], dtype=torch.int64)
        every = torch.empty(ws, dtype=torch.int64)
        what = lambda: _describe("all_reduce (sparse)", t, red)  # noqa: E731
        self._issue(what, [(_AG, nnz, every)], [], None, (nnz, every)).wait()
        counts = every.tolist()
        longest = max(counts)
        dims, dense = idx.size(0), tuple(val.shape[1:])
        pidx = torch.zeros((dims, longest), dtype=torch.int64)
        pidx[:, :idx.size(1)] = idx
        pval = torch.zeros((longest,) + dense, dtype=val.dtype)
        pval[:val.size(0)] = val.cpu()
        pidx, pval = pidx.reshape(-1), pval.reshape(-1)
        gidx = torch.empty(ws * pidx.numel(), dtype=torch.int64)
        gval = torch.empty(ws * pval.numel(), dtype=val.dtype)

        def finish() -> None:
            gi, gv = gidx.view(ws, dims, longest), gval.view((ws, longest) + dense)
            allidx = torch.cat([gi[r, :, :counts[r]] for r in range(ws)], dim=1)
            allval = torch.cat([gv[r, :counts[r]] for r in range(ws)], dim=0)
            out = torch.sparse_coo_tensor(allidx, allval, t.shape, dtype=t.dtype).coalesce()
            with torch.no_grad():
                t.copy_(out.to(t.device))

        return self._issue(what, [(_AG, self._stage_device(pidx), gidx), (_AG, self._stage_device(pval), gval)],
                           [t], finish, (pidx, pval, gidx, gval))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> DdplugWork:
        red = opts.reduceOp.op if opts is not None else _RedOpType.SUM
        steps, finish, keep = [], [], []
        for t in tensors:
            op = self._op_code(red, t.dtype, "all_reduce_coalesced")
            w = self._workable(t, "all_reduce_coalesced")
            steps.append((_AR, w, op))
            if w is not t:
                finish.append(_copy_back(t, w))
            keep.append(w)
        return self._issue(f"all_reduce_coalesced({len(tensors)} tensors, {_op_label(red)})", steps,
                           list(tensors), chained(finish), tuple(keep))

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> DdplugWork:
        t = self._one(tensors, "broadcast")
        root = self._root(opts.rootRank if opts is not None else 0, "broadcast")
        if opts is not None and opts.rootTensor != 0:
            raise _errors.invalid(f"broadcast: rootTensor {opts.rootTensor}: one tensor per process",
                                  self._where())
        if opts is not None and not opts.asyncOp and self._direct(t):
            dt = self._dtype(t, "broadcast")
            h = self._handle()
            p = t.data_ptr()
            with self.lock:
                st = _broadcast(h, p, p, t.numel(), dt, root, self._stream(t))
            if st:
                raise self.error_for(st, lambda: _describe("broadcast", t, f"src {root}"))
            return self._done
        w = self._workable(t, "broadcast")
        return self._issue(lambda: _describe("broadcast", t, f"src {root}"), [(_BC, w, root)], [t],
                           _copy_back(t, w) if w is not t else None, (w,))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> DdplugWork:
        """``all_gather_into_tensor``: output holds every rank's input, in rank order."""
        self._same_dtype(output, input, "all_gather_into_tensor")
        if output.numel() != input.numel() * self._ws:
            raise _errors.invalid(
                f"all_gather_into_tensor: the output has {output.numel()} elements, it needs {self._ws} x"
                f" {input.numel()} (world size x the input's)", self._where())
        src = self._workable(input, "all_gather_into_tensor")
        dst = self._workable(output, "all_gather_into_tensor", copy_in=False)
        return self._issue(lambda: _describe("all_gather_into_tensor", input), [(_AG, src, dst)], [output],
                           _copy_back(output, dst) if dst is not output else None, (src, dst))

    _allgather_base = all_gather_single  # the name of torch < 2.6

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
                  opts: Any = None) -> DdplugWork:
        """``all_gather``: output_tensors[0][r] receives rank r's input. Equal
        sizes: one allgather into a staging tensor, copied out; uneven sizes:
        one broadcast per rank (composed)."""
        t = self._one(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise self._several("all_gather")
        outs = list(output_tensors[0])
        self._check_list(outs, "all_gather", "tensor_list")
        for o in outs:
            self._same_dtype(o, t, "all_gather")
        if outs[self._me].numel() != t.numel():
            raise _errors.invalid(
                f"all_gather: tensor_list[{self._me}] (this rank's place) has {outs[self._me].numel()} elements,"
                f" the input {t.numel()}", self._where())
        if all(o.numel() == t.numel() for o in outs):
            src = self._workable(t, "all_gather")
            flat = torch.empty(self._ws * t.numel(), dtype=t.dtype, device=src.device)
            n = t.numel()

            def finish() -> None:
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view_as(o))

            return self._issue(lambda: _describe("all_gather", t), [(_AG, src, flat)], outs, finish, (src, flat))
        # uneven sizes: rank r broadcasts its input into everyone's tensor_list[r]
        bufs, steps = [], []
        for r, o in enumerate(outs):
            w = self._workable(o, "all_gather", copy_in=False)
            if r == self._me:
                w.copy_(t.reshape(w.shape))
            bufs.append(w)
            steps.append((_BC, w, r))
        finish = chained([_copy_back(o, w) for o, w in zip(outs, bufs) if w is not o])
        return self._issue(f"all_gather (uneven sizes {[o.numel() for o in outs]}: {self._ws} broadcasts)",
                           steps, outs, finish, tuple(bufs))

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor],
                            opts: Any = None) -> DdplugWork:
        """``all_gather_coalesced``: output_lists[r][i] receives rank r's
        input_list[i] (one list per rank, as torch passes them); one all_gather
        per input."""
        self._check_list(list(output_lists), "all_gather_coalesced", "output_tensor_lists")
        n = len(input_list)
        for r, outs in enumerate(output_lists):
            if len(outs) != n:
                raise _errors.invalid(
                    f"all_gather_coalesced: output_tensor_lists[{r}] has {len(outs)} tensors, the input list {n}"
                    " (one output list per rank, one tensor per input)", self._where())
        works = [self.allgather([[outs[i] for outs in output_lists]], [t], opts) for i, t in enumerate(input_list)]
        return self._merge(works, "all_gather_coalesced")

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                    opts: Any = None) -> DdplugWork:
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._merge(works, "all_gather_into_tensor_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def barrier(self, opts: Any = None) -> DdplugWork:
        if opts is not None and not opts.asyncOp:
            self._blocking_barrier(_call_timeout_ms(opts.timeout), "barrier")
            return self._done
        return self._issue("barrier", [(_BAR, None, None)], [], None, ())

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier: every rank announces its arrival at the
        group's n-th monitored barrier in the run's store and waits at most
        ``timeout`` (None: the group's) for every other rank's; on timeout it
        raises on this rank, naming every rank that did not arrive (ddplug always
        names all of them: ``wait_all_ranks`` has no other meaning), and the run
        goes on, as with gloo: no collective was started, so nothing is left
        pending (a blocking ``barrier``'s timeout ends the run instead). A
        timeout of 0 times out at once unless every rank is already there."""
        ms = -1 if timeout is None else _call_timeout_ms(timeout)
        limit_s = ms / 1000 if ms >= 0 else (self._ctx.collective_timeout_s
                                             or default_pg_timeout.total_seconds())
        self._handle()  # a closed group says so
        self._monitored += 1
        key = f"torch/monitored_barrier/{self._monitored}/"
        store = self._ctx.store
        store.set(key + str(self._me), b"1")
        deadline = time.monotonic() + limit_s
        missing = []
        for r in range(self._ws):
            if r == self._me:
                continue
            try:
                store.get(key + str(r), max(deadline - time.monotonic(), 0.0))
            except DdplugError as exc:
                if exc.name != "TIMEOUT":
                    raise _errors.backend_error(exc) from None
                missing.append(r)
        if missing:
            raise _errors.make(
                _TIMEOUT, f"Rank {self._me} timed out in monitoredBarrier (monitored_barrier) after"
                f" {limit_s:g} s: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not"
                f" arrive{_TIMEOUT_HINT}", self._where())

    def _blocking_barrier(self, ms: int, what: str) -> None:
        """A barrier waited for at most ``ms`` (-1: the group's timeout; 0: it
        times out at once unless every rank already arrived). Its TIMEOUT ends
        the run, as any blocking collective's."""
        h = self._handle()
        if ms != 0:
            with self.lock:
                st = _barrier(h, ms)
            if st:
                raise self.error_for(st, what)
            return
        req = ctypes.c_void_p()
        with self.lock:
            st = _ibarrier(h, ctypes.byref(req))
            if not st:
                st = _wait(req, 0)
                if st == _TIMEOUT:
                    # the run ends as after any blocking collective's timeout; the
                    # reason every rank gets says where the timeout came from
                    reason = (f"rank {self._me}: {what}: timed out at once (timeout 0): not every rank had"
                              f" arrived{_TIMEOUT_HINT}")
                    self._ctx.abort(reason)
                    err = _errors.make(st, reason, "")
                    _free(req)
                    raise err
                _free(req)
        if st:
            raise self.error_for(st, what)

    # ---- composed collectives (see the module doc for their cost) ----------------------
    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> DdplugWork:
        t = self._one(tensors, "reduce")
        red = opts.reduceOp.op if opts is not None else _RedOpType.SUM
        dst = self._root(opts.rootRank if opts is not None else 0, "reduce")
        op = self._op_code(red, t.dtype, "reduce")
        if self._me == dst:
            w = self._workable(t, "reduce")
            finish = _copy_back(t, w) if w is not t else None
        else:  # the others' tensors stay as they were
            w = self._copy(t)
            finish = None
        return self._issue(lambda: _describe("reduce", t, red, f"dst {dst}, composed: allreduce"), [(_AR, w, op)],
                           [t], finish, (w,))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> DdplugWork:
        """``reduce_scatter_tensor``: composed as an allreduce of the input."""
        red = opts.reduceOp.op if opts is not None else _RedOpType.SUM
        self._same_dtype(output, input, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._ws:
            raise _errors.invalid(
                f"reduce_scatter_tensor: the input has {input.numel()} elements, it needs {self._ws} x"
                f" {output.numel()} (world size x the output's)", self._where())
        op = self._op_code(red, input.dtype, "reduce_scatter_tensor")
        w = self._copy(input)
        n, me = output.numel(), self._me

        def finish() -> None:
            output.copy_(w[me * n:(me + 1) * n].view_as(output))

        return self._issue(lambda: _describe("reduce_scatter_tensor", input, red, "composed: allreduce"),
                           [(_AR, w, op)], [output], finish, (w,))

    _reduce_scatter_base = reduce_scatter_single  # the name of torch < 2.6

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_lists: List[List[torch.Tensor]],
                       opts: Any = None) -> DdplugWork:
        """``reduce_scatter``: rank r receives the reduction of every rank's
        input_list[r]; composed as an allreduce of the concatenated list."""
        out = self._one(output_tensors, "reduce_scatter")
        if len(input_lists) != 1:
            raise self._several("reduce_scatter")
        parts = list(input_lists[0])
        self._check_list(parts, "reduce_scatter", "input_list")
        for p in parts:
            self._same_dtype(out, p, "reduce_scatter")
            if p.numel() != out.numel():
                raise _errors.invalid(
                    f"reduce_scatter: every input_list tensor needs the output's {out.numel()} elements, got"
                    f" {p.numel()}", self._where())
        red = opts.reduceOp.op if opts is not None else _RedOpType.SUM
        op = self._op_code(red, out.dtype, "reduce_scatter")
        w = self._stage_device(torch.cat([p.reshape(-1) for p in parts]))
        n, me = out.numel(), self._me

        def finish() -> None:
            out.copy_(w[me * n:(me + 1) * n].view_as(out))

        return self._issue(lambda: _describe("reduce_scatter", out, red, "composed: allreduce"), [(_AR, w, op)],
                           [out], finish, (w,))

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> DdplugWork:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._merge(works, "reduce_scatter_tensor_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],
               opts: Any = None) -> DdplugWork:
        """``gather``: composed as an allgather (every rank receives every part)."""
        t = self._one(input_tensors, "gather")
        dst = self._root(opts.rootRank if opts is not None else 0, "gather")
        outs: list = list(output_tensors[0]) if output_tensors else []
        if self._me == dst:
            self._check_list(outs, "gather", "gather_list")
            for o in outs:
                self._same_dtype(o, t, "gather")
                if o.numel() != t.numel():
                    raise _errors.invalid(
                        f"gather: every gather_list tensor needs the input's {t.numel()} elements, got {o.numel()}",
                        self._where())
        src = self._workable(t, "gather")
        flat = torch.empty(self._ws * t.numel(), dtype=t.dtype, device=src.device)
        n = t.numel()

        def finish() -> None:
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))

        return self._issue(lambda: _describe("gather", t, f"dst {dst}, composed: allgather"), [(_AG, src, flat)],
                           outs, finish if outs else None, (src, flat))

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],
                opts: Any = None) -> DdplugWork:
        """``scatter``: composed as a broadcast of every part from ``src``."""
        out = self._one(output_tensors, "scatter")
        src = self._root(opts.rootRank if opts is not None else 0, "scatter")
        n = out.numel()
        if self._me == src:
            parts = list(input_tensors[0]) if input_tensors else []
            self._check_list(parts, "scatter", "scatter_list")
            for p in parts:
                self._same_dtype(out, p, "scatter")
                if p.numel() != n:
                    raise _errors.invalid(
                        f"scatter: every scatter_list tensor needs the output's {n} elements, got {p.numel()}",
                        self._where())
            w = self._stage_device(torch.cat([p.reshape(-1) for p in parts]))
        else:
            w = self._stage_device(torch.empty(self._ws * n, dtype=out.dtype, device=out.device))
        me = self._me

        def finish() -> None:
            out.copy_(w[me * n:(me + 1) * n].view_as(out))

        return self._issue(lambda: _describe("scatter", out, f"src {src}, composed: broadcast"), [(_BC, w, src)],
                           [out], finish, (w,))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                          input_split_sizes: Sequence[int], opts: Any = None) -> DdplugWork:
        """``all_to_all_single``: composed as an allgather of every rank's input
        (and, with split sizes, a small allgather of the sizes first)."""
        self._same_dtype(output, input, "all_to_all_single")
        ws, me = self._ws, self._me
        rows = input.size(0) if input.dim() else input.numel()
        row = input.numel() // rows if rows else (input[0].numel() if input.dim() > 1 else 1)
        in_splits = list(input_split_sizes) or _even_splits(rows, ws, "input", self._where())
        out_rows = output.size(0) if output.dim() else output.numel()
        out_splits = list(output_split_sizes) or _even_splits(out_rows, ws, "output", self._where())
        if len(in_splits) != ws or len(out_splits) != ws or sum(in_splits) != rows or sum(out_splits) != out_rows:
            raise _errors.invalid(
                f"all_to_all_single: split sizes {in_splits} (input, {rows} rows) and {out_splits} (output,"
                f" {out_rows} rows) must have {ws} entries summing to the rows", self._where())
        return self._all_to_all([input.reshape(-1)], [output], in_splits, out_splits, row,
                                "all_to_all_single", given=bool(input_split_sizes))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> DdplugWork:
        """``all_to_all``: input_tensors[r] goes to rank r's output_tensors[this
        rank]; composed like all_to_all_single."""
        self._check_list(list(input_tensors), "all_to_all", "input_tensor_list")
        self._check_list(list(output_tensors), "all_to_all", "output_tensor_list")
        for t in list(input_tensors) + list(output_tensors):
            self._same_dtype(output_tensors[0], t, "all_to_all")
        flat_in = [t.reshape(-1) for t in input_tensors]
        return self._all_to_all(flat_in, list(output_tensors), [t.numel() for t in input_tensors],
                                [t.numel() for t in output_tensors], 1, "all_to_all", given=True)

    # ---- point-to-point (see .p2p) -------------------------------------------------------
    def send(self, tensors: Any, dst: int, tag: int = 0) -> DdplugWork:
        return _p2p.start(self, "send", tensors, dst, tag)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> DdplugWork:
        return _p2p.start(self, "recv", tensors, src, tag)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> DdplugWork:
        return _p2p.start(self, "recv", tensors, _p2p.ANY_SOURCE, tag)

    # ---- what ddplug cannot do ------------------------------------------------------------

    def split_group(self, *args: Any, **kwargs: Any) -> Any:
        raise _errors.unsupported(
            "split_group: ddplug cannot split a group in place; create the subgroup with"
            " torch.distributed.new_group(ranks) (each subgroup is its own ddplug run)", self._where())

    # ---- coalescing (torch.distributed._coalescing_manager) -----------------------------
    def _start_coalescing(self, device: Any = None) -> None:
        self._coalescing = []

    def _end_coalescing(self, device: Any = None) -> DdplugWork:
        works, self._coalescing = self._coalescing or [], None
        return self._merge(works, "coalesced collectives")

    # ---- lifetime ---------------------------------------------------------------------------
    def shutdown(self) -> None:  # type: ignore[override]
        """``destroy_process_group``: stop the completion thread; close the
        context if this group opened it (collective: every rank of the group
        shuts down). Idempotent. Never raises for a run that failed: the
        failure was raised by the call that met it (as with gloo, destroying a
        group after a timeout or a lost peer is cleanup); it is logged."""
        if self._closed:
            return
        self._closed = True
        if self._progress_thread is not None:
            self._progress_thread.stop()
            self._progress_thread = None
        if self._owned and not self._ctx.closed:
            from ..context import current, set_current

            if current() is self._ctx:
                set_current(None)
            try:
                self._ctx.close()
            except DdplugError as exc:
                _log.info("destroy_process_group on rank %d: the ddplug run had ended: %s", self._me, exc)

    def abort(self) -> None:  # type: ignore[override]
        """Abort the ddplug run on every rank (thread-safe)."""
        self._ctx.abort(f"rank {self._me}: torch.distributed abort()")

    # ---- the native fast path (see .native) --------------------------------------------------
    def _attach_native(self) -> None:
        """The hot calls in C++ when the native module is on (see .native):
        instance attributes that shadow this class's methods and fall back to
        them for anything but their common case."""
        cls = type(self)
        names = ("allreduce", "broadcast", "send", "recv", "recv_anysource")
        if any(getattr(cls, n) is not getattr(ProcessGroupDdplug, n) for n in names):
            return  # a subclass's own methods stay its own
        ops = {}
        for red in _OP_NAMES:
            for dtype in self._dtypes:
                try:
                    ops[(int(red), dtype)] = self._op_code(red, dtype, "all_reduce")
                except DdplugError:
                    continue
        _native.attach(self, tuple(getattr(cls, n) for n in names), dict(self._dtypes), ops, self._host_ok)
        _native.attach_context(self._ctx)

    def _native_error(self, op: str, status: int, t: torch.Tensor, extra: Any) -> BaseException:
        """The exception for a native call that failed with ``status``, worded as
        the Python method's (``extra``: all_reduce's RedOpType, broadcast's root,
        a send's or receive's (peer, tag))."""
        if op == "all_reduce":
            return self.error_for(status, lambda: _describe(op, t, extra))
        if op == "broadcast":
            return self.error_for(status, lambda: _describe(op, t, f"src {extra}"))
        return self.error_for(status, _p2p.describe(op, t, *extra))

    def _adopt_p2p(self, req: int, t: torch.Tensor, receive: bool, peer: int, tag: int, src: int,
                   status: int = 0) -> Any:
        """A native send's or receive's request (0: one that completed, from
        ``src``; ``status``: the failure it already ended with) as a Python
        work, which answers every later call on it."""
        return _p2p.adopt(self, req, t, receive, peer, tag, src, status)

    def _release_native_request(self, req: int, t: torch.Tensor) -> None:
        """A native work dropped while its request is pending: released once it
        completed (see release_when_complete)."""
        self.release_when_complete([ctypes.c_void_p(req)], (t,))

    # ---- internals: issuing -------------------------------------------------------------------
    def _handle(self) -> Any:
        h = self._ctx.handle_if_open
        if not h:
            raise _errors.make(status_code("ABORTED"), "the ddplug context of this process group is closed"
                               " (destroy_process_group, or the strategy closed the run)", self._where())
        return h

    def _issue(self, what: Any, steps: list, outputs: list, finish: Optional[Callable[[], None]],
               keep: tuple) -> DdplugWork:
        h = self._handle()
        reqs: list = []
        with self.lock:
            if self._orphans:
                self._reap()
            for kind, a, b in steps:
                req = ctypes.c_void_p()
                if kind == _AR:
                    st = _iallreduce(h, a.data_ptr(), a.data_ptr(), a.numel(), self._dtype(a, what), b,
                                     self._stream(a), ctypes.byref(req))
                elif kind == _BC:
                    st = _ibroadcast(h, a.data_ptr(), a.data_ptr(), a.numel(), self._dtype(a, what), b,
                                     self._stream(a), ctypes.byref(req))
                elif kind == _AG:
                    st = _iallgather(h, a.data_ptr(), b.data_ptr(), a.numel(), self._dtype(a, what),
                                     self._stream(a), ctypes.byref(req))
                else:
                    st = _ibarrier(h, ctypes.byref(req))
                if st:
                    err = self.error_for(st, what)
                    if reqs:  # started ones must complete before they are released
                        self._orphans.append((reqs, keep))
                    raise err
                reqs.append(req)
        return self._track(DdplugWork(self, reqs, outputs, finish, what, keep))

    def _track(self, work: DdplugWork) -> DdplugWork:
        if self._coalescing is not None:
            self._coalescing.append(work)
        return work

    def _merge(self, works: list, what: str) -> DdplugWork:
        """One work for several (see DdplugWork.merge), tracked instead of them."""
        if self._coalescing is not None:
            for w in works:
                if w in self._coalescing:
                    self._coalescing.remove(w)
        return self._track(DdplugWork.merge(self, works, what))

    def _all_to_all(self, inputs: list, outputs: list, in_splits: list, out_splits: list, row: int,
                    what: str, given: bool) -> DdplugWork:
        ws, me = self._ws, self._me
        if given:  # every rank's splits: whom it sends how many rows
            mine = self._stage_device(torch.tensor(in_splits, dtype=torch.int64))
            every_t = self._stage_device(torch.empty(ws * ws, dtype=torch.int64))
            self._issue(f"{what}: the split sizes", [(_AG, mine, every_t)], [], None, (mine, every_t)).wait()
            every = every_t.cpu().view(ws, ws).tolist()
        else:
            every = [in_splits] * ws
        longest = max(sum(s) for s in every)
        src = torch.zeros(longest * row, dtype=outputs[0].dtype, device=inputs[0].device)
        off = 0
        for t in inputs:
            src[off:off + t.numel()].copy_(t)
            off += t.numel()
        src = self._stage_device(src)
        gathered = torch.empty(ws * longest * row, dtype=src.dtype, device=src.device)
        for j in range(ws):
            if every[j][me] != out_splits[j]:
                raise _errors.invalid(
                    f"{what}: rank {j} sends {every[j][me]} rows to rank {me}, which expects {out_splits[j]}",
                    self._where())

        def finish() -> None:
            pieces = []
            for j in range(ws):
                start = (j * longest + sum(every[j][:me])) * row
                pieces.append(gathered[start:start + every[j][me] * row])
            flat = torch.cat(pieces) if pieces else gathered[:0]
            off = 0
            for o in outputs:
                o.copy_(flat[off:off + o.numel()].view_as(o))
                off += o.numel()

        return self._issue(f"{what} (composed: allgather of {ws} x {longest * row} elements)",
                           [(_AG, src, gathered)], outputs, finish, (src, gathered))

    # ---- completion (DdplugWork calls these) ---------------------------------------------
    def watch(self, work: DdplugWork) -> None:
        """Complete ``work``'s future from the group's completion thread (started
        on first use; see :mod:`.work`). Under the lock."""
        if self._progress_thread is None:
            self._progress_thread = Progress(self)
        self._progress_thread.add(work)

    def release_when_complete(self, reqs: list, keep: tuple) -> None:
        """Requests of a work dropped while pending (freeing them now would abort
        the run): released, with the buffers in ``keep``, once they completed."""
        self._orphans.append((reqs, keep))

    def _reap(self) -> None:
        """Release requests of works dropped while pending, once they completed
        (under the lock)."""
        done_ = ctypes.c_int(0)
        left = []
        for reqs, keep in self._orphans:
            if self._ctx.closed:
                continue
            if all(_test(r, ctypes.byref(done_)) != 0 or done_.value for r in reqs):
                for r in reqs:
                    _free(r)
            else:
                left.append((reqs, keep))
        self._orphans = left

    # ---- internals: checks and tensors -------------------------------------------------------
    def _where(self) -> str:
        return f"rank {self._me}"

    def error_for(self, status: int, what: Any) -> BaseException:
        """torch's ``DistBackendError`` (also the ddplug class) for a failed
        ``status`` of the collective ``what`` (a str, or a callable making it).
        A TIMEOUT also says where the time limit comes from (timeout=)."""
        text = what() if callable(what) else str(what)
        err = self._ctx.error_for(status, text)
        if status == _TIMEOUT:
            err = _errors.with_timeout_hint(err, _TIMEOUT_HINT)
        return _errors.backend_error(err)

    def _one(self, tensors: List[torch.Tensor], op: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise self._several(op)
        return tensors[0]

    def _several(self, op: str) -> BaseException:
        return _errors.unsupported(
            f"{op}: ddplug takes one tensor per process (multi-device lists are deprecated in torch);"
            " run one process per device", self._where())

    def _root(self, root: int, op: str) -> int:
        if not 0 <= root < self._ws:
            raise _errors.invalid(f"{op}: rank {root} is not in the group (size {self._ws})", self._where())
        return root

    def _check_list(self, tensors: list, op: str, name: str) -> None:
        if len(tensors) != self._ws:
            raise _errors.invalid(f"{op}: {name} has {len(tensors)} tensors, the group has {self._ws} ranks",
                                  self._where())

    def _same_dtype(self, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
        if a.dtype != b.dtype:
            raise _errors.invalid(f"{op}: tensors of {a.dtype} and {b.dtype}; they must have one dtype",
                                  self._where())

    def _dtype(self, t: torch.Tensor, op: Any) -> int:
        code = self._dtypes.get(t.dtype)
        if code is None:
            known = ", ".join(str(d).replace("torch.", "") for d in self._dtypes)
            label = op() if callable(op) else op
            raise _errors.unsupported(
                f"{label}: dtype {str(t.dtype).replace('torch.', '')} has no equivalent in plugin {self._plugin}"
                f" (it takes {known}); convert the tensor (e.g. .to(torch.float32)) before the collective",
                self._where())
        return code

    def _op_code(self, red: Any, dtype: torch.dtype, op: str) -> int:
        key = (red, dtype is torch.bool)
        code = self._ops.get(key)
        if code is not None:
            return code
        name = _OP_NAMES.get(red)
        label = _op_label(red)
        if name is None:
            raise self._refused_op(op, red)
        if dtype is torch.bool:
            if name == "avg":
                raise _errors.unsupported(f"{op} with {label} on bool tensors: an average of booleans is not"
                                          " a boolean; convert to a float dtype first", self._where())
            name = _BOOL_OPS[name]
        elif name in ("band", "bor") and dtype not in _INTEGER:
            raise _errors.unsupported(f"{op} with {label} needs an integer or bool tensor, got {dtype}",
                                      self._where())
        codes = _names.ops()
        c = codes[name]
        if not self._op_mask & (1 << c):
            raise self._refused_op(op, red, name)
        self._ops[key] = c
        return c

    def _refused_op(self, op: str, red: Any, name: Optional[str] = None) -> BaseException:
        label = _op_label(red)
        instead = {
            "BXOR": "all_gather the tensors and combine them with torch.bitwise_xor",
            "PREMUL_SUM": "multiply the tensor by the factor first, then use ReduceOp.SUM",
            "BAND": "all_gather the tensors and combine them with torch.bitwise_and",
            "BOR": "all_gather the tensors and combine them with torch.bitwise_or",
        }.get(getattr(red, "name", ""), "all_gather the tensors and reduce them locally")
        why = f"plugin {self._plugin} has no {name} op" if name else "ddplug has no such reduction"
        return _errors.unsupported(f"{op} with {label}: {why}; {instead}", self._where())

    def _stream(self, t: torch.Tensor) -> Optional[int]:
        return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None

    def _direct(self, t: torch.Tensor) -> bool:
        """Whether the plugin takes ``t``'s memory as it is."""
        if not t.is_contiguous():
            return False
        if t.is_cuda:
            return self._dev_ok
        return self._host_ok and t.is_cpu

    def _target(self, t: torch.Tensor, op: Any) -> torch.device:
        dev = t.device
        if dev.type == "cuda":
            if self._dev_ok:
                return dev
            if self._host_ok:
                return torch.device("cpu")
        elif dev.type == "cpu":
            if self._host_ok:
                return dev
            if self._dev_ok and torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
        raise _errors.unsupported(
            f"{op() if callable(op) else op}: a tensor on {dev}; plugin {self._plugin} takes"
            f" {'CPU' if self._host_ok else ''}{' and ' if self._host_ok and self._dev_ok else ''}"
            f"{'CUDA' if self._dev_ok else ''} memory: move it there first", self._where())

    def _workable(self, t: torch.Tensor, op: Any, copy_in: bool = True) -> torch.Tensor:
        """``t`` itself, or a contiguous staging copy on memory the plugin takes
        (``copy_in`` False: uninitialised, for outputs)."""
        if self._direct(t):
            return t
        target = self._target(t, op)
        if copy_in:
            return t.detach().to(device=target, memory_format=torch.contiguous_format, copy=True)
        return torch.empty(t.shape, dtype=t.dtype, device=target)

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``t`` the plugin takes (t stays untouched)."""
        target = self._target(t, "a collective")
        return t.detach().to(device=target, memory_format=torch.contiguous_format, copy=True).reshape(-1)

    def _stage_device(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor ddplug made for itself, moved where the plugin takes it."""
        return t if self._direct(t) else t.to(self._target(t, "a collective")).contiguous()


def _call_timeout_ms(timeout: Any) -> int:
    """A call's ``timeout`` (torch's options) in ms: negative (torch's "unset",
    kUnsetTimeout) means the group's timeout (-1); 0 is 0."""
    ms = int(timeout.total_seconds() * 1000)
    return -1 if ms < 0 else ms


def _describe(op: str, t: torch.Tensor, *more: Any) -> str:
    """How error messages name a collective: "all_reduce(4 x float32 on cpu, ReduceOp.SUM)"."""
    extra = "".join(f", {_op_label(m) if isinstance(m, _RedOpType) else m}" for m in more)
    return f"{op}({t.numel()} x {str(t.dtype).replace('torch.', '')} on {t.device}{extra})"


def _copy_back(t: torch.Tensor, w: torch.Tensor) -> Optional[Callable[[], None]]:
    if w is t:
        return None

    def finish() -> None:
        with torch.no_grad():
            t.copy_(w.view(t.shape) if w.shape != t.shape else w)

    return finish


def _even_splits(rows: int, ws: int, which: str, where: str) -> list:
    """all_to_all_single's split sizes when none are given: ``rows`` in ``ws``
    equal parts (refused when they do not divide)."""
    if rows % ws:
        raise _errors.invalid(f"all_to_all_single: the {which} has {rows} rows, not divisible by the world size"
                              f" {ws}; pass split sizes", where)
    return [rows // ws] * ws


__all__ = ["ProcessGroupDdplug"]
