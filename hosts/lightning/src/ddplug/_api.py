"""The C prototypes of every libddplug function this package calls — one table.

``F.<name>`` is the bound function (bound on first use through :func:`ddplug._lib.fn`).
Opaque handles travel as ``c_void_p``; strings the library allocates come back as
``c_void_p`` and are read then released with ``ddplug_free`` (:func:`take_string`).
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_uint32,
    c_uint64,
    c_void_p,
)

from . import _lib
from . import _structs as S

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
    # world, plugins
    "ddplug_world_discover": (c_int, [P, POINTER(S.World)]),
    "ddplug_plugin_inspect": (c_int, [c_char_p, POINTER(S.PluginInfo)]),
    # store
    "ddplug_store_set": (c_int, [P, c_char_p, P, c_uint64]),
    "ddplug_store_get": (c_int, [P, c_char_p, c_int64, PP, U64P]),
    "ddplug_store_add": (c_int, [P, c_char_p, c_int64, I64P]),
    # context
    "ddplug_open": (c_int, [P, POINTER(S.OpenOptions), PP]),
    "ddplug_close": (c_int, [P]),
    "ddplug_abort": (c_int, [P, c_char_p]),
    "ddplug_context_error": (c_char_p, [P]),
    "ddplug_context_world": (c_int, [P, POINTER(S.World)]),
    "ddplug_context_num_nodes": (c_int, [P]),
    "ddplug_context_plugin": (c_int, [P, POINTER(S.PluginInfo)]),
    "ddplug_context_config": (P, [P]),
    "ddplug_context_store": (P, [P]),
    # collectives
    "ddplug_allreduce": (c_int, [P, P, P, c_uint64, c_int, c_int, P]),
    "ddplug_broadcast": (c_int, [P, P, P, c_uint64, c_int, c_int, P]),
    "ddplug_allgather": (c_int, [P, P, P, c_uint64, c_int, P]),
    "ddplug_barrier": (c_int, [P, c_int64]),
    "ddplug_iallreduce": (c_int, [P, P, P, c_uint64, c_int, c_int, P, PP]),
    "ddplug_ibroadcast": (c_int, [P, P, P, c_uint64, c_int, c_int, P, PP]),
    "ddplug_iallgather": (c_int, [P, P, P, c_uint64, c_int, P, PP]),
    "ddplug_wait": (c_int, [P, c_int64]),
    "ddplug_test": (c_int, [P, IP]),
    "ddplug_request_seq": (c_uint64, [P]),
    "ddplug_request_free": (None, [P]),
    # registered memory
    "ddplug_mem_alloc": (c_int, [P, c_uint64, PP]),
    "ddplug_mem_free": (c_int, [P, P]),
    "ddplug_mem_reach": (c_int, [P, P, c_uint64, IP]),
    # samplers
    "ddplug_sampler_new": (c_int, [POINTER(S.SamplerDesc), PP]),
    "ddplug_sampler_set_epoch": (c_int, [P, c_uint64]),
    "ddplug_sampler_next": (c_int, [P, I64P, c_uint64, U64P]),
    "ddplug_sampler_seek": (c_int, [P, c_uint64]),
    "ddplug_sampler_length": (c_int, [P, U64P]),
    "ddplug_sampler_position": (c_int, [P, U64P]),
    "ddplug_sampler_info_get": (c_int, [P, POINTER(S.SamplerInfo)]),
    "ddplug_sampler_free": (None, [P]),
    "ddplug_context_sampler_new": (c_int, [P, POINTER(S.SamplerDesc), PP]),
    # split ownership, audit
    "ddplug_split_claim": (c_int, [P, c_char_p, c_int, c_char_p]),
    "ddplug_split_owner": (c_int, [P, c_char_p, IP, c_char_p, c_uint64]),
    "ddplug_split_agree": (c_int, [P, c_char_p, c_int64]),
    "ddplug_audit_begin": (c_int, [P, c_char_p, c_uint64, c_uint64, POINTER(S.AuditOptions), PP]),
    "ddplug_audit_record": (c_int, [P, I64P, c_uint64]),
    "ddplug_audit_finish": (c_int, [P, POINTER(S.AuditReport), c_int64]),
    "ddplug_audit_free": (None, [P]),
    "ddplug_audit_verdict_name": (c_char_p, [c_int]),
    # run once (abi/src/runonce.c)
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
        f = _lib.fn(name, restype, argtypes)
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

