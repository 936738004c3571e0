"""A process's membership in a data-parallel run (``ddplug_context``) and its
collectives on torch tensors and numpy arrays.

Blocking collectives wait at most the configured collective timeout; a timeout or
a lost peer aborts the run on every rank and raises here (:class:`~ddplug.errors.
PeerLost`, :class:`~ddplug.errors.Timeout`, :class:`~ddplug.errors.Aborted`), naming
the rank and sequence number. Collectives must be issued in the same order on
every rank (the library detects mismatches where the plugin can). libddplug allows
one thread at a time in a context's collectives: every call here holds
:attr:`Context.lock` (which the torch.distributed backend's completion thread
shares). :meth:`Context.abort` may be called from any thread.
"""

from __future__ import annotations

import ctypes
import pickle
import threading
from typing import Any, Optional

from ._c import _buffers, _names
from ._c import _capi as S
from ._c._capi import F, take_bytes
from .config import Config, ConfigSource, load
from .errors import DdplugError, check, make

# The plugin's capability bits (common.h DDPLUG_CAP_*) in ``Context.plugin["caps"]``,
# checked against the header by tests/python/test_binding.py::test_header_constants.
CAP_HOST_MEMORY = 1 << 0
CAP_DEVICE_MEMORY = 1 << 1
CAP_REGISTERED_MEMORY = 1 << 8

_current_lock = threading.Lock()
_current: Optional["Context"] = None


def current() -> Optional["Context"]:
    """The context this process registered as current (the strategy's), if any."""
    return _current


def set_current(ctx: Optional["Context"]) -> None:
    global _current
    with _current_lock:
        _current = ctx


