"""torch.distributed's "ddplug" backend with real clients nobody here wrote:
torch's DistributedDataParallel, Lightning's own DDPStrategy, torchmetrics,
WebDataset's split_by_node, the init calls of coqui's trainer and SpeechBrain
(their packages cannot run here: coqui-tts-trainer's distributed mode needs CUDA,
speechbrain 1.1.2 imports torchaudio, whose wheels do not load with this CPU
torch), ddplug.torch for plain-PyTorch scripts, and failures — on 2 and 3 real
processes (tests/python/scripts/torch_run.py, lit_backend.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SRC, run_ranks, run_script, worlds


def ranks(out: Path, world: int) -> list:
    res = []
    for r in range(world):
        p = out / f"rank{r}.json"
        res.append(json.loads(p.read_text()) if p.exists() else None)
    return res


def all_checks_pass(results: list, outs: list, errors_expected: bool = False) -> None:
    for r, res in enumerate(results):
        assert res is not None, f"rank {r} wrote no result:\n" + "\n".join(outs)[-6000:]
        assert errors_expected or "error" not in res, f"rank {r}: {res.get('traceback', res['error'])}"
        failed = {k: v[1] for k, v in res["checks"].items() if not v[0]}
        assert not failed, f"rank {r}: {failed}"
        assert res["checks"], f"rank {r} checked nothing"


def test_import_ddplug_registers_the_backend_without_importing_torch() -> None:
    code = ("import sys, ddplug\n"
            "assert 'torch' not in sys.modules, 'import ddplug imported torch'\n"
            "import torch.distributed as dist\n"
            "assert 'DDPLUG' in dist.Backend._plugins and dist.is_backend_available('ddplug')\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("world,init", [(2, "coqui"), (3, "speechbrain")])
def test_real_clients_on_the_ddplug_backend(out: Path, world: int, init: str) -> None:
    """coqui's init_process_group(backend, init_method=tcp://...) or SpeechBrain's
    env:// one, then: every collective against its expected value (native,
    composed, object collectives, refusals), asynchronous Work (wait timeout,
    is_completed, futures), DDP gradients equal to whole-batch ones, torchmetrics
    equal to the single-process value, SpeechBrain's run_on_main, a subgroup."""
    codes, outs = run_ranks("torch_run.py", world, "client", "--init", init, out_dir=out)
    results = ranks(out, world)
    all_checks_pass(results, outs)
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    assert all(r["backend"] == "ddplug" and r["group"].startswith("ProcessGroupDdplug") for r in results)
    assert len(results[0]["checks"]) >= 40


def test_plain_pytorch_adapter(out: Path) -> None:
    """ddplug.torch: init (torch.distributed on the run), prepare_dataloader (one
    owner per stream, audited), torch's DDP, set_epoch, run_once, shutdown."""
    world, n = 3, 40
    codes, outs = run_ranks("torch_run.py", world, "adapter", out_dir=out)
    results = ranks(out, world)
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    for rank, r in enumerate(results):
        assert r["torch_distributed"] == [True, "ddplug", rank, world]
        assert r["owners"] == {"train": "plugin", "val": "user"}
        assert r["verdicts"] == {"train": ["PASS", "PASS"], "val": ["PASS"]}
        assert r["dataset_epochs"][:2] == [0, 1]
        assert r["ran_once"] == "made by rank 0"
        assert r["closed"] is True
        assert r["params"] == results[0]["params"], "DDP kept the ranks' parameters equal"
    for epoch in ("0", "1"):
        seen = [r["seen"][epoch] for r in results]
        assert set().union(*map(set, seen)) == set(range(n))
        assert sum(map(len, seen)) == n + 2  # padded by 2 to 14 per rank, as the audit declared
    assert results[0]["seen"]["0"] != results[0]["seen"]["1"], "set_epoch reshuffled"
    assert sorted(i for r in results for i in r["val_seen"]) == list(range(42))
    out0 = outs[0]
    assert "stream 'val': owner user (auto: sampler DistributedSampler" in out0
    # ddplug.torch reports through the "ddplug" logger (rank 0 only), as the strategies do
    lines = results[0]["reports"]
    assert any(line.startswith("ddplug: stream 'val': owner user (auto: sampler DistributedSampler") for line in lines)
    assert any("verdict: PASS" in line for line in lines), lines
    assert all(r["reports"] == [] for r in results[1:])
    # ddplug.torch.save / load: rank 0 wrote both, every rank read them; loading the
    # older one is named (once, on rank 0), the newer one is not
    for r in results:
        assert r["ckpt"] == [["ddplug", "model"], 1, 2, 1]
    older = [line for line in lines if "resuming from" in line]
    assert len(older) == 1, older
    assert (f"WARNING: resuming from {out / 'ckpt0.pt'} (save 1), but {out / 'ckpt1.pt'} (save 2, epoch 1)"
            " was saved after it") in older[0]
    assert json.loads((out / "ddplug-checkpoints.json").read_text())["save"] == 2


