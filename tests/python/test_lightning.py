"""The ddplug strategy under a real Lightning 2.6.6 Trainer with real subprocess
ranks (devices=N, accelerator="cpu"): split ownership, audit, gradient parity
with DDP (gloo), synced metrics, checkpoint resume, prepare_data run-once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_aborted_by, config, run_ranks, run_script, variants, worlds

N, B = 96, 4


def flat(steps: list) -> list:
    return [i for step in steps for i in step]


def expected_order(rank: int, world: int, epoch: int, seed: int = 0, shuffle: bool = True) -> list:
    """ddplug's standalone DistributedSampler gives the order a plugin-owned train
    stream must follow (same desc, seed and epoch on every machine)."""
    from ddplug.data.samplers import DistributedSampler

    s = DistributedSampler(N, rank=rank, num_replicas=world, shuffle=shuffle, seed=seed, batch_size=B)
    s.set_epoch(epoch)
    try:
        return list(s)
    finally:
        s.close()


@pytest.mark.parametrize("world", worlds(2, 3))
def test_plain_loader_is_split_by_the_plugin(out: Path, world: int) -> None:
    run = run_script("lit_run.py", "--scenario", "plain", "--devices", str(world), "--val", "--csv",
                     "--sanity", "2", out_dir=out).ok()
    ranks = run.ranks(world)
    for epoch in ("0", "1"):
        per_rank = [flat(r["seen"][epoch]) for r in ranks]
        everything = sorted(i for p in per_rank for i in p)
        assert everything == list(range(N)), f"epoch {epoch}: every sample exactly once"
        for r in ranks:
            assert len(r["seen"][epoch]) == N // (B * world)  # steps per epoch
    for r in ranks:
        assert flat(r["seen"]["0"]) != flat(r["seen"]["1"]), "the order changes between epochs"
        assert flat(r["seen"]["0"]) == expected_order(r["rank"], world, 0)
        assert flat(r["seen"]["1"]) == expected_order(r["rank"], world, 1)
        train = r["streams"]["train"]
        assert train["owner"] == "plugin" and "auto" in train["line"]
        assert train["reports"] and train["reports"][0]["verdict"] == "PASS", train
        assert r["dataset_epochs"][:2] == [0, 1], "set_epoch reaches the dataset"
        # validation: every val sample once over the ranks (exact: uneven counts per
        # rank), synced metrics weighted by what each rank evaluated
        counts = [len(x["val_seen"]["1"]) for x in ranks]
        assert r["metrics"]["val_rank"] == pytest.approx(
            sum((k + 1) * c for k, c in enumerate(counts)) / sum(counts))
        steps = [-(-c // B) for c in counts]  # "sum" adds each rank's steps, then the ranks
        assert r["metrics"]["val_rank_sum"] == pytest.approx(sum((k + 1) * st for k, st in enumerate(steps)))
        assert r["streams"]["val"]["owner"] == "plugin"
        assert r["gathered"] == [[k, 10 * k] for k in range(world)]
        assert r["broadcast"] == {"from": 1, "list": [1, 2]}
    assert [rep["epoch"] for rep in ranks[0]["streams"]["val"]["reports"]] == [0, 1], "no audit of the sanity check"
    val = sorted(i for r in ranks for i in r["val_seen"]["1"])
    assert val == list(range(N // 3)), "exact: every validation sample once, no padding"
    assert "owner plugin" in run.stdout and "PASS" in run.stdout
    metrics = (out / "logs" / "run" / "version_0" / "metrics.csv").read_text()  # the audit reaches the logger
    assert "ddplug/audit/train/passed" in metrics and "ddplug/audit/val/covered" in metrics
    # equal parameters everywhere: gradients were synchronized
    assert all(r["params"] == ranks[0]["params"] for r in ranks)


@pytest.mark.parametrize("world", worlds(3, 2))
def test_rank_aware_bucket_sampler_as_sampler_is_not_split_twice(out: Path, world: int) -> None:
    # Trainer(strategy="ddplug") by name: registered by `import ddplug.lightning`
    run = run_script("lit_run.py", "--scenario", "sovits", "--devices", str(world), "--epochs", "1",
                     "--strategy", "ddplug-by-name", out_dir=out).ok()
    ranks = run.ranks(world)
    for r in ranks:
        assert r["lightning_world"]["environment"] == "LightningEnvironment"
        assert r["num_training_batches"] == N // (B * world)  # not N / (B * world**2)
        assert len(r["seen"]["0"]) == N // (B * world)
        s = r["streams"]["train"]
        assert s["owner"] == "user" and "SoVITSBucketSampler" in s["line"] and "num_replicas" in s["line"]
        assert s["reports"][0]["verdict"] == "PASS"
    assert sorted(i for r in ranks for i in flat(r["seen"]["0"])) == list(range(N))


def test_bucket_sampler_from_config(out: Path) -> None:
    import bisect

    import lit_common

    world, bounds = 2, [50, 100, 150]
    cfg = config(sampler={"kind": "bucket", "seed": 5, "bucket": {"boundaries": bounds, "batch_size": 4}},
                 data_split={"audit": "every_epoch"})
    run = run_script("lit_run.py", "--scenario", "plain", "--devices", str(world), "--config", cfg,
                     out_dir=out).ok()
    ranks = run.ranks(world)
    lengths = lit_common.SeqDataset(N).lengths
    for r in ranks:
        s = r["streams"]["train"]
        assert s["owner"] == "plugin"
        assert [rep["verdict"] for rep in s["reports"]] == ["PASS", "PASS"]
        assert flat(r["seen"]["0"]) != flat(r["seen"]["1"]), "set_epoch reaches the bucket sampler"
        assert r["dataset_epochs"][:2] == [0, 1]
        for epoch in ("0", "1"):
            assert len(r["seen"][epoch]) == len(ranks[0]["seen"][epoch]), "equal steps on every rank"
            for batch in r["seen"][epoch]:
                assert len(batch) == 4
                assert len({bisect.bisect_left(bounds, lengths[i]) for i in batch}) == 1, "one bucket per batch"
    for epoch in ("0", "1"):
        assert set(i for r in ranks for i in flat(r["seen"][epoch])) == set(range(N))


def test_the_same_sampler_under_ddp_is_split_twice(out: Path) -> None:
    """The failure the previous test guards against, as Lightning's DDPStrategy
    produces it: the rank-aware sampler is wrapped again, N/(B*G^2) steps."""
    world = 2
    run = run_script("lit_run.py", "--scenario", "sovits", "--devices", str(world), "--epochs", "1",
                     "--strategy", "ddp", out_dir=out).ok()
    for r in run.ranks(world):
        assert r["num_training_batches"] == N // (B * world * world)


@pytest.mark.parametrize("world", worlds(3, 2))
def test_distributed_sampler_subclass_as_batch_sampler(out: Path, world: int) -> None:
    """Two epochs: set_epoch reaches the user's batch sampler (and the dataset)
    with 0 then 1, so the order changes."""
    run = run_script("lit_run.py", "--scenario", "dsbatch", "--devices", str(world), "--epochs", "2",
                     out_dir=out).ok()
    ranks = run.ranks(world)
    for r in ranks:
        assert r["num_training_batches"] == N // (B * world)
        s = r["streams"]["train"]
        assert s["owner"] == "user" and "VITSBucketBatchSampler" in s["line"] and "DistributedSampler" in s["line"]
        assert [rep["verdict"] for rep in s["reports"]] == ["PASS", "PASS"]
        assert r["batch_sampler_epochs"] == [0, 1]
        assert r["dataset_epochs"] == [0, 1]
        assert flat(r["seen"]["0"]) != flat(r["seen"]["1"]), "the order changes between epochs"
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in flat(r["seen"][epoch])) == list(range(N))


def test_forced_user_owner_without_split_stops_the_run(out: Path) -> None:
    # 2 ranks: the diagnosis for more ranks is the library's (tests/c/test-audit.c, 4 ranks)
    world = 2
    cfg = config(data_split={"streams": {"train": {"owner": "user"}}})
    run = run_script("lit_run.py", "--scenario", "nosplit", "--devices", str(world), "--epochs", "1",
                     "--config", cfg, out_dir=out)
    assert run.returncode != 0
    for r in run.ranks(world):
        assert r["type"] == "AuditFailed", r
        assert "no partitioning" in r["error"]
        assert "owner user (forced by data_split.streams.train.owner" in r["error"]
        assert "let ddplug split it" in r["error"]
    assert "no partitioning: every rank saw the same samples" in run.output


def test_a_sampler_that_asks_torch_distributed_for_ranks_is_named(out: Path) -> None:
    """GPT-SoVITS' upstream bucket sampler calls dist.get_world_size() when
    num_replicas is not given: DDP initialized torch.distributed; a ddplug strategy
    told not to (torch_distributed=False) does not. Every rank stops at dataloader
    setup naming the sampler, the line and what to pass. (With torch.distributed
    initialised, the default, the sampler works: test_torch_backend.py.)"""
    run = run_script("lit_run.py", "--scenario", "distsampler", "--devices", "2", "--epochs", "1",
                     "--torch-distributed", "off", out_dir=out)
    assert run.returncode != 0
    for rank, r in enumerate(run.ranks(2)):
        assert r["type"] == "TorchDistributedNotInitialized", r
        e = r["error"]
        assert f"rank {rank}: train_dataloader() (lit_run.py:" in e, e
        assert "DDPOnlyBucketSampler.__init__ (lit_common.py:" in e and "torch.distributed.get_world_size()" in e
        assert "runs without torch.distributed" in e
        assert f"num_replicas=self.trainer.world_size, rank=self.trainer.global_rank (here 2 and {rank})" in e
        assert "**self.trainer.distributed_sampler_kwargs" in e
        assert "Default process group has not been initialized" in r["traceback"], "the original error is chained"


@pytest.mark.parametrize("world", worlds(2, 3))
def test_parity_with_ddp_gloo(out: Path, world: int) -> None:
    # small buckets: several async allreduces per step; accumulation: no_sync path
    cfg = config(gradients={"bucket_mb": 0.0005, "first_bucket_mb": 0.0002}, checks={"param_sync_every": 1})
    common = ["--scenario", "parity", "--devices", str(world), "--epochs", "2", "--accumulate", "2"]
    ddp = run_script("lit_run.py", *common, "--strategy", "ddp", out_dir=out / "ddp").ok()
    mine = run_script("lit_run.py", *common, "--config", cfg, "--count-syncs", out_dir=out / "ddplug").ok()
    a, b = ddp.ranks(world), mine.ranks(world)
    for r in range(world):
        assert a[r]["seen"] == b[r]["seen"], "same data per rank and step"
        assert a[r]["global_step"] == b[r]["global_step"]
        for pa, pb in zip(a[r]["params"], b[r]["params"]):
            assert pa == pytest.approx(pb, rel=1e-5, abs=1e-6)
        assert b[r]["streams"]["train"]["owner"] == "user"
        # Parity cannot tell whether every micro-batch synchronized (the average of
        # sums is the same): count the gradient allreduces instead.
        syncs, steps = b[r]["syncs"], b[r]["global_step"]
        assert syncs["buckets"] >= 2
        assert syncs["per_step"] == [syncs["buckets"]] * steps, "one round per optimizer step, not per micro-batch"
        assert syncs["rounds"] == steps
        # every bucket of the synchronizing micro-batch started while its backward ran
        # (before post_backward finishes the round); none in the accumulating one
        assert syncs["in_backward"] == [0, syncs["buckets"]] * steps


def test_parameter_check_names_the_rank_that_drifted(out: Path) -> None:
    run = run_script("lit_run.py", "--scenario", "desync", "--devices", "2", "--epochs", "1",
                     "--config", config(checks={"param_sync_every": 1}), out_dir=out)
    assert run.returncode != 0
    for r in run.ranks(2):
        assert r["type"] == "ParametersDiffer", r
        assert "parameters differ across ranks after step 3: rank(s) 1 disagree with rank 0" in r["error"]


@pytest.mark.parametrize("failing", [0, 1])
def test_an_error_on_one_rank_stops_every_rank_with_it(out: Path, failing: int) -> None:
    """on_exception aborts the run: the other rank stops at its next collective
    with the failing rank's error, not a collective timeout (set long here)."""
    run = run_script("lit_run.py", "--scenario", "plain", "--devices", "2", "--epochs", "1",
                     "--fail-rank", str(failing), "--config", config(timeouts={"collective_s": 120}), out_dir=out)
    assert_aborted_by(run, failing)


