"""torch.distributed, ddplug.torch and Lightning in jobs an MPI launcher
starts (mpirun.openmpi, mpiexec.hydra), with no MASTER_ADDR, no RANK and no
`ddplug run`: the world and rank 0's store address come through the mpi
plugin's bootstrap. Skipped where the family's backend or launcher is
missing. The jobs set Open MPI's run-as-root variables for themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, Run

BUILD = Path(os.environ["DDPLUG_BUILD_DIR"])
FAMILIES = {
    "openmpi": ["mpirun.openmpi", "--oversubscribe"],
    "mpich": ["mpiexec.hydra"],
}


def launcher(family: str) -> list:
    if not (BUILD / "lib" / f"libddplug-mpi-{family}.so").exists():
        pytest.skip(f"the mpi plugin's {family} backend is not built")
    cmd = FAMILIES[family]
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not installed")
    return cmd


def mpirun(family: str, n: int, what: str, out_dir: Path, timeout: float = 300,
           hide_mpi4py: bool = False) -> Run:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if hide_mpi4py:  # a package that fails to import, first on the path: as if not installed
        shadow = out_dir / "no-mpi4py" / "mpi4py"
        shadow.mkdir(parents=True, exist_ok=True)
        (shadow / "__init__.py").write_text('raise ImportError("mpi4py hidden by the test")\n')
        env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), env.get("PYTHONPATH", "")])
    # The config names no plugin: under an MPI launcher that is "mpi".
    env.update(DDPLUG_CONFIG=json.dumps({"rendezvous": {"timeout_s": 120}}), DDPLUG_TEST_OUT=str(out_dir),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([*launcher(family), "-n", str(n), sys.executable, str(SCRIPTS / "mpi_run.py"), what],
                          env=env, cwd=str(out_dir), capture_output=True, text=True, timeout=timeout)
    return Run(proc, out_dir)


@pytest.mark.parametrize("family", ["openmpi", "mpich"])
def test_init_process_group_under_mpirun_needs_nothing_else(family: str, out: Path) -> None:
    run = mpirun(family, 2, "torch-dist", out).ok()
    for r, res in enumerate(run.ranks(2)):
        assert res["rank"] == r and res["world"] == 2
        assert res["sum"] == [3.0, 3.0, 3.0, 3.0]
        assert res["obj"] == "from rank 0"
        assert res["gathered"] == [0.0, 1.0]
        assert res["plugin"] == "mpi"


def test_ddplug_torch_under_mpirun(out: Path) -> None:
    run = mpirun("mpich", 2, "ddplug-torch", out).ok()
    for r, res in enumerate(run.ranks(2)):
        assert (res["rank"], res["world"], res["plugin"]) == (r, 2, "mpi")
        assert res["sum"] == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("mpi4py", ["without mpi4py", "with mpi4py"])
def test_lightning_trainer_under_mpirun(mpi4py: str, out: Path) -> None:
    hide = mpi4py == "without mpi4py"
    if not hide:
        pytest.importorskip("mpi4py")
    run = mpirun("openmpi", 2, "lightning", out, hide_mpi4py=hide).ok()
    ranks = run.ranks(2)
    for r, res in enumerate(ranks):
        assert (res["rank"], res["world"], res["plugin"]) == (r, 2, "mpi"), res
        # Lightning's own MPIEnvironment needs mpi4py; the strategy's does not.
        assert res["env"] == ("MPILauncherEnvironment" if hide else "MPIEnvironment"), res
        assert res["steps"] == 8  # 64 samples / 2 ranks / batch 4: split once
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_mpi4py_initialised_first_is_shared_and_finalized_by_mpi4py(out: Path) -> None:
    pytest.importorskip("mpi4py")
    run = mpirun("openmpi", 2, "mpi4py", out).ok()  # exit 0: MPI finalized once, by mpi4py
    for r, res in enumerate(run.ranks(2)):
        assert (res["rank"], res["mpi4py_rank"], res["plugin"]) == (r, r, "mpi")
        assert res["sum"] == [3.0, 3.0] and res["mpi4py_sum"] == 3 and res["mpi4py_after"] == 2
        assert res["finalized_by_ddplug"] is False
