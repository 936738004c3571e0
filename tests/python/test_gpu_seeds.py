"""The seed systems' own distributed code on the "ddplug" backend with CUDA
tensors (tests/python/scripts/seed_systems.py): coqui-tts-trainer's
init_distributed, reduce_tensor and DDP; SpeechBrain's run_on_main,
ddp_barrier and ddp_broadcast, and a failed preparation reaching every rank.
Both need CUDA (coqui asserts a GPU; SpeechBrain imports torchaudio, whose
PyPI wheels need a CUDA build of torch), so these run on a GPU machine with
coqui-tts-trainer==0.4.0 and speechbrain==1.1.2 installed, and skip elsewhere,
saying why. Both ranks share GPU 0 through the cpu plugin (CUDA tensors staged
through the host), so one GPU and any NCCL will do."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import TEST_PLUGIN, run_ranks
from test_gpu import gpu_env, need_gpus


def _need(module: str, package: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{package} is not installed (a GPU machine's environment; see the module docstring)")


def _run(out: Path, scenario: str) -> list:
    cfg = {"plugin": TEST_PLUGIN, "rendezvous": {"timeout_s": 120}, "timeouts": {"collective_s": 120}}
    env = dict(gpu_env(1), DDPLUG_CONFIG=json.dumps(cfg))
    codes, outs = run_ranks("seed_systems.py", 2, scenario, out_dir=out, env=env, timeout=300)
    results = []
    for r in range(2):
        p = out / f"rank{r}.json"
        assert p.exists(), f"rank {r} wrote no result:\n" + "\n".join(outs)[-6000:]
        res = json.loads(p.read_text())
        assert "error" not in res, f"rank {r}: {res.get('traceback', res.get('error'))}"
        failed = {k: v[1] for k, v in res["checks"].items() if not v[0]}
        assert not failed, f"rank {r}: {failed}"
        results.append(res)
    assert codes == [0, 0], "\n".join(outs)[-6000:]
    return results


def test_coqui_trainer_init_distributed_and_ddp(out: Path) -> None:
    need_gpus(1)
    _need("trainer", "coqui-tts-trainer")
    _run(out, "coqui")


def test_speechbrain_run_on_main_and_barriers(out: Path) -> None:
    need_gpus(1)
    _need("speechbrain", "speechbrain")
    results = _run(out, "speechbrain")
    # SpeechBrain 1.1.2's ddp_init_group accepts nccl, gloo and mpi only: a
    # recipe joins through ddplug.torch.init() instead (README).
    assert "communication protocol doesn't exist" in results[0].get("ddp_init_group", ""), results[0]
