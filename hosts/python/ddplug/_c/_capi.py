"""The ctypes binding of ``libddplug``: finding and loading the library, mirrors
of its versioned structs, and the prototype of every function this package
calls — one module (ABI mode: nothing compiled against torch).

Where the library comes from, in order (the first that loads wins):

1. ``DDPLUG_LIBRARY``: an explicit path to ``libddplug.so`` (or ``.so.1``).
2. The package's own install location: ``ddplug/_lib/`` (a wheel
   that bundles the library), ``<sys.prefix>/lib`` (``cmake --install`` into the
   virtual environment) and the dynamic linker's search (``ldconfig``).
3. The build tree: ``$DDPLUG_BUILD_DIR/lib`` and ``<source>/build/lib`` when this
   package is used from a source checkout (``hosts/python`` on ``sys.path``).

When none loads, :class:`LibraryNotFound` lists every place it looked and why each
failed. ``F.<name>`` is the C function ``name`` bound on first use from
:data:`PROTOTYPES`, so a library that predates a function fails only when that
function is used, with a message naming it. Every struct begins ``{uint32
struct_size; uint32 abi_version}``; :func:`new` fills both (``abi_version`` read
from the loaded library). ``tests/python/test_binding.py`` compiles a C program
against the headers and checks every struct's field offsets and size here.
Opaque handles travel as ``c_void_p``; strings the library allocates come back as
``c_void_p`` and are read then released with ``ddplug_free`` (:func:`take_string`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from ctypes import (
    POINTER,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int32,
    c_int64,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

# ---- loading the library ---------------------------------------------------------

_SONAMES = ("libddplug.so.1", "libddplug.so")

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_bound: dict = {}


class LibraryNotFound(ImportError):
    """``libddplug`` could not be loaded; the message lists every place searched."""


def _source_root() -> Optional[Path]:
    # hosts/python/ddplug/_c/_capi.py -> the repository root, when this is a checkout.
    here = Path(__file__).resolve()
    if len(here.parents) < 5:
        return None
    root = here.parents[4]
    return root if (root / "abi" / "include" / "ddplug" / "ddplug.h").is_file() else None


def candidates() -> list[tuple[str, str]]:
    """Every (origin, path) the loader tries, in order."""
    out: list[tuple[str, str]] = []
    explicit = os.environ.get("DDPLUG_LIBRARY")
    if explicit:
        out.append(("DDPLUG_LIBRARY", explicit))
    pkg = Path(__file__).resolve().parents[1] / "_lib"  # ddplug/_lib
    out += [("package", str(pkg / n)) for n in _SONAMES]
    out += [("sys.prefix", str(Path(sys.prefix) / "lib" / n)) for n in _SONAMES]
    found = ctypes.util.find_library("ddplug")
    if found:
        out.append(("ldconfig", found))
    build = os.environ.get("DDPLUG_BUILD_DIR")
    if build:
        out += [("DDPLUG_BUILD_DIR", str(Path(build) / "lib" / n)) for n in _SONAMES]
    root = _source_root()
    if root is not None:
        out += [("source tree", str(root / "build" / "lib" / n)) for n in _SONAMES]
    return out


def load() -> ctypes.CDLL:
    """The loaded library (loaded on first call). Raises :class:`LibraryNotFound`."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for origin, path in candidates():
            is_name = "/" not in path  # ldconfig gives a bare soname
            if not is_name and not os.path.exists(path):
                tried.append(f"  {origin}: {path} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                tried.append(f"  {origin}: {path} ({exc})")
                continue
            _lib, _lib_path = lib, path
            from . import _logbridge  # its log lines go to the "ddplug" logger

            _logbridge.install(lib)
            return lib
        raise LibraryNotFound(
            "ddplug: cannot load libddplug. Looked in:\n"
            + "\n".join(tried)
            + "\nSet DDPLUG_LIBRARY to the library's path, or DDPLUG_BUILD_DIR to a build"
            " directory (cmake -S . -B build && cmake --build build)."
        )


def path() -> str:
    """The path (or soname) the library was loaded from."""
    load()
    assert _lib_path is not None
    return _lib_path


def fn(name: str, restype: Any, argtypes: Sequence[Any]) -> Callable:
    """The C function ``name`` with its prototype, bound once.

    Raises :class:`AttributeError` naming the function and the library when the
    loaded library does not export it (a library older than this package)."""
    f = _bound.get(name)
    if f is not None:
        return f
    lib = load()
    try:
        f = getattr(lib, name)
    except AttributeError:
        raise AttributeError(
            f"ddplug: {path()} does not export {name}(): the library is older than this"
            " Python package; rebuild it or point DDPLUG_LIBRARY at a newer one"
        ) from None
    f.restype = restype
    f.argtypes = list(argtypes)
    _bound[name] = f
    return f


def has(name: str) -> bool:
    """Whether the loaded library exports ``name``."""
    return hasattr(load(), name)


def build_dir_of_library() -> Optional[Path]:
    """The directory holding the loaded library (plugins are searched beside it)."""
    p = path()
    return Path(p).resolve().parent if "/" in p else None


# ---- structs ---------------------------------------------------------------------

class World(ctypes.Structure):
    """``ddplug_world``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("local_rank", c_int32),
        ("local_world_size", c_int32),
        ("node_rank", c_int32),
        ("master_port", c_int32),
        ("master_addr", c_char * 256),
        ("source", c_char * 16),
    ]


class PluginInfo(ctypes.Structure):
    """``ddplug_plugin_info``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("plugin_abi_version", c_uint32),
        ("dtype_mask", c_uint32),
        ("op_mask", c_uint32),
        ("has_sampler", c_int32),
        ("caps", c_uint64),
        ("name", c_char * 64),
        ("version", c_char * 64),
        ("description", c_char * 256),
        ("path", c_char * 4096),
    ]


