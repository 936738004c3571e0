"""Lightning against torch.distributed's "ddplug" backend, three fits in one
launch (Lightning's subprocess launcher, devices=N; each fit on its own port):

1. Lightning's own ``DDPStrategy(process_group_backend="gloo")``;
2. Lightning's own ``DDPStrategy(process_group_backend="ddplug")``, same seed and
   data: torch's DDP on ddplug's process group;
3. ``strategy="ddplug"`` (which initialises torch.distributed itself) with a
   real WebDataset pipeline whose ``split_by_node`` reads torch.distributed
   (Lightning's launcher sets no RANK) as the training stream, and a
   torchmetrics ``BinaryAccuracy`` logged in validation.

    python lit_backend.py --devices 2 --shards DIR

Each rank writes $DDPLUG_TEST_OUT/rank<r>.json.
"""

from __future__ import annotations

import argparse
import glob
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy

import ddplug  # noqa: F401  (registers torch.distributed's backend "ddplug")
import lit_common as C


class Metric(pl.LightningModule):
    """A binary classifier trained on WebDataset samples; validation logs a
    torchmetrics BinaryAccuracy (synced by torchmetrics through torch.distributed)."""

    def __init__(self) -> None:
        super().__init__()
        from torchmetrics.classification import BinaryAccuracy

        self.net = torch.nn.Linear(C.FEATURES, 1)
        self.val_acc = BinaryAccuracy()
        self.keys: list = []
        self.val_seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        keys, x, y = batch
        self.keys += list(keys)
        return torch.nn.functional.binary_cross_entropy_with_logits(self(x), y)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_seen += batch["idx"].tolist()
        self.val_acc(torch.sigmoid(self(batch["x"])), (batch["y"] > 0).long())
        self.log("val_acc", self.val_acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def webdataset_loader(shards: str) -> DataLoader:
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(shards, "shard-*.tar")))
    ds = (wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False, empty_check=False)
          .decode().to_tuple("__key__", "x.pth", "y.pth"))
    return DataLoader(ds, batch_size=4)


def ddp_fit(backend: str, args: argparse.Namespace) -> list:
    pl.seed_everything(1234, workers=True)
    model = C.Recorder()
    ds = C.SeqDataset(48)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=DDPStrategy(process_group_backend=backend),
                         max_epochs=2, enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, deterministic=True)
    trainer.fit(model, DataLoader(ds, batch_size=4, shuffle=True))
    info = {"backend": dist.get_backend(), "group": type(dist.group.WORLD).__name__, "seen": model.seen}
    dist.destroy_process_group()
    return [C.params_list(model), info]


@C.guarded
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--shards", required=True)
    args = p.parse_args()
    os.environ["DDPLUG_TEST_DEVICES"] = str(args.devices)
    result: dict = {}
    result["gloo"] = ddp_fit("gloo", args)
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)  # every rank, the same
    result["ddplug_backend"] = ddp_fit("ddplug", args)
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)

    import ddplug.lightning

    pl.seed_everything(1234, workers=True)
    model = Metric()
    val = C.SeqDataset(30, seed=1)
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=ddplug.lightning.DdplugStrategy(),
                         max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, num_sanity_val_steps=0)
    trainer.fit(model, webdataset_loader(args.shards), DataLoader(val, batch_size=4))
    from torchmetrics.classification import BinaryAccuracy

    with torch.no_grad():  # the same model on every rank: the single-process value
        single = BinaryAccuracy()(torch.sigmoid(model(val.x)), (val.y > 0).long())
    result.update({
        "rank": trainer.global_rank,
        "torch_distributed": [dist.is_initialized(), dist.get_backend(), dist.get_rank(), dist.get_world_size()],
        "keys": model.keys,
        "val_seen": model.val_seen,
        "val_acc": float(trainer.callback_metrics["val_acc"]),
        "val_acc_single_process": float(single),
        "streams": C.streams_summary(trainer.strategy),
    })
    C.write_result(trainer.global_rank, result)
    trainer.strategy.close()
    result["after_close"] = dist.is_initialized()
    C.write_result(trainer.global_rank, result)


if __name__ == "__main__":
    main()
