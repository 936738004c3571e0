"""The standalone lightning_fabric package with strategy="ddplug" by name (after
`import ddplug`): a module set up, a few steps on a loader split by ddplug,
Fabric's all_reduce, and the per-run secret the launcher passed on. Each rank writes $DDPLUG_TEST_OUT/rank<r>.json."""

from __future__ import annotations

import hashlib
import json
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning_fabric as lf

import ddplug  # noqa: F401  registers strategy="ddplug" in every Lightning spelling


def main() -> None:
    fabric = lf.Fabric(accelerator="cpu", devices=2, strategy="ddplug")
    fabric.launch()
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.arange(20.0).view(10, 2)), batch_size=2))
    seen = []
    for (batch,) in loader:
        seen += batch[:, 0].div(2).long().tolist()
        loss = model(torch.cat([batch, torch.ones(len(batch), 1)], 1)).pow(2).mean()
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    total = fabric.all_reduce(torch.tensor([float(fabric.global_rank + 1)]), reduce_op="sum")
    secret = os.environ.get("DDPLUG_SECRET", "")
    out = {"strategy": f"{type(fabric.strategy).__module__}.{type(fabric.strategy).__name__}",
           "secret": hashlib.sha256(secret.encode()).hexdigest()[:16] if secret else "",
           "seen": seen, "sum": float(total), "params": [p.detach().flatten().tolist() for p in model.parameters()]}
    with open(os.path.join(os.environ["DDPLUG_TEST_OUT"], f"rank{fabric.global_rank}.json"), "w") as f:
        json.dump(out, f)
    fabric.strategy.close()


if __name__ == "__main__":
    main()
