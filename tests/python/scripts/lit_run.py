"""One Lightning Trainer run for the tests (real subprocess ranks: devices=N).

    python lit_run.py --scenario plain --devices 2 [--strategy ddplug|ddp] ...

Each rank writes $DDPLUG_TEST_OUT/rank<r>.json: what it consumed per epoch and
step, the owner decisions and audit reports, validation metrics, final
parameters, predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, DistributedSampler

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

import lit_common as C


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True,
                   choices=["plain", "sovits", "dsbatch", "nosplit", "parity", "resume", "predict", "prepare",
                            "desync", "syncbn", "distsampler"])
    p.add_argument("--strategy", default="ddplug", choices=["ddplug", "ddplug-by-name", "ddp"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--config", default=None, help="ddplug config (JSON text)")
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--val", action="store_true")
    p.add_argument("--workers", type=int, default=0, help="train DataLoader num_workers")
    p.add_argument("--csv", action="store_true", help="log to a CSVLogger in $DDPLUG_TEST_OUT/logs")
    p.add_argument("--sanity", type=int, default=0, help="num_sanity_val_steps")
    p.add_argument("--prepare-scope", default="global", choices=["global", "node"])
    p.add_argument("--prepare-fail", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank raises in training step --fail-step")
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--fail-kill", action="store_true", help="the failing rank dies by SIGKILL instead")
    p.add_argument("--torch-distributed", default="on", choices=["on", "off"],
                   help="the ddplug strategy initialises torch.distributed (its torch_distributed argument)")
    p.add_argument("--count-syncs", action="store_true",
                   help="count the gradient allreduces started per optimizer step and during backward")
    return p.parse_args()


class Data(pl.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.ds = C.SeqDataset(args.n)
        self.val = C.SeqDataset(max(8, args.n // 3), seed=1)
        self.prepare_data_per_node = args.prepare_scope == "node"

    def prepare_data(self) -> None:
        if self.args.scenario != "prepare":
            return
        marker = os.path.join(os.environ["DDPLUG_TEST_OUT"], "prepared.txt")
        with open(os.path.join(os.environ["DDPLUG_TEST_OUT"], "prepare_calls.txt"), "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.5)  # slow "download": the other ranks must wait for it
        if self.args.prepare_fail:
            raise FileNotFoundError("mirror https://example.invalid/data.tar is unreachable")
        with open(marker, "w") as f:
            f.write("ready")

    def setup(self, stage: str) -> None:
        if self.args.scenario == "prepare":
            marker = os.path.join(os.environ["DDPLUG_TEST_OUT"], "prepared.txt")
            self.prepared_seen = os.path.exists(marker)

    def train_dataloader(self) -> DataLoader:
        a, t = self.args, self.trainer
        ws, rank = t.world_size, t.global_rank
        if a.scenario == "sovits":
            s = C.SoVITSBucketSampler(self.ds, num_replicas=ws, rank=rank, batch_size=a.batch)
            return DataLoader(self.ds, batch_size=a.batch, sampler=s)
        if a.scenario == "dsbatch":
            self.user_batch_sampler = C.VITSBucketBatchSampler(self.ds, a.batch, num_replicas=ws, rank=rank)
            return DataLoader(self.ds, batch_sampler=self.user_batch_sampler)
        if a.scenario == "distsampler":  # ranks from torch.distributed, as under DDP
            return DataLoader(self.ds, batch_size=a.batch, sampler=C.DDPOnlyBucketSampler(self.ds, a.batch))
        if a.scenario == "parity":
            s = DistributedSampler(self.ds, num_replicas=ws, rank=rank, shuffle=True, seed=3)
            return DataLoader(self.ds, batch_size=a.batch, sampler=s)
        return DataLoader(self.ds, batch_size=a.batch, shuffle=True, num_workers=a.workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.args.batch)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.args.batch)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.ds, batch_size=self.args.batch)


class FailOnRank(pl.Callback):
    """One rank raises in the middle of training (an OOM, a bad sample)."""

    def __init__(self, rank: int, step: int, kill: bool) -> None:
        self.rank, self.step, self.kill = rank, step, kill

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_rank == self.rank and batch_idx == self.step:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"CUDA out of memory on rank {self.rank} (test)")


class CountSyncs(pl.Callback):
    """Counts the gradient allreduces the strategy starts (Context.iallreduce): per
    optimizer step, and those already started when backward returned
    (on_after_backward runs before the strategy's post_backward finishes the round)."""

    def __init__(self) -> None:
        self.calls = 0
        self.per_step: list = []
        self.in_backward: list = []
        self.buckets = 0
        self.rounds = 0

    def on_train_start(self, trainer, module):
        ctx = trainer.strategy.context
        start = ctx.iallreduce

        def counting(*args, **kwargs):
            self.calls += 1
            return start(*args, **kwargs)

        ctx.iallreduce = counting
        self.buckets = len(trainer.strategy.gradient_sync.buckets)

    def on_after_backward(self, trainer, module):
        self.in_backward.append(self.calls)

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.per_step.append(self.calls)
        self.calls = 0

    def on_train_end(self, trainer, module):
        self.rounds = trainer.strategy.gradient_sync.syncs

    def result(self) -> dict:
        return {"per_step": self.per_step, "in_backward": self.in_backward, "buckets": self.buckets,
                "rounds": self.rounds}


class Desync(pl.Callback):
    """Rank 1 nudges a parameter after its second step, behind the gradient sync's back."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and batch_idx == 1:
            with torch.no_grad():
                next(module.parameters()).add_(0.5)


@C.guarded
def main() -> None:
    args = parse()
    os.environ["DDPLUG_TEST_DEVICES"] = str(args.devices)
    pl.seed_everything(1234, workers=True)
    if args.strategy == "ddplug":
        import ddplug.lightning

        strategy = ddplug.lightning.DdplugStrategy(config=json.loads(args.config) if args.config else None,
                                                   torch_distributed=args.torch_distributed == "on")
    elif args.strategy == "ddplug-by-name":
        import ddplug.lightning  # noqa: F401  (registers strategy="ddplug"; config from DDPLUG_CONFIG)

        strategy = "ddplug"
    else:
        strategy = "ddp"
    model = C.BNRecorder() if args.scenario == "syncbn" else C.Recorder()
    data = Data(args)
    callbacks: list = []
    counter = CountSyncs() if args.count_syncs else None
    if counter is not None:
        callbacks.append(counter)
    if args.scenario == "desync":
        callbacks.append(Desync())
    if args.fail_rank >= 0:
        callbacks.append(FailOnRank(args.fail_rank, args.fail_step, args.fail_kill))
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(os.environ["DDPLUG_TEST_OUT"], "ckpt"),
                                         every_n_train_steps=args.ckpt_every, save_top_k=-1,
                                         filename="{step}"))
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.nodes, strategy=strategy, max_epochs=args.epochs,
        max_steps=args.max_steps, accumulate_grad_batches=args.accumulate,
        limit_val_batches=1.0 if args.val else 0, num_sanity_val_steps=args.sanity,
        enable_progress_bar=False, enable_model_summary=False,
        logger=CSVLogger(os.path.join(os.environ["DDPLUG_TEST_OUT"], "logs"), name="run") if args.csv else False,
        enable_checkpointing=bool(args.ckpt_every), callbacks=callbacks, deterministic=True,
        sync_batchnorm=args.scenario == "syncbn",
    )
    result: dict = {}
    if args.scenario == "predict":
        preds = trainer.predict(model, datamodule=data)
        result["predicted"] = model.predicted
        result["num_predictions"] = sum(len(p) for p in preds)
        result["predict_streams"] = C.streams_summary(trainer.strategy)
        trainer.test(model, datamodule=data, verbose=False)  # the same strategy, a second run
        result["test_seen"] = model.test_seen
    else:
        trainer.fit(model, datamodule=data, ckpt_path=args.resume)
    rank = trainer.global_rank
    result.update({
        "rank": rank,
        "world_size": trainer.world_size,
        "seen": model.seen,
        "val_seen": model.val_seen,
        "params": C.params_list(model),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "streams": C.streams_summary(trainer.strategy),
        "global_step": trainer.global_step,
        "num_training_batches": trainer.num_training_batches,
        "prepared_seen": getattr(data, "prepared_seen", None),
        "dataset_epochs": data.ds.epochs_seen,
    })
    if counter is not None:
        result["syncs"] = counter.result()
    if hasattr(data, "user_batch_sampler"):
        result["batch_sampler_epochs"] = data.user_batch_sampler.epochs_set
    if args.scenario == "syncbn":
        bn = model.net[0]
        result["bn"] = {"class_in_fit": model.bn_class_in_fit, "class_after": type(bn).__name__,
                        "running_mean": bn.running_mean.tolist(), "running_var": bn.running_var.tolist(),
                        "batches": int(bn.num_batches_tracked)}
    if args.strategy != "ddp":
        ctx = trainer.strategy.context
        result["ddplug_world"] = {"rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
                                  "node_rank": ctx.node_rank, "num_nodes": ctx.num_nodes}
        result["lightning_world"] = {"local_rank": trainer.local_rank, "node_rank": trainer.node_rank,
                                     "environment": type(trainer.strategy.cluster_environment).__name__}
        result["sampler_kwargs"] = trainer.distributed_sampler_kwargs
        result["plugin"] = ctx.plugin["name"]
        result["root_device"] = str(trainer.strategy.root_device)
        result["gathered"] = trainer.strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist()
        result["broadcast"] = trainer.strategy.broadcast({"from": rank, "list": [1, 2]}, src=min(1, trainer.world_size - 1))
    C.write_result(rank, result)
    if hasattr(trainer.strategy, "close"):
        trainer.strategy.close()


if __name__ == "__main__":
    main()