@pytest.mark.parametrize("world", worlds(2, 3))
def test_lightning_ddp_strategy_torchmetrics_and_webdataset(out: Path, world: int) -> None:
    """Lightning's own DDPStrategy(process_group_backend="ddplug") trains to the
    same weights as with gloo; under strategy="ddplug", WebDataset's real
    split_by_node (reading torch.distributed: Lightning's launcher sets no RANK)
    gives every rank its own shards, and a torchmetrics BinaryAccuracy logged in
    validation equals the single-process value on every rank."""
    import torch
    import webdataset as wds

    shards = out / "shards"
    shards.mkdir()
    g = torch.Generator().manual_seed(3)
    keys = []
    for s in range(6):
        with wds.TarWriter(str(shards / f"shard-{s:02d}.tar")) as sink:
            for i in range(4):
                x = torch.randn(8, generator=g)
                keys.append(f"s{s}_{i}")
                sink.write({"__key__": keys[-1], "x.pth": x, "y.pth": torch.tensor(float(x.sum() > 0))})
    run = run_script("lit_backend.py", "--devices", str(world), "--shards", str(shards), out_dir=out).ok()
    results = run.ranks(world)
    for rank, r in enumerate(results):
        (gloo_params, gloo), (mine_params, mine) = r["gloo"], r["ddplug_backend"]
        assert gloo["backend"] == "gloo" and mine["backend"] == "ddplug" and mine["group"] == "ProcessGroupDdplug"
        assert mine["seen"] == gloo["seen"]
        for a, b in zip(gloo_params, mine_params):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
        assert r["torch_distributed"] == [True, "ddplug", rank, world]
        assert r["val_acc"] == pytest.approx(r["val_acc_single_process"], abs=1e-6)
        assert r["after_close"] is False, "the strategy's close() destroyed its process group"
        assert r["streams"]["val"]["reports"][0]["verdict"] == "PASS"
    per_rank = [set(r["keys"]) for r in results]
    assert set().union(*per_rank) == set(keys) and sum(map(len, per_rank)) == len(keys), "split once, by shard"
    assert "stream 'train': owner user (auto: an IterableDataset" in run.output
    assert f"torch.distributed says rank 0 of {world} (backend ddplug)" in run.output


def test_a_sampler_that_asks_torch_distributed_for_ranks_just_works(out: Path) -> None:
    """The sampler of test_lightning.py's refusal case, with torch.distributed
    initialised by the strategy: it gets its ranks there, is recognised as
    rank-aware (owner user) and splits once, audited."""
    world = 2
    run = run_script("lit_run.py", "--scenario", "distsampler", "--devices", str(world), "--epochs", "1",
                     out_dir=out).ok()
    results = run.ranks(world)
    for r in results:
        train = r["streams"]["train"]
        assert train["owner"] == "user" and "DDPOnlyBucketSampler: exposes num_replicas=2" in train["line"]
        assert train["reports"][0]["verdict"] == "PASS"
    assert sorted(i for r in results for step in r["seen"]["0"] for i in step) == list(range(96))


