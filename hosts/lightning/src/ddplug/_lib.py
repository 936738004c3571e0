"""Finding and binding ``libddplug`` (ctypes, ABI mode: never compiled against torch).

Where the library comes from, in order (the first that loads wins):

1. ``DDPLUG_LIBRARY``: an explicit path to ``libddplug.so`` (or ``.so.1``).
2. The package's own install location: ``ddplug/_lib/`` beside this file (a wheel
   that bundles the library), ``<sys.prefix>/lib`` (``cmake --install`` into the
   virtual environment) and the dynamic linker's search (``ldconfig``).
3. The build tree: ``$DDPLUG_BUILD_DIR/lib`` and ``<source>/build/lib`` when this
   package is used from a source checkout (``pip install -e hosts/lightning``).

When none loads, :class:`LibraryNotFound` lists every place it looked and why each
failed. Functions are bound lazily by name (:func:`fn`), so a library that predates
a function fails only when that function is used, with a message naming it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

_SONAMES = ("libddplug.so.1", "libddplug.so")

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_bound: dict = {}


class LibraryNotFound(ImportError):
    """``libddplug`` could not be loaded; the message lists every place searched."""


def _source_root() -> Optional[Path]:
    # hosts/lightning/src/ddplug/_lib.py -> the repository root, when this is a checkout.
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
    pkg = Path(__file__).resolve().parent / "_lib"
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
