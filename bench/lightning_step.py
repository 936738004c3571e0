#!/usr/bin/env python3
"""lightning_step.py — time per training step of a communication-heavy model on
2 CPU ranks: Lightning's DDPStrategy (gloo) against the ddplug strategy, in one
invocation, with the same model, data and seeds.

    .venv/bin/python bench/lightning_step.py [--steps 30] [--warmup 5] [--json FILE]
                                             [--overlap] [--before TREE] [--rounds N]

Two models, both ~27 M parameters (~104 MiB of fp32 gradients per step):
  mlp        1024 -> 6 x (2048 x 2048) -> 10, batch 8 per rank: forward and
             backward take about as long as the allreduce on 2 shared cores;
  embedding  a 106,496 x 256 embedding table (dense gradients) + a linear head,
             batch 8 sequences of 32 tokens: almost no compute, the step is the
             gradient allreduce (large-vocabulary / recommendation models).
Each configuration runs as its own Lightning job (devices=2 or --devices, accelerator="cpu",
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
                               completion thread); also with bucket view, and
                               with bucket view and ddplug's communication hook
                               (ddp_comm_hook=ddplug.distributed.allreduce_hook:
                               the buckets moved into registered memory)
  ddplug (cpu)                strategy=DdplugStrategy() with the default config
                               (which initialises torch.distributed on its run:
                               Lightning then broadcasts a SIGTERM flag every step)
  ddplug (cpu), torch.dist...  the same with torch_distributed=False
  no communication (1 rank)    the same step in one process (devices=1): the floor
                               no strategy can beat; what is left above it is
                               the cost of the gradient exchange
  no communication, 2 at once  that single-process job started twice at the same
                               time (as many as --devices), timed in the first:
                               what the ranks' computations cost each other on
                               shared cores, caches and memory, before any
                               exchange (the 2-rank floor)
  bare allreduce, registered   two ranks (ddplug.Context, no Lightning) allreduce
                               (avg) the model's gradient bytes as one float32
                               tensor in registered memory, once per "step": what
                               the exchange costs with nothing around it
  bare allreduce, ordinary     the same with an ordinary tensor
With --keep-grads the model's optimizer_zero_grad keeps the gradients
(zero_grad(set_to_none=False); Lightning's default sets them to None). With --overlap also "ddplug (cpu), progress thread on" and "... off" (the cpu
plugin's plugin_options.progress_thread: whether a helper thread reduces buckets
during backward, or the caller at the end of it); with --before TREE also
"ddplug (cpu), before": the same step with the ddplug package and build of
another source tree (TREE/hosts/python, or TREE/hosts/lightning/src in older
trees; TREE/build, or --before-build), e.g. the commit before a change, for
before/after rows from one run.
With --phases every rank also cuts each step into phases (forward, zero_grad,
backward, the exchange's copy-in, start, wait and copy-out, optimizer) and the
run prints a phase table per model with wall and CPU time, page faults, and the
operators that touch gradient-sized tensors (bench/step_phases.py).
"gloo at its best" is the fastest ddp row. The table gives the median and mean step
time and the ratio to the default ddp row, and "cpu ms": rank 0's CPU time per step
(every thread of the process), less sensitive to other load than the wall time. The
machine's other load shows up as noise: compare rows of one invocation; --rounds N
runs every configuration N times, interleaved, and shows each one's best round.
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


def python_src(tree: Path) -> Path:
    """Where a source tree keeps the ddplug package (hosts/lightning/src before
    it moved to hosts/python), for --before trees of either age."""
    new = tree / "hosts" / "python"
    return new if (new / "ddplug").is_dir() else tree / "hosts" / "lightning" / "src"

CONFIGS = [
    ("ddp (gloo), default", "ddp", {}),
    ("ddp (gloo), bucket view", "ddp", {"gradient_as_bucket_view": True}),
    ("ddp (gloo), 100 MiB buckets", "ddp", {"bucket_cap_mb": 100, "gradient_as_bucket_view": True}),
    ("ddp, ddplug backend", "ddp", {"process_group_backend": "ddplug"}),
    ("ddp, ddplug backend, bucket view", "ddp", {"process_group_backend": "ddplug", "gradient_as_bucket_view": True}),
    ("ddp, ddplug backend, ddplug hook", "ddp", {"process_group_backend": "ddplug", "gradient_as_bucket_view": True,
                                                 "ddp_comm_hook": "ddplug"}),
    ("ddplug (cpu)", "ddplug", {}),
    ("ddplug (cpu), torch.distributed off", "ddplug", {"torch_distributed": False}),
    ("no communication (1 rank)", "single", {}),
    ("no communication, 2 at once", "single", {"concurrent": True}),
    ("bare allreduce, registered", "bare", {"registered": True}),
    ("bare allreduce, ordinary", "bare", {"registered": False}),
]
OVERLAP = [
    ("ddplug (cpu), progress thread on", "ddplug", {"config": {"plugin_options": {"progress_thread": "on"}}}),
    ("ddplug (cpu), progress thread off", "ddplug", {"config": {"plugin_options": {"progress_thread": "off"}}}),
]
BEFORE = ("ddplug (cpu), before", "ddplug-before", {})  # one row per --before tree


def model_params(args: argparse.Namespace) -> int:
    """Parameters of the benchmark's model (as Net builds it)."""
    if args.model == "mlp":
        return (args.inputs * args.hidden + args.hidden + args.layers * (args.hidden * args.hidden + args.hidden)
                + args.hidden * 10 + 10)
    return args.vocab * 256 + 256 * 10 + 10


