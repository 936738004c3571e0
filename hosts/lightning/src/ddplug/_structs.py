"""ctypes mirrors of the versioned structs of ``ddplug/ddplug.h`` and ``plugin.h``.

Every struct begins ``{uint32 struct_size; uint32 abi_version}``; :func:`new` fills
both (``abi_version`` read from the loaded library, never hand-copied).
``tests/python/test_binding.py`` compiles a C program against the headers and checks
every field offset and every struct size here against ``offsetof``/``sizeof``.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char, c_char_p, c_int32, c_int64, c_uint32, c_uint64, c_void_p


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


# name in the C headers -> the mirror, for the layout test.
C_NAMES = {
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
    from . import _api

    obj = cls()
    obj.struct_size = ctypes.sizeof(cls)
    obj.abi_version = (
        _api.F.ddplug_plugin_abi_version() if cls in _PLUGIN_ABI else _api.F.ddplug_abi_version()
    )
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def text(buf) -> str:
    """A ``char[N]`` field as str."""
    return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace")


c_void_pp = POINTER(c_void_p)
