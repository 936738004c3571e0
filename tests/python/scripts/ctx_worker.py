"""A torchrun-style rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment) exercising ddplug.Context directly.

    python ctx_worker.py MODE [ARGS...]

Writes $DDPLUG_TEST_OUT/rank<r>.json with what it observed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

import ddplug

OUT = os.environ["DDPLUG_TEST_OUT"]
RANK = int(os.environ["RANK"])


def write(data: dict) -> None:
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(data, f)


def collectives(ctx: ddplug.Context) -> dict:
    import torch

    w, r = ctx.world_size, ctx.rank
    res: dict = {}
    t = torch.full((5,), float(r + 1))
    ctx.allreduce(t, "sum")
    res["sum"] = t.tolist()
    t = torch.full((3,), float(r + 1), dtype=torch.float64)
    ctx.allreduce(t, "avg")
    res["avg"] = t.tolist()
    t = torch.tensor([r, -r], dtype=torch.int64)
    ctx.allreduce(t, "max")
    res["max"] = t.tolist()
    a = np.arange(4, dtype=np.int32) * (r + 1)
    ctx.allreduce(a, "min")
    res["min_np"] = a.tolist()
    b = torch.tensor([True, r == 0])
    ctx.allreduce(b, "min")  # logical and
    res["bool_and"] = b.tolist()
    x = torch.arange(6, dtype=torch.float32) if r == 1 else torch.zeros(6)
    ctx.broadcast(x, root=1)
    res["bcast"] = x.tolist()
    g = torch.empty(w * 2, dtype=torch.int64)
    ctx.allgather(torch.tensor([r, r * r]), g)
    res["gather"] = g.tolist()
    res["obj"] = ctx.broadcast_object({"hello": "from 0", "r": r} if r == 0 else None, 0)
    res["objs"] = ctx.allgather_object(("rank", r, "x" * (r * 100)))
    reqs = [ctx.iallreduce(torch.full((1000,), float(i + r)), "sum") for i in range(4)]
    outs = []
    for q in reqs:
        q.wait()
    for q in reqs:
        outs.append(q._keep == ())
    res["async_done"] = outs
    ctx.barrier()
    # the host's corner of the store (user/...)
    if r == 0:
        ctx.store.set("greeting", b"hello\x00bytes")
    res["store_get"] = ctx.store.get("greeting", 30).decode("latin-1")
    res["store_add"] = ctx.store.add("counter", r + 1)
    ctx.barrier()
    res["store_total"] = ctx.store.add("counter", 0)
    from ddplug._c import _names

    if ctx.plugin["dtype_mask"] & (1 << _names.dtypes()["bfloat16"]):
        bf = torch.full((7,), 0.5 * (r + 1), dtype=torch.bfloat16)
        ctx.allreduce(bf, "sum")
        res["bf16"] = bf.float().tolist()
    return res


def errors(ctx: ddplug.Context) -> dict:
    import torch

    res: dict = {}
    try:
        ctx.allreduce(torch.zeros(3, dtype=torch.complex64), "sum")
    except TypeError as e:
        res["complex"] = str(e)
    try:
        ctx.allreduce(torch.zeros(4, 4).t(), "sum")
    except ValueError as e:
        res["noncontig"] = str(e)
    try:
        ctx.allreduce(torch.zeros(2), "median")
    except ValueError as e:
        res["op"] = str(e)
    return res


def gradsync(ctx: ddplug.Context) -> dict:
    import torch

    from ddplug.nn.gradsync import GradientSync, broadcast_module

    torch.manual_seed(100 + ctx.rank)  # different init per rank: the broadcast fixes it
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    model.register_buffer("steps", torch.tensor([ctx.rank * 7.0]))
    broadcast_module(ctx, model)
    gs = GradientSync(ctx, model.parameters(), bucket_mb=0.01, first_bucket_mb=0.0005, average=True)
    gs.attach()
    g = torch.Generator().manual_seed(0)
    data = torch.randn(ctx.world_size * 3, 8, 32, generator=g)
    res: dict = {"buckets": gs.bucket_sizes(), "buffer": model.steps.item()}
    grads_per_step = []
    for step in range(3):
        batch = data[step * ctx.world_size + ctx.rank]
        model.zero_grad(set_to_none=(step != 1))
        loss = model(batch).pow(2).mean()
        loss.backward()
        gs.finish()
        grads_per_step.append([p.grad.detach().double().flatten().tolist() for p in model.parameters()])
    # reference: the average of every rank's local gradients, computed here from all batches
    ref_steps = []
    for step in range(3):
        acc = None
        for r in range(ctx.world_size):
            ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
            m = _functional(model, ref)
            m(data[step * ctx.world_size + r]).pow(2).mean().backward()
            gr = [p.grad.double() for p in ref]
            acc = gr if acc is None else [a + b for a, b in zip(acc, gr)]
        ref_steps.append([(a / ctx.world_size).flatten().tolist() for a in acc])
    # accumulation: two micro-batches, the first without sync
    model.zero_grad(set_to_none=True)
    with gs.no_sync():
        model(data[ctx.rank]).pow(2).mean().backward()
    local_first = [p.grad.detach().clone() for p in model.parameters()]
    model(data[ctx.world_size + ctx.rank]).pow(2).mean().backward()
    gs.finish()
    res.update({
        "grads": grads_per_step, "ref": ref_steps, "syncs": gs.syncs,
        "params": [p.detach().double().flatten().tolist() for p in model.parameters()],
        "accum": [p.grad.double().flatten().tolist() for p in model.parameters()],
        "local_first": [t.double().flatten().tolist() for t in local_first],
    })
    gs.detach()
    return res


class _Replacing:
    """An optimizer wrapper that replaces every .grad with a new tensor before
    stepping (as some optimizers do), and keeps what it assigned."""

    def __init__(self, opt) -> None:
        self.opt = opt
        self.assigned: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for group in self.opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad = p.grad.clone()
                    self.assigned[id(p)] = p.grad
        self.opt.step()


def bucketviews(ctx: ddplug.Context) -> dict:
    """Train the same model twice per case — gradients as bucket views (registered
    buckets) and the copy path — and compare the final weights bit for bit."""
    import torch

    from ddplug.distributed import native
    from ddplug.nn.gradsync import GradientSync, broadcast_module

    def make():
        torch.manual_seed(7)
        m = torch.nn.ModuleDict({
            "big": torch.nn.Linear(64, 1024),   # 260 KiB of weights: a bucket of its own
            "mid": torch.nn.Linear(1024, 48),
            "aux": torch.nn.Linear(48, 48),     # not used on every step (rank 0, even steps)
            "out": torch.nn.Linear(48, 5),
        })
        broadcast_module(ctx, m)
        return m

    def forward(m, x, step):
        h = torch.relu(m["mid"](torch.tanh(m["big"](x))))
        if ctx.rank == 0 and step % 2 == 0:
            h = h + torch.sin(m["aux"](h))
        return m["out"](h).pow(2).mean()

    g = torch.Generator().manual_seed(3)
    data = torch.randn(ctx.world_size * 12, 6, 64, generator=g)

    def train(case: str, view: bool) -> tuple:
        m = make()
        params = list(m.parameters())
        gs = GradientSync(ctx, params, bucket_mb=0.05, first_bucket_mb=0.01, average=True,
                          gradient_as_bucket_view=view, registered=view)
        gs.attach()
        base = torch.optim.Adam(params, lr=1e-2) if case == "zero" else torch.optim.SGD(params, lr=0.05,
                                                                                         momentum=0.9)
        opt = _Replacing(base) if case == "replace" else base
        info: dict = {}
        for step in range(4):
            batch = lambda i: data[(step * 2 + i) * ctx.world_size + ctx.rank]  # noqa: E731
            opt.zero_grad(set_to_none=case not in ("zero", "replace"))
            if case == "accumulate":
                with gs.no_sync():
                    forward(m, batch(0), step).backward()
            forward(m, batch(1), step).backward()
            gs.finish()
            if case == "clip":
                info.setdefault("norms", []).append(float(torch.nn.utils.clip_grad_norm_(params, 0.05)))
            if view and step == 2:
                info["memory"] = gs.bucket_memory()
                info["views"] = sum(1 for b in gs.buckets if b.flat is not None for s in b.slots
                                    if s.param.grad is not None and s.param.grad.data_ptr() == b.view(s).data_ptr())
                info["flat_params"] = sum(len(b.slots) for b in gs.buckets if not b.solo)
                info["pool"] = gs.pool_stats()
            opt.step()
        if case == "replace":
            info["copy_slots"] = sum(1 for s in gs._slots.values() if s.copy)
            info["still_assigned"] = sum(1 for p in params if p.grad is not None and opt.assigned.get(id(p)) is p.grad)
        info["rebuilt"] = gs.rebuilt
        pool = gs._pool
        info["pool_native"] = native.status().startswith("on")
        info["order"] = [[s.index for s in b.slots] for b in gs.buckets]
        gs.detach()
        info["grads_own_memory"] = all(p.grad is None or not any(
            b.flat is not None for b in gs.buckets) for p in params)
        if pool is not None:  # detach gave the pool's gradients their own memory and released its blocks
            info["pool_after"] = pool.stats()
            info["pool_holds"] = sum(1 for p in params if p.grad is not None
                                     and pool.holds(p.grad.untyped_storage().data_ptr()))
        return [p.detach().clone() for p in params], info

    res: dict = {}
    for case in ("set_to_none", "zero", "accumulate", "clip", "replace"):
        wa, ia = train(case, True)
        wb, ib = train(case, False)
        res[case] = {
            "equal": all(torch.equal(a, b) for a, b in zip(wa, wb)),
            "max_diff": max(float((a - b).abs().max()) for a, b in zip(wa, wb)),
            "view": ia, "copy": ib,
            "moved": any(not torch.equal(a, b) for a, b in zip(wa, [p.detach() for p in make().parameters()])),
        }
    return res


def syncbn(ctx: ddplug.Context) -> dict:
    """ddplug's SyncBatchNorm on this rank's share of a batch against plain
    BatchNorm on the whole batch in one process — torch.nn.SyncBatchNorm's
    definition. Ranks hold different batch sizes (an empty one with 3 ranks)."""
    import torch

    from ddplug.nn.gradsync import GradientSync, broadcast_module, check_parameters_equal
    from ddplug.nn.syncbn import SyncBatchNorm, convert_sync_batchnorm, synced_buffers

    w, r = ctx.world_size, ctx.rank
    sizes = [5, 3] if w == 2 else [5, 0, 4]
    lo, hi = sum(sizes[:r]), sum(sizes[: r + 1])
    g = torch.Generator().manual_seed(5)
    res: dict = {}

    def err(a, b) -> float:
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0

    for case, shape, momentum in (("3d", (4, 6), 0.1), ("4d", (3, 2, 5), 0.1), ("cumulative", (4, 6), None)):
        kind = torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d
        base = kind(shape[0], momentum=momentum)
        with torch.no_grad():
            base.weight.copy_(torch.rand(shape[0], generator=g) + 0.5)
            base.bias.copy_(torch.randn(shape[0], generator=g))
        mine = convert_sync_batchnorm(base)
        assert isinstance(mine, SyncBatchNorm) and mine.weight is base.weight
        ref = kind(shape[0], momentum=momentum)  # separate parameters and statistics
        ref.load_state_dict(mine.state_dict())
        worst = {"out": 0.0, "grad_x": 0.0, "grad_w": 0.0, "grad_b": 0.0}
        for step in range(2):
            full = torch.randn((sum(sizes),) + shape, generator=g) * 3 + 2
            up = torch.randn(full.shape, generator=g)
            x_ref = full.clone().requires_grad_(True)
            y_ref = ref(x_ref)
            (y_ref * up).sum().backward()
            x = full[lo:hi].clone().requires_grad_(True)
            mine.zero_grad()
            y = mine(x)
            (y * up[lo:hi]).sum().backward()  # the whole loss is the sum of every rank's
            gw, gb = mine.weight.grad.clone(), mine.bias.grad.clone()
            ctx.allreduce(gw, "sum")
            ctx.allreduce(gb, "sum")
            worst["out"] = max(worst["out"], err(y, y_ref[lo:hi]))
            worst["grad_x"] = max(worst["grad_x"], err(x.grad, x_ref.grad[lo:hi]))
            worst["grad_w"] = max(worst["grad_w"], err(gw, ref.weight.grad))
            worst["grad_b"] = max(worst["grad_b"], err(gb, ref.bias.grad))
            ref.zero_grad()
        worst["running_mean"] = err(mine.running_mean, ref.running_mean)
        worst["running_var"] = err(mine.running_var, ref.running_var)
        worst["batches"] = [int(mine.num_batches_tracked), int(ref.num_batches_tracked)]
        mine.eval()
        ref.eval()
        probe = torch.randn((3,) + shape, generator=g)
        worst["eval_out"] = err(mine(probe), ref(probe))  # running statistics, no collective
        res[case] = worst

    # In a model, with the bucketed gradient sync running during the same backward
    # (the BatchNorm allreduces interleave with the buckets' asynchronous ones).
    torch.manual_seed(7 + r)  # different init per rank: the broadcast fixes it
    ref_model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 2))
    model = convert_sync_batchnorm(torch.nn.Sequential(*[type(m)(*_ctor(m)) for m in ref_model]))
    broadcast_module(ctx, model)
    ref_model.load_state_dict(model.state_dict())
    gs = GradientSync(ctx, model.parameters(), bucket_mb=0.001, first_bucket_mb=0.0005, average=True)
    gs.attach()
    per = 4
    worst = 0.0
    for step in range(3):
        full = torch.randn(per * w, 6, generator=g)
        model.zero_grad()
        model(full[r * per:(r + 1) * per]).pow(2).mean().backward()
        gs.finish()
        ref_model.zero_grad()
        out = ref_model(full).pow(2)
        torch.stack([out[k * per:(k + 1) * per].mean() for k in range(w)]).mean().backward()
        for p, q in zip(model.parameters(), ref_model.parameters()):
            worst = max(worst, err(p.grad, q.grad))
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref_model.parameters()):
                p.sub_(0.1 * p.grad)
                q.sub_(0.1 * q.grad)
    gs.detach()
    res["model_grads"] = worst
    res["model_buckets"] = len(gs.buckets)
    res["model_running_mean"] = err(model[1].running_mean, ref_model[1].running_mean)
    buffers = list(synced_buffers(model))
    res["synced_buffers"] = len(buffers)
    check_parameters_equal(ctx, model.parameters(), 3, buffers)  # equal everywhere: passes
    if r == 1:
        with torch.no_grad():
            model[4].running_mean.add_(0.25)
    try:
        check_parameters_equal(ctx, model.parameters(), 4, synced_buffers(model))
    except ddplug.errors.ParametersDiffer as e:
        res["drift"] = str(e)
    return res


def _ctor(m) -> tuple:
    import torch

    return (m.in_features, m.out_features) if isinstance(m, torch.nn.Linear) else \
        (m.num_features,) if isinstance(m, torch.nn.BatchNorm1d) else ()


def _functional(model, params: list):
    import torch

    names = [n for n, _ in model.named_parameters()]

    def f(x):
        return torch.func.functional_call(model, dict(zip(names, params)), (x,))
    return f


def runonce(ctx: ddplug.Context, scope: str, fail: bool) -> dict:
    calls = os.path.join(OUT, f"calls-{scope}.txt")
    done = os.path.join(OUT, f"done-{scope}-{ctx.node_rank if scope == 'node' else 0}.txt")

    def work() -> dict:
        with open(calls, "a") as f:
            f.write(f"{ctx.rank}\n")
        time.sleep(1.0)  # the others are most likely waiting by now (what is checked does not need it)
        if fail:
            raise KeyError(f"no shard for node {ctx.node_rank}")
        with open(done, "w") as f:
            f.write("x")
        return {"node": ctx.node_rank, "runner": ctx.rank}

    res: dict = {"node_rank": ctx.node_rank, "local_rank": ctx.local_rank, "num_nodes": ctx.num_nodes}
    try:
        res["value"] = ddplug.run_once(work, scope=scope, name=f"work-{scope}")
    except ddplug.RunOnceFailed as e:
        res["failed"] = str(e)
        res["runner_text"] = e.runner_text
    except KeyError as e:
        res["raised_here"] = repr(e)
    # returned only once the work was done: its last act is there to see
    res["work_done_seen"] = os.path.exists(done)
    # a name that completed returns its recorded outcome at once, work not repeated
    try:
        res["again"] = ddplug.run_once(work, scope=scope, name=f"work-{scope}")
    except (ddplug.RunOnceFailed, KeyError) as e:
        res["again_failed"] = type(e).__name__
    # the context-manager form: the runner's block is done when the others enter theirs
    marker = os.path.join(OUT, f"cm-{scope}-{ctx.node_rank if scope == 'node' else 0}.txt")
    with ddplug.once(f"cm-{scope}", scope) as runner:
        res["cm_runner"] = runner
        if runner:
            time.sleep(0.5)
            with open(marker, "w") as f:
                f.write("x")
        res["cm_file_seen"] = os.path.exists(marker)
    return res


def runner_dies(ctx: ddplug.Context) -> dict:
    """Node scope on two "nodes": the runner of node 1 dies inside the work; its
    node's other rank must learn it (PEER_LOST) long before its timeout."""
    if ctx.node_rank == 1 and ctx.local_rank == 0:
        # node 0 finishes its own run_once first: this death ends the run, and a
        # node-0 rank still inside its run_once would (rightly) see PEER_LOST
        for r in (0, 1):
            ctx.store.get(f"node0-done-{r}", 60)
        with ddplug.once("doomed", "node") as runner:
            assert runner
            write({"dying": True, "rank": ctx.rank})
            os._exit(3)
    t0 = time.monotonic()
    try:
        with ddplug.once("doomed", "node", timeout_s=60) as runner:
            pass
        if ctx.node_rank == 0:
            ctx.store.set(f"node0-done-{ctx.rank}", b"1")
        return {"outcome": "ok", "runner": runner}
    except ddplug.DdplugError as e:
        return {"outcome": e.name, "message": str(e), "waited": time.monotonic() - t0}