def bare_worker(args: argparse.Namespace) -> None:
    """One rank of the bare allreduce: the gradient bytes as one float32 tensor."""
    import torch

    import ddplug
    from ddplug import registered_memory as registered
    from ddplug._c import _names

    torch.set_num_threads(1)
    kwargs = json.loads(args.kwargs)
    n = model_params(args)
    with ddplug.Context(framework="lightning_step bare") as ctx:
        t = registered.empty(ctx, n, torch.float32) if kwargs.get("registered") else torch.zeros(n)
        op = "avg" if ctx.plugin["op_mask"] & (1 << _names.ops()["avg"]) else "sum"
        times, cpu = [], []
        for i in range(args.steps + args.warmup):
            t.fill_(1.0)  # the gradients are written again every step
            ctx.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            ctx.allreduce(t, op)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        memory = registered.reach(ctx, t)
        if ctx.rank == 0:
            with open(args.out, "w") as f:
                json.dump({"times": times[args.warmup:], "cpu": cpu[args.warmup:], "params": n, "memory": memory}, f)
        del t


def worker(args: argparse.Namespace) -> None:
    """One Lightning job (rank 0 and, through the launcher, rank 1)."""
    if args.strategy == "bare":
        bare_worker(args)
        return
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

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            optimizer.zero_grad(set_to_none=not args.keep_grads)

    class DdplugHook(pl.Callback):
        """Registers ddplug.distributed.allreduce_hook on the DDP-wrapped model:
        Lightning's DDPStrategy registers its ddp_comm_hook on CUDA only."""

        def on_fit_start(self, trainer, module):
            import ddplug.distributed

            trainer.strategy.model.register_comm_hook(None, ddplug.distributed.allreduce_hook)

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.times: list = []
            self.cpu: list = []

        def on_train_start(self, trainer, module):
            sync = os.environ.get("BENCH_SYNC_DIR")  # concurrent single jobs start training together
            if sync:
                open(os.path.join(sync, f"ready{os.getpid()}"), "w").close()
                deadline = time.time() + 300
                while len(os.listdir(sync)) < int(os.environ["BENCH_SYNC_N"]) and time.time() < deadline:
                    time.sleep(0.005)

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    n = args.batch * args.devices * (args.steps + args.warmup)
    if args.model == "mlp":
        inputs = torch.randn(n, args.inputs, generator=g)
    else:
        inputs = torch.randint(0, args.vocab, (n, 32), generator=g)
    data = TensorDataset(inputs, torch.randint(0, 10, (n,), generator=g))
    devices = args.devices
    if args.strategy == "single":  # the floor: the same step without any gradient exchange
        strategy, devices = "auto", 1
    elif args.strategy == "ddplug":
        sys.path.insert(0, os.environ.get("DDPLUG_BENCH_SRC", str(python_src(ROOT))))
        import ddplug.lightning

        strategy = ddplug.lightning.DdplugStrategy(**kwargs)
    else:
        from lightning.pytorch.strategies import DDPStrategy

        if kwargs.get("process_group_backend") == "ddplug":
            sys.path.insert(0, str(python_src(ROOT)))
            import ddplug  # noqa: F401  (registers torch.distributed's backend "ddplug")

        hook = kwargs.pop("ddp_comm_hook", None) == "ddplug"
        strategy = DDPStrategy(**kwargs) if kwargs else "ddp"
    timer = Timer()
    callbacks: list = [timer]
    if args.strategy == "ddp" and hook:
        callbacks.append(DdplugHook())
    rec = None
    if args.phases:  # every rank cuts its steps into phases (bench/step_phases.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import step_phases

        rec = step_phases.Recorder()
        step_phases.install(rec)
        callbacks.append(step_phases.callback(rec, max(0, args.warmup - 1)))
    model = Net()
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=args.nodes, strategy=strategy,
                         max_steps=args.steps + args.warmup,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(model, DataLoader(data, batch_size=args.batch, shuffle=True))
    if rec is not None:
        skip = max(0, args.warmup - 1)  # the counting step (the last warm-up step) left no times
        with open(f"{args.out}.phases{trainer.global_rank}", "w") as f:
            json.dump({"phases": step_phases.summarize(rec.steps[skip:], rec.step_cpu[skip:],
                                                                 rec.step_helpers[skip:]), "ops": rec.ops}, f)
    if trainer.global_rank == 0:
        params = sum(p.numel() for p in model.parameters())
        with open(args.out, "w") as f:
            json.dump({"times": timer.times[args.warmup:], "cpu": timer.cpu[args.warmup:], "params": params}, f)
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
    p.add_argument("--overlap", action="store_true", help="also ddplug with the progress thread on and off")
    p.add_argument("--before", default=None,
                   help="other source trees (comma-separated) whose ddplug runs as 'before' rows")
    p.add_argument("--before-build", default=None,
                   help="the build folder of the --before tree (comma-separated, one per tree; default TREE/build)")
    p.add_argument("--devices", type=int, default=2, help="ranks (processes) of the multi-rank configurations")
    p.add_argument("--keep-grads", action="store_true",
                   help="zero_grad(set_to_none=False): gradients persist from step to step")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every configuration this many times, interleaved; report each one's best round")
    p.add_argument("--phases", action="store_true",
                   help="also cut every rank's steps into phases (forward, zero_grad, backward, copy-in, start,"
                        " wait, copy-out, optimizer; bench/step_phases.py) and print their tables")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--strategy", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    env = dict(os.environ)
    env.setdefault("DDPLUG_BUILD_DIR", str(ROOT / "build"))
    env["PYTHONPATH"] = os.pathsep.join([str(python_src(ROOT)), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["CUDA_VISIBLE_DEVICES"] = ""
    configs = list(CONFIGS)
    if args.overlap:
        configs[4:4] = OVERLAP
    if args.before:
        trees = args.before.split(",")
        builds = args.before_build.split(",") if args.before_build else [str(Path(t) / "build") for t in trees]
        if len(builds) != len(trees):
            raise SystemExit("--before-build: one build folder per --before tree")
        for tree, build in reversed(list(zip(trees, builds))):
            name = BEFORE[0] if len(trees) == 1 else f"{BEFORE[0]} ({Path(tree).name})"
            configs.insert(4, (name, BEFORE[1], {"tree": tree, "build": build}))
    if args.only:
        keys = args.only.split(";")
        configs = [c for c in configs if any(k in c[0] for k in keys)]
    report: dict = {"batch": args.batch, "steps": args.steps, "warmup": args.warmup, "models": {}}
    for model in args.models.split(","):
        runs: dict = {}
        for _ in range(args.rounds):  # interleaved: a busy moment hits every configuration alike
            for name, strategy, kwargs in configs:
                runs.setdefault(name, []).append(run_config(args, env, model, name, strategy, kwargs))
        rows = []
        for name, _, _ in configs:
            best = min(runs[name], key=lambda r: r["median_ms"])
            best["rounds_median_ms"] = [r["median_ms"] for r in runs[name]]
            rows.append(best)
        report["models"][model] = rows
        print_table(args, model, rows)
        if args.phases:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import step_phases

            step_phases.print_tables(model, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


def run_config(args: argparse.Namespace, env: dict, model: str, name: str, strategy: str, kwargs: dict) -> dict:
    env = dict(env)
    if strategy == "ddplug-before":  # the same step with another tree's package and build
        kwargs = dict(kwargs)
        tree = Path(kwargs.pop("tree")).resolve()
        build = Path(kwargs.pop("build", tree / "build")).resolve()
        env["DDPLUG_BENCH_SRC"] = str(python_src(tree))
        env["DDPLUG_BUILD_DIR"] = str(build)
        env["PYTHONPATH"] = os.pathsep.join([env["DDPLUG_BENCH_SRC"], env.get("PYTHONPATH", "")])
        env.pop("DDPLUG_PLUGIN_PATH", None)
        strategy = "ddplug"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        cmd = [sys.executable, __file__, "--worker", "--strategy", strategy, "--kwargs", json.dumps(kwargs),
               "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", model,
               "--batch", str(args.batch), "--inputs", str(args.inputs), "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--vocab", str(args.vocab), "--devices", str(args.devices)]
        if args.keep_grads:
            cmd.append("--keep-grads")
        if args.phases:
            cmd.append("--phases")
        print(f"running {model}: {name} ...", file=sys.stderr, flush=True)
        if strategy == "single" and kwargs.get("concurrent"):  # the floor, --devices jobs at once
            procs = []
            sync = os.path.join(tmp, "sync")
            os.mkdir(sync)
            for r in range(args.devices):
                c = list(cmd)
                c[c.index("--out") + 1] = out if r == 0 else os.path.join(tmp, f"times{r}.json")
                e = dict(env, BENCH_SYNC_DIR=sync, BENCH_SYNC_N=str(args.devices))
                procs.append(subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            outs = [p.communicate(timeout=1800)[0] for p in procs]
            proc = subprocess.CompletedProcess(cmd, max(p.returncode for p in procs), "".join(outs), "")
        elif strategy == "bare":  # two ranks, torchrun-style, no Lightning
            procs = []
            port = _free_port()
            for r in range(args.devices):
                e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.devices),
                         LOCAL_WORLD_SIZE=str(args.devices),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            outs = [p.communicate(timeout=1800)[0] for p in procs]
            proc = subprocess.CompletedProcess(cmd, max(p.returncode for p in procs), "".join(outs), "")
        else:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not os.path.exists(out):
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{model}: {name}: failed (exit {proc.returncode})")
        with open(out) as f:
            data = json.load(f)
        phases, ops = {}, {}
        for r in range(args.devices):
            path = f"{out}.phases{r}"
            if os.path.exists(path):
                with open(path) as f:
                    ph = json.load(f)
                phases[str(r)], ops[str(r)] = ph["phases"], ph["ops"]
    t = data["times"]
    c = data.get("cpu") or [0.0]
    return {"cpu_ms": 1e3 * statistics.median(c), "config": name, "strategy": "bare" if strategy == "bare" else
            ("ddplug-before" if "DDPLUG_BENCH_SRC" in env else strategy),
            "kwargs": kwargs, "params": data["params"], "steps": len(t),
            "median_ms": 1e3 * statistics.median(t), "mean_ms": 1e3 * statistics.mean(t),
            "min_ms": 1e3 * min(t), "max_ms": 1e3 * max(t), "memory": data.get("memory"),
            **({"phases": phases, "ops": ops} if phases else {})}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def print_table(args: argparse.Namespace, model: str, rows: list) -> None:
    base = next((r["median_ms"] for r in rows if r["config"] == "ddp (gloo), default"), None)
    best = min((r["median_ms"] for r in rows if r["strategy"] == "ddp"
                and r["kwargs"].get("process_group_backend", "gloo") == "gloo"), default=None)
    for r in rows:
        r["vs_ddp_default"] = r["median_ms"] / base if base else None
        r["vs_gloo_best"] = r["median_ms"] / best if best else None
    params = rows[0]["params"] if rows else 0
    print(f"\nLightning training step, {args.devices} CPU ranks, {model}: {params / 1e6:.1f} M parameters"
          f" ({params * 4 / 2**20:.0f} MiB of fp32 gradients), batch {args.batch} per rank,"
          f" {args.steps} timed steps after {args.warmup} warm-up"
          + (", zero_grad(set_to_none=False)" if args.keep_grads else "")
          + (f"; best of {args.rounds} interleaved rounds (by median)" if args.rounds > 1 else "") + "\n")
    print(f"| {'configuration':<38} | {'median ms':>9} | {'mean ms':>8} | {'min ms':>7} | {'max ms':>7} |"
          f" {'cpu ms':>6} | {'vs ddp default':>14} | {'vs gloo best':>12} |")
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 16}|{'-' * 14}|")
    for r in rows:
        vd = f"{r['vs_ddp_default']:.2f}x" if r["vs_ddp_default"] else "-"
        vb = f"{r['vs_gloo_best']:.2f}x" if r["vs_gloo_best"] else "-"
        print(f"| {r['config']:<38} | {r['median_ms']:9.1f} | {r['mean_ms']:8.1f} | {r['min_ms']:7.1f} |"
              f" {r['max_ms']:7.1f} | {r['cpu_ms']:6.1f} | {vd:>14} | {vb:>12} |", flush=True)
    floor = next((r["median_ms"] for r in rows if r["config"] == "no communication (1 rank)"), None)
    floor2 = next((r["median_ms"] for r in rows if r["config"] == "no communication, 2 at once"), None)
    mine = next((r["median_ms"] for r in rows if r["config"] == "ddplug (cpu)"), None)
    bare = next((r["median_ms"] for r in rows if r["config"] == "bare allreduce, registered"), None)
    before = next((r["median_ms"] for r in rows if r["strategy"] == "ddplug-before"), None)
    if floor is not None and mine is not None:
        ex = mine - floor
        line = f"\nddplug's exchange cost above the 1-rank floor: {ex:.1f} ms"
        if bare:
            line += f" = {ex / bare:.2f}x the bare registered allreduce of the gradient bytes ({bare:.1f} ms;" \
                    f" goal <= 1.5x)"
        if before is not None:
            line += f"; before: {before - floor:.1f} ms"
        if floor2 is not None:
            line += (f"\nabove the floor of {args.devices} jobs at once ({floor2:.1f} ms): {mine - floor2:.1f} ms"
                     + (f" = {(mine - floor2) / bare:.2f}x the bare registered allreduce" if bare else "")
                     + (f"; before: {before - floor2:.1f} ms" if before is not None else ""))
        if base:
            line += f"; ddplug step = {mine / base:.2f}x the ddp default (goal for mlp <= 0.5x)"
        print(line, flush=True)
    mine = next((r["median_ms"] for r in rows if r["config"] == "ddplug (cpu)"), None)
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