class OpenOptions(ctypes.Structure):
    """``ddplug_open_options``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("plugin", c_char_p),
        ("host_id", c_char_p),
        ("framework", c_char_p),
        ("timeout_ms", c_int64),
        ("world", ctypes.POINTER(World)),
        ("collective_timeout_ms", c_int64),
        ("rendezvous_addr", c_char_p),
        ("rendezvous_port", c_int32),
        ("reserved0", c_int32),
    ]


class SamplerOptions(ctypes.Structure):
    """``ddplug_sampler_options`` (the host API's sampler description)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("kind", c_int32),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("shuffle", c_int32),
        ("drop_last", c_int32),
        ("exact", c_int32),
        ("seed", c_uint64),
        ("num_samples", c_uint64),
        ("stream", c_char_p),
        ("lengths", POINTER(c_int64)),
        ("boundaries", POINTER(c_int64)),
        ("num_boundaries", c_uint32),
        ("num_buckets", c_uint32),
        ("batch_size", c_uint64),
    ]


class SamplerInfo(ctypes.Structure):
    """``ddplug_sampler_info``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("kind", c_int32),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("from_plugin", c_int32),
        ("num_samples", c_uint64),
        ("batch_size", c_uint64),
        ("length", c_uint64),
        ("epoch", c_uint64),
        ("position", c_uint64),
        ("padded", c_uint64),
        ("dropped", c_uint64),
        ("stream", c_char * 64),
        ("exact", c_int32),
        ("reserved0", c_int32),
        ("steps", c_uint64),
        ("committed", c_uint64),
    ]


class AuditOptions(ctypes.Structure):
    """``ddplug_audit_options``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("shuffle", c_int32),
        ("evaluation", c_int32),
        ("allowed_padding", c_uint64),
        ("allowed_missing", c_uint64),
        ("local_dropped", c_uint64),
        ("by_id", c_int32),
        ("steps_only", c_int32),
    ]


class AuditReport(ctypes.Structure):
    """``ddplug_audit_report``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("verdict", c_int32),
        ("violations", c_uint32),
        ("world_size", c_int32),
        ("exact", c_int32),
        ("full", c_int32),
        ("evaluation", c_int32),
        ("epoch", c_uint64),
        ("num_samples", c_uint64),
        ("tracked", c_uint64),
        ("covered", c_uint64),
        ("common", c_uint64),
        ("deliveries", c_uint64),
        ("repeats", c_uint64),
        ("allowed_padding", c_uint64),
        ("allowed_missing", c_uint64),
        ("out_of_range", c_uint64),
        ("steps_min", c_uint64),
        ("steps_max", c_uint64),
        ("steps_min_rank", c_int32),
        ("steps_max_rank", c_int32),
        ("samples_min", c_uint64),
        ("samples_max", c_uint64),
        ("samples_min_rank", c_int32),
        ("samples_max_rank", c_int32),
        ("missing", c_uint64),
        ("cross_repeats", c_uint64),
        ("stream", c_char * 64),
        ("summary", c_char * 512),
    ]


class Membership(ctypes.Structure):
    """``ddplug_membership``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("abi_version", c_uint32),
        ("generation", c_uint64),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("identity", c_int32),
        ("previous_rank", c_int32),
        ("previous_world_size", c_int32),
        ("lost_count", c_int32),
        ("lost", c_char * 256),
    ]


# name in the C headers -> the mirror, for the layout test.
C_NAMES = {
    "ddplug_membership": Membership,
    "ddplug_world": World,
    "ddplug_plugin_info": PluginInfo,
    "ddplug_open_options": OpenOptions,
    "ddplug_sampler_options": SamplerOptions,
    "ddplug_sampler_info": SamplerInfo,
    "ddplug_audit_options": AuditOptions,
    "ddplug_audit_report": AuditReport,
}