# ---- failures through torch.distributed --------------------------------------------------
def test_a_killed_rank_fails_every_survivors_pending_work(out: Path) -> None:
    """Rank 1 of 3 is SIGKILLed while the others' collectives are pending: each
    survivor's Work.wait() raises PeerLost (a DistBackendError) naming rank 1 —
    found by the death, not by a timeout — and so does its future."""
    world = 3
    codes, outs = run_ranks("torch_run.py", world, "failure", "--kind", "kill", out_dir=out)
    results = ranks(out, world)
    assert codes[1] == -9
    for rank in (0, 2):
        all_checks_pass([results[rank]], outs, errors_expected=True)
        assert results[rank]["type"] == "PeerLost"
        # the runtime's sentence, or the cpu plugin's own when its liveness watch saw the
        # death first and the store's account came later than the wait for it (a loaded machine)
        err = results[rank]["error"]
        assert "rank 1 (pid" in err and ("exited or was killed" in err or "exited while the group was running" in err)
        print(f"rank {rank}: raised {results[rank]['raised_after_s']:.3f} s after rank 1 was killed")


@pytest.mark.parametrize("kind", ["raise", "prepare"])
def test_an_exception_on_one_rank_fails_the_others_barrier(out: Path, kind: str) -> None:
    """raise: rank 1 raises (uncaught) while the others wait in dist.barrier();
    prepare: SpeechBrain's run_on_main, whose preparation fails on the main
    process. The others' barrier raises Aborted carrying that rank's error
    instead of hanging."""
    world = 2
    codes, outs = run_ranks("torch_run.py", world, "failure", "--kind", kind, out_dir=out)
    results = ranks(out, world)
    victim = 1 if kind == "raise" else 0
    error = ("RuntimeError: CUDA out of memory on rank 1 (test)" if kind == "raise"
             else "FileNotFoundError: /nfs/corpus/train.csv: no such file (test)")
    assert codes[victim] != 0
    assert error.split(": ", 1)[1] in results[victim]["error"]
    other = results[1 - victim]
    all_checks_pass([other], outs, errors_expected=True)
    assert codes[1 - victim] == 0
    assert other["type"] == "Aborted"
    assert f"rank {victim} aborted the run: rank {victim}: {error}" in other["error"]


def test_a_zero_timeout_times_out_at_once_and_says_where_timeouts_come_from(out: Path) -> None:
    """barrier(timeout=timedelta(0)) on rank 0 (0 is 0, not "the default"): it
    times out at once, ending the run; rank 1, waiting to receive from rank 0,
    gets rank 0's reason. Both messages say "timed out" and name timeout= and
    timeouts.collective_s once."""
    codes, outs = run_ranks("torch_run.py", 2, "failure", "--kind", "timeout0", out_dir=out)
    results = ranks(out, 2)
    all_checks_pass(results, outs, errors_expected=True)
    assert results[0]["type"] == "Timeout", results[0]


def test_torchs_timeout_semantics_for_the_group() -> None:
    """The group's collective timeout: the user's timeout= (0 is 0: the
    shortest, 1 ms); without one, the config's timeouts.collective_s where the
    config sets it, else torch's default for CPU backends (30 minutes), not
    ddplug's own default."""
    import datetime

    from torch.distributed.constants import default_pg_timeout

    import ddplug
    from ddplug.distributed.create import _collective_timeout_s

    plain = ddplug.Config.from_dict({"plugin": "cpu"})
    configured = ddplug.Config.from_dict({"plugin": "cpu", "timeouts": {"collective_s": 42}})
    try:
        assert _collective_timeout_s(default_pg_timeout, plain) == 1800.0
        assert _collective_timeout_s(None, plain) == 1800.0
        assert _collective_timeout_s(default_pg_timeout, configured) is None  # the config's 42 s
        assert _collective_timeout_s(datetime.timedelta(seconds=5), configured) == 5.0
        assert _collective_timeout_s(datetime.timedelta(0), plain) == 0.001
    finally:
        plain.close()
        configured.close()


