"""ddplug demo: a Lightning Trainer on 2 CPU processes, one line away from DDP.

    python examples/lightning/train.py --config examples/lightning/ddplug.json

A small sequence classifier learns whether a variable-length token sequence
contains more "high" than "low" tokens. The loaders are plain DataLoaders: the
ddplug strategy decides who splits them — the training stream with ddplug's
length-bucketed batch sampler (the config's data_split.streams.train.sampler),
the validation stream exactly (every sample once, no padding) — claims that
through the runtime, audits every epoch what each rank consumed, and prints all
of it.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as pl

import ddplug.lightning

VOCAB = 32


class Sequences(Dataset):
    """Synthetic variable-length token sequences (8..128 tokens) with a binary
    label; ``lengths`` lets ddplug's bucket sampler batch similar lengths."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(8, 129, (n,), generator=g).tolist()
        self.tokens = [torch.randint(1, VOCAB, (n_,), generator=g) for n_ in self.lengths]
        self.labels = [int((t > VOCAB // 2).sum() > (t <= VOCAB // 2).sum()) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        return self.tokens[i], self.labels[i]


def collate(batch):
    tokens, labels = zip(*batch)
    padded = nn.utils.rnn.pad_sequence(tokens, batch_first=True)  # 0 = padding
    return padded, torch.tensor(labels)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32, padding_idx=0)
        self.conv = nn.Conv1d(32, 64, kernel_size=5, padding=2)
        self.head = nn.Linear(64, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        h = torch.relu(self.conv(self.emb(tokens).transpose(1, 2))).transpose(1, 2)
        return self.head((h * mask).sum(1) / mask.sum(1))

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        loss = nn.functional.cross_entropy(self(tokens), labels)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        tokens, labels = batch
        acc = (self(tokens).argmax(-1) == labels).float().mean()
        self.log("val_acc", acc, sync_dist=True)  # over every validation sample once, through ddplug

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def audit_seconds(trainer) -> float:
    """Time this rank spent in the streams' audit calls so far (begin, the
    collective finish, the report); recording runs inside ddplug's sampler and
    costs microseconds an epoch here (bench/audit_cost.py measures it)."""
    return sum(s.audit_seconds for s in trainer.strategy.streams.values())


class Throughput(pl.Callback):
    """Steps per epoch and samples/s over all ranks, and the audit's share of the
    epoch, printed by rank 0."""

    def on_train_epoch_start(self, trainer, module):
        self.t0, self.samples, self.steps = time.perf_counter(), 0, 0
        self.audit0 = audit_seconds(trainer)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.samples += batch[1].numel()
        self.steps += 1

    def on_train_epoch_end(self, trainer, module):
        dt = time.perf_counter() - self.t0
        total = trainer.strategy.reduce(torch.tensor(float(self.samples)), reduce_op="sum")
        acc = trainer.callback_metrics.get("val_acc")
        # Time in the audit calls on every rank. A rank that reaches the audit's
        # collective finish early also waits there for the others (the skew any
        # collective absorbs); the rank that arrives last waits for nobody, so
        # the least of the ranks' times is the audit's own cost.
        audits = trainer.strategy.all_gather(torch.tensor([audit_seconds(trainer) - self.audit0],
                                                          dtype=torch.float64)).flatten().tolist()
        if trainer.is_global_zero:
            extra = f", val_acc {float(acc):.3f}" if acc is not None else ""
            audit = min(audits)
            print(f"demo: epoch {trainer.current_epoch}: {self.steps} steps per epoch per rank,"
                  f" {int(total)} samples on {trainer.world_size} ranks in {dt:.2f} s ="
                  f" {float(total) / dt:,.0f} samples/s{extra}", flush=True)
            print(f"demo: epoch {trainer.current_epoch}: the data-split audit (train and val) took"
                  f" {audit * 1000:.1f} ms (on the rank that waited least; rank 0, waits included:"
                  f" {audits[0] * 1000:.1f} ms), {100 * audit / dt:.2f}% of the epoch", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "ddplug.json"))
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=4096)
    args = p.parse_args()

    pl.seed_everything(0, workers=True)
    if os.environ.get("LOCAL_RANK", "0") == "0" and "NODE_RANK" not in os.environ:
        print(f"demo: {args.devices} CPU processes, config {args.config}, {args.samples} sequences of 8..128"
              f" tokens, {args.epochs} epochs", flush=True)
    train = DataLoader(Sequences(args.samples, seed=1), batch_size=16, shuffle=True, collate_fn=collate)
    val = DataLoader(Sequences(args.samples // 4, seed=2), batch_size=16, collate_fn=collate)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=ddplug.lightning.DdplugStrategy(config=args.config),  # the one-line change (was "ddp")
        max_epochs=args.epochs,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        callbacks=[Throughput()],
    )
    trainer.fit(Classifier(), train, val)
    trainer.strategy.close()


if __name__ == "__main__":
    main()
