"""GPT-SoVITS' s1 training setup, written as GPT-SoVITS writes it: the standalone
``pytorch_lightning`` package, ``Trainer(use_distributed_sampler=False)``, and its
AR ``DistributedBucketSampler`` (GPT_SoVITS/AR/data/bucket_sampler.py), which
takes its ranks from torch.distributed and pads like torch's DistributedSampler,
to ceil(N/G)·G. Each rank writes $DDPLUG_TEST_OUT/rank<r>.json.

    python sovits_pl.py --n 961 --devices 2 --mode pad|cpu-branch|overpad|ddp

pad         strategy="ddplug" by name (the script imports ddplug, nothing of
            ddplug's strategies), two epochs, the audit in error mode: the
            padding torch's rule allows passes without a declaration
cpu-branch  the sampler's CPU branch: num_replicas=1, rank=0 on every rank —
            stopped before the first step
overpad     a sampler that repeats more than torch's rule: still refused
ddp         pytorch_lightning's own DDPStrategy(process_group_backend="ddplug")
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import traceback

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy

import ddplug  # registers strategy="ddplug" in every Lightning spelling


class Text2Semantic(Dataset):
    """Samples of varying length, as the AR dataset has (get_sample_length)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(5, 200, (n,), generator=g).tolist()
        self.x = torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.lengths)

    def get_sample_length(self, i: int) -> float:
        return self.lengths[i] / 100.0

    def __getitem__(self, i: int) -> dict:
        return {"idx": i, "x": self.x[i]}


class DistributedBucketSampler(Sampler):
    """GPT-SoVITS' AR bucket sampler, as upstream: ranks from torch.distributed
    when CUDA is there (``cpu_branch`` False), else num_replicas=1, rank=0."""

    def __init__(self, dataset: Text2Semantic, batch_size: int, cpu_branch: bool, extra_padding: int = 0) -> None:
        if cpu_branch:
            num_replicas, rank = 1, 0
        else:
            num_replicas, rank = dist.get_world_size(), dist.get_rank()
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.batch_size = batch_size
        self.seed = 0
        self.num_samples = int(math.ceil(len(dataset) * 1.0 / num_replicas)) + extra_padding
        self.total_size = self.num_samples * num_replicas
        self.id_with_length = sorted(((i, dataset.get_sample_length(i)) for i in range(len(dataset))),
                                     key=lambda x: x[1])
        self.id_buckets = self.make_buckets(2.0)

    def make_buckets(self, bucket_width: float) -> list:
        buckets, cur, cur_max = [], [], bucket_width
        for idx, length in self.id_with_length:
            if length > cur_max:
                buckets.append(cur)
                cur, cur_max = [], cur_max + bucket_width
            cur.append(idx)
        buckets.append(cur)
        return [b for b in buckets if b]

    def __iter__(self):
        random.seed(self.epoch + self.seed)
        shuffled = []
        for bucket in self.id_buckets:
            bucket = list(bucket)
            random.shuffle(bucket)
            shuffled += bucket
        grouped = [shuffled[i: i + self.batch_size * self.num_replicas]
                   for i in range(0, len(shuffled), self.batch_size * self.num_replicas)]
        random.shuffle(grouped)
        indices = [i for g in grouped for i in g]
        if len(indices) < self.total_size:  # pad with the head, as upstream
            indices += (indices * math.ceil((self.total_size - len(indices)) / len(indices)))[
                : self.total_size - len(indices)]
        indices = indices[self.rank: self.total_size: self.num_replicas]
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen: dict = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(str(self.current_epoch), []).extend(batch["idx"].tolist())
        return self.net(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Data(pl.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def train_dataloader(self):
        ds = Text2Semantic(self.args.n)
        sampler = DistributedBucketSampler(ds, 8, cpu_branch=self.args.mode == "cpu-branch",
                                           extra_padding=1 if self.args.mode == "overpad" else 0)
        return DataLoader(ds, batch_size=8, sampler=sampler)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--mode", default="pad", choices=["pad", "cpu-branch", "overpad", "ddp"])
    args = p.parse_args()
    out = os.environ["DDPLUG_TEST_OUT"]
    strategy = DDPStrategy(process_group_backend="ddplug") if args.mode == "ddp" else "ddplug"
    trainer = pl.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=2,
                         use_distributed_sampler=False, enable_progress_bar=False, enable_model_summary=False,
                         logger=False, enable_checkpointing=False, num_sanity_val_steps=0)
    model = Model()
    result: dict = {"strategy": f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__name__}"}
    try:
        trainer.fit(model, datamodule=Data(args))
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    result["rank"] = trainer.global_rank
    secret = os.environ.get("DDPLUG_SECRET", "")
    result["secret"] = hashlib.sha256(secret.encode()).hexdigest()[:16] if secret else ""
    result["seen"] = model.seen
    streams = getattr(trainer.strategy, "streams", {})
    if "train" in streams:
        s = streams["train"]
        result["owner_line"] = s.decision.line
        result["reports"] = [{"verdict": r.verdict, "repeats": r.repeats, "summary": r.summary}
                             for r in s.reports]
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(result, f)
    if hasattr(trainer.strategy, "close"):
        trainer.strategy.close()


if __name__ == "__main__":
    main()
