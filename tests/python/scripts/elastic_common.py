"""What the elastic test trainers share (elastic_lit.py, elastic_torch.py,
elastic_fabric.py): the
dataset (sample i carries its index), the model, the run's settings from the
environment, and the record file the tests count from (the same lines the C
trainer writes; tests/python/elastic_records.py reads them):

    $ELASTIC_DIR/rec-a<attempt>-p<identity>.txt
      resumed <steps> | drawn <step> <idx>... | commit <step> | lost <committed> | done <padded> <text>

Settings (environment): ELASTIC_DIR, ELASTIC_N, ELASTIC_B, ELASTIC_VICTIM (a
process's rank at open), ELASTIC_STEP (the epoch step it dies at, in the first
attempt), ELASTIC_KILL ("barrier": after a barrier in that step; "inside": during
backward, with its first gradient bucket's allreduce in flight), ELASTIC_MODE
("inplace" or "restart"), ELASTIC_ATTEMPT (else DDPLUG_RESTART_COUNT or torchrun's
TORCHELASTIC_RESTART_COUNT, else 0), ELASTIC_KILL_PARENT=1 (the victim kills its
launcher first: under torchrun, its agent — a lost node), ELASTIC_VICTIM_HERE=1 (this
process is the victim, whatever its rank).
"""

from __future__ import annotations

import json
import os
import signal

import torch
from torch.utils.data import Dataset

FEATURES = 8
N = int(os.environ.get("ELASTIC_N", "96"))
B = int(os.environ.get("ELASTIC_B", "4"))
VICTIM = int(os.environ.get("ELASTIC_VICTIM", "-1"))
STEP = int(os.environ.get("ELASTIC_STEP", "-1"))
KILL = os.environ.get("ELASTIC_KILL", "barrier")
MODE = os.environ.get("ELASTIC_MODE", "inplace")
ATTEMPT = int(os.environ.get("ELASTIC_ATTEMPT") or os.environ.get("DDPLUG_RESTART_COUNT")
              or os.environ.get("TORCHELASTIC_RESTART_COUNT") or "0")
DIR = os.environ.get("ELASTIC_DIR") or os.environ.get("DDPLUG_TEST_OUT", ".")


def config() -> str:
    return json.dumps({
        "plugin": "cpu", "rendezvous": {"timeout_s": 60}, "timeouts": {"collective_s": 60},
        "elastic": {"on_peer_lost": "shrink" if MODE == "inplace" else "stop"},
        "data_split": {"audit": "every_epoch"},
        # a small first bucket: the victim dies with that bucket's allreduce started
        "gradients": {"first_bucket_mb": 0.0001, "bucket_mb": 25},
    })


class Indexed(Dataset):
    """Sample i: (i, x_i, y_i), deterministic."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = self.x @ (torch.arange(1, FEATURES + 1, dtype=torch.float32) / FEATURES)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple:
        return i, self.x[i], self.y[i]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


class Record:
    """This process's record file (identity: its rank at open)."""

    def __init__(self, identity: int) -> None:
        os.makedirs(DIR, exist_ok=True)
        self.identity = identity
        self.f = open(os.path.join(DIR, f"rec-a{ATTEMPT}-p{identity}.txt"), "w", buffering=1)
        self.drawn: set = set()

    def line(self, text: str) -> None:
        self.f.write(text + "\n")

    def draw(self, step: int, idx: list) -> None:
        if step not in self.drawn:  # a redone step draws nothing new
            self.drawn.add(step)
            self.line(f"drawn {step} " + " ".join(str(int(i)) for i in idx))

    def close(self) -> None:
        self.f.close()


def is_victim(identity: int) -> bool:
    return identity == VICTIM or bool(os.environ.get("ELASTIC_VICTIM_HERE"))


def kill_now() -> None:
    if os.environ.get("ELASTIC_KILL_PARENT"):
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_inside_backward(mod: torch.nn.Module) -> None:
    """Die during backward once the last layer's gradient (the first bucket) has
    started its allreduce: a hook on the first layer's weight, whose gradient
    comes last."""
    first = next(mod.parameters())
    first.register_hook(lambda grad: kill_now())
