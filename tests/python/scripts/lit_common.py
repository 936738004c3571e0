"""Shared pieces of the Lightning test scripts: datasets, samplers in the styles
of real projects, a tiny model that records what each rank consumed, and the
per-rank result file."""

from __future__ import annotations

import json
import math
import os
import traceback
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

import lightning.pytorch as pl

FEATURES = 8


class SeqDataset(Dataset):
    """Synthetic variable-length "sequences": sample i has a length in [5, 200]
    (``lengths``, for bucket samplers), fixed-size features and a linear target."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.n = n
        self.lengths = torch.randint(5, 201, (n,), generator=g).tolist()
        self.x = torch.randn(n, FEATURES, generator=g)
        w = torch.arange(1, FEATURES + 1, dtype=torch.float32) / FEATURES
        self.y = self.x @ w + 0.01 * torch.randn(n, generator=g)
        self.epochs_seen: list = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"idx": i, "x": self.x[i], "y": self.y[i], "len": self.lengths[i]}

    def set_epoch(self, epoch: int) -> None:  # ddplug calls it where it exists
        self.epochs_seen.append(int(epoch))


class SoVITSBucketSampler(Sampler):
    """A rank-aware bucket sampler in the style of GPT-SoVITS' AR bucket sampler:
    NOT a DistributedSampler subclass; it exposes num_replicas/rank, pads to a
    multiple of the world size and yields this rank's indices, sorted into length
    buckets. Lightning's DDP wraps it again (N/G² per rank); ddplug must not."""

    def __init__(self, dataset: SeqDataset, num_replicas: int, rank: int, batch_size: int,
                 shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g).tolist() if self.shuffle else list(range(len(self.dataset)))
        order += order[: self.total_size - len(order)]
        mine = order[self.rank: self.total_size: self.num_replicas]
        # length buckets of batch_size, in shuffled bucket order
        mine.sort(key=lambda i: self.dataset.lengths[i])
        buckets = [mine[i: i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
        perm = torch.randperm(len(buckets), generator=g).tolist() if self.shuffle else range(len(buckets))
        for b in perm:
            yield from buckets[b]

    def __len__(self) -> int:
        return self.num_samples


class DDPOnlyBucketSampler(SoVITSBucketSampler):
    """GPT-SoVITS' upstream bucket sampler takes its ranks from torch.distributed
    when num_replicas/rank are not given — which only works where something
    initialized a process group (DDP does; ddplug does not)."""

    def __init__(self, dataset: SeqDataset, batch_size: int, num_replicas: Any = None, rank: Any = None) -> None:
        import torch.distributed as dist

        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank()
        super().__init__(dataset, num_replicas, rank, batch_size)


class VITSBucketBatchSampler(DistributedSampler):
    """A DistributedSampler subclass that yields batches (VITS-style), meant to be
    passed as ``batch_sampler=``: Lightning only checks ``dataloader.sampler``."""

    def __init__(self, dataset: SeqDataset, batch_size: int, num_replicas: int, rank: int,
                 shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.lengths = dataset.lengths
        self.epochs_set: list = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs_set.append(int(epoch))
        super().set_epoch(epoch)

    def __iter__(self):
        mine = list(super().__iter__())
        mine.sort(key=lambda i: self.lengths[i])
        batches = [mine[i: i + self.batch_size] for i in range(0, len(mine), self.batch_size)]
        g = torch.Generator().manual_seed(self.seed + self.epoch + 1000)
        for b in torch.randperm(len(batches), generator=g).tolist():
            yield batches[b]

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)


class Recorder(pl.LightningModule):
    """Linear regression that records every consumed index per epoch, logs a
    synced validation metric, and can gather/broadcast through the strategy."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))
        self.lr = lr
        self.seen: dict = {}
        self.val_seen: dict = {}
        self.predicted: list = []
        self.test_seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(str(self.current_epoch), []).append(batch["idx"].tolist())
        loss = torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_seen.setdefault(str(self.current_epoch), []).extend(batch["idx"].tolist())
        loss = torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])
        self.log("val_loss", loss, sync_dist=True)
        self.log("val_rank", float(self.global_rank + 1), sync_dist=True)
        self.log("val_rank_sum", float(self.global_rank + 1), sync_dist=True, reduce_fx="sum")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.test_seen.extend(batch["idx"].tolist())
        self.log("test_loss", torch.nn.functional.mse_loss(self(batch["x"]), batch["y"]), sync_dist=True)

    def predict_step(self, batch: dict, batch_idx: int) -> Any:
        self.predicted.extend(batch["idx"].tolist())
        return self(batch["x"])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class BNRecorder(Recorder):
    """Recorder with a BatchNorm1d on the raw features first: its running statistics
    follow from the samples of each step alone (every rank's, when synchronized)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.BatchNorm1d(FEATURES), *self.net)
        self.bn_class_in_fit = None

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.bn_class_in_fit = f"{type(self.net[0]).__module__}.{type(self.net[0]).__name__}"
        return super().training_step(batch, batch_idx)


def params_list(module: torch.nn.Module) -> list:
    return [p.detach().double().flatten().tolist() for p in module.parameters()]


def write_result(rank: int, data: dict) -> None:
    out = os.environ["DDPLUG_TEST_OUT"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(data, f)


def streams_summary(strategy: Any) -> dict:
    out = {}
    data = getattr(strategy, "_data", None)
    every = dict(getattr(strategy, "streams", {}))
    every.update(getattr(data, "iterables", {}) if data is not None else {})
    for name, s in every.items():
        if not hasattr(s, "decision"):  # an iterable stream's id audit
            out[name] = {"owner": "user", "line": "", "length": -1,
                         "reports": [{"verdict": r.verdict, "summary": r.summary, "violations": r.violations,
                                      "diagnoses": r.diagnoses, "repeats": r.repeats, "covered": r.covered,
                                      "num_samples": r.num_samples, "deliveries": r.deliveries,
                                      "repeated_examples": r.repeated_examples,
                                      "repeated_keys": r.repeated_keys} for r in s.reports]}
            continue
        out[name] = {
            "owner": s.owner,
            "line": s.decision.line,
            "length": len(s),
            "reports": [{"verdict": r.verdict, "summary": r.summary, "epoch": r.epoch,
                         "covered": r.covered, "deliveries": r.deliveries, "violations": r.violations,
                         "diagnoses": r.diagnoses, "text": r.text, "missing": r.missing,
                         "repeats": r.repeats, "num_samples": r.num_samples, "steps": r.steps,
                         "missing_examples": r.missing_examples,
                         "repeated_examples": r.repeated_examples} for r in s.reports],
        }
    return out


def guarded(main):
    """Run main(); on failure write the error into this rank's result and re-raise."""
    def wrapper() -> None:
        try:
            main()
        except BaseException as exc:
            rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) + \
                int(os.environ.get("NODE_RANK", "0")) * int(os.environ.get("DDPLUG_TEST_DEVICES", "1"))
            try:
                write_result(rank, {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__,
                                    "traceback": traceback.format_exc()})
            except Exception:
                pass
            raise
    return wrapper


class HalfSampler(Sampler):
    """A rank-aware sampler with a self-consistent bug: it only ever covers the
    first half of the dataset, and its length agrees with that."""

    def __init__(self, n: int, num_replicas: int, rank: int) -> None:
        self.n, self.num_replicas, self.rank = n, num_replicas, rank
        self.half = n // 2

    def __iter__(self):
        return iter(range(self.rank, self.half, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.half, self.num_replicas))


class SkippingSampler(DistributedSampler):
    """A DistributedSampler subclass that silently skips the first ``skip``
    indices of the dataset (a filtering bug); its length stays torch's."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, skip: int = 50) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.skip = skip

    def __iter__(self):
        return iter([i if i >= self.skip else i + self.skip for i in super().__iter__()])


class LengthBucketBatchSampler(DistributedSampler):
    """A batch sampler in the manner of the VITS / GPT-SoVITS distributed bucket
    sampler: samples whose length falls outside (boundaries[0], boundaries[-1]]
    are left out; each bucket is padded by repeating its own samples to a multiple
    of batch_size * num_replicas, split by rank, cut into batches, and the batches
    are shuffled per epoch. It pads and drops, and declares neither."""

    def __init__(self, dataset: Any, batch_size: int, boundaries: list, num_replicas: int, rank: int,
                 shuffle: bool = True) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle)
        self.lengths = dataset.lengths
        self.batch_size = batch_size
        self.boundaries = list(boundaries)
        self.buckets = [[] for _ in range(len(self.boundaries) - 1)]
        self.left_out = []
        for i, n in enumerate(self.lengths):
            for b in range(len(self.boundaries) - 1):
                if self.boundaries[b] < n <= self.boundaries[b + 1]:
                    self.buckets[b].append(i)
                    break
            else:
                self.left_out.append(i)
        self.buckets = [b for b in self.buckets if b]
        per = batch_size * num_replicas
        self.sizes = [len(b) + (per - len(b) % per) % per for b in self.buckets]
        self.padding = sum(self.sizes) - sum(len(b) for b in self.buckets)
        self.num_samples = sum(self.sizes) // num_replicas

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        batches = []
        for bucket, size in zip(self.buckets, self.sizes):
            order = torch.randperm(len(bucket), generator=g).tolist() if self.shuffle else list(range(len(bucket)))
            order = (order * (size // len(bucket) + 1))[:size]
            mine = order[self.rank::self.num_replicas]
            batches += [[bucket[k] for k in mine[j:j + self.batch_size]]
                        for j in range(0, len(mine), self.batch_size)]
        if self.shuffle:
            batches = [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]
        return iter(batches)

    def __len__(self) -> int:
        return self.num_samples // self.batch_size


class RankSizedDataset(SeqDataset):
    """A dataset each rank builds with a different length (sharded by hand, not a
    Subset): ddplug sees that it differs but cannot map it to one index space."""

    def __init__(self, n: int, rank: int) -> None:
        super().__init__(n + rank, seed=5)


class Ids(torch.utils.data.IterableDataset):
    """A streaming dataset whose samples carry a WebDataset-style "__key__"; it
    yields all of its samples to whoever iterates it (not split by itself)."""

    def __init__(self, n: int, prefix: str = "s", key: bool = True) -> None:
        super().__init__()
        self.base = SeqDataset(n, seed=11)
        self.n, self.prefix, self.key = n, prefix, key

    def __iter__(self):
        for i in range(self.n):
            item = dict(self.base[i])
            if self.key:
                item["__key__"] = f"{self.prefix}{i:05d}"
            yield item

    def __len__(self) -> int:
        return self.n
