"""A torchrun-style rank for tests/python/test_logging.py: joins a 2-rank run
with the library's log threshold at info (DDPLUG_LOG), so every rank logs its
"joined" line, then makes rank 1 log a warning, emits a report, and writes
what its own handler on the "ddplug" logger received.

    python log_worker.py default|captured
default: no logging configured (the ddplug logger's own handler prints);
captured: a handler of the test's on the ddplug logger records every record.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys

import ddplug
from ddplug._c import _logbridge

OUT = os.environ["DDPLUG_TEST_OUT"]
RANK = int(os.environ["RANK"])


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=1)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append({"level": record.levelname, "rank": getattr(record, "ddplug_rank", None),
                             "source": getattr(record, "ddplug_source", None),
                             "thread": record.threadName, "message": record.getMessage()})


def main() -> None:
    keep = Keep()
    if sys.argv[1] == "captured":
        logging.getLogger("ddplug").addHandler(keep)
        logging.getLogger("ddplug").setLevel(1)
    ctx = ddplug.Context(None, framework="test")
    if RANK == 1:
        # A warning of the library's own: a plugin file whose name differs.
        from ddplug._c import _capi

        src = ctx.plugin["path"]
        dst = os.path.join(OUT, "libddplug-renamed.so")
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
        from ddplug._c import _capi as S

        info = S.new(S.PluginInfo)
        _capi.F.ddplug_plugin_inspect(dst.encode(), ctypes.byref(info))
    if RANK == 0:
        _logbridge.report("ddplug: a report line")
    ctx.barrier()
    ctx.close()
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(keep.records, f)


if __name__ == "__main__":
    main()