class Request:
    """A started asynchronous collective. Keep it until :meth:`wait` returned; the
    buffers it uses stay referenced here until then. A request dropped while
    pending is never freed (freeing a pending request aborts the run)."""

    def __init__(self, ctx: "Context", handle: ctypes.c_void_p, keep: tuple) -> None:
        self._ctx = ctx
        self._h = handle
        self._keep = keep
        self._done = False

    @property
    def seq(self) -> int:
        return int(F.ddplug_request_seq(self._h)) if self._h else 0

    def test(self) -> bool:
        """True when complete (never blocks); raises if it failed."""
        if self._done:
            return True
        done = ctypes.c_int(0)
        with self._ctx.lock:
            self._ctx.check(F.ddplug_request_test(self._h, ctypes.byref(done)), "test")
            if done.value:
                self._finish()
        return bool(done.value)

    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Wait until complete; ``None`` = the configured collective timeout."""
        if self._done:
            return
        ms = -1 if timeout_s is None else max(0, int(timeout_s * 1000))
        with self._ctx.lock:
            st = F.ddplug_request_wait(self._h, ms)
            if st == 0:
                self._finish()
                return
            err = self._ctx.error_for(st, f"collective seq {self.seq}")
            if err.name != "TIMEOUT":
                self._finish()  # a failure other than TIMEOUT is final for the request
        raise err

    def _finish(self) -> None:
        h, self._h = self._h, None
        self._done = True
        self._keep = ()
        if h:
            F.ddplug_request_free(h)


class Store:
    """The context's rendezvous store (borrowed), restricted to keys under
    ``user/`` — the prefix ddplug reserves for the host."""

    PREFIX = "user/"

    def __init__(self, ctx: "Context") -> None:
        self._ctx = ctx

    def _key(self, key: str) -> bytes:
        return (self.PREFIX + key).encode()

    @property
    def _h(self) -> ctypes.c_void_p:
        return F.ddplug_context_store(self._ctx.handle)

    def set(self, key: str, value: bytes) -> None:
        check(F.ddplug_store_set(self._h, self._key(key), value, len(value)), f"store set {key}")

    def get(self, key: str, timeout_s: float) -> bytes:
        """Wait (at most timeout_s) until key exists; its value."""
        out, n = ctypes.c_void_p(), ctypes.c_uint64()
        check(F.ddplug_store_get(self._h, self._key(key), int(timeout_s * 1000), ctypes.byref(out),
                                 ctypes.byref(n)), f"store get {key}")
        return take_bytes(out, n.value)

    def add(self, key: str, delta: int) -> int:
        """Atomically add delta to the integer at key (missing = 0); the new value."""
        out = ctypes.c_int64()
        check(F.ddplug_store_add(self._h, self._key(key), delta, ctypes.byref(out)), f"store add {key}")
        return out.value


class Context:
    """Join the run (collective: every rank calls it) — see ``ddplug_open``.

    Args:
        config: a path, JSON text, dict, :class:`~ddplug.config.Config` or None
            (``DDPLUG_CONFIG``, else defaults).
        plugin: plugin name or path overriding config "plugin".
        host_id: node identity override (ranks with equal ids share a node).
        framework: who is calling, for logs ("lightning 2.6.6").
        timeout_s: rendezvous timeout override.
        world: the world as the caller decided it (a framework's cluster
            environment), used instead of discovery: a dict with ``rank`` and
            ``world_size`` and, where known, ``local_rank``,
            ``local_world_size``, ``node_rank`` (-1 or absent: unknown),
            ``master_addr`` and ``master_port`` (used when the config names no
            rendezvous address / port).
        collective_timeout_s: collective timeout override (a framework's own
            timeout argument).
        rendezvous: ``(addr, port)`` the caller decided, overriding the config's
            and the environment's (with ``world`` only; port -1: any free port,
            a world of one).
    """

    def __init__(
        self,
        config: ConfigSource = None,
        *,
        plugin: Optional[str] = None,
        host_id: Optional[str] = None,
        framework: Optional[str] = None,
        timeout_s: Optional[float] = None,
        world: Optional[dict] = None,
        collective_timeout_s: Optional[float] = None,
        rendezvous: Optional[tuple] = None,
    ) -> None:
        self.lock = threading.RLock()  # held around every call into the context's collectives
        # A Config given is borrowed (ddplug_open copies it): a copy through
        # JSON text would mark every default as set by the user, and "the
        # config names no plugin" (mpi under an MPI launcher) would be lost.
        own = not isinstance(config, Config)
        cfg = load(config) if own else config
        try:
            opts = S.new(
                S.OpenOptions,
                plugin=plugin.encode() if plugin else None,
                host_id=host_id.encode() if host_id else None,
                framework=framework.encode() if framework else None,
                timeout_ms=int(timeout_s * 1000) if timeout_s else 0,
                collective_timeout_ms=max(1, int(collective_timeout_s * 1000)) if collective_timeout_s else 0,
            )
            if world is not None:
                given = S.new(
                    S.World,
                    rank=int(world["rank"]),
                    world_size=int(world["world_size"]),
                    local_rank=int(world.get("local_rank", -1)),
                    local_world_size=int(world.get("local_world_size", -1)),
                    node_rank=int(world.get("node_rank", -1)),
                    master_port=int(world.get("master_port") or 0),
                    master_addr=str(world.get("master_addr") or "").encode(),
                )
                opts.world = ctypes.pointer(given)
            if rendezvous is not None:
                opts.rendezvous_addr = str(rendezvous[0]).encode() if rendezvous[0] else None
                opts.rendezvous_port = int(rendezvous[1])
            out = ctypes.c_void_p()
            check(F.ddplug_open(cfg.handle, ctypes.byref(opts), ctypes.byref(out)), "ddplug_open")
            # the collective timeout in force (None: the library's default), for
            # waits the host does itself (the torch backend's monitored_barrier)
            self.collective_timeout_s: Optional[float] = (
                collective_timeout_s if collective_timeout_s
                else cfg.get_float("timeouts.collective_s") if cfg.is_set("timeouts.collective_s") else None)
        finally:
            if own:
                cfg.close()
        self._h: Optional[ctypes.c_void_p] = out
        self.generation = 0  # + 1 per re-formation (shrink)
        self._read_world()
        info = S.new(S.PluginInfo)
        self.check(F.ddplug_context_plugin(self._h, ctypes.byref(info)), "context plugin")
        self.plugin = {
            "name": S.text(info.name),
            "version": S.text(info.version),
            "description": S.text(info.description),
            "path": S.text(info.path),
            "plugin_abi_version": info.plugin_abi_version,
            "caps": info.caps,
            "dtype_mask": info.dtype_mask,
            "op_mask": info.op_mask,
            "has_sampler": bool(info.has_sampler),
        }
        self.store = Store(self)
        self._aborted = False
        self._on_close: list = []

    def _read_world(self) -> None:
        w = S.new(S.World)
        self.check(F.ddplug_context_world(self._h, ctypes.byref(w)), "context world")
        self.rank = w.rank
        self.world_size = w.world_size
        self.local_rank = w.local_rank
        self.local_world_size = w.local_world_size
        self.node_rank = w.node_rank
        # where the run's rendezvous store is served ("" and 0 for one process)
        self.master_addr = S.text(w.master_addr)
        self.master_port = int(w.master_port)
        self.num_nodes = int(F.ddplug_context_num_nodes(self._h))

    # ---- elastic in place ------------------------------------------------------
    def shrink(self, timeout_s: Optional[float] = None) -> dict:
        """Re-form the group over the survivors after a lost rank (a call raised
        :class:`~ddplug.errors.PeerLost`, and the config says
        ``"elastic": {"on_peer_lost": "shrink"}``) — ``ddplug_shrink``: collective
        over the survivors; afterwards :attr:`rank` and :attr:`world_size` are the
        new ones. Returns :meth:`membership`. Raises what ``ddplug_shrink`` fails
        with (the run then ends). No other thread may use the context meanwhile."""
        m = S.new(S.Membership)
        ms = -1 if timeout_s is None else max(1, int(timeout_s * 1000))
        with self.lock:
            self.check(F.ddplug_shrink(self.handle, ms, ctypes.byref(m)), "shrink")
            self._read_world()
            self.generation = int(m.generation)
        return _membership(m)

    def membership(self) -> dict:
        """``{"generation", "rank", "world_size", "identity", "previous_rank",
        "previous_world_size", "lost_count", "lost"}`` — generation 0 at open, + 1 per
        re-formation; identity is this process's rank at open; lost names the
        previous ranks the last re-formation lost ("2", "1, 3")."""
        m = S.new(S.Membership)
        self.check(F.ddplug_context_membership(self.handle, ctypes.byref(m)), "membership")
        return _membership(m)

    # ---- identity ----------------------------------------------------------
    @property
    def handle(self) -> ctypes.c_void_p:
        if not self._h:
            raise RuntimeError("ddplug: the context is closed")
        return self._h

    @property
    def handle_if_open(self) -> Optional[ctypes.c_void_p]:
        """The library handle, or a false value once closed (no exception: for
        callers on a hot path that check it themselves)."""
        return self._h

    @property
    def closed(self) -> bool:
        return not self._h

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` was called on this context."""
        return self._aborted

    @property
    def config(self) -> Config:
        """The context's effective config: a view of the context's own, readable
        while the context is open (a read after :meth:`close` raises
        ValueError); nothing to close or free."""
        return Config(F.ddplug_context_config(self.handle), view_of=self)

    def error(self) -> str:
        return (F.ddplug_context_error(self._h) or b"").decode("utf-8", "replace") if self._h else ""

    def error_for(self, status: int, where: str) -> DdplugError:
        """The exception for a failed call on this context (``status``): the
        context's last error sentence (else this thread's), headed by this rank
        and ``where``."""
        detail = self.error() or (F.ddplug_last_error() or b"").decode("utf-8", "replace")
        return make(status, detail, f"rank {self.rank}: {where}" if hasattr(self, "rank") else where)

    def check(self, status: int, where: str) -> None:
        """Raise :meth:`error_for` unless ``status`` is OK (0)."""
        if status != 0:
            raise self.error_for(status, where)

    # ---- lifetime ----------------------------------------------------------
    def on_close(self, fn) -> None:
        """Call ``fn()`` first thing in :meth:`close` (release what is bound to
        the context, e.g. its samplers)."""
        self._on_close.append(fn)

    def close(self) -> None:
        """Leave the run (waits for the other ranks to close, at most the
        collective timeout). Idempotent."""
        callbacks, self._on_close = self._on_close, []
        for fn in reversed(callbacks):
            fn()
        with self.lock:
            h, self._h = self._h, None
            if _current is self:
                set_current(None)
            if h:
                check(F.ddplug_close(h), "ddplug_close")

    def abort(self, reason: str) -> None:
        """Abort the run on every rank (thread-safe); the context must still be closed."""
        if self._h:
            self._aborted = True
            F.ddplug_abort(self._h, reason.encode("utf-8", "replace"))

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and self._h:
            self.abort(f"{type(exc).__name__}: {exc}")
        self.close()

    # ---- collectives ---------------------------------------------------------
    def allreduce(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduce ``x`` over ranks with ``op`` (sum, avg, min, max, prod, bor, band);
        in place unless ``out`` is given. Returns the result buffer."""
        # The error's description is made only on failure: formatting it (a call
        # into the library for the dtype's name) cost more than the rest of an
        # 8-byte call's Python (bench/torch_backend_perf.py --profile).
        src = _buffers.of(x)
        dst = src if out is None else _buffers.of(out)
        self._same_shape(src, dst)
        code = self._op(op)
        with self.lock:
            st = F.ddplug_allreduce(self.handle, src.ptr, dst.ptr, src.count, src.dtype, code,
                                    _buffers.stream_of(src))
        if st:
            raise self._allreduce_error(st, src, op)
        return x if out is None else out

    def _allreduce_error(self, status: int, src: _buffers.Buffer, op: str) -> BaseException:
        return self.error_for(status, f"allreduce({src.count} x {_dtype_name(src.dtype)}, {op})")

    def _native_allreduce_error(self, status: int, x: Any, op: str) -> BaseException:
        """The exception for the native allreduce of ``x`` that failed with
        ``status`` (ddplug.distributed.native.attach_context), worded as this
        class's allreduce words it."""
        return self._allreduce_error(status, _buffers.of(x), op)

    def iallreduce(self, x: Any, op: str = "sum") -> Request:
        """Start an in-place allreduce of ``x``; wait on the returned request."""
        b = _buffers.of(x)
        req = ctypes.c_void_p()
        code = self._op(op)
        with self.lock:
            st = F.ddplug_iallreduce(self.handle, b.ptr, b.ptr, b.count, b.dtype, code,
                                     _buffers.stream_of(b), ctypes.byref(req))
        if st:
            raise self.error_for(st, f"iallreduce({b.count} x {_dtype_name(b.dtype)}, {op})")
        return Request(self, req, (x,))

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Root's ``x`` to every rank's ``x`` (in place)."""
        b = _buffers.of(x)
        with self.lock:
            self.check(
                F.ddplug_broadcast(self.handle, b.ptr, b.ptr, b.count, b.dtype, root,
                                   _buffers.stream_of(b)),
                f"broadcast({b.count} x {_dtype_name(b.dtype)}, root {root})",
            )
        return x

    def allgather(self, x: Any, out: Any) -> Any:
        """``out`` (world_size times x's elements) receives every rank's ``x`` in
        rank order."""
        src, dst = _buffers.of(x), _buffers.of(out)
        if dst.count != src.count * self.world_size or dst.dtype != src.dtype:
            raise ValueError(
                f"ddplug: allgather output needs {src.count * self.world_size} elements of"
                f" {_dtype_name(src.dtype)}, got {dst.count} of {_dtype_name(dst.dtype)}"
            )
        with self.lock:
            self.check(
                F.ddplug_allgather(self.handle, src.ptr, dst.ptr, src.count, src.dtype,
                                   _buffers.stream_of(src)),
                f"allgather({src.count} x {_dtype_name(src.dtype)})",
            )
        return out

    def barrier(self, timeout_s: Optional[float] = None) -> None:
        ms = -1 if timeout_s is None else int(timeout_s * 1000)
        with self.lock:
            self.check(F.ddplug_barrier(self.handle, ms), "barrier")

    # ---- Python objects ------------------------------------------------------
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """Root's picklable ``obj`` on every rank: size first, then the bytes."""
        import numpy as np

        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if self.rank == root else b""
        size = np.array([len(payload)], dtype=np.int64)
        self.broadcast(size, root)
        buf = np.frombuffer(bytearray(payload), dtype=np.uint8) if self.rank == root else \
            np.empty(int(size[0]), dtype=np.uint8)
        if buf.size:
            self.broadcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def allgather_object(self, obj: Any) -> list:
        """Every rank's picklable ``obj``, in rank order."""
        import numpy as np

        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        sizes = np.empty(self.world_size, dtype=np.int64)
        self.allgather(np.array([len(payload)], dtype=np.int64), sizes)
        width = int(sizes.max())
        mine = np.zeros(width, dtype=np.uint8)
        mine[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        every = np.empty(width * self.world_size, dtype=np.uint8)
        if width:
            self.allgather(mine, every)
        return [pickle.loads(every[r * width: r * width + int(sizes[r])].tobytes())
                for r in range(self.world_size)]

    # ---- helpers -------------------------------------------------------------
    @staticmethod
    def _op(op: str) -> int:
        codes = _names.ops()
        if op not in codes:
            raise ValueError(f"ddplug: unknown reduce op {op!r} (one of {', '.join(codes)})")
        return codes[op]

    @staticmethod
    def _same_shape(a: _buffers.Buffer, b: _buffers.Buffer) -> None:
        if a.count != b.count or a.dtype != b.dtype:
            raise ValueError("ddplug: output must have the input's element count and dtype")

    def __repr__(self) -> str:
        if not self._h:
            return "Context(closed)"
        return (f"Context(rank={self.rank}, world_size={self.world_size}, "
                f"plugin={self.plugin['name']!r})")


def _membership(m: S.Membership) -> dict:
    return {"generation": int(m.generation), "rank": int(m.rank), "world_size": int(m.world_size),
            "identity": int(m.identity), "previous_rank": int(m.previous_rank),
            "previous_world_size": int(m.previous_world_size), "lost_count": int(m.lost_count),
            "lost": S.text(m.lost)}


def _dtype_name(code: int) -> str:
    raw = F.ddplug_dtype_name(code)
    return raw.decode() if raw else f"dtype#{code}"