def test_the_torch_autoload_entry_point_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch turns an exception of a torch.backends entry point into a failing
    `import torch`; ddplug's warns instead (the entry point itself is tested
    where it exists: the installed wheel, tests/wheel/test-wheel.sh)."""
    import ddplug._autoload as autoload

    monkeypatch.setitem(sys.modules, "ddplug", None)  # `import ddplug` now fails
    with pytest.warns(RuntimeWarning, match="could not register the torch.distributed backend"):
        autoload.autoload()


def test_the_plain_pytorch_example_runs(out: Path) -> None:
    """examples/pytorch/train.py, as the README shows it (torchrun-style ranks)."""
    from conftest import ROOT

    example = str(ROOT / "examples" / "pytorch" / "train.py")  # an absolute path: run_ranks takes it as it is
    codes, outs = run_ranks(example, 2, "--epochs", "2", "--data", str(out / "data.pt"), out_dir=out)
    assert codes == [0, 0], "\n".join(outs)[-6000:]
    assert "stream 'train': owner plugin" in outs[0] and "verdict: PASS" in outs[0]
    assert "epoch 1: validation accuracy" in outs[0] and "100 samples over 2 ranks" in outs[0]


def test_errors_are_torch_types_and_ddplug_classes() -> None:
    """What joining or a collective raises: torch's exception type and ddplug's
    class at once, with ddplug's sentence (in-process: no run needed)."""
    import torch.distributed as dist

    import ddplug
    from ddplug.distributed import errors as E
    from ddplug.errors import make, status_code

    lost = E.backend_error(make(status_code("PEER_LOST"), "rank 1 (pid 7) exited or was killed", "rank 0"))
    assert isinstance(lost, dist.DistBackendError) and isinstance(lost, ddplug.PeerLost)
    assert str(lost) == "rank 0: rank 1 (pid 7) exited or was killed [PEER_LOST]"
    timeout = E.backend_error(make(status_code("TIMEOUT"), "allreduce not complete", "rank 1"))
    assert isinstance(timeout, dist.DistBackendError) and isinstance(timeout, TimeoutError)
    never = E.open_error(make(status_code("TIMEOUT"), "ranks 2, 3 never joined after 30.0 s", "rank 0"))
    assert isinstance(never, dist.DistStoreError) and isinstance(never, ddplug.Timeout)
    gone = E.open_error(make(status_code("PEER_LOST"), "rank 0 exited", "rank 1"))
    assert isinstance(gone, dist.DistNetworkError) and isinstance(gone, ddplug.PeerLost)
    bad = E.open_error(make(status_code("CONFIG"), "sampler.shufle: unknown key", ""))
    assert type(bad) is ddplug.ConfigError  # a ValueError, as torch raises for bad arguments
    assert type(E.backend_error(make(status_code("ABORTED"), "x", ""))) is type(
        E.backend_error(make(status_code("ABORTED"), "y", ""))), "one class per pair"


def test_the_native_fast_path_answers_as_the_python_methods(out: Path) -> None:
    """ddplug_torchfast (hosts/python/native) on 3 ranks, beside the group's own
    Python methods: every dtype x reduction, broadcast, send/recv with tags,
    any source, polling, futures, a wait's own timeout, a receive dropped while
    pending, refusals (before and after the start) and a closed group give
    equal results and equal errors;
    the common all_reduce runs no Python of ddplug's."""
    codes, outs = run_ranks("torch_run.py", 3, "native", out_dir=out)
    results = ranks(out, 3)
    all_checks_pass(results, outs)
    assert codes == [0] * 3, "\n".join(outs)[-6000:]
    assert len(results[0]["checks"]) >= 16 and len(results[1]["checks"]) >= 19


def test_the_native_fast_path_is_used_only_with_its_own_torch(tmp_path: Path) -> None:
    """Built for another torch (its version stamp), or DDPLUG_TORCH_NATIVE=0:
    the Python methods serve every call, and native.status() says why."""
    import os
    import shutil

    build = Path(os.environ["DDPLUG_BUILD_DIR"])
    lib = tmp_path / "lib"
    lib.mkdir()
    for f in (build / "lib").iterdir():
        if f.name.startswith(("libddplug", "ddplug_torchfast")):
            shutil.copy2(f, lib / f.name, follow_symlinks=True)
    assert list(lib.glob("ddplug_torchfast*.so")), "make build builds the native fast path"
    (lib / "ddplug_torchfast.torch-version").write_text("2.0.0\n")
    code = "from ddplug.distributed import native; print(native.status())"
    env = {**os.environ, "PYTHONPATH": str(SRC), "DDPLUG_BUILD_DIR": str(tmp_path)}
    env.pop("DDPLUG_LIBRARY", None)
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "was built for torch 2.0.0, this is torch" in other.stdout, other.stdout + other.stderr
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "DDPLUG_TORCH_NATIVE": "0"})
    assert off.stdout.strip() == "off (DDPLUG_TORCH_NATIVE=0)", off.stdout + off.stderr