@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_rank_is_named_on_the_survivor(out: Path, killed: int) -> None:
    """SIGKILL gives no hook a chance: the plugin and the store notice the death
    and the survivor's gradient allreduce raises PeerLost naming the rank (rank 0
    also serves the store)."""
    run = run_script("lit_run.py", "--scenario", "plain", "--devices", "2", "--epochs", "1",
                     "--fail-rank", str(killed), "--fail-kill",
                     "--config", config(timeouts={"collective_s": 120}), out_dir=out)
    assert run.returncode != 0
    survivor = run.rank(1 - killed)
    assert survivor["type"] == "PeerLost", survivor
    assert (f"rank {killed} (pid" if killed else "rank 0 exited or was killed") in survivor["error"]
    assert not (out / f"rank{killed}.json").exists(), "the killed rank wrote nothing"


def test_checkpoint_resume_continues_the_sampler(out: Path) -> None:
    # a DataLoader worker prefetches ahead of the loop: the checkpoint must hold
    # what the loop consumed, not what the sampler handed out (2 ranks only: two
    # runs per case; resume with 3 ranks is the same code with another world size)
    world = 2
    steps_per_epoch = N // (B * world)
    first = run_script("lit_run.py", "--scenario", "resume", "--devices", str(world), "--epochs", "2",
                       "--max-steps", "5", "--ckpt-every", "3", "--workers", "1", out_dir=out / "a").ok()
    ckpt = out / "a" / "ckpt" / "step=3.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (out / "a" / "ckpt").glob("*"))
    # the strategy noted it as the directory's newest checkpoint; say a later one
    # was saved since (as a run that went on would have): resuming from step 3 is named
    ledger = out / "a" / "ckpt" / "ddplug-checkpoints.json"
    assert json.loads(ledger.read_text()) == {"path": str(ckpt), "global_step": 3, "epoch": 0}
    later = out / "a" / "ckpt" / "step=6.ckpt"
    ledger.write_text(json.dumps({"path": str(later), "global_step": 6, "epoch": 1}))
    second = run_script("lit_run.py", "--scenario", "resume", "--devices", str(world), "--epochs", "2",
                        "--resume", str(ckpt), out_dir=out / "b").ok()
    assert (f"resuming from {ckpt} (epoch 0, step 3), but {later} (epoch 1, step 6) was saved after it: the 3"
            " steps between are trained again") in second.output
    for r in range(world):
        before = first.rank(r)["seen"]["0"][:3]  # the 3 steps the checkpoint holds
        after = second.rank(r)["seen"]
        epoch0 = flat(before) + flat(after["0"])
        assert epoch0 == expected_order(r, world, 0), "resumed at step 3 of epoch 0, nothing repeated or lost"
        assert flat(after["1"]) == expected_order(r, world, 1)
        assert len(after["0"]) == steps_per_epoch - 3


