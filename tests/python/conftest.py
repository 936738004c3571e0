"""pytest setup for the Python host adapter tests (real Lightning, real processes).

The package under test is imported from this checkout (hosts/python), also
in the subprocesses the tests and Lightning's launcher start (PYTHONPATH), and the
library from the build tree (DDPLUG_BUILD_DIR, set by tests/run-all.sh; default
<repo>/build). Plugins are found beside libddplug.so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from free_port import free_port  # noqa: F401 (the tests import it from here)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "hosts" / "python"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

sys.path.insert(0, str(SRC))
sys.path.insert(0, str(SCRIPTS))
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), str(SCRIPTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("DDPLUG_BUILD_DIR", str(ROOT / "build"))
os.environ.setdefault("DDPLUG_LOG", "warn")
# Small, deterministic CPU runs: one thread per rank, no GPU probing noise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("PYTHONWARNINGS", "ignore")


# make test runs each test that is meant for several world sizes at one of
# them (chosen per test, so 2 and 3 ranks are both covered across the suite and
# make test stays inside CI's time); DDPLUG_TESTS=full (make test-full) runs
# every size of every such test.
FULL = os.environ.get("DDPLUG_TESTS", "") == "full"


def worlds(lean: int, *more: int) -> list:
    """The world sizes a test is parametrized over: ``lean`` in make test,
    ``lean`` and ``more`` with DDPLUG_TESTS=full."""
    return sorted({lean, *more}) if FULL else [lean]


def variants(lean, *more) -> list:
    """Like worlds, for any parameter: ``lean`` in make test, every one with
    DDPLUG_TESTS=full. For variants another test covers at a lower layer in
    make test (e.g. both run-once scopes in test_runonce.py)."""
    return [lean, *more] if FULL else [lean]


# The plugin the tests run on: "cpu" (CPU, shared memory) unless told otherwise.
TEST_PLUGIN = os.environ.get("DDPLUG_TEST_PLUGIN", "cpu")
os.environ.setdefault("DDPLUG_CONFIG", json.dumps({"plugin": TEST_PLUGIN, "rendezvous": {"timeout_s": 60}}))


def config(**sections: dict) -> str:
    """A test config as JSON text: the test plugin, short rendezvous timeout,
    plus the given sections."""
    data: dict = {"plugin": TEST_PLUGIN, "rendezvous": {"timeout_s": 60}}
    data.update(sections)
    return json.dumps(data)


class Run:
    """The outcome of one script run: return code, output, per-rank JSON results."""

    def __init__(self, proc: subprocess.CompletedProcess, out_dir: Path) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.out_dir = out_dir

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def rank(self, r: int) -> dict:
        path = self.out_dir / f"rank{r}.json"
        if not path.exists():
            raise AssertionError(f"rank {r} wrote no result ({path}); output:\n{self.output[-6000:]}")
        return json.loads(path.read_text())

    def ranks(self, n: int) -> list:
        return [self.rank(r) for r in range(n)]

    def ok(self) -> "Run":
        assert self.returncode == 0, f"exit {self.returncode}; output:\n{self.output[-8000:]}"
        return self


def run_script(script: str, *args: str, out_dir: Path, env: dict | None = None, timeout: float = 240) -> Run:
    """Run tests/python/scripts/<script> with args; each rank writes
    <out_dir>/rank<r>.json. Lightning's launcher (devices=N) starts the other ranks."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env["DDPLUG_TEST_OUT"] = str(out_dir)
    full_env.setdefault("MASTER_ADDR", "127.0.0.1")
    full_env["MASTER_PORT"] = str(free_port())
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        env=full_env, cwd=str(out_dir), capture_output=True, text=True, timeout=timeout,
    )
    return Run(proc, out_dir)


def assert_aborted_by(run: Run, failing: int, world: int = 2) -> None:
    """A run in which rank ``failing`` raised the scripts' test RuntimeError: it
    failed, that rank reports its own error, and every other rank stopped with
    Aborted carrying it (not a timeout)."""
    assert run.returncode != 0
    ranks = run.ranks(world)
    assert ranks[failing]["type"] == "RuntimeError", ranks[failing]
    for other in ranks[:failing] + ranks[failing + 1:]:
        assert other["type"] == "Aborted", other
        assert (f"rank {failing} aborted the run: rank {failing}: RuntimeError: CUDA out of memory on rank"
                f" {failing}") in other["error"]


def run_ranks(script: str, world: int, *args: str, out_dir: Path, env: dict | None = None,
              timeout: float = 120, per_rank_env: dict | None = None) -> tuple:
    """Start ``world`` processes with a torchrun-style environment (RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT); returns
    (returncodes, outputs, Run-like accessor)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for r in range(world):
        e = dict(os.environ)
        e.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                  "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(port), "DDPLUG_TEST_OUT": str(out_dir)})
        if env:
            e.update({k: str(v) for k, v in env.items()})
        if per_rank_env and r in per_rank_env:
            e.update({k: str(v) for k, v in per_rank_env[r].items()})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / script), *args], env=e,
                                      cwd=str(out_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n[test harness: killed after timeout]"
        outs.append(out)
        codes.append(p.returncode)
    return codes, outs


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path


def lib_available() -> bool:
    try:
        import ddplug._c._capi as L

        L.load()
        return True
    except Exception:
        return False
