"""The newest checkpoint saved in a directory, kept beside the checkpoints
(``ddplug-checkpoints.json``): resuming from an older one than the last is named,
because the steps between would be trained again. Lightning's strategy writes it
in ``save_checkpoint`` (position: ``global_step``); ``ddplug.torch.save`` writes it
too (position: the save's serial number in that directory)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

LEDGER = "ddplug-checkpoints.json"

log = logging.getLogger("ddplug")


def path_for(filepath: Any) -> Optional[str]:
    """The ledger beside ``filepath``; None for remote storage (``scheme://``)."""
    path = str(filepath)
    if "://" in path:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(path)), LEDGER)


def last(filepath: Any) -> Optional[dict]:
    """The ledger's record of the newest checkpoint beside ``filepath``, or None."""
    path = path_for(filepath)
    if path is None:
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def note(filepath: Any, key: str, position: int, **fields: Any) -> None:
    """Record ``filepath`` as the newest checkpoint at ``position`` (under ``key``),
    unless the ledger already names a later one. Written atomically; a directory
    that cannot be written is only logged (the checkpoint itself was saved)."""
    path = path_for(filepath)
    if path is None:
        return
    newest = last(filepath)
    if newest is not None and int(newest.get(key, -1)) > position:
        return
    try:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"path": os.path.abspath(str(filepath)), key: position, **fields}, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("ddplug: checkpoint ledger %s not written: %s", path, exc)


def newer(filepath: Any, key: str, position: int) -> Optional[dict]:
    """The ledger's record when it names a checkpoint saved after ``filepath``'s
    ``position`` (another file), else None."""
    newest = last(filepath)
    if newest is None:
        return None
    try:
        later = int(newest.get(key, -1)) > position
    except (TypeError, ValueError):
        return None
    return newest if later else None
