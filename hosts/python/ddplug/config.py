"""The strict JSON configuration, as the library parses and validates it.

:func:`load` accepts what a user passes to the strategy: a path, a JSON text, a
dict, a :class:`Config`, or ``None`` (``DDPLUG_CONFIG`` from the environment, else
the defaults). A file is parsed by the library first, so syntax errors carry
FILE:LINE:COLUMN and unknown keys a "did you mean". :meth:`Config.with_overrides`
returns a new config with some keys replaced (the strategy uses it to pass the
world it got from Lightning's cluster environment), keeping the origin for messages.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Mapping, Optional, Union

from ._c._capi import F, take_string
from .errors import check


class Config:
    """An immutable, validated configuration handle (``ddplug_config``): one
    this process loaded (freed by :meth:`close`, at the end of a ``with``
    block, or when garbage collected), or the view of a context's own
    (:attr:`ddplug.Context.config`: valid while the context is open, never
    freed here)."""

    def __init__(self, handle: ctypes.c_void_p, *, view_of: Any = None) -> None:
        self._h = handle
        self._view_of = view_of  # the Context whose config this is, for a view

    # ---- construction ----------------------------------------------------
    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "Config":
        out = ctypes.c_void_p()
        check(F.ddplug_config_load_file(os.fsencode(path), ctypes.byref(out)))
        return cls(out)

    @classmethod
    def from_string(cls, text: str, origin: Optional[str] = None) -> "Config":
        out = ctypes.c_void_p()
        check(
            F.ddplug_config_load_string(
                text.encode(), origin.encode() if origin else None, ctypes.byref(out)
            )
        )
        return cls(out)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "<dict>") -> "Config":
        return cls.from_string(json.dumps(data), origin)

    @classmethod
    def from_env(cls) -> "Config":
        out = ctypes.c_void_p()
        check(F.ddplug_config_load_env(ctypes.byref(out)))
        return cls(out)

    @classmethod
    def default(cls) -> "Config":
        out = ctypes.c_void_p()
        check(F.ddplug_config_default(ctypes.byref(out)))
        return cls(out)

    # ---- reading ---------------------------------------------------------
    @property
    def handle(self) -> ctypes.c_void_p:
        if self._view_of is not None and self._view_of.closed:
            raise ValueError("ddplug: the config of a closed context (a context's config is readable while it is"
                             " open; keep a copy of your own: Config.from_string(ctx.config.to_json()))")
        if not self._h:
            raise ValueError("ddplug: config already closed")
        return self._h

    @property
    def origin(self) -> str:
        return (F.ddplug_config_origin(self.handle) or b"").decode()

    def to_json(self) -> str:
        """The effective config (defaults filled in) as canonical JSON."""
        out = ctypes.c_void_p()
        check(F.ddplug_config_to_json(self.handle, ctypes.byref(out)))
        return take_string(out)

    def to_dict(self) -> dict:
        return json.loads(self.to_json())

    def hash(self) -> int:
        out = ctypes.c_uint64()
        check(F.ddplug_config_hash(self.handle, ctypes.byref(out)))
        return out.value

    def get(self, path: str, default: Any = None) -> Any:
        """The effective value at a dotted path ("sampler.seed"); ``default`` if the
        key is absent (an optional key that is not set)."""
        node: Any = self.to_dict()
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def get_int(self, path: str) -> int:
        out = ctypes.c_int64()
        check(F.ddplug_config_get_int(self.handle, path.encode(), ctypes.byref(out)))
        return out.value

    def get_float(self, path: str) -> float:
        out = ctypes.c_double()
        check(F.ddplug_config_get_double(self.handle, path.encode(), ctypes.byref(out)))
        return out.value

    def get_bool(self, path: str) -> bool:
        out = ctypes.c_int()
        check(F.ddplug_config_get_bool(self.handle, path.encode(), ctypes.byref(out)))
        return bool(out.value)

    def is_set(self, path: str) -> bool:
        """Whether the document this config was loaded from sets ``path`` itself
        (rather than leaving it to its default): e.g. whether the user chose a
        plugin. A path the schema does not have raises, with a suggestion."""
        out = ctypes.c_int()
        check(F.ddplug_config_is_set(self.handle, path.encode(), ctypes.byref(out)))
        return bool(out.value)

    def get_str(self, path: str) -> str:
        out = ctypes.c_void_p()
        check(F.ddplug_config_get_string(self.handle, path.encode(), ctypes.byref(out)))
        return take_string(out)

    # ---- deriving --------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, Any]) -> "Config":
        """A new config: this one with the dotted keys of ``overrides`` set."""
        data = self.to_dict()
        for path, value in overrides.items():
            node = data
            parts = path.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return Config.from_string(json.dumps(data), self.origin or "<config>")

    # ---- lifetime --------------------------------------------------------
    def close(self) -> None:
        h, self._h = self._h, None
        if h and self._view_of is None:
            F.ddplug_config_free(h)

    def __enter__(self) -> "Config":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        try:
            return f"Config(origin={self.origin!r})"
        except ValueError:
            return "Config(closed)"


ConfigSource = Union[None, str, os.PathLike, Mapping[str, Any], Config]


def load(source: ConfigSource = None) -> Config:
    """A :class:`Config` from what a user passed (see the module doc).

    A str that starts with ``{`` is JSON text; any other str or path is a file.
    ``None`` reads ``DDPLUG_CONFIG`` (JSON text or a path), else the defaults.
    A :class:`Config` is copied, so the caller keeps ownership of theirs.
    """
    if source is None:
        return Config.from_env()
    if isinstance(source, Config):
        return Config.from_string(source.to_json(), source.origin)
    if isinstance(source, Mapping):
        return Config.from_dict(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return Config.from_string(source, "<string>")
    return Config.from_file(source)
