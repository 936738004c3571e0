"""Lightning in both spellings — the standalone pytorch_lightning and
lightning_fabric packages GPT-SoVITS imports, beside lightning.pytorch /
lightning.fabric (the rest of the tests) — with GPT-SoVITS' own s1 setup: its AR
bucket sampler (ranks from torch.distributed, padding like torch's
DistributedSampler), use_distributed_sampler=False, strategy="ddplug" by name;
torch's padding rule without a declaration at N = 961 on 2 ranks and N = 1000
on 3; the sampler's CPU branch (num_replicas=1) stopped before the first step;
Lightning's own DDPStrategy with the ddplug backend saying once what it means.
Real processes started by Lightning's launcher (scripts/sovits_pl.py,
scripts/fabric_pl.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import config, run_script, variants

AUDIT = {"data_split": {"audit": "every_epoch", "on_violation": "error"}}


# make test: 961 samples on 2 ranks (1 padded); with DDPLUG_TESTS=full also
# 1000 on 3 (2 padded).
@pytest.mark.parametrize("n,world", variants((961, 2), (1000, 3)))
def test_gpt_sovits_setup_pads_like_torch_without_a_declaration(out: Path, n: int, world: int) -> None:
    run = run_script("sovits_pl.py", "--n", str(n), "--devices", str(world), out_dir=out,
                     env={"DDPLUG_CONFIG": config(**AUDIT), "DDPLUG_SECRET": ""}).ok()
    pad = world * math.ceil(n / world) - n
    ranks = run.ranks(world)
    # Lightning's launcher started the ranks: they share a per-run secret it did not have
    assert ranks[0]["secret"] and all(r["secret"] == ranks[0]["secret"] for r in ranks), ranks
    for r in ranks:
        assert "error" not in r, r.get("traceback")
        assert r["strategy"] == "ddplug.pytorch_lightning.DdplugStrategy"
        assert "owner user" in r["owner_line"] and "DistributedBucketSampler" in r["owner_line"]
        assert [rep["verdict"] for rep in r["reports"]] == ["PASS", "PASS"], r["reports"]
        assert all(rep["repeats"] == pad for rep in r["reports"])
        assert all(len(v) == math.ceil(n / world) for v in r["seen"].values())


def test_a_sampler_that_says_one_replica_is_stopped_before_the_first_step(out: Path) -> None:
    """GPT-SoVITS' CPU branch: num_replicas=1, rank=0 on every rank of 2."""
    run = run_script("sovits_pl.py", "--n", "961", "--devices", "2", "--mode", "cpu-branch", out_dir=out,
                     env={"DDPLUG_CONFIG": config(**AUDIT)})
    for r in run.ranks(2):
        assert "error" in r, "the run went on"
        assert r["seen"] == {}, "no step ran"
        assert "num_replicas=1" in r["error"] and "this run has 2 ranks" in r["error"], r["error"]
        assert "num_replicas=2" in r["error"], r["error"]  # what to do


def test_padding_beyond_torchs_rule_still_needs_a_declaration(out: Path) -> None:
    run = run_script("sovits_pl.py", "--n", "961", "--devices", "2", "--mode", "overpad", out_dir=out,
                     env={"DDPLUG_CONFIG": config(**AUDIT)})
    r = run.rank(0)
    assert "error" in r, "the audit passed"
    assert "repeated samples" in r["error"] and "ddplug.declare" in r["error"], r["error"]


def test_lightnings_ddp_strategy_with_the_ddplug_backend_says_so_once(out: Path) -> None:
    run = run_script("sovits_pl.py", "--n", "961", "--devices", "2", "--mode", "ddp", out_dir=out).ok()
    for r in run.ranks(2):
        assert "error" not in r, r.get("traceback")
        assert r["strategy"] == "pytorch_lightning.strategies.ddp.DDPStrategy"
    notice = "runs under Lightning's DDPStrategy"
    assert run.output.count(notice) == 1, run.output[-4000:]
    assert "data-split ownership and audit are off" in run.output and 'strategy="ddplug"' in run.output


def test_standalone_lightning_fabric_by_name(out: Path) -> None:
    run = run_script("fabric_pl.py", out_dir=out, env={"DDPLUG_SECRET": ""}).ok()
    ranks = run.ranks(2)
    assert ranks[0]["secret"] and ranks[1]["secret"] == ranks[0]["secret"], "Fabric's launcher passed a secret on"
    for r in ranks:
        assert r["strategy"] == "ddplug.lightning_fabric.DdplugStrategy"
        assert r["sum"] == 3.0
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == list(range(10)), "split by ddplug, every sample once"
    assert ranks[0]["params"] == ranks[1]["params"]