# Structs whose abi_version field carries the plugin ABI version (plugin.h) rather
# than the host API version: none of those the package fills.
_PLUGIN_ABI: tuple = ()


def new(cls, **fields):
    """An instance of ``cls`` with struct_size/abi_version filled from the library."""
    obj = cls()
    obj.struct_size = ctypes.sizeof(cls)
    obj.abi_version = (
        F.ddplug_plugin_abi_version() if cls in _PLUGIN_ABI else F.ddplug_abi_version()
    )
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def text(buf) -> str:
    """A ``char[N]`` field as str."""
    return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace")


c_void_pp = POINTER(c_void_p)


# ---- functions --------------------------------------------------------------------

P = c_void_p
PP = POINTER(c_void_p)
I64P = POINTER(c_int64)
U64P = POINTER(c_uint64)
IP = POINTER(c_int)

PROTOTYPES: dict = {
    # library, errors, memory, names
    "ddplug_version_string": (c_char_p, []),
    "ddplug_abi_version": (c_uint32, []),
    "ddplug_plugin_abi_version": (c_uint32, []),
    "ddplug_strerror": (c_char_p, [c_int]),
    "ddplug_status_name": (c_char_p, [c_int]),
    "ddplug_last_error": (c_char_p, []),
    "ddplug_free": (None, [P]),
    "ddplug_dtype_size": (c_uint32, [c_int]),
    "ddplug_dtype_name": (c_char_p, [c_int]),
    "ddplug_op_name": (c_char_p, [c_int]),
    "ddplug_owner_name": (c_char_p, [c_int]),
    # logging
    "ddplug_log_set_level": (c_int, [c_int]),
    "ddplug_log_level_parse": (c_int, [c_char_p, IP]),
    # config
    "ddplug_config_load_file": (c_int, [c_char_p, PP]),
    "ddplug_config_load_string": (c_int, [c_char_p, c_char_p, PP]),
    "ddplug_config_load_env": (c_int, [PP]),
    "ddplug_config_default": (c_int, [PP]),
    "ddplug_config_free": (None, [P]),
    "ddplug_config_to_json": (c_int, [P, PP]),
    "ddplug_config_hash": (c_int, [P, U64P]),
    "ddplug_config_origin": (c_char_p, [P]),
    "ddplug_config_get_int": (c_int, [P, c_char_p, I64P]),
    "ddplug_config_get_double": (c_int, [P, c_char_p, POINTER(c_double)]),
    "ddplug_config_get_bool": (c_int, [P, c_char_p, IP]),
    "ddplug_config_get_string": (c_int, [P, c_char_p, PP]),
    "ddplug_config_is_set": (c_int, [P, c_char_p, IP]),
    # world, plugins
    "ddplug_world_discover": (c_int, [P, POINTER(World)]),
    "ddplug_plugin_inspect": (c_int, [c_char_p, POINTER(PluginInfo)]),
    # store
    "ddplug_store_set": (c_int, [P, c_char_p, P, c_uint64]),
    "ddplug_store_get": (c_int, [P, c_char_p, c_int64, PP, U64P]),
    "ddplug_store_add": (c_int, [P, c_char_p, c_int64, I64P]),
    # context
    "ddplug_open": (c_int, [P, POINTER(OpenOptions), PP]),
    "ddplug_close": (c_int, [P]),
    "ddplug_abort": (c_int, [P, c_char_p]),
    "ddplug_context_error": (c_char_p, [P]),
    "ddplug_context_world": (c_int, [P, POINTER(World)]),
    "ddplug_context_num_nodes": (c_int, [P]),
    "ddplug_context_plugin": (c_int, [P, POINTER(PluginInfo)]),
    "ddplug_context_config": (P, [P]),
    "ddplug_context_store": (P, [P]),
    # elastic in place (abi/src/run/shrink.c)
    "ddplug_shrink": (c_int, [P, c_int64, POINTER(Membership)]),
    "ddplug_context_membership": (c_int, [P, POINTER(Membership)]),
    # collectives
    "ddplug_allreduce": (c_int, [P, P, P, c_uint64, c_int, c_int, P]),
    "ddplug_broadcast": (c_int, [P, P, P, c_uint64, c_int, c_int, P]),
    "ddplug_allgather": (c_int, [P, P, P, c_uint64, c_int, P]),
    "ddplug_barrier": (c_int, [P, c_int64]),
    "ddplug_iallreduce": (c_int, [P, P, P, c_uint64, c_int, c_int, P, PP]),
    "ddplug_ibroadcast": (c_int, [P, P, P, c_uint64, c_int, c_int, P, PP]),
    "ddplug_iallgather": (c_int, [P, P, P, c_uint64, c_int, P, PP]),
    "ddplug_ibarrier": (c_int, [P, PP]),
    "ddplug_request_wait": (c_int, [P, c_int64]),
    "ddplug_request_test": (c_int, [P, IP]),
    "ddplug_request_seq": (c_uint64, [P]),
    "ddplug_request_free": (None, [P]),
    # point-to-point (host ABI 1.1)
    "ddplug_isend": (c_int, [P, P, c_uint64, c_int, c_int, c_int64, P, PP]),
    "ddplug_irecv": (c_int, [P, P, c_uint64, c_int, c_int, c_int64, P, PP]),
    "ddplug_send": (c_int, [P, P, c_uint64, c_int, c_int, c_int64, P, c_int64]),
    "ddplug_recv": (c_int, [P, P, c_uint64, c_int, c_int, c_int64, P, c_int64, IP]),
    "ddplug_request_source": (c_int, [P, IP]),
    # registered memory
    "ddplug_mem_alloc": (c_int, [P, c_uint64, PP]),
    "ddplug_mem_free": (c_int, [P, P]),
    "ddplug_mem_reach": (c_int, [P, P, c_uint64, IP]),
    # samplers
    "ddplug_sampler_new": (c_int, [POINTER(SamplerOptions), PP]),
    "ddplug_sampler_set_epoch": (c_int, [P, c_uint64]),
    "ddplug_sampler_next": (c_int, [P, I64P, c_uint64, U64P]),
    "ddplug_sampler_seek": (c_int, [P, c_uint64]),
    "ddplug_sampler_length": (c_int, [P, U64P]),
    "ddplug_sampler_position": (c_int, [P, U64P]),
    "ddplug_sampler_info_get": (c_int, [P, POINTER(SamplerInfo)]),
    "ddplug_sampler_free": (None, [P]),
    "ddplug_context_sampler_new": (c_int, [P, POINTER(SamplerOptions), PP]),
    "ddplug_sampler_next_batch": (c_int, [P, I64P, c_uint64, U64P]),
    "ddplug_sampler_commit": (c_int, [P, c_uint64]),
    "ddplug_sampler_state_save": (c_int, [P, PP]),
    "ddplug_sampler_state_load": (c_int, [P, c_char_p]),
    "ddplug_sampler_reform": (c_int, [P, c_int64, U64P]),
    # streams, split ownership, audit
    "ddplug_stream_name_check": (c_int, [c_char_p]),
    "ddplug_split_forced_owner": (c_int, [P, c_char_p, IP, c_char_p, c_uint64]),
    "ddplug_split_claim": (c_int, [P, c_char_p, c_int, c_char_p]),
    "ddplug_split_owner": (c_int, [P, c_char_p, IP, c_char_p, c_uint64]),
    "ddplug_split_agree": (c_int, [P, c_char_p, c_int64]),
    "ddplug_audit_begin": (c_int, [P, c_char_p, c_uint64, c_uint64, POINTER(AuditOptions), PP]),
    "ddplug_audit_record": (c_int, [P, I64P, c_uint64]),
    "ddplug_audit_record_ids": (c_int, [P, U64P, c_uint64]),
    "ddplug_audit_declare_dropped": (c_int, [P, I64P, c_uint64]),
    "ddplug_audit_finish": (c_int, [P, POINTER(AuditReport), c_int64]),
    "ddplug_audit_rank_counts": (c_int, [P, ctypes.c_int32, U64P, U64P]),
    "ddplug_audit_text": (c_char_p, [P]),
    "ddplug_audit_examples": (c_int, [P, c_int, I64P, c_uint64, U64P]),
    "ddplug_audit_free": (None, [P]),
    "ddplug_audit_verdict_name": (c_char_p, [c_int]),
    # run once (abi/src/run/runonce.c)
    "ddplug_run_once_begin": (c_int, [P, c_char_p, c_int, c_int64, IP, PP]),
    "ddplug_run_once_end": (c_int, [P, c_char_p, c_int, c_int, c_char_p]),
}


class _Functions:
    """Attribute access binds the named function from :data:`PROTOTYPES`."""

    def __getattr__(self, name: str):
        try:
            restype, argtypes = PROTOTYPES[name]
        except KeyError:
            raise AttributeError(f"ddplug: no prototype for {name}") from None
        f = fn(name, restype, argtypes)
        setattr(self, name, f)
        return f


F = _Functions()


def take_string(ptr: c_void_p) -> str:
    """Read a NUL-terminated string the library allocated and release it."""
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        F.ddplug_free(ptr)


def take_bytes(ptr: c_void_p, n: int) -> bytes:
    """Read n bytes the library allocated and release them."""
    if not ptr:
        return b""
    try:
        return ctypes.string_at(ptr, n)
    finally:
        F.ddplug_free(ptr)
