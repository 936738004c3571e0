"""The library's log lines and the package's reports in Python logging: the
"ddplug" logger gets the library's lines (rank-prefixed, at the matching
levels, from every rank) and the reports; with logging unconfigured its own
handler prints them, leaving out other ranks' info lines."""

from __future__ import annotations

from pathlib import Path

from conftest import run_ranks


def test_library_lines_and_reports_reach_the_ddplug_logger(out: Path) -> None:
    import json

    codes, outs = run_ranks("log_worker.py", 2, "captured", out_dir=out, env={"DDPLUG_LOG": "info"})
    assert codes == [0, 0], "\n".join(outs)[-6000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    lib0 = [x for x in r0 if x["source"] == "library"]
    assert any(x["level"] == "INFO" and x["rank"] == 0 and x["message"].startswith("[ddplug r0] rank 0 of 2 joined")
               for x in lib0), r0
    assert {"level": "INFO", "rank": -1, "source": "report", "message": "ddplug: a report line"}.items() <= next(
        x for x in r0 if x["source"] == "report").items()
    warn = [x for x in r1 if x["source"] == "library" and x["level"] == "WARNING"]
    assert any(x["rank"] == 1 and x["message"].startswith("[ddplug r1] warning: plugin file")
               and "calls itself 'cpu', not 'renamed'" in x["message"] for x in warn), r1
    for x in lib0 + [x for x in r1 if x["source"] == "library"]:  # the level matches the line
        assert (x["level"] == "WARNING") == (" warning: " in x["message"]), x
        assert (x["level"] == "ERROR") == (" error: " in x["message"]), x


def test_default_handler_shows_rank_zero_info_and_every_warning(out: Path) -> None:
    codes, outs = run_ranks("log_worker.py", 2, "default", out_dir=out, env={"DDPLUG_LOG": "info"})
    assert codes == [0, 0], "\n".join(outs)[-6000:]
    assert "[ddplug r0] rank 0 of 2 joined" in outs[0] and "ddplug: a report line" in outs[0], outs[0]
    assert "[ddplug r1] rank 1 of 2 joined" not in outs[1], outs[1]
    assert "[ddplug r1] warning: plugin file" in outs[1], outs[1]
