"""A Lightning Fabric run with the ddplug strategy (devices=N, real subprocess
ranks): a plain loader split by the plugin, gradients synchronized (with a
no_backward_sync accumulation step, gradient allreduces counted per optimizer
step), collectives, a named eval stream, optionally torch.nn.SyncBatchNorm.
Each rank writes $DDPLUG_TEST_OUT/rank<r>.json."""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch.utils.data import DataLoader

import lightning.fabric as lf

import ddplug.fabric
import lit_common as C


@C.guarded
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--config", default=None)
    p.add_argument("--by-name", action="store_true", help='strategy="ddplug" (config from DDPLUG_CONFIG)')
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank raises at --fail-step")
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--workers", type=int, default=0, help="train DataLoader num_workers")
    p.add_argument("--stop-epoch", type=int, default=-1, help="save a checkpoint in this epoch and stop")
    p.add_argument("--stop-after", type=int, default=3, help="... after this many batches")
    p.add_argument("--resume", default=None, help="checkpoint to continue from (fabric.load)")
    p.add_argument("--syncbn", action="store_true",
                   help="a BatchNorm1d first, converted with torch.nn.SyncBatchNorm.convert_sync_batchnorm")
    args = p.parse_args()
    strategy = "ddplug" if args.by_name else \
        ddplug.fabric.DdplugStrategy(config=json.loads(args.config) if args.config else None)
    fabric = lf.Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(7)
    ds, ev = C.SeqDataset(64), C.SeqDataset(20, seed=3)
    model = torch.nn.Sequential(torch.nn.Linear(C.FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if args.syncbn:  # Fabric's documented way to ask for synchronized batch norm
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
            torch.nn.Sequential(torch.nn.BatchNorm1d(C.FEATURES), *model))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = fabric.setup(model, opt)
    calls = {"n": 0}
    start = fabric.strategy.context.iallreduce

    def counting(*a, **k):
        calls["n"] += 1
        return start(*a, **k)

    fabric.strategy.context.iallreduce = counting  # the gradient sync's allreduces
    per_step: list = []
    train = DataLoader(ds, batch_size=4, shuffle=True, num_workers=args.workers)
    evald = ddplug.fabric.name_stream(DataLoader(ev, batch_size=4), "eval")
    train, evald = fabric.setup_dataloaders(train, evald)
    state = {"model": model, "opt": opt, "train": train, "epoch": 0}
    len_after_load = None
    if args.resume:
        fabric.load(args.resume, state)  # the train stream continues where it was saved
        len_after_load = len(train)  # the batches left in the resumed epoch
    seen: dict = {}
    for epoch in range(state["epoch"], 2):
        for i, batch in enumerate(train):
            seen.setdefault(str(epoch), []).append(batch["idx"].tolist())
            if epoch == args.stop_epoch and len(seen[str(epoch)]) == args.stop_after:
                state["epoch"] = epoch
                fabric.save(os.path.join(os.environ["DDPLUG_TEST_OUT"], "fabric.ckpt"), state)
                C.write_result(fabric.global_rank, {"rank": fabric.global_rank, "seen": seen,
                                                    "saved": train.state_dict()})
                fabric.strategy.close()
                return
            if fabric.global_rank == args.fail_rank and i == args.fail_step:
                raise RuntimeError(f"CUDA out of memory on rank {args.fail_rank} (test)")
            accumulate = i % 2 == 0
            with fabric.no_backward_sync(model, enabled=accumulate):
                loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
                fabric.backward(loss)
            if not accumulate:
                per_step.append(calls["n"])
                calls["n"] = 0
                opt.step()
                opt.zero_grad()
    eval_seen = [i for batch in evald for i in batch["idx"].tolist()]
    total = fabric.all_reduce(torch.tensor(float(len(eval_seen))), reduce_op="sum")
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
    s = fabric.strategy
    extra: dict = {}
    if args.syncbn:
        bn = model.module[0]
        extra["bn"] = {"class": f"{type(bn).__module__}.{type(bn).__name__}", "running_mean": bn.running_mean.tolist(),
                       "running_var": bn.running_var.tolist(), "batches": int(bn.num_batches_tracked)}
    C.write_result(fabric.global_rank, {
        **extra, "per_step": per_step, "buckets": len(s.gradient_sync.buckets),
        "rank": fabric.global_rank, "seen": seen, "eval_seen": eval_seen, "eval_total": float(total),
        "gathered": gathered.flatten().tolist(), "params": C.params_list(model),
        "streams": C.streams_summary(s), "rank_kwargs": s.rank_kwargs,
        "broadcast": fabric.broadcast([fabric.global_rank, "x"], src=0),
        "len_after_load": len_after_load, "len_now": len(train),
    })
    s.close()


if __name__ == "__main__":
    main()
