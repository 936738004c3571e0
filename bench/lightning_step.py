#!/usr/bin/env python3
"""lightning_step.py — time per training step of a communication-heavy model on
2 CPU ranks: Lightning's DDPStrategy (gloo) against the ddplug strategy, in one
invocation, with the same model, data and seeds.

    .venv/bin/python bench/lightning_step.py [--steps 30] [--warmup 5] [--json FILE]

Two models, both ~27 M parameters (~104 MiB of fp32 gradients per step):
  mlp        1024 -> 6 x (2048 x 2048) -> 10, batch 8 per rank: forward and
             backward take about as long as the allreduce on 2 shared cores;
  embedding  a 106,496 x 256 embedding table (dense gradients) + a linear head,
             batch 8 sequences of 32 tokens: almost no compute, the step is the
             gradient allreduce (large-vocabulary / recommendation models).
Each
configuration runs as its own Lightning job (devices=2, accelerator="cpu",
Lightning's subprocess launcher, one torch thread per rank); rank 0 times every
training step (on_train_batch_start -> on_train_batch_end: forward, backward with
the gradient allreduce, optimizer step), the first --warmup steps are dropped.

Configurations:
  ddp (gloo), default          strategy="ddp" as a user gets it (25 MiB buckets)
  ddp (gloo), bucket view      gradient_as_bucket_view=True
  ddp (gloo), 100 MiB buckets  bucket_cap_mb=100, gradient_as_bucket_view=True
  ddp, ddplug backend          Lightning's DDPStrategy(process_group_backend="ddplug"):
                               torch's DDP reducer over ddplug's torch.distributed
                               backend (its futures completed by the backend's
                               completion thread); also with bucket view
  ddplug (cpu)                strategy=DdplugStrategy() with the default config
                               (which initialises torch.distributed on its run:
                               Lightning then broadcasts a SIGTERM flag every step)
  ddplug (cpu), torch.dist... the same with torch_distributed=False
  no communication (1 rank)    the same step in one process (devices=1): the floor
                               no strategy can beat; what is left above it is
                               the cost of the gradient exchange
"gloo at its best" is the fastest ddp row on gloo. The table gives the median and mean step
time and the ratio to the default ddp row. The machine's other load shows up as
noise: compare rows of one invocation, re-run for confirmation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = [
    ("ddp (gloo), default", "ddp", {}),
    ("ddp (gloo), bucket view", "ddp", {"gradient_as_bucket_view": True}),
    ("ddp (gloo), 100 MiB buckets", "ddp", {"bucket_cap_mb": 100, "gradient_as_bucket_view": True}),
    ("ddp, ddplug backend", "ddp", {"process_group_backend": "ddplug"}),
    ("ddp, ddplug backend, bucket view", "ddp", {"process_group_backend": "ddplug", "gradient_as_bucket_view": True}),
    ("ddplug (cpu)", "ddplug", {}),
    ("ddplug (cpu), torch.distributed off", "ddplug", {"torch_distributed": False}),
    ("no communication (1 rank)", "single", {}),
]


def worker(args: argparse.Namespace) -> None:
    """One Lightning job (rank 0 and, through the launcher, rank 1)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import lightning.pytorch as pl

    torch.set_num_threads(1)
    kwargs = json.loads(args.kwargs)

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            if args.model == "mlp":
                layers = [nn.Linear(args.inputs, args.hidden), nn.ReLU()]
                for _ in range(args.layers):
                    layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
                layers.append(nn.Linear(args.hidden, 10))
                self.net = nn.Sequential(*layers)
            else:
                self.net = nn.Sequential(nn.EmbeddingBag(args.vocab, 256, mode="mean"), nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.times: list = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.times.append(time.perf_counter() - self.t0)

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    n = args.batch * 2 * (args.steps + args.warmup)
    if args.model == "mlp":
        inputs = torch.randn(n, args.inputs, generator=g)
    else:
        inputs = torch.randint(0, args.vocab, (n, 32), generator=g)
    data = TensorDataset(inputs, torch.randint(0, 10, (n,), generator=g))
    if args.strategy == "ddplug":
        sys.path.insert(0, str(ROOT / "hosts" / "lightning" / "src"))
        import ddplug.lightning

        strategy = ddplug.lightning.DdplugStrategy(**kwargs)
    else:
        from lightning.pytorch.strategies import DDPStrategy

        if kwargs.get("process_group_backend") == "ddplug":
            sys.path.insert(0, str(ROOT / "hosts" / "lightning" / "src"))
            import ddplug  # noqa: F401  (registers torch.distributed's backend "ddplug")
        strategy = DDPStrategy(**kwargs) if kwargs else "ddp"
    devices = 2
    if args.strategy == "single":  # the floor: the same step without any gradient exchange
        strategy, devices = "auto", 1
    timer = Timer()
    model = Net()
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=args.steps + args.warmup,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[timer])
    trainer.fit(model, DataLoader(data, batch_size=args.batch, shuffle=True))
    if trainer.global_rank == 0:
        params = sum(p.numel() for p in model.parameters())
        with open(args.out, "w") as f:
            json.dump({"times": timer.times[args.warmup:], "params": params}, f)
    if hasattr(trainer.strategy, "close"):
        trainer.strategy.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="steps dropped before timing")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--inputs", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6, help="hidden x hidden layers")
    p.add_argument("--vocab", type=int, default=106496, help="embedding rows")
    p.add_argument("--models", default="embedding,mlp", help="comma-separated: embedding, mlp")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--only", default=None, help="';'-separated substrings of configuration names")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    env = dict(os.environ)
    env.setdefault("DDPLUG_BUILD_DIR", str(ROOT / "build"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "hosts" / "lightning" / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["CUDA_VISIBLE_DEVICES"] = ""
    configs = CONFIGS
    if args.only:
        keys = args.only.split(";")
        configs = [c for c in CONFIGS if any(k in c[0] for k in keys)]
    report: dict = {"batch": args.batch, "steps": args.steps, "warmup": args.warmup, "models": {}}
    for model in args.models.split(","):
        rows = []
        for name, strategy, kwargs in configs:
            rows.append(run_config(args, env, model, name, strategy, kwargs))
        report["models"][model] = rows
        print_table(args, model, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


def run_config(args: argparse.Namespace, env: dict, model: str, name: str, strategy: str, kwargs: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        cmd = [sys.executable, __file__, "--worker", "--strategy", strategy, "--kwargs", json.dumps(kwargs),
               "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", model,
               "--batch", str(args.batch), "--inputs", str(args.inputs), "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--vocab", str(args.vocab)]
        print(f"running {model}: {name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not os.path.exists(out):
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{model}: {name}: failed (exit {proc.returncode})")
        with open(out) as f:
            data = json.load(f)
    t = data["times"]
    return {"config": name, "strategy": strategy, "kwargs": kwargs, "params": data["params"], "steps": len(t),
            "median_ms": 1e3 * statistics.median(t), "mean_ms": 1e3 * statistics.mean(t),
            "min_ms": 1e3 * min(t), "max_ms": 1e3 * max(t)}


def print_table(args: argparse.Namespace, model: str, rows: list) -> None:
    base = next((r["median_ms"] for r in rows if r["config"] == "ddp (gloo), default"), None)
    best = min((r["median_ms"] for r in rows if r["strategy"] == "ddp"
                and r["kwargs"].get("process_group_backend", "gloo") == "gloo"), default=None)
    for r in rows:
        r["vs_ddp_default"] = r["median_ms"] / base if base else None
        r["vs_gloo_best"] = r["median_ms"] / best if best else None
    params = rows[0]["params"] if rows else 0
    print(f"\nLightning training step, 2 CPU ranks, {model}: {params / 1e6:.1f} M parameters"
          f" ({params * 4 / 2**20:.0f} MiB of fp32 gradients), batch {args.batch} per rank,"
          f" {args.steps} timed steps after {args.warmup} warm-up\n")
    print(f"| {'configuration':<38} | {'median ms':>9} | {'mean ms':>8} | {'min ms':>7} | {'max ms':>7} |"
          f" {'vs ddp default':>14} | {'vs gloo best':>12} |")
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 16}|{'-' * 14}|")
    for r in rows:
        vd = f"{r['vs_ddp_default']:.2f}x" if r["vs_ddp_default"] else "-"
        vb = f"{r['vs_gloo_best']:.2f}x" if r["vs_gloo_best"] else "-"
        print(f"| {r['config']:<38} | {r['median_ms']:9.1f} | {r['mean_ms']:8.1f} | {r['min_ms']:7.1f} |"
              f" {r['max_ms']:7.1f} | {vd:>14} | {vb:>12} |", flush=True)
    floor = next((r["median_ms"] for r in rows if r["strategy"] == "single"), None)
    mine = next((r["median_ms"] for r in rows if r["strategy"] == "ddplug" and not r["kwargs"]), None)
    if floor is not None and base is not None and mine is not None:
        # What each strategy adds to the step beyond its computation.
        over = {"ddp default": base - floor, "gloo best": best - floor, "ddplug": mine - floor}
        for r in rows:
            r["above_floor_ms"] = r["median_ms"] - floor
        print(f"\nexchange cost above the 1-rank floor ({floor:.1f} ms): ddp default {over['ddp default']:.1f} ms,"
              f" gloo best {over['gloo best']:.1f} ms, ddplug {over['ddplug']:.1f} ms"
              + (f" ({over['ddp default'] / over['ddplug']:.1f}x less than ddp default)" if over["ddplug"] > 0 else ""),
              flush=True)

if __name__ == "__main__":
    main()
