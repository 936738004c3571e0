"""The Lightning Trainer with the ddplug strategy under the REAL torchrun.

torchrun (torch >= 2.4) serves its agent's TCPStore on MASTER_PORT and tells
the workers so (TORCHELASTIC_USE_AGENT_STORE=True): ddplug's rank 0 cannot
listen there, so it serves on a free port and publishes it in torchrun's
store. These runs go through torch's own elastic agent, rendezvous and
TorchElasticEnvironment, one node and two simulated nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import SCRIPTS, free_port

N = 96  # lit_run.py's default dataset size


def torchrun(out: Path, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    e = dict(os.environ)
    e["DDPLUG_TEST_OUT"] = str(out)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    if env:
        e.update(env)
    log = open(out / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=e, cwd=str(out),
                            stdout=log, stderr=subprocess.STDOUT)


def finish(out: Path, procs: dict) -> None:
    for name, p in procs.items():
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "killed after 240 s"
        assert rc == 0, f"torchrun {name} exited {rc}:\n" + (out / f"{name}.log").read_text()[-6000:]


def seen(r: dict) -> list:
    return [i for batch in r["seen"]["0"] for i in batch]


def test_trainer_under_torchrun_standalone(out: Path) -> None:
    p = torchrun(out, "standalone", "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "lit_run.py"),
                 "--scenario", "plain", "--devices", "2", "--epochs", "1")
    finish(out, {"standalone": p})
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["lightning_world"]["environment"] == "TorchElasticEnvironment"
        assert r["ddplug_world"]["world_size"] == 2 and r["ddplug_world"]["rank"] == r["rank"]
        assert r["streams"]["train"]["owner"] == "plugin"
    assert sorted(seen(ranks[0]) + seen(ranks[1])) == list(range(N)), "each sample exactly once"


def test_trainer_under_torchrun_on_two_nodes(out: Path) -> None:
    """Classic multi-node form: one torchrun per node with --master-addr/port."""
    port = str(free_port())
    procs = {}
    for node in range(2):
        procs[f"node{node}"] = torchrun(
            out, f"node{node}", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", port, str(SCRIPTS / "lit_run.py"),
            "--scenario", "plain", "--devices", "2", "--nodes", "2", "--epochs", "1",
            env={"DDPLUG_HOST_ID": f"node{node}"})
    finish(out, procs)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    for r in ranks:
        assert r["ddplug_world"] == {"rank": r["rank"], "world_size": 4, "local_rank": r["rank"] % 2,
                                     "node_rank": r["rank"] // 2, "num_nodes": 2}
        assert r["sampler_kwargs"] == {"num_replicas": 4, "rank": r["rank"]}
    assert sorted(i for r in ranks for i in seen(r)) == list(range(N)), "each sample exactly once"