def iterable_stop(ctx: ddplug.Context) -> dict:
    """An audited iterable stream whose key ddplug found itself (WebDataset's
    "__key__"): rank 0's batches lost it in a map, the last rank gets no batch at
    all, two passes. Every rank must stop auditing together."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from ddplug.data.iterable import IdAudit

    class Items(IterableDataset):
        def __iter__(self):
            n = 6 if ctx.rank == 0 else 0 if ctx.rank == ctx.world_size - 1 else 2
            return iter([torch.tensor([float(i)]) for i in range(n)])

    warned: list = []
    audit = IdAudit(ctx, "train", "__key__", 6, evaluation=False, should_audit=lambda: True,
                    on_report=lambda report: None, explain=lambda exc: exc, declared=False,
                    warn=warned.append)
    loader = DataLoader(Items(), batch_size=2)
    audit.attach(loader)
    t0 = time.monotonic()
    seen = [sum(len(b) for b in loader) for _ in range(2)]
    return {"seen": seen, "stopped": audit.stopped, "warnings": warned, "reports": len(audit.reports),
            "seconds": time.monotonic() - t0}


def main() -> None:
    mode = sys.argv[1]
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].startswith("{") else None
    try:
        ctx = ddplug.Context(config, framework="test")
        ddplug.context.set_current(ctx)
        if mode == "collectives":
            res = collectives(ctx)
        elif mode == "errors":
            res = errors(ctx)
        elif mode == "gradsync":
            res = gradsync(ctx)
        elif mode == "syncbn":
            res = syncbn(ctx)
        elif mode == "bucketviews":
            res = bucketviews(ctx)
        elif mode.startswith("runonce-"):
            _, scope, what = mode.split("-")
            res = runonce(ctx, scope, what == "fail")
        elif mode == "runner-dies":
            res = runner_dies(ctx)
        elif mode == "iterable-stop":
            res = iterable_stop(ctx)
        else:
            raise SystemExit(f"unknown mode {mode}")
        res.update({"rank": ctx.rank, "world_size": ctx.world_size, "plugin": ctx.plugin["name"]})
        write(res)
    except Exception as exc:
        write({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise
    try:
        ctx.close()
    except ddplug.DdplugError as exc:
        print(f"rank {RANK}: close: {exc}", flush=True)
        sys.exit(4)


if __name__ == "__main__":
    main()
