"""Lightning in both spellings: ``strategy="ddplug"`` and the strategy classes
for the unified package (``lightning.pytorch``, ``lightning.fabric``) and for the
standalone ones (``pytorch_lightning``, ``lightning_fabric``; GPT-SoVITS imports
those).

The standalone packages are copies of the same source with the import names
rewritten: their own ``Strategy`` classes and registries, so a strategy built on
``lightning.pytorch``'s ``ParallelStrategy`` is not a ``pytorch_lightning``
strategy and that Trainer refuses it. ddplug does what Lightning does to make
them: ``ddplug.pytorch_lightning`` (``ddplug.lightning_fabric``) executes
``ddplug/lightning.py`` (``fabric.py``) once more (:func:`exec_rewritten`), with
``lightning.pytorch`` read as ``pytorch_lightning`` and ``lightning.fabric`` as
``lightning_fabric`` — the same lines, so tracebacks point at the real file.

Registration by name needs no import of ddplug's strategy modules: Lightning
resolves ``strategy="ddplug"`` from its registry (it reads no entry points for
strategies), and a registry entry may be any callable. :func:`install` (run by
``import ddplug``) registers a factory in every spelling's registry that is
already imported and, through a ``sys.meta_path`` finder, in each of the others
right after its ``strategies`` module is executed; the factory builds the
spelling's strategy on first use. Never raises into Lightning's import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import re
import sys
from pathlib import Path
from typing import Any, Optional

NAME = "ddplug"

# the registry module -> (its registry's attribute, the ddplug module serving it)
TARGETS = {
    "lightning.pytorch.strategies": ("StrategyRegistry", "ddplug.lightning"),
    "pytorch_lightning.strategies": ("StrategyRegistry", "ddplug.pytorch_lightning"),
    "lightning.fabric.strategies": ("STRATEGY_REGISTRY", "ddplug.fabric"),
    "lightning_fabric.strategies": ("STRATEGY_REGISTRY", "ddplug.lightning_fabric"),
}
_REWRITES = ((re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
             (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"))


def exec_rewritten(namespace: dict, filename: str) -> None:
    """Execute ddplug's ``filename`` (lightning.py, fabric.py) in ``namespace``
    (the standalone spelling's module) with the unified package's import names
    read as the standalone ones: the same lines, so tracebacks and line numbers
    point at the real file."""
    path = Path(__file__).with_name(filename)
    text = path.read_text()
    for pattern, repl in _REWRITES:
        text = pattern.sub(repl, text)
    exec(compile(text, str(path), "exec"), namespace)


def _factory(served_by: str) -> Any:
    def make(**init_params: Any) -> Any:
        return importlib.import_module(served_by).DdplugStrategy(**init_params)

    make.__qualname__ = make.__name__ = "DdplugStrategy"
    return make


def _register(module_name: str) -> None:
    attr, served_by = TARGETS[module_name]
    registry = getattr(sys.modules[module_name], attr)
    if NAME in registry and registry[NAME].get("ddplug_served_by") == served_by:
        return
    registry.register(NAME, _factory(served_by),
                      description="ddplug: data-parallel strategy plugins (config from DDPLUG_CONFIG)",
                      override=True)
    registry[NAME]["ddplug_served_by"] = served_by


def _register_quietly(module_name: str) -> None:
    try:
        _register(module_name)
    except Exception:  # never break Lightning's import; Trainer(strategy="ddplug") will say it is unknown
        pass


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self._inner, self._name = inner, name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)

    def create_module(self, spec: Any) -> Optional[Any]:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _register_quietly(self._name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname not in TARGETS:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_finder = _Finder()


def install() -> None:
    """Register in the spellings already imported; the others when they are."""
    for name in TARGETS:
        if name in sys.modules and hasattr(sys.modules[name], TARGETS[name][0]):
            _register_quietly(name)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


__all__ = ["NAME", "TARGETS", "exec_rewritten", "install"]
