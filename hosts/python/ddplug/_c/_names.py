"""Name tables read from the library (dtypes, reduce ops, split owners).

Nothing here is hand-copied from the headers: each table is discovered by asking
the library for the name of 1, 2, 3, ... until it answers NULL.
"""

from __future__ import annotations

import functools

from ._capi import F


def _scan(fn, start: int) -> dict:
    out = {}
    code = start
    while True:
        raw = fn(code)
        if raw is None:
            return out
        out[raw.decode()] = code
        code += 1


@functools.lru_cache(maxsize=None)
def dtypes() -> dict:
    """{"float32": code, ...}."""
    return _scan(F.ddplug_dtype_name, 1)


@functools.lru_cache(maxsize=None)
def ops() -> dict:
    """{"sum": code, "avg": code, ...}."""
    return _scan(F.ddplug_op_name, 1)


@functools.lru_cache(maxsize=None)
def owners() -> dict:
    """{"unset": 0, "plugin": code, "framework": code, "user": code}."""
    return _scan(F.ddplug_owner_name, 0)


def owner_name(code: int) -> str:
    raw = F.ddplug_owner_name(code)
    return raw.decode() if raw else f"owner#{code}"


def dtype_size(code: int) -> int:
    return int(F.ddplug_dtype_size(code))
