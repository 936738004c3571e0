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

from conftest import run_ranks, run_script

N, B = 96, 4


@functools.lru_cache(maxsize=None)
def cuda_probe() -> tuple:
    """(CUDA devices, NCCL version as a tuple or None) that a fresh process sees
    once the CPU tests' mask is lifted. The NCCL version is torch's: torch loads
    its libnccl.so.2 at import, and the nccl plugin then uses that same library
    (same SONAME), so it is the version that decides whether two ranks may share
    a GPU (>= 2.30)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    code = ("import torch\n"
            "n = torch.cuda.device_count()\n"
            "v = None\n"
            "if n:\n"
            "    import ctypes\n"  # the NCCL loaded now (torch.cuda.nccl.version() is the one torch was built with)
            "    try:\n"
            "        torch.cuda.init()\n"
            "        c = ctypes.c_int(0)\n"
            "        if ctypes.CDLL('libnccl.so.2').ncclGetVersion(ctypes.byref(c)) == 0:\n"
            "            v = c.value\n"
            "    except OSError:\n"
            "        v = torch.cuda.nccl.version()\n"
            "if isinstance(v, int):\n"  # old torch: NCCL_VERSION_CODE
            "    v = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)\n"
            "print(n, '.'.join(map(str, v)) if v else '-')\n")
    try:
        probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        count, version = probe.stdout.strip().splitlines()[-1].split()
        return int(count), (tuple(int(x) for x in version.split(".")) if version != "-" else None)
    except (ValueError, IndexError, subprocess.SubprocessError, OSError):
        return 0, None


def visible_gpus() -> int:
    return cuda_probe()[0]


def nccl_built() -> bool:
    return (Path(os.environ["DDPLUG_BUILD_DIR"]) / "lib" / "libddplug-nccl.so").exists()


def need_gpus(n: int) -> None:
    if not nccl_built():
        pytest.skip("the nccl plugin was not built (CMake found no CUDA toolkit or NCCL)")
    if visible_gpus() < n:
        pytest.skip(f"needs {n} CUDA device(s), {visible_gpus()} visible")


def gpu_config(shared: bool = False) -> str:
    cfg: dict = {"plugin": "nccl", "rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}}
    if shared:
        # Both ranks on GPU 0, allowed explicitly (the default refuses it).
        cfg["plugin_options"] = {"device_map": [0, 0], "allow_shared_gpu": True}
    return json.dumps(cfg)


def gpu_env(n: int) -> dict:
    # deterministic=True in the run needs cuBLAS's fixed workspace on CUDA.
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n)), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def flat(steps: list) -> list:
    return [i for step in steps for i in step]


def check_ranks(ranks: list, world: int, devices: list) -> None:
    """What every CUDA run must show: the nccl plugin on the expected device,
    one split of the data, collectives through NCCL, averaged gradients."""
    for r in ranks:
        assert r["plugin"] == "nccl" and r["root_device"] == devices[r["rank"]], r
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


@pytest.mark.parametrize("world", [1, 2])
def test_trainer_on_cuda_through_the_nccl_plugin(out: Path, world: int) -> None:
    """One rank per GPU, launched by Lightning (devices=world)."""
    need_gpus(world)
    run = run_script("lit_run.py", "--scenario", "plain", "--accelerator", "gpu", "--devices", str(world),
                     "--val", "--config", gpu_config(), out_dir=out, env=gpu_env(world), timeout=600).ok()
    check_ranks(run.ranks(world), world, [f"cuda:{r}" for r in range(world)])


def test_two_ranks_share_one_gpu_through_the_nccl_plugin(out: Path) -> None:
    """Two ranks on GPU 0 (so it runs on a machine with a single GPU): the
    multi-rank CUDA path of the adapter — gradient hooks on autograd's CUDA
    thread calling the plugin on the current stream, collectives between two
    processes' NCCL communicators on one device. NCCL >= 2.30 with
    NCCL_MULTI_RANK_GPU_ENABLE=1 allows it; the config allows it explicitly
    (plugin_options.allow_shared_gpu). Lightning itself refuses devices=2 with
    one visible GPU, so the two ranks are started torchrun-style as two
    one-device "nodes" (GROUP_RANK 0 and 1) of the same host; ddplug finds by
    host identity that they share it (local ranks 0 and 1 of node 0)."""
    need_gpus(1)
    version = cuda_probe()[1]
    if version is None or version < (2, 30, 0):
        pytest.skip(f"torch's NCCL {'.'.join(map(str, version)) if version else '(none)'} cannot put two ranks"
                    " on one GPU (needs >= 2.30)")
    world = 2
    env = dict(gpu_env(1), NCCL_MULTI_RANK_GPU_ENABLE="1")
    per_rank = {r: {"GROUP_RANK": r, "NODE_RANK": r, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
                    "TORCHELASTIC_RUN_ID": "ddplug-gpu-test"} for r in range(world)}
    codes, outs = run_ranks("lit_run.py", world, "--scenario", "plain", "--accelerator", "gpu", "--devices", "1",
                            "--nodes", str(world), "--val", "--config", gpu_config(shared=True),
                            out_dir=out, env=env, per_rank_env=per_rank, timeout=600)
    assert codes == [0] * world, "\n".join(outs)[-8000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    check_ranks(ranks, world, ["cuda:0"] * world)
    for r in ranks:
        assert r["lightning_world"]["environment"] == "TorchElasticEnvironment"
        assert r["ddplug_world"] == {"rank": r["rank"], "world_size": world, "local_rank": r["rank"],
                                     "node_rank": 0, "num_nodes": 1}
