"""A 2-rank Lightning Trainer.fit with strategy="ddplug", run from an
installed wheel (tests/wheel/test-wheel.sh): no DDPLUG_* variable, no
checkout on the path. Every rank R writes wheel-fit-rankR.txt:

    wheel-fit rank R/W steps S lib PATH

and the run fails unless each rank took N/(B*W) steps: one layer split the
data, exactly once."""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl

import ddplug
import ddplug.lightning  # noqa: F401  (registers strategy="ddplug")

N, B, W = 64, 4, 2


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> int:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(N, 8), torch.randn(N, 1))
    trainer = pl.Trainer(accelerator="cpu", devices=W, strategy="ddplug", max_epochs=1,
                         logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(data, batch_size=B))
    steps = trainer.global_step
    with open(f"wheel-fit-rank{trainer.global_rank}.txt", "w") as f:
        f.write(f"wheel-fit rank {trainer.global_rank}/{trainer.world_size} steps {steps}"
                f" lib {ddplug.library_path()} package {os.path.dirname(ddplug.__file__)}\n")
    want = N // (B * W)
    if trainer.world_size != W or steps != want:
        print(f"wheel-fit: expected {W} ranks of {want} steps each", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
