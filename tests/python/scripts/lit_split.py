"""Lightning Trainer runs for the data-split checks (real subprocess ranks:
devices=N). Each rank writes $DDPLUG_TEST_OUT/rank<r>.json.

    python lit_split.py --scenario declare|sovits|shards|stream --devices 2

declare  four training streams at once, the audit in warn mode: a rank-aware
         sampler that covers half the data (its length agrees), a
         DistributedSampler subclass that skips 50 samples, a length-bucket
         batch sampler that pads and drops undeclared, and the same declared.
sovits   only the undeclared bucket sampler, the audit in error mode.
shards   a training set sharded per rank with Subset; validation on a plain
         loader of 1001 samples (a synced accuracy), on unequal Subset shards and
         on a per-rank dataset ddplug cannot map; then predict over 1001 inputs.
stream   streaming (iterable) data with sample ids: training on ddplug.shard
         with 2 workers per rank, validation on an unsplit stream (repeats) and
         on one without ids; prepare_data outlives the collective timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Subset

import lightning.pytorch as pl
from lightning.pytorch.utilities import CombinedLoader

import ddplug
import ddplug.lightning
import lit_common as C


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True, choices=["declare", "sovits", "shards", "stream"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--config", default=None)
    p.add_argument("--no-distributed-sampler", action="store_true", help="Trainer(use_distributed_sampler=False)")
    return p.parse_args()


BOUNDS = [20, 60, 120, 180]


class Model(pl.LightningModule):
    """Linear regression over whatever batches come (one, or a dict of them), and a
    validation accuracy as exact sums: correct and count, summed over the epoch
    and the ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(C.FEATURES, 1)
        self.seen: dict = {}
        self.val_seen: dict = {}
        self.predicted: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        parts = batch if isinstance(batch, dict) and "x" not in batch else {"train": batch}
        loss = 0.0
        for name, b in parts.items():
            if b is None:
                continue
            self.seen.setdefault(name, []).extend(b["idx"].tolist())
            loss = loss + torch.nn.functional.mse_loss(self(b["x"]), b["y"])
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.val_seen.setdefault(str(dataloader_idx), []).extend(batch["idx"].tolist())
        if dataloader_idx == 0:
            correct = ((self(batch["x"]) > 0) == (batch["y"] > 0)).sum().float()
            n = float(len(batch["idx"]))
            self.log("val_correct", correct, reduce_fx="sum", sync_dist=True, add_dataloader_idx=False)
            self.log("val_count", n, reduce_fx="sum", sync_dist=True, add_dataloader_idx=False)
            # the usual form: a per-batch mean, weighted by batch size over the epoch and the ranks
            self.log("val_acc", correct / n, sync_dist=True, add_dataloader_idx=False, batch_size=int(n))

    def predict_step(self, batch, batch_idx):
        self.predicted.extend(batch["idx"].tolist())
        return self(batch["x"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Data(pl.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def prepare_data(self) -> None:
        if self.args.scenario == "stream":  # a slow download: the other ranks wait for it
            time.sleep(3.0)
            with open(os.path.join(os.environ["DDPLUG_TEST_OUT"], "prepared.txt"), "w") as f:
                f.write("ready")

    def setup(self, stage: str) -> None:
        self.prepared_seen = os.path.exists(os.path.join(os.environ["DDPLUG_TEST_OUT"], "prepared.txt"))

    def train_dataloader(self):
        a, t = self.args, self.trainer
        ws, rank = t.world_size, t.global_rank
        if a.scenario in ("declare", "sovits"):
            ds = C.SeqDataset(1003)
            sovits = C.LengthBucketBatchSampler(ds, 4, BOUNDS, ws, rank)
            if a.scenario == "sovits":
                return DataLoader(ds, batch_sampler=sovits)
            declared = C.LengthBucketBatchSampler(ds, 4, BOUNDS, ws, rank)
            ddplug.declare(declared, padding=declared.padding, dropped=declared.left_out)
            loaders = {
                "half": DataLoader(ds, batch_size=4, sampler=C.HalfSampler(len(ds), ws, rank)),
                "skip": DataLoader(ds, batch_size=4, sampler=C.SkippingSampler(ds, ws, rank)),
                "sovits": DataLoader(ds, batch_sampler=sovits),
                "declared": DataLoader(ds, batch_sampler=declared),
            }
            return CombinedLoader(loaders, mode="max_size_cycle")
        if a.scenario == "shards":  # split per rank before the loader, as split_dataset_by_node does
            ds = C.SeqDataset(1002)
            return DataLoader(Subset(ds, range(rank, len(ds), ws)), batch_size=4, shuffle=True)
        return DataLoader(ddplug.shard(ddplug.declare(C.Ids(96, "t"), key="__key__")), batch_size=4, num_workers=2)

    def val_dataloader(self):
        a, t = self.args, self.trainer
        ws, rank = t.world_size, t.global_rank
        if a.scenario == "shards":
            val = C.SeqDataset(1001, seed=1)
            return [DataLoader(val, batch_size=8),
                    DataLoader(Subset(val, range(rank, len(val), ws)), batch_size=8),
                    DataLoader(C.RankSizedDataset(40, rank), batch_size=8)]
        if a.scenario == "stream":
            return [DataLoader(ddplug.declare(C.Ids(30, "v"), key="__key__"), batch_size=4),
                    DataLoader(C.Ids(20, "w", key=False), batch_size=4)]
        return []

    def predict_dataloader(self):
        return DataLoader(C.SeqDataset(1001, seed=1), batch_size=8)


@C.guarded
def main() -> None:
    args = parse()
    os.environ["DDPLUG_TEST_DEVICES"] = str(args.devices)
    pl.seed_everything(1234, workers=True)
    strategy = ddplug.lightning.DdplugStrategy(config=json.loads(args.config) if args.config else None)
    data, model = Data(args), Model()
    trainer = pl.Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=1,
        limit_val_batches=1.0 if args.scenario in ("shards", "stream") else 0, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False,
        use_distributed_sampler=not args.no_distributed_sampler,
    )
    trainer.fit(model, datamodule=data)
    rank = trainer.global_rank
    result: dict = {
        "rank": rank, "seen": model.seen, "val_seen": model.val_seen,
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "streams": C.streams_summary(trainer.strategy),
        "prepared_seen": getattr(data, "prepared_seen", None),
    }
    if args.scenario == "shards":
        # the single-process accuracy with the final parameters, computed here
        val = C.SeqDataset(1001, seed=1)
        with torch.no_grad():
            result["local_correct"] = float(((model(val.x) > 0) == (val.y > 0)).sum())
        trainer.predict(model, datamodule=data)
        result["predicted"] = model.predicted
        result["predict_streams"] = C.streams_summary(trainer.strategy)
    C.write_result(rank, result)
    trainer.strategy.close()


if __name__ == "__main__":
    main()
