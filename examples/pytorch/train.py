"""ddplug in a plain PyTorch training script (no Lightning): torch's own
DistributedDataParallel and torchmetrics on torch.distributed's "ddplug"
backend, the data split once and audited, data preparation run once.

    torchrun --nproc-per-node 2 examples/pytorch/train.py
    build/bin/ddplug run -n 2 -- .venv/bin/python examples/pytorch/train.py
    DDPLUG_CONFIG=examples/configs/cpu.json torchrun --nproc-per-node 2 examples/pytorch/train.py

A linear classifier learns whether the sum of 16 features is positive.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ddplug.torch as dt


def make_data(path: str, n: int) -> str:
    """The "download": run on one process per node while the others wait."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    torch.save({"x": x, "y": (x.sum(1) > 0).float()}, path)
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "ddplug-example-data.pt"))
    args = p.parse_args()

    ctx = dt.init()  # joins the run; torch.distributed now runs on ddplug
    rank, world = dist.get_rank(), dist.get_world_size()
    path = dt.run_once(lambda: make_data(args.data, args.samples), scope="node", name="example-data")
    data = torch.load(path)
    train = dt.prepare_dataloader(DataLoader(TensorDataset(data["x"], data["y"]), batch_size=16, shuffle=True))
    val = dt.prepare_dataloader(DataLoader(TensorDataset(data["x"][:100], data["y"][:100]), batch_size=16), "val")

    torch.manual_seed(rank)  # DDP makes every rank start from rank 0's weights
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(args.epochs):
        train.sampler.set_epoch(epoch)
        for x, y in train:
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y).backward()
            opt.step()
        correct = torch.zeros(2)
        with torch.no_grad():
            for x, y in val:
                correct += torch.tensor([float(((model(x).squeeze(1) > 0).float() == y).sum()), float(len(y))])
        dist.all_reduce(correct)  # every rank's share of the validation set
        if rank == 0:
            print(f"epoch {epoch}: validation accuracy {correct[0] / correct[1]:.3f}"
                  f" ({int(correct[1])} samples over {world} ranks, plugin {ctx.plugin['name']})", flush=True)
    dt.shutdown()


if __name__ == "__main__":
    main()
