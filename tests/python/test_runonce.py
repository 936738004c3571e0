"""run-once through ddplug.Context (torchrun-style ranks, two simulated nodes via
DDPLUG_HOST_ID): one runner per scope, the others wait, results and failures
reach everyone, a runner that dies does not leave its node hanging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import config, run_ranks

WORLD = 4
NODES = {r: {"DDPLUG_HOST_ID": "nodeA" if r < 2 else "nodeB", "LOCAL_RANK": r % 2,
             "LOCAL_WORLD_SIZE": 2} for r in range(WORLD)}


def results(out: Path, codes: list, outs: list, world: int = WORLD) -> list:
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("scope", ["global", "node"])
def test_success(out: Path, scope: str) -> None:
    codes, outs = run_ranks("ctx_worker.py", WORLD, f"runonce-{scope}-ok", out_dir=out, per_rank_env=NODES)
    res = results(out, codes, outs)
    calls = sorted(int(x) for x in (out / f"calls-{scope}.txt").read_text().split())
    assert calls == ([0] if scope == "global" else [0, 2]), "one runner per scope, work not repeated"
    for r in res:
        assert r["num_nodes"] == 2
        runner = 0 if scope == "global" else 2 * r["node_rank"]
        assert r["value"] == {"node": 0 if scope == "global" else r["node_rank"], "runner": runner}
        assert r["again"] == r["value"]
        assert r["cm_runner"] == (r["rank"] == runner)
        assert r["cm_file_seen"] is True
        assert r["work_done_seen"] is True, "run_once returned only after the work was done"


@pytest.mark.parametrize("scope", ["global", "node"])
def test_failure_reaches_every_rank(out: Path, scope: str) -> None:
    codes, outs = run_ranks("ctx_worker.py", WORLD, f"runonce-{scope}-fail", out_dir=out, per_rank_env=NODES)
    res = results(out, codes, outs)
    for r in res:
        runner = 0 if scope == "global" else 2 * r["node_rank"]
        if r["rank"] == runner:
            assert "KeyError" in r["raised_here"], "the runner sees its own exception"
            assert r["again_failed"] == "RunOnceFailed", "the recorded failure is returned again"
        else:
            assert "failed on its runner" in r["failed"]
            assert "KeyError: 'no shard for node" in r["runner_text"]
            assert "Traceback (most recent call last)" in r["runner_text"] and "in work" in r["runner_text"]
            assert r["again_failed"] == "RunOnceFailed"


def test_runner_death_wakes_its_node(out: Path) -> None:
    cfg = config(timeouts={"collective_s": 15})
    codes, outs = run_ranks("ctx_worker.py", WORLD, "runner-dies", cfg, out_dir=out, per_rank_env=NODES,
                            timeout=90)
    assert codes[2] == 3
    r3 = json.loads((out / "rank3.json").read_text())
    # PEER_LOST, not TIMEOUT after its 60 s: the runner's disconnect woke the waiter
    assert r3["outcome"] == "PEER_LOST", r3
    assert "rank 2" in r3["message"]
    assert "disconnected before it finished" in r3["message"] or "exited or was killed" in r3["message"]
    for r in (0, 1):
        assert json.loads((out / f"rank{r}.json").read_text())["outcome"] == "ok"
