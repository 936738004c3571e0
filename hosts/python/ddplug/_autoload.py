"""What torch calls at ``import torch`` through ddplug's ``torch.backends`` entry
point (pyproject.toml): torch's documented autoload of out-of-tree backends
(torch/__init__.py, ``_import_device_backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns it off), so that ``torch.distributed.init_process_group("ddplug")`` and
Lightning's ``strategy="ddplug"`` work in a script that never imports ddplug.

The group is meant for device backends, but nothing in it is device-specific:
torch loads each entry point and calls it with no arguments, at the very end of
its own import (torch.distributed is imported by then). Two rules follow from
torch's side: the call must be cheap (it runs in every process that imports
torch) — importing the package loads no library and no Lightning; and it must
never raise (torch turns an exception into a RuntimeError that breaks ``import
torch`` for the whole environment) — a failure is a warning instead. Without
the entry point (a checkout used through PYTHONPATH, or autoload turned off),
``import ddplug`` registers the same way.
"""

from __future__ import annotations


def autoload() -> None:
    """Register the "ddplug" backend and strategy names (importing the package
    does both). Never raises."""
    try:
        import ddplug  # noqa: F401  the package's import registers (ddplug/__init__.py)
    except Exception as exc:  # pragma: no cover - a broken install must not break torch
        import warnings

        warnings.warn(f"ddplug: could not register the torch.distributed backend \"ddplug\": {exc}",
                      RuntimeWarning, stacklevel=2)
