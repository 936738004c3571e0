"""libddplug's log lines, and this package's reports, in Python ``logging``.

Everything ddplug says goes to the ``ddplug`` logger, so that users silence,
filter or redirect it the way they do any library's output::

    logging.getLogger("ddplug").setLevel(logging.WARNING)   # no reports
    logging.getLogger("ddplug").addHandler(my_handler)       # elsewhere

* **The library's lines** arrive through ``ddplug_log_set_callback``, installed
  when libddplug is loaded (:func:`install`), from whatever thread logs. Each
  keeps the library's own rank prefix (``[ddplug r3] warning: ...``) and comes
  at the matching level: error → ``ERROR``, warn → ``WARNING``, info →
  ``INFO``, debug → ``DEBUG``, trace → ``TRACE`` (5). Records carry
  ``ddplug_rank`` (-1 before the rank is known) and ``ddplug_source``
  (``"library"``). Which lines the library produces is still its own threshold
  (``DDPLUG_LOG``, else the config's ``log_level``, default warn); the logger's
  level and handlers decide what is shown.
* **The reports** — the plugin line, each stream's split owner, the audit
  reports — are ``INFO`` records (``ddplug_source`` ``"report"``) that the
  strategies emit on rank 0 only, as Lightning's ``rank_zero_info`` does.

Unless the application configured logging (the root logger has handlers),
the ``ddplug`` logger gets one handler of its own, as Lightning's loggers do:
messages as they are, ``INFO`` and below to stdout, warnings and errors to
stderr (where the library printed them before), and the library's ``INFO``
and finer lines of ranks other than 0 left out — every rank says the same
there; its warnings and errors are always shown.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import sys
import threading
from typing import Any, Optional

LOGGER_NAME = "ddplug"
TRACE = 5

# DDPLUG_LOG_* (common.h) → logging levels.
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: TRACE}

_CALLBACK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p)

_lock = threading.Lock()
_callback: Optional[Any] = None  # the ctypes thunk: alive as long as the library may call it
_installed_in: Optional[Any] = None


def logger() -> logging.Logger:
    """The ``ddplug`` logger (with its default handler unless logging is configured)."""
    log = logging.getLogger(LOGGER_NAME)
    _default_handler(log)
    return log


class _DefaultHandler(logging.StreamHandler):
    """``INFO`` and below to stdout, the rest to stderr; other ranks' library
    ``INFO``/``DEBUG`` lines left out."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        if (record.levelno < logging.WARNING and getattr(record, "ddplug_source", "") == "library"
                and getattr(record, "ddplug_rank", -1) > 0):
            return False
        return super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        # The streams of the moment (pytest and Lightning replace them).
        self.stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        super().emit(record)
        self.flush()


def _default_handler(log: logging.Logger) -> None:
    with _lock:
        if getattr(log, "_ddplug_configured", False):
            return
        log._ddplug_configured = True  # type: ignore[attr-defined]
        if logging.getLevelName(TRACE) == f"Level {TRACE}":
            logging.addLevelName(TRACE, "TRACE")
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
        if not log.handlers and not logging.getLogger().hasHandlers():
            log.addHandler(_DefaultHandler())
            log.propagate = False


def _on_line(user: Any, level: int, rank: int, line: bytes) -> None:
    try:
        log = logging.getLogger(LOGGER_NAME)
        py_level = _LEVELS.get(level, logging.INFO)
        if log.isEnabledFor(py_level):
            text = line.decode("utf-8", "replace") if line else ""
            log.log(py_level, text, extra={"ddplug_rank": rank, "ddplug_source": "library"})
    except Exception:  # never raise into C
        pass


def install(lib: Any) -> None:
    """Route the loaded library's log lines to the ``ddplug`` logger (once per
    library; undone at interpreter exit, before Python can no longer run the
    callback)."""
    global _callback, _installed_in
    logger()
    with _lock:
        if _installed_in is lib:
            return
        try:
            set_callback = lib.ddplug_log_set_callback
        except AttributeError:  # a library older than the callback: keep stderr
            return
        set_callback.restype = ctypes.c_int
        set_callback.argtypes = [_CALLBACK_TYPE, ctypes.c_void_p]
        if _callback is None:
            _callback = _CALLBACK_TYPE(_on_line)
        set_callback(_callback, None)
        _installed_in = lib
    atexit.register(_uninstall, lib)


def _uninstall(lib: Any) -> None:
    global _installed_in
    with _lock:
        if _installed_in is not lib:
            return
        try:
            lib.ddplug_log_set_callback(ctypes.cast(None, _CALLBACK_TYPE), None)
        except Exception:
            pass
        _installed_in = None


def report(text: str) -> None:
    """One report (plugin line, split owner, audit report) as an ``INFO`` record
    of the ``ddplug`` logger. Callers emit reports on rank 0 only."""
    logger().info(text, extra={"ddplug_rank": -1, "ddplug_source": "report"})
