"""Synchronized batch norm without torch.distributed (ddplug.nn.syncbn): the layer
against BatchNorm over every rank's batch in one process — torch.nn.SyncBatchNorm's
definition — and Trainer(sync_batchnorm=True) under the ddplug strategy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import config, run_ranks, run_script

N, B = 96, 4


def test_convert_and_revert_keep_parameters_and_classes() -> None:
    from ddplug.nn.syncbn import SyncBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm, synced_buffers

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4),
                                torch.nn.SyncBatchNorm(4, momentum=None), torch.nn.BatchNorm1d(2, affine=False))
    weight, mean, keys = model[1].weight, model[2].running_mean, list(model.state_dict())
    model.eval()
    converted = convert_sync_batchnorm(model)
    assert converted is model
    assert [type(m).__name__ for m in model] == ["Conv2d", "SyncBatchNorm", "SyncBatchNorm", "SyncBatchNorm"]
    assert all(isinstance(m, SyncBatchNorm) for m in model[1:]) and not model[1].training
    assert model[1].weight is weight and model[2].running_mean is mean and model[2].momentum is None
    assert list(model.state_dict()) == keys
    assert len(list(synced_buffers(model))) == 6
    only = convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(2), torch.nn.SyncBatchNorm(2)),
                                  only_torch_sync=True)
    assert [type(m).__name__ for m in only] == ["BatchNorm1d", "SyncBatchNorm"] and isinstance(only[1], SyncBatchNorm)
    reverted = revert_sync_batchnorm(model)
    assert [type(m) for m in reverted[1:]] == [torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm, torch.nn.BatchNorm1d]
    assert reverted[1].weight is weight and reverted[2].running_mean is mean


def test_outside_a_run_it_is_batchnorm() -> None:
    """No context (or a world of one): plain batch norm, as torch's does."""
    from ddplug.nn.syncbn import convert_sync_batchnorm

    ref = torch.nn.BatchNorm1d(3)
    mine = convert_sync_batchnorm(torch.nn.BatchNorm1d(3))
    x = torch.randn(8, 3, 5) * 2 + 1
    assert torch.allclose(mine(x), ref(x)) and torch.allclose(mine.running_var, ref.running_var)
    with pytest.raises(ValueError, match="at least 2D input"):
        mine(torch.randn(3))


def test_matches_batchnorm_over_every_ranks_batch(out: Path) -> None:
    """Forward, input/weight/bias gradients, running statistics (momentum and
    cumulative), evaluation; 3d and 4d input; 3 ranks with unequal batches, one of
    them empty; in a model whose bucketed gradient sync runs in the same backward.
    (test_trainer_sync_batchnorm runs 2 ranks.)"""
    world = 3
    codes, outs = run_ranks("ctx_worker.py", world, "syncbn", out_dir=out)
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    for r in range(world):
        res = json.loads((out / f"rank{r}.json").read_text())
        for case in ("3d", "4d", "cumulative"):
            errs = res[case]
            assert errs.pop("batches") == [2, 2]
            assert max(errs.values()) < 1e-4, (case, errs)
        assert res["model_buckets"] >= 2 and res["model_grads"] < 1e-5 and res["model_running_mean"] < 1e-6
        assert res["synced_buffers"] == 4
        assert ("synchronized BatchNorm running statistics differ across ranks after step 4: rank(s) 1 disagree"
                in res["drift"]), res["drift"]


def test_trainer_sync_batchnorm(out: Path) -> None:
    """Trainer(sync_batchnorm=True): the running statistics are those of every
    rank's samples of each step (torch's SyncBatchNorm would silently use each
    rank's own: they would differ between ranks), equal on every rank (checked
    after every step, checks.param_sync_every), and the layer is a BatchNorm1d
    again after fit."""
    import lit_common

    world = 2
    run = run_script("lit_run.py", "--scenario", "syncbn", "--devices", str(world), "--epochs", "1",
                     "--config", config(checks={"param_sync_every": 1}), out_dir=out).ok()
    ranks = run.ranks(world)
    x = lit_common.SeqDataset(N).x.double()
    mean, var = torch.zeros(x.shape[1], dtype=torch.float64), torch.ones(x.shape[1], dtype=torch.float64)
    steps = len(ranks[0]["seen"]["0"])
    for t in range(steps):
        batch = x[[i for r in ranks for i in r["seen"]["0"][t]]]
        mean = 0.9 * mean + 0.1 * batch.mean(0)
        var = 0.9 * var + 0.1 * batch.var(0, unbiased=True)
    for r in ranks:
        bn = r["bn"]
        assert bn["batches"] == steps == N // (B * world)
        assert bn["running_mean"] == pytest.approx(mean.tolist(), abs=1e-5)
        assert bn["running_var"] == pytest.approx(var.tolist(), abs=1e-5)
        assert bn["class_in_fit"] == "ddplug.nn.syncbn.SyncBatchNorm" and bn["class_after"] == "BatchNorm1d"
        assert r["params"] == ranks[0]["params"]
    assert "sync_batchnorm: batch norm statistics over every rank, through ddplug" in run.stdout
