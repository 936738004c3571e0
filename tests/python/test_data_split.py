"""The data split, airtight, under the real Lightning Trainer with real
subprocess ranks (devices=2 and 3): every way a split can silently go wrong is
caught or explicitly declared, evaluation is exact, per-rank datasets are found
before the first step, streaming datasets are audited by sample id, run-once
waits for a live runner, and checkpoints move between ddplug and DDP.

One Trainer run checks several streams at once (the audit in warn mode reports
each), to keep the suite short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import config, run_script, worlds

WARN = {"on_violation": "warn", "audit": "every_epoch"}


def report(rank: dict, stream: str, key: str = "streams") -> dict:
    reports = rank[key][stream]["reports"]
    assert reports, f"stream {stream}: no audit report; {rank[key][stream]}"
    return reports[0]


@pytest.mark.parametrize("world", worlds(3, 2))
def test_missing_and_repeated_samples_are_violations_unless_declared(out: Path, world: int) -> None:
    """Four training streams over 1003 samples: a rank-aware sampler that covers
    half and whose length agrees (it passed before: the allowance came from its
    length), a DistributedSampler subclass that skips 50 samples (was "overlap: 1
    deliveries repeated"), a length-bucket batch sampler that pads and drops
    (was a netted, wrong diagnosis) — and the same one declared, which passes."""
    run = run_script("lit_split.py", "--scenario", "declare", "--devices", str(world),
                     "--config", config(data_split=WARN), out_dir=out).ok()
    for r in run.ranks(world):
        half = report(r, "train")
        assert half["verdict"] != "PASS", half
        assert half["missing"] == 1003 - 501 and half["missing_examples"][:3] == [501, 502, 503]
        skip = report(r, "train.1")
        assert skip["verdict"] == "MISSING" and "OVERLAP" in skip["violations"], skip
        assert skip["missing"] == 50 and skip["missing_examples"][:3] == [0, 1, 2]
        assert skip["diagnoses"][0].startswith("missing samples: ranks together saw 953 of 1003 samples; 50 never")
        sovits = report(r, "train.2")
        assert sorted(sovits["violations"]) == ["MISSING", "OVERLAP"], sovits
        missing, repeated = sovits["diagnoses"]
        assert missing.startswith("missing samples:") and "(declared dropped: 0), e.g. sample " in missing
        assert "a sampler that leaves samples out on purpose must declare it" in missing
        # no declaration: the allowance is torch's padding rule, world*ceil(1003/world) - 1003
        allowance = world * -(-1003 // world) - 1003
        assert repeated.startswith("repeated samples:") and f"(declared padding: {allowance})" in repeated
        assert "must declare it (padding: a count)" in repeated
        assert "check the rank and world size" not in repeated, "padding is no broken rank split"
        declared = report(r, "train.3")
        assert declared["verdict"] == "PASS", declared
        assert declared["missing"] == 0
    assert "declared padding" in run.stdout and "declared on LengthBucketBatchSampler" in run.stdout


def test_an_undeclared_bucket_sampler_stops_the_run_saying_how_to_declare(out: Path) -> None:
    run = run_script("lit_split.py", "--scenario", "sovits", "--devices", "2", out_dir=out)
    assert run.returncode != 0
    for r in run.ranks(2):
        assert r["type"] == "AuditFailed", r
        e = r["error"]
        assert e.count("audit of stream 'train' epoch 0:") == 1, "the prefix appears once"
        assert "missing samples:" in e and "repeated samples:" in e, "both problems, not the first only"
        assert "If LengthBucketBatchSampler pads or drops on purpose, declare it:" in e
        assert "ddplug.declare(<the LengthBucketBatchSampler>, dropped=<the " in e and ", padding=" in e


@pytest.mark.parametrize("world", worlds(2, 3))
def test_per_rank_datasets_and_exact_evaluation(out: Path, world: int) -> None:
    """A training set sharded per rank with Subset is found before the first step:
    owned by the user, not split again, audited over all 1002 samples. Validation
    and predict over 1001 samples deliver each sample once (uneven per rank), a
    synced accuracy equals the single-process one exactly, unequal Subset shards
    are audited in the whole dataset's indices, and a per-rank dataset ddplug
    cannot map gets a warning."""
    run = run_script("lit_split.py", "--scenario", "shards", "--devices", str(world),
                     "--no-distributed-sampler", out_dir=out).ok()
    ranks = run.ranks(world)
    train = sorted(i for r in ranks for i in r["seen"]["train"])
    assert train == list(range(1002)), "every sample once: the Subset shards were not split again"
    for r in ranks:
        s = r["streams"]["train"]
        assert s["owner"] == "user" and "already sharded per rank" in s["line"], s["line"]
        # the loader is rank-aware (sharded): use_distributed_sampler=False is what happens, no notice
        assert "use_distributed_sampler" not in s["line"], s["line"]
        rep = report(r, "train")
        assert rep["verdict"] == "PASS" and rep["num_samples"] == 1002 and rep["covered"] == 1002
        # validation: exact, uneven counts
        val = report(r, "val")
        assert val["verdict"] == "PASS" and val["covered"] == 1001 and val["deliveries"] == 1001
        # the plain validation loader is split by ddplug: there, the notice says so
        assert r["streams"]["val"]["owner"] == "plugin"
        assert "use_distributed_sampler=False) does not keep this loader whole" in r["streams"]["val"]["line"]
        shards = report(r, "val.1")
        assert shards["verdict"] == "PASS" and shards["num_samples"] == 1001 and shards["covered"] == 1001
        assert r["streams"]["val.2"]["owner"] == "user"
        assert r["metrics"]["val_correct"] == r["local_correct"], "a synced sum equals the single-process one"
        assert r["metrics"]["val_count"] == 1001.0
        assert r["metrics"]["val_acc"] == pytest.approx(r["local_correct"] / 1001, rel=1e-6), \
            "a mean-reduced accuracy over uneven shares is the single-process one too"
        pred = report(r, "predict", "predict_streams")
        assert pred["verdict"] == "PASS" and pred["deliveries"] == 1001
    for k in ("0", "1"):
        seen = sorted(i for r in ranks for i in r["val_seen"][k])
        assert seen == list(range(1001)), f"val dataloader {k}: every sample exactly once"
    predicted = sorted(i for r in ranks for i in r["predicted"])
    assert predicted == list(range(1001)), "predictions over 1001 inputs are exactly the 1001 inputs"
    counts = sorted(len(r["predicted"]) for r in ranks)
    assert counts[-1] - counts[0] <= 1
    assert "ddplug cannot map its indices to one index space" in run.output


@pytest.mark.parametrize("world", worlds(3, 2))
def test_streaming_data_is_audited_by_id_and_prepare_data_waits(out: Path, world: int) -> None:
    """An IterableDataset split by ddplug.shard over ranks and 2 DataLoader workers
    passes its audit by sample id; one that every rank reads whole is caught by its
    repeated ids; one without ids gets a warning. prepare_data takes 3 s: the
    others wait for the runner. (That a live runner is waited for past the
    collective timeout is test-runonce's: here a short collective timeout would
    bound every collective of the run, and a loaded machine would trip it.)"""
    cfg = config(data_split=WARN, timeouts={"collective_s": 60})
    run = run_script("lit_split.py", "--scenario", "stream", "--devices", str(world), "--config", cfg,
                     out_dir=out).ok()
    ranks = run.ranks(world)
    assert sorted(i for r in ranks for i in r["seen"]["train"]) == list(range(96))
    for r in ranks:
        assert r["prepared_seen"] is True
        train = report(r, "train")
        assert train["verdict"] == "PASS" and train["covered"] == 96 and train["num_samples"] == 96, train
        val = report(r, "val")
        assert val["verdict"] == "OVERLAP", val
        assert val["repeats"] == 30 * (world - 1)
        assert val["repeated_examples"], "example ids"
        assert {k for k in val["repeated_keys"]} <= {f"v{i:05d}" for i in range(30)} and val["repeated_keys"]
    assert "not audited: its samples carry no id" in run.output
    assert "audited by sample id (96 ids expected)" in run.stdout
    assert "repeated sample keys: v000" in run.stdout


@pytest.mark.parametrize("world,first,second", [(2, "ddplug", "ddp"), (3, "ddp", "ddplug")])
def test_checkpoints_resume_across_ddplug_and_ddp(out: Path, world: int, first: str, second: str) -> None:
    """ddplug keeps its stream positions under checkpoint["ddplug"], which DDP
    ignores (a stateful loader in Lightning's loop state made DDP refuse the
    checkpoint: "The CombinedLoader has 0 stateful loaders, but found 1 states")."""
    common = ["--scenario", "resume", "--devices", str(world), "--epochs", "2"]
    run_script("lit_run.py", *common, "--strategy", first, "--max-steps", "5", "--ckpt-every", "3",
               out_dir=out / "a").ok()
    ckpt = out / "a" / "ckpt" / "step=3.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (out / "a" / "ckpt").glob("*"))
    resumed = run_script("lit_run.py", *common, "--strategy", second, "--resume", str(ckpt),
                         out_dir=out / "b").ok()
    for r in resumed.ranks(world):
        assert r["global_step"] == 2 * (96 // (4 * world)), "the resumed run trained to the end"
    if second == "ddplug":
        assert "holds no ddplug stream positions (saved by another strategy)" in resumed.stdout


def test_strategy_by_name_after_lightning_is_imported() -> None:
    """Lightning reads no entry points for strategies: ``import ddplug`` registers
    strategy="ddplug" when Lightning is already imported."""
    import subprocess
    import sys

    code = ("import lightning.pytorch as pl, lightning.fabric as lf; import ddplug;"
            "from lightning.pytorch.strategies import StrategyRegistry;"
            "from lightning.fabric.strategies import STRATEGY_REGISTRY;"
            "print('ddplug' in StrategyRegistry, 'ddplug' in STRATEGY_REGISTRY)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
