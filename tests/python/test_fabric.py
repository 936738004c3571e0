"""The ddplug strategy under Lightning Fabric with real subprocess ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_script


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
