"""The ddplug strategy under Lightning Fabric with real subprocess ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import assert_aborted_by, config, run_script


def flat(steps: list) -> list:
    return [i for s in steps for i in s]


@pytest.mark.parametrize("world", [2])
def test_fabric_split_sync_and_collectives(out: Path, world: int) -> None:
    run = run_script("fabric_run.py", "--devices", str(world), "--by-name", out_dir=out).ok()
    ranks = run.ranks(world)
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in flat(r["seen"][epoch])) == list(range(64))
    for r in ranks:
        assert flat(r["seen"]["0"]) != flat(r["seen"]["1"]), "Fabric's set_epoch reaches the stream"
        train, ev = r["streams"]["train"], r["streams"]["eval"]
        assert train["owner"] == "plugin" and ev["owner"] == "plugin"
        assert train["reports"][0]["verdict"] == "PASS" and ev["reports"][0]["verdict"] == "PASS"
        assert r["params"] == ranks[0]["params"], "gradients synchronized on every rank"
        assert r["gathered"] == list(range(world))
        assert r["broadcast"] == [0, "x"]
        assert r["rank_kwargs"] == {"num_replicas": world, "rank": r["rank"]}
        assert r["eval_total"] == sum(len(x["eval_seen"]) for x in ranks)
    assert sorted(set(i for r in ranks for i in r["eval_seen"])) == list(range(20))


@pytest.mark.parametrize("failing", [0, 1])
def test_an_uncaught_error_on_one_rank_stops_every_rank_with_it(out: Path, failing: int) -> None:
    """Fabric calls no strategy hook on errors: ddplug's sys.excepthook aborts the
    run, so the other rank stops at its next collective with the failing rank's
    error, not a collective timeout (set long here)."""
    run = run_script("fabric_run.py", "--devices", "2", "--fail-rank", str(failing),
                     "--config", config(timeouts={"collective_s": 120}), out_dir=out)
    assert_aborted_by(run, failing)


def test_checkpoint_resume_continues_the_stream(out: Path) -> None:
    """DataLoader workers draw batches ahead of the loop: the checkpoint holds the
    batches the loop consumed, and a resumed run (Fabric numbers epochs from 0
    again) continues the saved epoch at that batch with the same order."""
    world, common = 2, ["--devices", "2", "--workers", "2"]
    ref = run_script("fabric_run.py", *common, out_dir=out / "ref").ok().ranks(world)
    stop = run_script("fabric_run.py", *common, "--stop-epoch", "1", "--stop-after", "3",
                      out_dir=out / "stop").ok().ranks(world)
    for r in stop:
        assert r["saved"]["epoch"] == 1 and r["saved"]["position"] == 3, r["saved"]
        assert r["seen"]["1"] == ref[r["rank"]]["seen"]["1"][:3]
    resumed = run_script("fabric_run.py", *common, "--resume", str(out / "stop" / "fabric.ckpt"),
                         out_dir=out / "resumed").ok().ranks(world)
    for r in resumed:
        assert list(r["seen"]) == ["1"], "epoch 0 was done before the checkpoint"
        assert r["seen"]["1"] == ref[r["rank"]]["seen"]["1"][3:]
