"""The Lightning adapter with CUDA tensors on the "nccl" plugin: the real
Trainer with accelerator="gpu" and real subprocess ranks. These run only where
CUDA devices are visible (the GPU machine); elsewhere they skip and say why.
The conftest hides GPUs from the CPU tests (CUDA_VISIBLE_DEVICES=""); these
tests probe and pass the devices explicitly."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_script

N, B = 96, 4


@functools.lru_cache(maxsize=None)
def visible_gpus() -> int:
    """CUDA devices a fresh process sees once the CPU tests' mask is lifted."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           env=env, capture_output=True, text=True, timeout=120)
    try:
        return int(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def nccl_built() -> bool:
    return (Path(os.environ["DDPLUG_BUILD_DIR"]) / "lib" / "libddplug-nccl.so").exists()


def need_gpus(n: int) -> None:
    if not nccl_built():
        pytest.skip("the nccl plugin was not built (CMake found no CUDA toolkit or NCCL)")
    if visible_gpus() < n:
        pytest.skip(f"needs {n} CUDA device(s), {visible_gpus()} visible")


def gpu_config() -> str:
    return json.dumps({"plugin": "nccl", "rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}})


def gpu_env(n: int) -> dict:
    # deterministic=True in the run needs cuBLAS's fixed workspace on CUDA.
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n)), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def flat(steps: list) -> list:
    return [i for step in steps for i in step]


@pytest.mark.parametrize("world", [1, 2])
def test_trainer_on_cuda_through_the_nccl_plugin(out: Path, world: int) -> None:
    need_gpus(world)
    run = run_script("lit_run.py", "--scenario", "plain", "--accelerator", "gpu", "--devices", str(world),
                     "--val", "--config", gpu_config(), out_dir=out, env=gpu_env(world), timeout=600).ok()
    ranks = run.ranks(world)
    for r in ranks:
        assert r["plugin"] == "nccl" and r["root_device"] == f"cuda:{r['rank']}"
        train = r["streams"]["train"]
        assert train["owner"] == "plugin" and train["reports"][0]["verdict"] == "PASS", train
        assert len(r["seen"]["0"]) == N // (B * world)
        assert r["gathered"] == [[k, 10 * k] for k in range(world)]
        assert r["broadcast"] == {"from": min(1, world - 1), "list": [1, 2]}
        assert r["metrics"]["val_rank"] == pytest.approx(sum(range(1, world + 1)) / world)
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in flat(r["seen"][epoch])) == list(range(N))
    # gradients were averaged over NCCL: identical parameters on every rank
    assert all(r["params"] == ranks[0]["params"] for r in ranks)
