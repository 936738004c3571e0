"""torch.distributed's "ddplug" backend with CUDA tensors on the nccl plugin
(tests/python/scripts/torch_run.py gpu): collectives on the current and on a
side stream, async Work and futures of CUDA tensors, CPU tensors staged through
the GPU, torch's DDP with device_ids, torchmetrics on the GPU, and (two ranks)
torch.nn.SyncBatchNorm, which torch runs on CUDA only. These run only
where CUDA devices are visible and the nccl plugin was built; elsewhere they
skip and say why (test_gpu.py's probes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import TEST_PLUGIN, run_ranks
from test_gpu import cuda_probe, gpu_env, need_gpus


def _run(out: Path, world: int, config: dict, env: dict, plugin: str = "nccl") -> list:
    env = dict(env, DDPLUG_CONFIG=json.dumps(config))
    codes, outs = run_ranks("torch_run.py", world, "gpu", out_dir=out, env=env, timeout=600)
    results = []
    for r in range(world):
        p = out / f"rank{r}.json"
        assert p.exists(), f"rank {r} wrote no result:\n" + "\n".join(outs)[-6000:]
        results.append(json.loads(p.read_text()))
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res.get('traceback', res.get('error'))}"
        failed = {k: v[1] for k, v in res["checks"].items() if not v[0]}
        assert not failed, f"rank {r}: {failed}"
        assert res["plugin"] == plugin
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    return results


def test_one_rank_picks_the_nccl_plugin_for_a_gpu_process(out: Path) -> None:
    """No plugin in the config: a process that sees a GPU runs on nccl."""
    need_gpus(1)
    _run(out, 1, {"rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}}, gpu_env(1))


def test_two_ranks_on_two_gpus(out: Path) -> None:
    need_gpus(2)
    _run(out, 2, {"rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}}, gpu_env(2))


def test_two_ranks_share_one_gpu(out: Path) -> None:
    """Both ranks on GPU 0 (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, allowed
    by the config), so the multi-rank CUDA path runs on a single-GPU machine."""
    need_gpus(1)
    version = cuda_probe()[1]
    if version is None or version < (2, 30, 0):
        pytest.skip(f"torch's NCCL {'.'.join(map(str, version)) if version else '(none)'} cannot put two ranks"
                    " on one GPU (needs >= 2.30)")
    cfg = {"plugin": "nccl", "rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120},
           "plugin_options": {"device_map": [0, 0], "allow_shared_gpu": True}}
    env = dict(gpu_env(1), NCCL_MULTI_RANK_GPU_ENABLE="1", DDPLUG_TEST_CUDA_DEVICE="0")
    _run(out, 2, cfg, env)


def test_two_ranks_share_one_gpu_on_the_cpu_plugin(out: Path) -> None:
    """Both ranks on GPU 0 with the config naming the CPU plugin: CUDA tensors
    are staged through the CPU. Any NCCL will do, so torch.nn.SyncBatchNorm
    (CUDA only in torch) runs over ddplug on a single-GPU machine."""
    need_gpus(1)
    cfg = {"plugin": TEST_PLUGIN, "rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}}
    _run(out, 2, cfg, dict(gpu_env(1), DDPLUG_TEST_CUDA_DEVICE="0"), plugin=TEST_PLUGIN)
