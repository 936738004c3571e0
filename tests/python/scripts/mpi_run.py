"""A job an MPI launcher starts (tests/python/test_mpi.py): no MASTER_ADDR, no
RANK, no `ddplug run`: ddplug learns the world from the launcher and rank 0's
store address over MPI (the mpi plugin's bootstrap).

    mpirun -n 2 python mpi_run.py torch-dist|ddplug-torch|lightning|mpi4py

Each rank writes $DDPLUG_TEST_OUT/rank<r>.json (r: the launcher's rank).
"""

from __future__ import annotations

import json
import os
import sys

import torch


def launcher_rank() -> int:
    return int(os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK"))


def write(result: dict) -> None:
    path = os.path.join(os.environ["DDPLUG_TEST_OUT"], f"rank{launcher_rank()}.json")
    with open(path, "w") as f:
        json.dump(result, f)


def torch_dist() -> dict:
    import ddplug  # noqa: F401  (registers the backend and env:// under MPI launchers)
    import torch.distributed as dist

    dist.init_process_group("ddplug")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    obj = ["from rank 0" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(dist.get_rank())]))
    import ddplug.distributed as ddist

    plugin = ddist.context_of().plugin["name"]
    result = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.tolist(), "obj": obj[0],
              "gathered": [g.item() for g in gathered], "plugin": plugin}
    dist.destroy_process_group()
    return result


def ddplug_torch() -> dict:
    import ddplug.torch as dt
    import torch.distributed as dist

    ctx = dt.init()
    t = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(t)
    result = {"rank": ctx.rank, "world": ctx.world_size, "sum": t.tolist(), "plugin": ctx.plugin["name"],
              "source": ctx.source if hasattr(ctx, "source") else None}
    dt.shutdown()
    return result


def mpi4py_first() -> dict:
    """mpi4py initialises MPI first (MPI_THREAD_MULTIPLE, its default); ddplug
    uses that MPI, both work side by side, and mpi4py finalizes it at exit."""
    from mpi4py import MPI

    import ddplug.torch as dt
    import torch.distributed as dist

    ctx = dt.init()
    t = torch.full((2,), float(ctx.rank + 1))
    dist.all_reduce(t)
    theirs = MPI.COMM_WORLD.allreduce(ctx.rank + 1)
    result = {"rank": ctx.rank, "world": ctx.world_size, "sum": t.tolist(), "mpi4py_sum": theirs,
              "plugin": ctx.plugin["name"], "mpi4py_rank": MPI.COMM_WORLD.Get_rank()}
    dt.shutdown()
    result["mpi4py_after"] = MPI.COMM_WORLD.allreduce(1)
    result["finalized_by_ddplug"] = MPI.Is_finalized()
    return result


def lightning() -> dict:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    import ddplug.lightning  # noqa: F401  (strategy="ddplug")

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = Model()
    trainer = pl.Trainer(strategy="ddplug", accelerator="cpu", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=4))
    steps = trainer.fit_loop.epoch_loop._batches_that_stepped
    return {"rank": trainer.global_rank, "world": trainer.world_size, "steps": steps,
            "env": type(trainer.strategy.cluster_environment).__name__,
            "plugin": trainer.strategy.context.plugin["name"],
            "weights": [float(v) for v in model.layer.weight.detach().flatten()]}


if __name__ == "__main__":
    what = sys.argv[1]
    write({"torch-dist": torch_dist, "ddplug-torch": ddplug_torch, "lightning": lightning,
           "mpi4py": mpi4py_first}[what]())