@pytest.mark.parametrize("world", worlds(3, 2))
def test_predict_and_test_split_by_the_plugin(out: Path, world: int) -> None:
    run = run_script("lit_run.py", "--scenario", "predict", "--devices", str(world), out_dir=out).ok()
    ranks = run.ranks(world)
    assert sorted(i for r in ranks for i in r["predicted"]) == list(range(N))
    for r in ranks:
        assert r["predict_streams"]["predict"]["owner"] == "plugin"  # though predict re-creates loaders
        assert r["predict_streams"]["predict"]["reports"][0]["verdict"] == "PASS"
        assert r["num_predictions"] == N // world
        assert r["streams"]["test"]["owner"] == "plugin"
        assert r["streams"]["test"]["reports"][0]["verdict"] == "PASS"
    assert sorted(set(i for r in ranks for i in r["test_seen"])) == list(range(N // 3))


# Both scopes of run-once are tested in test_runonce.py; through Lightning,
# make test takes one scope here and the other for the failure below.
@pytest.mark.parametrize("scope", variants("node", "global"))
def test_prepare_data_runs_once_and_the_others_wait(out: Path, scope: str) -> None:
    run = run_script("lit_run.py", "--scenario", "prepare", "--devices", "2", "--epochs", "1",
                     "--prepare-scope", scope, out_dir=out).ok()
    assert len((out / "prepare_calls.txt").read_text().split()) == 1
    for r in run.ranks(2):
        assert r["prepared_seen"] is True, "setup ran after prepare_data finished, on every rank"


@pytest.mark.parametrize("scope", variants("global", "node"))
def test_prepare_data_failure_reaches_every_rank(out: Path, scope: str) -> None:
    run = run_script("lit_run.py", "--scenario", "prepare", "--devices", "2", "--epochs", "1",
                     "--prepare-scope", scope, "--prepare-fail", out_dir=out)
    assert run.returncode != 0
    r0, r1 = run.ranks(2)
    assert r0["type"] == "FileNotFoundError" and "example.invalid" in r0["error"]
    assert r1["type"] == "RunOnceFailed"
    assert "FileNotFoundError: mirror https://example.invalid/data.tar is unreachable" in r1["error"]
    assert "Traceback" in r1["error"] and "prepare_data" in r1["error"]


def test_torchrun_launched_on_two_nodes(out: Path) -> None:
    """torchrun-style processes (TorchElasticEnvironment), 2 simulated nodes x 2
    devices: global ranks, sampler kwargs and node-scope prepare_data."""
    nodes, devices = 2, 2
    world = nodes * devices
    per_rank = {r: {"GROUP_RANK": r // devices, "LOCAL_RANK": r % devices, "LOCAL_WORLD_SIZE": devices,
                    "DDPLUG_HOST_ID": f"node{r // devices}", "TORCHELASTIC_RUN_ID": "ddplug-test"}
                for r in range(world)}
    codes, outs = run_ranks("lit_run.py", world, "--scenario", "prepare", "--devices", str(devices),
                            "--nodes", str(nodes), "--epochs", "1", "--prepare-scope", "node",
                            out_dir=out, per_rank_env=per_rank, timeout=240)
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for r in ranks:
        assert r["lightning_world"]["environment"] == "TorchElasticEnvironment"
        assert r["ddplug_world"] == {"rank": r["rank"], "world_size": world, "local_rank": r["rank"] % devices,
                                     "node_rank": r["rank"] // devices, "num_nodes": nodes}
        assert r["sampler_kwargs"] == {"num_replicas": world, "rank": r["rank"]}
        assert r["prepared_seen"] is True
    assert sorted(i for r in ranks for i in flat(r["seen"]["0"])) == list(range(N))
    assert len((out / "prepare_calls.txt").read_text().split()) == nodes, "once per node"


_OBSERVED = """
import subprocess, sys, time
from ddplug._strategy import _TolerantObserver
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
_TolerantObserver([child], stop_grace_s=float(sys.argv[1]), sleep_period=0.05).start()
child.wait()
if sys.argv[2] == "reports":
    time.sleep(1)  # its exception path: many of the observer's polls (Lightning's killed it at the first)
    print("survivor reported the loss", flush=True)
    sys.exit(0)
time.sleep(600)  # a survivor that never ends
"""


@pytest.mark.parametrize("survivor", ["reports", "hangs"])
def test_the_launching_rank_reports_a_lost_rank_before_it_is_terminated(tmp_path: Path, survivor: str) -> None:
    """Lightning's observer SIGKILLed the launching rank at its first poll after a
    launched rank died, whether or not rank 0 had reported the loss yet (a race:
    test_a_killed_rank_is_named_on_the_survivor failed under load). ddplug's lets
    the survivors end on their own, and terminates only one still running after
    the grace."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    grace = "600" if survivor == "reports" else "0.2"
    p = subprocess.run([sys.executable, "-c", _OBSERVED, grace, survivor], capture_output=True, text=True,
                       timeout=300, env=env)
    if survivor == "reports":
        assert p.returncode == 0 and "survivor reported the loss" in p.stdout, (p.returncode, p.stdout, p.stderr)
    else:
        assert p.returncode == -9, (p.returncode, p.stderr)
        assert "launched rank 1 (pid" in p.stderr and "exited with 3" in p.stderr, p.stderr
        assert "terminating every rank" in p.stderr, p.stderr
