"""The ddplug strategy under Lightning Fabric with real subprocess ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import assert_aborted_by, config, run_script, worlds


def flat(steps: list) -> list:
    return [i for s in steps for i in s]


@pytest.mark.parametrize("world", worlds(3, 2))
def test_fabric_split_sync_and_collectives(out: Path, world: int) -> None:
    import torch

    import lit_common

    # small buckets: several gradient allreduces per round
    cfg = config(gradients={"bucket_mb": 0.0005, "first_bucket_mb": 0.0002})
    run = run_script("fabric_run.py", "--devices", str(world), "--by-name", "--syncbn", out_dir=out,
                     env={"DDPLUG_CONFIG": cfg}).ok()
    ranks = run.ranks(world)
    per_rank = -(-64 // world)  # ddplug's sampler pads to equal shares
    for epoch in ("0", "1"):
        every = [i for r in ranks for i in flat(r["seen"][epoch])]
        assert set(every) == set(range(64)) and len(every) == per_rank * world
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
        # fabric.no_backward_sync on every other micro-batch: one round of allreduces
        # per optimizer step, not one per micro-batch
        steps = sum(len(r["seen"][e]) // 2 for e in ("0", "1"))
        assert r["buckets"] >= 2 and r["per_step"] == [r["buckets"]] * steps
    assert sorted(set(i for r in ranks for i in r["eval_seen"])) == list(range(20))
    # torch.nn.SyncBatchNorm (which needs torch.distributed) became ddplug's: the
    # running statistics are those of every rank's samples of each forward
    x = lit_common.SeqDataset(64).x.double()
    mean, var = torch.zeros(x.shape[1], dtype=torch.float64), torch.ones(x.shape[1], dtype=torch.float64)
    for epoch in ("0", "1"):
        for t in range(len(ranks[0]["seen"][epoch])):
            batch = x[[i for r in ranks for i in r["seen"][epoch][t]]]
            mean = 0.9 * mean + 0.1 * batch.mean(0)
            var = 0.9 * var + 0.1 * batch.var(0, unbiased=True)
    for r in ranks:
        assert r["bn"]["class"] == "ddplug.nn.syncbn.SyncBatchNorm"
        assert r["bn"]["running_mean"] == pytest.approx(mean.tolist(), abs=1e-5)
        assert r["bn"]["running_var"] == pytest.approx(var.tolist(), abs=1e-5)
    assert "torch.nn.SyncBatchNorm layer(s) synchronize through ddplug" in run.stdout


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
    batches the loop consumed (position 3) and those its optimizer steps committed
    (2: the loop steps every second batch, so batch 3's gradient was still being
    accumulated, and the checkpoint does not hold it). A resumed run (Fabric numbers
    epochs from 0 again) continues the saved epoch at the last committed batch, in
    the same order: the uncommitted batch is dealt again, so every sample's
    gradient is applied exactly once."""
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
        assert r["seen"]["1"] == ref[r["rank"]]["seen"]["1"][2:]
        full = len(ref[r["rank"]]["seen"]["1"])
        assert r["len_after_load"] == full - 2, "len(loader) after a mid-epoch resume: the batches left"
        assert r["len_now"] == full, "then whole epochs again"
