"""Elastic runs end to end: a rank SIGKILLed at a step drawn from a printed seed
(random, but the outcome may not depend on it: every step must pass), and the
epoch still trains every sample exactly once — counted from the record files the
trainers write (tests/python/elastic_records.py), independently of the audit,
which must PASS too.

- restart: ``ddplug run --max-restarts 1 --shrink-on-restart`` (3->2, 2->1), and a
  second launch on more ranks (2->3), for the C trainer, the Lightning Trainer
  (``ckpt_path="last"``) and ddplug.torch (``dt.state_dict()`` in the checkpoint);
- in place: ``elastic.on_peer_lost = "shrink"``: the C trainer and ddplug.torch
  through ``ddplug run --tolerate-loss``, the Lightning Trainer and a Fabric loop
  (``strategy.step``) under Lightning's own launchers (devices=N), 3->2 and 4->3,
  killed after a barrier or inside an allreduce.

``make test`` runs one case of each kind (the C trainer's, and for the Python
trainers restart 3->2 and 2->3 under the Trainer, 2->1 under ddplug.torch, in place
3->2 under the Trainer, 4->3 under ddplug.torch, 3->2 inside an allreduce under
Fabric); make test-full (DDPLUG_TESTS=full) or DDPLUG_ELASTIC_FULL=1 runs every pair. The soak (off by default:
DDPLUG_ELASTIC_SOAK=<trials>, or ``make soak``) runs random trials — trainer (C,
ddplug.torch, Lightning, Fabric in place only), world size,
victim, step, kill point, mode — and prints the repeats and skips it counted.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conftest
from conftest import ROOT, SCRIPTS, TEST_PLUGIN, free_port
from elastic_records import count

BUILD = Path(os.environ.get("DDPLUG_BUILD_DIR", ROOT / "build"))
DDPLUG = BUILD / "bin" / "ddplug"
C_TRAINER = BUILD / "bin" / "ddplug-elastic-trainer"
N, B = 301, 4

pytestmark = pytest.mark.skipif(TEST_PLUGIN != "cpu", reason="the elastic tests run on the cpu plugin")


def seed_of(name: str) -> int:
    seed = int(os.environ.get("DDPLUG_TEST_SEED", str(int(time.time() * 1000) % 1000003)))
    print(f"{name}: seed {seed} (DDPLUG_TEST_SEED={seed} repeats it)")
    return seed


def steps_of(world: int) -> int:
    return (N + world * B - 1) // (world * B)


def run_c(out: Path, world: int, mode: str, victim: int, step: int, kill: str = "barrier") -> subprocess.CompletedProcess:
    cfg = {"plugin": "cpu", "rendezvous": {"timeout_s": 60}, "timeouts": {"collective_s": 60},
           "data_split": {"audit": "every_epoch"}}
    if mode == "inplace":
        cfg["elastic"] = {"on_peer_lost": "shrink"}
    env = dict(os.environ, DDPLUG_CONFIG=json.dumps(cfg), ELASTIC_DIR=str(out), ELASTIC_N=str(N),
               ELASTIC_B=str(B), ELASTIC_VICTIM=str(victim), ELASTIC_STEP=str(step), ELASTIC_KILL=kill,
               ELASTIC_MODE=mode)
    cmd = [str(DDPLUG), "run", "-n", str(world), "--grace", "20"]
    if mode == "restart":
        cmd += ["--max-restarts", "1", "--shrink-on-restart"]
    else:
        cmd += ["--tolerate-loss"]
    return subprocess.run(cmd + ["--", str(C_TRAINER)], env=env, capture_output=True, text=True, timeout=240)


def check_run(proc: subprocess.CompletedProcess, out: Path, what: str, expect_ok: bool = True):
    text = proc.stdout + proc.stderr
    if expect_ok:
        assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{text[-6000:]}"
    outcome = count(out, N)
    outcome.check(f"{what}\n{text[-3000:]}")
    return outcome


def test_c_trainer_restarts_three_ranks_on_two_exactly_once(tmp_path: Path) -> None:
    seed = seed_of("restart 3->2")
    step = seed % steps_of(3)
    victim = seed % 3  # rank 0 too: the restart needs no survivor's store
    proc = run_c(tmp_path, 3, "restart", victim, step)
    outcome = check_run(proc, tmp_path, f"restart 3->2, rank {victim} killed at step {step}")
    assert "restarting the run (restart 1 of 1) with 2 ranks" in proc.stderr
    line = next(iter(outcome.done.values()))
    if step > 0:
        assert "resumed at step" in line and "on 2 ranks, saved on 3" in line, line


def test_c_trainer_shrinks_four_ranks_to_three_in_place_exactly_once(tmp_path: Path) -> None:
    seed = seed_of("in place 4->3")
    step = seed % steps_of(4)
    victim = 1 + seed % 3  # rank 0 serves the store
    proc = run_c(tmp_path, 4, "inplace", victim, step, kill="inside")
    assert "was lost (signal 9, Killed); the others go on" in proc.stderr
    outcome = check_run(proc, tmp_path, f"in place 4->3, rank {victim} killed inside step {step}")
    assert len(outcome.done) == 3
    assert "membership: ranks 0-3 until step" in next(iter(outcome.done.values()))


# ---- the Python trainers (tests/python/scripts/elastic_lit.py, elastic_torch.py) ----
PY_N, PY_B = 64, 4
PY_SCRIPTS = {"lightning": SCRIPTS / "elastic_lit.py", "torch": SCRIPTS / "elastic_torch.py",
              "fabric": SCRIPTS / "elastic_fabric.py"}


def run_py(out: Path, trainer: str, world: int, mode: str, victim: int, step: int, kill: str = "barrier",
           restarts: int = 1, attempt: int | None = None, launcher: str = "ddplug") -> subprocess.CompletedProcess:
    env = dict(os.environ, ELASTIC_DIR=str(out), ELASTIC_N=str(PY_N), ELASTIC_B=str(PY_B),
               ELASTIC_VICTIM=str(victim), ELASTIC_STEP=str(step), ELASTIC_KILL=kill, ELASTIC_MODE=mode,
               DDPLUG_TEST_OUT=str(out))
    env.pop("DDPLUG_CONFIG", None)
    if attempt is not None:
        env["ELASTIC_ATTEMPT"] = str(attempt)
    script = str(PY_SCRIPTS[trainer])
    if launcher == "lightning":  # Lightning's (or Fabric's) own launcher starts ranks 1..N-1
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"):
            env.pop(k, None)
        cmd = [sys.executable, script, "--devices", str(world)]
    else:
        cmd = [str(DDPLUG), "run", "-n", str(world), "--grace", "60"]
        if mode == "restart" and restarts:
            cmd += ["--max-restarts", str(restarts), "--shrink-on-restart"]
        elif mode == "inplace":
            cmd += ["--tolerate-loss"]
        cmd += ["--", sys.executable, script]
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, env=env, cwd=str(out), capture_output=True, text=True, timeout=400)


def check_py(proc: subprocess.CompletedProcess, out: Path, what: str, ranks_done: int):
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{text[-8000:]}"
    outcome = count(out, PY_N)
    outcome.check(f"{what}\n{text[-3000:]}")
    assert len(outcome.done) == ranks_done, f"{what}: {len(outcome.done)} ranks finished\n{text[-3000:]}"
    return outcome, text


FULL = conftest.FULL or bool(os.environ.get("DDPLUG_ELASTIC_FULL"))
_LEAN = {("lightning", 3, 2), ("lightning", 2, 3), ("torch", 2, 1), ("lightning", 3, "barrier"),
         ("torch", 4, "inside"), ("fabric", 3, "inside")}


def _lean(trainer: str, a: object, b: object) -> None:
    if not FULL and (trainer, a, b) not in _LEAN:
        pytest.skip("one case of each kind in make test; make test-full (or DDPLUG_ELASTIC_FULL=1) runs every pair")


@pytest.mark.parametrize("trainer", ["lightning", "torch"])
@pytest.mark.parametrize("before,after", [(3, 2), (2, 1), (2, 3)])
def test_restart_on_another_world_size_trains_every_sample_once(tmp_path: Path, trainer: str, before: int,
                                                                 after: int) -> None:
    _lean(trainer, before, after)
    seed = seed_of(f"{trainer} restart {before}->{after}")
    steps = (PY_N + before * PY_B - 1) // (before * PY_B)
    victim, step = seed % before, seed % steps
    what = f"{trainer}: restart {before}->{after}, rank {victim} killed at step {step}"
    if after == before - 1:
        proc = run_py(tmp_path, trainer, before, "restart", victim, step)
        _, text = check_py(proc, tmp_path, what, after)
        assert f"restart 1 of 1) with {after} rank" in text, text[-3000:]
    else:  # more ranks: the job is launched again on a larger world
        first = run_py(tmp_path, trainer, before, "restart", victim, step, restarts=0)
        assert first.returncode != 0, f"{what}: the first launch did not fail"
        proc = run_py(tmp_path, trainer, after, "restart", -1, -1, restarts=0, attempt=1)
        check_py(proc, tmp_path, what, after)
    outcome = count(tmp_path, PY_N)
    line = next(iter(outcome.done.values()))
    if step > 0:
        assert "resumed at step" in line, line


@pytest.mark.parametrize("trainer", ["lightning", "torch", "fabric"])
@pytest.mark.parametrize("world,kill", [(3, "barrier"), (4, "inside"), (3, "inside")])
def test_in_place_shrink_trains_every_sample_once(tmp_path: Path, trainer: str, world: int, kill: str) -> None:
    _lean(trainer, world, kill)
    seed = seed_of(f"{trainer} in place {world}->{world - 1}")
    steps = (PY_N + world * PY_B - 1) // (world * PY_B)
    victim, step = 1 + seed % (world - 1), seed % steps  # rank 0 serves the store
    what = f"{trainer}: in place {world}->{world - 1}, rank {victim} killed at step {step} ({kill})"
    launcher = "ddplug" if trainer == "torch" else "lightning"
    proc = run_py(tmp_path, trainer, world, "inplace", victim, step, kill=kill, launcher=launcher)
    outcome, text = check_py(proc, tmp_path, what, world - 1)
    assert "remain (generation 1); stream 'train':" in text, text[-4000:]
    if step < steps - 1:  # a loss in the last step comes after the audit (it ends at the last draw)
        assert "membership: ranks " in next(iter(outcome.done.values()))


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)


def test_torchrun_restarts_on_the_nodes_left(tmp_path: Path) -> None:
    """torchrun --nnodes=1:2 --max-restarts=1, one agent per simulated node and a
    c10d rendezvous: node 1's rank kills its agent and itself (a lost node); the other
    agent restarts its worker on a world of one, which resumes from ddplug.torch's
    checkpoint."""
    seed = seed_of("torchrun 2->1")
    steps = (PY_N + 2 * PY_B - 1) // (2 * PY_B)
    step = seed % steps
    port = free_port()
    env = dict(os.environ, ELASTIC_DIR=str(tmp_path), ELASTIC_N=str(PY_N), ELASTIC_B=str(PY_B),
               ELASTIC_VICTIM="1", ELASTIC_STEP=str(step), ELASTIC_KILL="barrier", ELASTIC_MODE="restart",
               ELASTIC_KILL_PARENT="1", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "DDPLUG_CONFIG"):
        env.pop(k, None)
    args = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
            "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=ddplug-elastic", "--rdzv-conf=join_timeout=300,last_call_timeout=15,read_timeout=300",
            "--monitor-interval=0.5", str(PY_SCRIPTS["torch"])]
    agents = []
    for node in range(2):
        log = open(tmp_path / f"agent{node}.log", "w")
        # node 0's agent hosts the c10d rendezvous store (it binds the endpoint
        # first); node 1's worker is the victim, so the store outlives the loss
        node_env = dict(env, DDPLUG_HOST_ID=f"node{node}", ELASTIC_VICTIM="-1")
        if node == 1:
            node_env["ELASTIC_VICTIM_HERE"] = "1"
        agents.append((subprocess.Popen(args, env=node_env, cwd=str(tmp_path), stdout=log,
                                        stderr=subprocess.STDOUT), log))
        if node == 0:
            _wait_listening(port, agents[0][0])
    codes = []
    for p, log in agents:
        try:
            codes.append(p.wait(timeout=400))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
        log.close()
    text = "".join((tmp_path / f"agent{n}.log").read_text()[-4000:] for n in range(2))
    assert sorted(codes) == [-9, 0], f"agents exited {codes}\n{text}"
    outcome = count(tmp_path, PY_N)
    outcome.check(f"torchrun 2->1, node 1 lost at step {step}\n{text}")
    assert len(outcome.done) == 1, text
    if step > 0:
        assert "on 1 rank, saved on 2" in next(iter(outcome.done.values()))


@pytest.mark.skipif(not os.environ.get("DDPLUG_ELASTIC_SOAK"), reason="the soak runs with DDPLUG_ELASTIC_SOAK=<trials>")
def test_soak(tmp_path: Path) -> None:
    trials = int(os.environ["DDPLUG_ELASTIC_SOAK"])
    trainers = os.environ.get("DDPLUG_ELASTIC_SOAK_TRAINERS", "c,torch,lightning,fabric").split(",")
    seed = seed_of("soak")
    rng = random.Random(seed)
    totals = {"trials": 0, "repeats_beyond_padding": 0, "skips": 0, "by_trainer": {}}
    failures = []
    for t in range(trials):
        trainer = rng.choice(trainers)
        world = rng.randint(2, 4)
        mode = rng.choice(["inplace", "restart"] if trainer != "fabric" else ["inplace"])
        victim = rng.randrange(1 if mode == "inplace" else 0, world)
        kill = rng.choice(["barrier", "inside"])
        out = tmp_path / f"trial{t}"
        out.mkdir()
        if trainer == "c":
            n, step = N, rng.randrange(steps_of(world))
            proc = run_c(out, world, mode, victim, step, kill)
        else:
            n, step = PY_N, rng.randrange((PY_N + world * PY_B - 1) // (world * PY_B))
            launcher = "lightning" if trainer in ("lightning", "fabric") and mode == "inplace" else "ddplug"
            proc = run_py(out, trainer, world, mode, victim, step, kill=kill, launcher=launcher)
        what = f"trial {t}: {trainer}, {world} ranks, {mode}, rank {victim} killed at step {step} ({kill})"
        print(what, flush=True)
        outcome = count(out, n)
        totals["trials"] += 1
        totals["by_trainer"][trainer] = totals["by_trainer"].get(trainer, 0) + 1
        totals["skips"] += outcome.skips
        totals["repeats_beyond_padding"] += max(0, outcome.repeats - outcome.padded - outcome.prior_padding)
        try:
            assert proc.returncode == 0, f"exit {proc.returncode}"
            outcome.check(what)
        except AssertionError as exc:
            failures.append(f"{what}: {exc}\n{(proc.stdout + proc.stderr)[-2000:]}")
    print(f"soak: {json.dumps(totals)}")
    assert not failures, "\n\n".join(failures)
