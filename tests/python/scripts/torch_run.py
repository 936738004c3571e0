"""One plain-PyTorch rank on torch.distributed's "ddplug" backend (no Lightning):
the init calls of real trainers, every collective against its expected value,
torch's DistributedDataParallel, torchmetrics, SpeechBrain's run_on_main
pattern, ddplug.torch, and failures.

    python torch_run.py SCENARIO [--init coqui|speechbrain] ...

Started torchrun-style by tests/python/conftest.py::run_ranks (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). Each rank writes
$DDPLUG_TEST_OUT/rank<r>.json: {"checks": {name: [ok, detail]}, ...} or, when it
failed, {"type", "error"}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist

import ddplug  # noqa: F401  (registers the backend "ddplug")

OUT = os.environ["DDPLUG_TEST_OUT"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
checks: dict = {}
result: dict = {"checks": checks}


def write() -> None:
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(result, f)


def check(name: str, ok: bool, detail: object = "") -> None:
    checks[name] = [bool(ok), str(detail)[:500]]


def wait_for_file(path: str, limit_s: float = 120.0) -> None:
    """Until another rank has written path (limit_s: a hang guard)."""
    end = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


# ---- the init calls of real trainers, with the backend from their config ----------
def coqui_init() -> None:
    """coqui-tts-trainer's init_distributed(rank, num_gpus, group_name,
    dist_backend, dist_url) (its CUDA lines left out: it asserts a GPU), with
    dist_backend and dist_url from its config; the trainer passes any backend
    name through to init_process_group."""
    config = {"distributed_backend": "ddplug", "distributed_url": f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"}
    dist.init_process_group(config["distributed_backend"], init_method=config["distributed_url"],
                            world_size=WORLD, rank=RANK, group_name="group_coqui")


def speechbrain_init() -> None:
    """The init_process_group call of speechbrain 1.x's utils/distributed.py
    ddp_init_group: env:// with the backend from run_opts and a 7200 s timeout.
    (ddp_init_group itself first checks the name against nccl, gloo and mpi and
    raises "ddplug communication protocol doesn't exist." for any other: a
    SpeechBrain recipe calls ddplug.torch.init() instead of ddp_init_group.)"""
    run_opts = {"distributed_backend": "ddplug"}
    dist.init_process_group(backend=run_opts["distributed_backend"], rank=RANK,
                            timeout=datetime.timedelta(seconds=7200))


def reduce_tensor(tensor: torch.Tensor, num_gpus: int) -> torch.Tensor:  # coqui trainer/utils/distributed.py
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.reduce_op.SUM)
    rt /= num_gpus
    return rt


def if_main_process() -> bool:  # speechbrain.utils.distributed
    return int(os.environ.get("RANK", "0")) == 0


def ddp_barrier() -> None:  # speechbrain.utils.distributed
    if not dist.is_initialized():
        return
    if dist.get_backend() == dist.Backend.NCCL:
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def run_on_main(func, args=None, kwargs=None) -> None:  # speechbrain.utils.distributed
    if if_main_process():
        func(*(args or []), **(kwargs or {}))
    ddp_barrier()


# ---- collectives -------------------------------------------------------------------
def collectives() -> None:
    r, w = RANK, WORLD
    ar = sum(range(1, w + 1))

    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    check("all_reduce sum", close(t, torch.full((5,), float(ar))), t)
    loss = reduce_tensor(torch.tensor([float(r + 1)]), w)  # the deprecated dist.reduce_op.SUM
    check("coqui reduce_tensor", close(loss, torch.tensor([ar / w])), loss)
    for op, dtype, make, want in [
        (dist.ReduceOp.AVG, torch.float64, lambda: torch.full((3,), float(r + 1), dtype=torch.float64),
         torch.full((3,), ar / w, dtype=torch.float64)),
        (dist.ReduceOp.MAX, torch.int64, lambda: torch.tensor([r, -r]), torch.tensor([w - 1, 0])),
        (dist.ReduceOp.MIN, torch.int32, lambda: torch.tensor([r, -r], dtype=torch.int32),
         torch.tensor([0, -(w - 1)], dtype=torch.int32)),
        (dist.ReduceOp.PRODUCT, torch.float32, lambda: torch.tensor([float(r + 1)]),
         torch.tensor([float(torch.arange(1, w + 1).prod())])),
        (dist.ReduceOp.BOR, torch.int32, lambda: torch.tensor([1 << r], dtype=torch.int32),
         torch.tensor([(1 << w) - 1], dtype=torch.int32)),
        (dist.ReduceOp.BAND, torch.uint8, lambda: torch.tensor([0xFF ^ (1 << r)], dtype=torch.uint8),
         torch.tensor([0xFF ^ ((1 << w) - 1)], dtype=torch.uint8)),
        (dist.ReduceOp.SUM, torch.float16, lambda: torch.full((4,), 0.5 * (r + 1), dtype=torch.float16),
         torch.full((4,), 0.5 * ar, dtype=torch.float16)),
        (dist.ReduceOp.SUM, torch.bfloat16, lambda: torch.full((4,), float(r + 1), dtype=torch.bfloat16),
         torch.full((4,), float(ar), dtype=torch.bfloat16)),
        (dist.ReduceOp.SUM, torch.bool, lambda: torch.tensor([r == 0, False]), torch.tensor([True, False])),
        (dist.ReduceOp.PRODUCT, torch.bool, lambda: torch.tensor([True, r == 0]), torch.tensor([True, False])),
    ]:
        t = make()
        dist.all_reduce(t, op=op)
        check(f"all_reduce {op} {dtype}", t.dtype == dtype and torch.equal(t, want), t)
    # non-contiguous: staged through a contiguous copy and copied back
    m = torch.arange(12, dtype=torch.float32).view(3, 4) * (r + 1)
    col = m[:, 1]
    dist.all_reduce(col)
    check("all_reduce non-contiguous", close(m[:, 1], torch.tensor([1.0, 5.0, 9.0]) * ar) and m[0, 0] == 0, m)

    b = torch.arange(6, dtype=torch.float32) if r == w - 1 else torch.zeros(6)
    dist.broadcast(b, src=w - 1)
    check("broadcast", close(b, torch.arange(6, dtype=torch.float32)), b)

    outs = [torch.zeros(2) for _ in range(w)]
    dist.all_gather(outs, torch.full((2,), float(r)))
    check("all_gather", all(close(o, torch.full((2,), float(i))) for i, o in enumerate(outs)), outs)
    outs = [torch.zeros(i + 1) for i in range(w)]  # uneven: one broadcast per rank
    dist.all_gather(outs, torch.full((r + 1,), float(r)))
    check("all_gather uneven", all(close(o, torch.full((i + 1,), float(i))) for i, o in enumerate(outs)), outs)
    o = torch.zeros(w * 3, dtype=torch.int64)
    dist.all_gather_into_tensor(o, torch.full((3,), r, dtype=torch.int64))
    check("all_gather_into_tensor", torch.equal(o, torch.arange(w).repeat_interleave(3)), o)

    x = torch.arange(w * 2, dtype=torch.float32) + r
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, x)
    want = (torch.arange(w * 2, dtype=torch.float32) * w + sum(range(w)))[r * 2:(r + 1) * 2]
    check("reduce_scatter_tensor", close(o, want), o)
    o = torch.zeros(2)
    dist.reduce_scatter(o, [torch.full((2,), float(i * 10 + r)) for i in range(w)])
    check("reduce_scatter", close(o, torch.full((2,), float(r * 10 * w + sum(range(w))))), o)

    t = torch.tensor([float(r + 1)])
    dist.reduce(t, dst=1)
    check("reduce", t.item() == (ar if r == 1 else r + 1), t)
    g = [torch.zeros(2) for _ in range(w)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    check("gather", r != 0 or all(close(x, torch.full((2,), float(i))) for i, x in enumerate(g)), g)
    s = torch.zeros(2)
    dist.scatter(s, [torch.full((2,), 100.0 + i) for i in range(w)] if r == 0 else None, src=0)
    check("scatter", close(s, torch.full((2,), 100.0 + r)), s)

    o = torch.zeros(w)
    dist.all_to_all_single(o, torch.arange(w, dtype=torch.float32) + 10 * r)
    check("all_to_all_single", close(o, torch.arange(w, dtype=torch.float32) * 10 + r), o)
    # uneven: rank r sends j+1 rows to rank j; receives r+1 rows from every rank
    ins = torch.cat([torch.full((j + 1, 2), float(100 * r + j)) for j in range(w)])
    o = torch.zeros((r + 1) * w, 2)
    dist.all_to_all_single(o, ins, output_split_sizes=[r + 1] * w, input_split_sizes=[j + 1 for j in range(w)])
    want = torch.cat([torch.full((r + 1, 2), float(100 * j + r)) for j in range(w)])
    check("all_to_all_single uneven", close(o, want), o)
    outs = [torch.zeros(1) for _ in range(w)]
    dist.all_to_all(outs, [torch.tensor([float(10 * r + j)]) for j in range(w)])
    check("all_to_all", all(close(x, torch.tensor([float(10 * j + r)])) for j, x in enumerate(outs)), outs)

    objs = [None] * w
    dist.all_gather_object(objs, {"rank": r, "pad": "x" * (50 * r)})
    check("all_gather_object", [o["rank"] for o in objs] == list(range(w)), objs)
    lst = [f"from {r}", r] if r == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    check("broadcast_object_list", lst == ["from 1", 1], lst)
    got = [None] if r != 0 else [None]
    dist.scatter_object_list(got, [{"to": i} for i in range(w)] if r == 0 else None, src=0)
    check("scatter_object_list", got[0] == {"to": r}, got)
    dist.barrier()
    check("barrier", True)
    # torch's monitored_barrier refuses any backend but gloo; the group's own method (what
    # torch's suite calls) waits for every rank in the store, as gloo's does
    dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=60))
    check("monitored_barrier, every rank", True)

    # all_gather_coalesced: output lists are [rank][input], as torch passes them (with as
    # many inputs as ranks, the transposed layout gave a silently wrong result)
    ins = [torch.full((2,), float(10 * r + i)) for i in range(w)]
    outs = [[torch.zeros(2) for _ in range(w)] for _ in range(w)]
    dist.all_gather_coalesced(outs, ins)
    check("all_gather_coalesced", all(close(outs[j][i], torch.full((2,), float(10 * j + i)))
                                      for j in range(w) for i in range(w)), outs)
    # sparse tensors are summed as gloo does (indices and values gathered, coalesced)
    sp = torch.sparse_coo_tensor(torch.tensor([[r, w]]), torch.tensor([1.0, float(r)]), (w + 1,))
    dist.all_reduce(sp)
    want = torch.zeros(w + 1)
    want[:w] = 1.0
    want[w] = float(sum(range(w)))
    check("sparse all_reduce", sp.is_sparse and close(sp.to_dense(), want), sp)
    try:
        dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (2,)),
                        op=dist.ReduceOp.MAX)
        check("sparse MAX refused", False, "no error")
    except dist.DistBackendError as e:
        check("sparse MAX refused", isinstance(e, ddplug.Unsupported) and "ReduceOp.SUM" in str(e), e)

    # point-to-point: a ring (send/recv), any source, tags out of order, isend/irecv and
    # batch_isend_irecv of 1 MiB both ways (larger than the eager size)
    nxt, prv = (r + 1) % w, (r - 1) % w
    got = torch.zeros(3)
    if r % 2 == 0:
        dist.send(torch.full((3,), float(r)), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(torch.full((3,), float(r)), nxt)
    check("send/recv ring", close(got, torch.full((3,), float(prv))), got)
    # a tag of its own: with tag 0, a rank that has sent its one float goes on to the 1 MiB
    # batch below, whose send to rank 0 (tag 0) an any-source receive may rightly match
    # before the slower rank's float arrives (a Mismatch, in 1 of ~10 loaded CI runs)
    if r == 0:
        froms = sorted(dist.recv(torch.zeros(1), tag=5) for _ in range(w - 1))
        check("recv from any source", froms == list(range(1, w)), froms)
    else:
        dist.send(torch.tensor([float(r)]), 0, tag=5)
    a, b = torch.zeros(2), torch.zeros(2)
    if r == 0:
        dist.send(torch.full((2,), 1.0), 1, tag=1)
        dist.send(torch.full((2,), 2.0), 1, tag=2)
    elif r == 1:
        dist.recv(b, 0, tag=2)
        dist.recv(a, 0, tag=1)
        check("tags taken out of order", close(a, torch.full((2,), 1.0)) and close(b, torch.full((2,), 2.0)), (a, b))
    big_out, big_in = torch.arange(1 << 18, dtype=torch.float32) + r, torch.zeros(1 << 18)
    ops = [dist.P2POp(dist.isend, big_out, nxt), dist.P2POp(dist.irecv, big_in, prv)]
    works = dist.batch_isend_irecv(ops)
    for wk in works:
        wk.wait()
    check("batch_isend_irecv 1 MiB", close(big_in, torch.arange(1 << 18, dtype=torch.float32) + prv), big_in[:3])
    x = torch.zeros(1)
    wk = dist.irecv(x, src=prv, tag=9)
    dist.isend(torch.tensor([float(r)]), nxt, tag=9).wait()
    wk.wait()
    check("isend/irecv", x.item() == float(prv) and wk.is_completed(), x)
    try:
        dist.send(torch.ones(1), dst=r)
        check("send to itself refused", False, "no error")
    except (ValueError, dist.DistBackendError) as e:
        check("send to itself refused", "itself" in str(e) or "same as the rank" in str(e), e)

    # refusals: an error naming the op and what to use, never a wrong result
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BXOR)
        check("BXOR refused", False, "no error")
    except dist.DistBackendError as e:
        check("BXOR refused", isinstance(e, ddplug.Unsupported) and "torch.bitwise_xor" in str(e), e)
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
        check("int16 refused", False, "no error")
    except dist.DistBackendError as e:
        check("int16 refused", "int16" in str(e) and "float32" in str(e), e)


def works() -> None:
    """Work objects: asynchronous requests, wait(timeout), is_completed, futures."""
    r = RANK
    ws = [dist.all_reduce(torch.full((1000,), float(i + r)), async_op=True) for i in range(4)]
    check("async works", all(w.wait() for w in ws) and all(w.is_completed() for w in ws))
    t = torch.ones(3)
    fut = dist.all_reduce(t, async_op=True).get_future()
    val = fut.then(lambda f: f.value()[0] * 2).wait()
    check("get_future", close(val, torch.full((3,), 2.0 * WORLD)) and close(t, torch.full((3,), float(WORLD))), val)
    # rank 0 waits 100 ms for an allreduce the others join only once that wait
    # has timed out (a marker file): the collective stays pending and completes
    # on the next wait
    timed_out = os.path.join(OUT, "async-wait-timed-out")
    if r != 0:
        wait_for_file(timed_out)
    t = torch.ones(2)
    w = dist.all_reduce(t, async_op=True)
    if r == 0:
        pending = not w.is_completed()
        try:
            w.wait(timeout=datetime.timedelta(milliseconds=100))
            check("wait timeout", False, "no timeout")
        except dist.DistBackendError as e:
            check("wait timeout", pending and isinstance(e, TimeoutError) and "still pending" in str(e), e)
        with open(timed_out, "w") as f:
            f.write("x")
    check("wait after timeout", w.wait() and close(t, torch.full((2,), float(WORLD))), t)


# ---- torch's DistributedDataParallel over ddplug --------------------------------------
def ddp(device: torch.device = torch.device("cpu")) -> None:
    """Gradients and two SGD steps of DDP over ddplug equal single-process
    whole-batch ones (the batch split evenly over the ranks)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    ref.load_state_dict(model.state_dict())
    if RANK != 0:  # DDP broadcasts rank 0's parameters: the others start elsewhere
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    # tiny buckets: several asynchronous allreduces per backward, completed through futures
    ids = [device] if device.type == "cuda" else None
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=0.0002)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * WORLD * 2, 8, generator=g).to(device)
    y = torch.randn(4 * WORLD * 2, 1, generator=g).to(device)
    opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    grads_ok = []
    for step in range(2):
        xb, yb = x[step::2], y[step::2]
        mine = slice(RANK * 4, (RANK + 1) * 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(xb[mine]), yb[mine]).backward()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(xb), yb).backward()
        grads_ok.append(all(close(p.grad, q.grad, 1e-5) for p, q in zip(model.parameters(), ref.parameters())))
        opt.step()
        ref_opt.step()
    check("ddp gradients equal whole-batch gradients", all(grads_ok), grads_ok)
    check("ddp parameters equal single-process SGD",
          all(close(p, q, 1e-5) for p, q in zip(model.parameters(), ref.parameters())))


def ddp_hook() -> list:
    """ddplug.distributed.allreduce_hook: DDP's buckets moved into registered
    memory and reduced there; the parameters equal hook-less DDP's, bit for bit
    on 2 ranks (the mean's two orders agree when the world size is a power of
    two), within rounding on 3; set_to_none and kept gradients both. Returns
    (grad, its values) pairs for the check after the group is destroyed."""
    from ddplug import _native
    from ddplug import registered_memory as registered
    from ddplug.distributed import allreduce_hook, context_of
    from ddplug.distributed import hooks

    def make() -> torch.nn.Module:
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                   torch.nn.Tanh(), torch.nn.Linear(256, 1))

    plain = torch.nn.parallel.DistributedDataParallel(make(), bucket_cap_mb=0.1)
    hooked = torch.nn.parallel.DistributedDataParallel(make(), bucket_cap_mb=0.1, gradient_as_bucket_view=True)
    hooked.register_comm_hook(None, allreduce_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (plain, hooked)]
    g = torch.Generator().manual_seed(11 + RANK)
    for step in range(5):
        x, y = torch.randn(6, 64, generator=g), torch.randn(6, 1, generator=g)
        for m, opt in zip((plain, hooked), opts):
            opt.zero_grad(set_to_none=step < 3)
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    pa, pb = list(plain.parameters()), list(hooked.parameters())
    if WORLD & (WORLD - 1) == 0:
        check("ddp hook: parameters bit-identical to DDP without it", all(torch.equal(a, b) for a, b in zip(pa, pb)),
              max(float((a - b).abs().max()) for a, b in zip(pa, pb)))
    else:
        check("ddp hook: parameters equal DDP without it", all(close(a, b, 1e-5) for a, b in zip(pa, pb)))
    ctx = context_of()
    if _native.load() is not None:
        reach = [registered.reach(ctx, p.grad) for p in pb]
        st = hooks.stats(ctx)
        check("ddp hook: every bucket (and .grad, a bucket view) in registered memory",
              reach == ["registered"] * len(pb) and st.get("moved", 0) >= 2 and st.get("kept") == 0, (reach, st))
    else:
        check("ddp hook: the native module is on (a source build)", False, _native.status())
    # sparse buckets (nn.Embedding(sparse=True)): torch's own hook, the same gradients
    embs = []
    for hook in (False, True):
        torch.manual_seed(5)
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(40, 4, sparse=True))
        if hook:
            m.register_comm_hook(None, allreduce_hook)
        m(torch.tensor([RANK, 7, 30 + RANK])).sum().backward()
        embs.append(m.module.weight.grad.to_dense())
    check("ddp hook: sparse gradients as without it", close(embs[0], embs[1], 1e-6), embs)
    return [(p.grad, p.grad.clone()) for p in pb]


# ---- torchmetrics ----------------------------------------------------------------------
def metrics(device: torch.device = torch.device("cpu")) -> None:
    """torchmetrics syncs through ddplug: every rank's compute() equals the
    single-process value (uneven shards: 13 samples over the ranks)."""
    import torchmetrics
    from torchmetrics.classification import BinaryAccuracy

    g = torch.Generator().manual_seed(7)
    preds, target = torch.rand(13, generator=g).to(device), torch.randint(0, 2, (13,), generator=g).to(device)
    vals = torch.randn(13, generator=g).to(device)
    mine = slice(RANK, None, WORLD)
    acc, mean, cat = BinaryAccuracy().to(device), torchmetrics.MeanMetric().to(device), torchmetrics.CatMetric().to(device)
    acc.update(preds[mine], target[mine])
    mean.update(vals[mine])
    cat.update(vals[mine])
    single = BinaryAccuracy().to(device)(preds, target)
    check("torchmetrics BinaryAccuracy", close(acc.compute(), single), (acc.compute(), single))
    check("torchmetrics MeanMetric", close(mean.compute(), vals.mean(), 1e-5), mean.compute())
    got = cat.compute()
    check("torchmetrics CatMetric (uneven all_gather)", close(got.sort().values, vals.sort().values), got)


def prepare_on_main() -> None:
    """SpeechBrain's data preparation on the main process behind a barrier."""
    marker = os.path.join(OUT, "prepared.txt")

    def prepare(path: str) -> None:
        time.sleep(0.5)  # slow shared file system
        with open(path, "w") as f:
            f.write("ready")

    run_on_main(prepare, args=[marker])
    check("run_on_main: the others waited for the preparation", os.path.exists(marker))


def subgroup() -> None:
    group = dist.new_group([0, 1], backend="ddplug")
    t = torch.tensor([float(RANK + 1)])
    if RANK in (0, 1):
        dist.all_reduce(t, group=group)
        check("new_group", t.item() == 3.0, t)
        dist.destroy_process_group(group)
    dist.barrier()


def client(init: str) -> None:
    coqui_init() if init == "coqui" else speechbrain_init()
    result["backend"] = dist.get_backend()
    result["group"] = repr(dist.group.WORLD)
    collectives()
    works()
    ddp()
    kept = ddp_hook()
    metrics()
    prepare_on_main()
    subgroup()
    dist.destroy_process_group()
    check("ddp hook: the buckets keep their values once the group is gone",
          all(torch.equal(g, v) for g, v in kept))


# ---- CUDA tensors on the nccl plugin ---------------------------------------------------------
def gpu() -> None:
    """CUDA tensors: collectives on the current stream (also a side stream),
    async Work and futures holding CUDA tensors, CPU tensors staged through the
    GPU (object collectives), DDP with device_ids, torchmetrics on the GPU."""
    from ddplug.distributed import context_of

    local = int(os.environ.get("LOCAL_RANK", RANK))
    dev = torch.device("cuda", int(os.environ.get("DDPLUG_TEST_CUDA_DEVICE", local % torch.cuda.device_count())))
    torch.cuda.set_device(dev)
    dist.init_process_group("ddplug")
    ctx = context_of()
    result["plugin"] = ctx.plugin["name"]
    r, w = RANK, WORLD
    ar = float(sum(range(1, w + 1)))
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        t = torch.full((1 << 16,), r + 1, dtype=dtype, device=dev)
        dist.all_reduce(t)
        check(f"cuda all_reduce {dtype}", bool((t == ar).all()), t[:4])
    t = torch.full((1000,), float(r + 1), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check("cuda all_reduce AVG", close(t, torch.full_like(t, ar / w)), t[:4])
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32, device=dev), op=dist.ReduceOp.BOR)
        check("BOR refused on nccl", ctx.plugin["name"] != "nccl", "no error")
    except dist.DistBackendError as e:
        check("BOR refused on nccl", "no bor op" in str(e) and "torch.bitwise_or" in str(e), e)
    b = torch.arange(8, dtype=torch.float32, device=dev) if r == 0 else torch.zeros(8, device=dev)
    dist.broadcast(b, src=0)
    check("cuda broadcast", close(b, torch.arange(8, dtype=torch.float32, device=dev)), b)
    o = torch.zeros(w * 4, device=dev)
    dist.all_gather_into_tensor(o, torch.full((4,), float(r), device=dev))
    check("cuda all_gather_into_tensor", close(o, torch.arange(w, device=dev).float().repeat_interleave(4)), o)
    o = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(o, torch.arange(2 * w, dtype=torch.float32, device=dev))
    check("cuda reduce_scatter_tensor", close(o, torch.arange(2 * w, device=dev).float()[2 * r:2 * r + 2] * w), o)
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):  # enqueued after the fill on the same (side) stream
        t = torch.full((1 << 20,), float(r + 1), device=dev)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        total = t.sum()
    torch.cuda.synchronize(dev)
    check("cuda async on a side stream", float(total) == ar * (1 << 20), total)
    fut = dist.all_reduce(torch.ones(4, device=dev), async_op=True).get_future()
    v = fut.wait()[0]
    check("cuda future", v.is_cuda and close(v, torch.full((4,), float(w), device=dev)), v)
    objs = [None] * w
    dist.all_gather_object(objs, {"rank": r})
    check("object collective (CPU tensors staged)", [o["rank"] for o in objs] == list(range(w)), objs)
    t = torch.full((3,), float(r + 1))  # a CPU tensor on the nccl plugin
    dist.all_reduce(t)
    check("cpu tensor on nccl", close(t, torch.full((3,), ar)), t)
    if w > 1:
        gpu_p2p(dev)
    ddp(dev)
    metrics(dev)
    if w > 1:
        sync_batchnorm(dev)
    dist.destroy_process_group()


def gpu_p2p(dev: torch.device) -> None:
    """Point-to-point with CUDA tensors (ncclSend/ncclRecv): a ring with
    batch_isend_irecv (fused), blocking send/recv in rank order, and isend/irecv
    of 16 MiB (beyond NCCL's buffers)."""
    r, w = RANK, WORLD
    nxt, prv = (r + 1) % w, (r - 1) % w
    got = torch.zeros(1 << 16, device=dev)
    ops = [dist.P2POp(dist.isend, torch.full((1 << 16,), float(r), device=dev), nxt),
           dist.P2POp(dist.irecv, got, prv)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    check("cuda batch_isend_irecv ring", close(got, torch.full_like(got, float(prv))), got[:4])
    small = torch.zeros(3, device=dev)
    if r == 0:
        dist.send(torch.full((3,), 5.0, device=dev), nxt)
        dist.recv(small, prv)
    else:
        dist.recv(small, prv)
        dist.send(torch.full((3,), 5.0, device=dev), nxt)
    check("cuda send/recv in order", close(small, torch.full((3,), 5.0, device=dev)), small)
    big = torch.full((4 << 20,), float(r + 1), device=dev) if r == 0 else torch.zeros(4 << 20, device=dev)
    if r == 0:
        dist.isend(big, 1).wait()
    elif r == 1:
        dist.irecv(big, 0).wait()
        check("cuda 16 MiB irecv", bool((big == 1.0).all()), big[:4])


def sync_batchnorm(dev: torch.device) -> None:
    """torch.nn.SyncBatchNorm (CUDA only, in torch) over ddplug: outputs, input
    gradients and running statistics equal BatchNorm's over the whole batch."""
    torch.manual_seed(0)
    bn = torch.nn.SyncBatchNorm(4).to(dev)
    ref = torch.nn.BatchNorm1d(4).to(dev)
    ref.load_state_dict(bn.state_dict())
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(6 * WORLD, 4, generator=g) * 3 + 1).to(dev)
    wts = torch.randn(6 * WORLD, 4, generator=g).to(dev)
    mine = slice(RANK * 6, (RANK + 1) * 6)
    xm, xa = x[mine].clone().requires_grad_(), x.clone().requires_grad_()
    out = bn(xm)
    (out * wts[mine]).sum().backward()
    ref_out = ref(xa)
    (ref_out * wts).sum().backward()
    check("SyncBatchNorm output", close(out, ref_out[mine], 1e-4), (out - ref_out[mine]).abs().max())
    check("SyncBatchNorm input gradient", close(xm.grad, xa.grad[mine], 1e-4), (xm.grad - xa.grad[mine]).abs().max())
    check("SyncBatchNorm running statistics", close(bn.running_mean, ref.running_mean, 1e-5)
          and close(bn.running_var, ref.running_var, 1e-5), (bn.running_mean, ref.running_mean))


# ---- ddplug.torch ------------------------------------------------------------------------
class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return i, torch.full((4,), float(i))

    def set_epoch(self, e: int) -> None:
        self.epochs.append(e)


class Reports(logging.Handler):
    """The reports (owner lines, audit reports) the "ddplug" logger receives."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "ddplug_source", None) == "report":
            self.lines.append(record.getMessage())


def adapter() -> None:
    import ddplug.torch as dt

    ctx = dt.init()
    reports = Reports()  # beside the logger's own handler, which prints them
    logging.getLogger("ddplug").addHandler(reports)
    result["torch_distributed"] = [dist.is_initialized(), dist.get_backend(), dist.get_rank(), dist.get_world_size()]
    ds = Indexed(40)
    loader = dt.prepare_dataloader(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True))
    # 42 over 3 ranks: DistributedSampler pads nothing (an evaluation stream's
    # audit refuses padding, which repeats samples and biases metrics)
    val = Indexed(42)
    user = dt.prepare_dataloader(torch.utils.data.DataLoader(
        val, batch_size=2, sampler=torch.utils.data.DistributedSampler(val, shuffle=False)), "val")
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    seen: dict = {}
    ckpts = [os.path.join(OUT, f"ckpt{e}.pt") for e in range(2)]
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        seen[epoch] = []
        for idx, x in loader:
            seen[epoch] += idx.tolist()
            opt.zero_grad()
            net(x).sum().backward()
            opt.step()
        dt.save({"model": net.state_dict()}, ckpts[epoch])  # rank 0 writes
    ctx.barrier()
    # the older of the two is named on rank 0; the newer loads quietly
    older = dt.load(ckpts[0], weights_only=False)
    newer = dt.load(ckpts[1], weights_only=False)
    result["ckpt"] = [sorted(older), older["ddplug"]["save"], newer["ddplug"]["save"],
                      newer["ddplug"]["streams"]["train"]["epoch"]]
    val_seen = [i for idx, _ in user for i in idx.tolist()]
    streams = dt._split.streams
    result.update({
        "seen": seen, "val_seen": val_seen, "dataset_epochs": ds.epochs,
        "owners": {n: s.owner for n, s in streams.items()},
        "verdicts": {n: [r.verdict for r in s.reports] for n, s in streams.items()},
        "params": [p.detach().flatten().tolist() for p in net.parameters()],
        "ran_once": dt.run_once(lambda: f"made by rank {ctx.rank}", name="prep"),
    })
    dt.shutdown()
    result["closed"] = ctx.closed and not dist.is_initialized()
    result["reports"] = reports.lines


# ---- failures ----------------------------------------------------------------------------
def failure(kind: str, victim: int) -> None:
    speechbrain_init()
    t = torch.ones(4)
    dist.all_reduce(t)
    if kind == "kill":
        # the survivors' work is pending when the victim dies (it never joins)
        if RANK == victim:
            time.sleep(0.3)
            with open(os.path.join(OUT, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        w = dist.all_reduce(torch.ones(1 << 16), async_op=True)
        fut = dist.all_reduce(torch.ones(8), async_op=True).get_future()
        try:
            w.wait()
            check("pending work raised", False, "completed")
        except dist.DistBackendError as e:
            result["raised_after_s"] = time.time() - float(open(os.path.join(OUT, "killed_at")).read())
            result["type"], result["error"] = type(e).__name__, str(e)
            check("pending work raised", isinstance(e, ddplug.PeerLost), e)
        try:
            fut.wait()
            check("future raised", False, "completed")
        except Exception as e:
            check("future raised", f"rank {victim}" in str(e), e)
        return
    if kind == "timeout0":  # barrier(timeout=0) times out at once; the message says where timeouts come from
        if RANK == 0:
            try:
                dist.barrier(timeout=datetime.timedelta(0))
                check("barrier timeout 0", False, "passed")
            except dist.DistBackendError as e:
                result["type"], result["error"] = type(e).__name__, str(e)
                m = str(e)
                check("barrier timeout 0", isinstance(e, TimeoutError) and "timed out" in m
                      and m.count("timeout=") == 1 and m.count("timeouts.collective_s") == 1, m)
        else:  # waits for rank 0, which never sends: the run rank 0 ended says why
            try:
                dist.recv(torch.zeros(1), src=0)
                check("receive ended by rank 0's timeout", False, "received")
            except dist.DistBackendError as e:
                result["type"], result["error"] = type(e).__name__, str(e)
                m = str(e)
                check("receive ended by rank 0's timeout", "rank 0" in m and "timed out" in m
                      and m.count("timeout=") == 1 and m.count("timeouts.collective_s") == 1, m)
        return
    if kind == "raise":  # an exception on one rank reaches the others, in their barrier
        if RANK == victim:
            write()
            raise RuntimeError(f"CUDA out of memory on rank {victim} (test)")
        try:
            dist.barrier()
            check("barrier raised", False, "passed")
        except dist.DistBackendError as e:
            result["type"], result["error"] = type(e).__name__, str(e)
            check("barrier raised", isinstance(e, ddplug.Aborted), e)
        return
    if kind == "prepare":  # SpeechBrain: the preparation on the main process fails
        def prepare() -> None:
            time.sleep(0.3)
            raise FileNotFoundError("/nfs/corpus/train.csv: no such file (test)")

        if RANK == 0:
            write()
        try:
            run_on_main(prepare)
            check("barrier raised", False, "passed")
        except dist.DistBackendError as e:
            result["type"], result["error"] = type(e).__name__, str(e)
            check("barrier raised", isinstance(e, ddplug.Aborted), e)


# ---- the backend's native fast path against its Python methods -------------------------
def native() -> None:
    """The native fast path (ddplug/distributed/native.py) and the group's own
    Python methods, on the same ranks, side by side: equal results, equal
    errors, for every dtype x reduction, broadcast, and the point-to-point
    cases (tags, any source, polling, futures, a wait's own timeout, a work
    dropped while pending)."""
    import gc

    from ddplug.distributed import native as nat

    dist.init_process_group("ddplug")
    pg = dist.group.WORLD
    cls = type(pg)
    store = dist.distributed_c10d._get_default_store()
    result["native"] = nat.status()
    on = all(type(pg.__dict__.get(n)).__name__ == "FastMethod"
             for n in ("allreduce", "broadcast", "send", "recv", "recv_anysource"))
    check("native path on", nat.status().startswith("on") and on, nat.status())
    base = dist.ProcessGroup
    check("rank() and size() answered from Python ints, equal to the base class's",
          "rank" in pg.__dict__ and "size" in pg.__dict__
          and pg.rank() == base.rank(pg) == dist.get_rank() == int(os.environ["RANK"])
          and pg.size() == base.size(pg) == dist.get_world_size(),
          (pg.rank(), base.rank(pg), pg.size(), base.size(pg)))

    def python(name: str):
        return getattr(cls, name).__get__(pg)

    def outcome(fn, *args):
        try:
            w = fn(*args)
            w.wait()
            return None
        except Exception as e:  # noqa: BLE001 (compared, not handled)
            return f"{type(e).__name__}: {e}"

    # every dtype x reduction, blocking (what dist.all_reduce does)
    R = dist.ReduceOp
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
              torch.int32, torch.int64, torch.bool, torch.int16]
    reds = [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, R.BAND, R.BOR, R.BXOR]
    mismatches = []
    for dt in dtypes:
        for red in reds:
            o = dist.AllreduceOptions()
            o.reduceOp = red
            o.asyncOp = False
            base = torch.arange(1, 6) % 2 == RANK % 2 if dt is torch.bool else (torch.arange(1, 6) + RANK).to(dt)
            a, b = base.clone(), base.clone()
            ea, eb = outcome(pg.allreduce, [a], o), outcome(python("allreduce"), [b], o)
            if ea != eb or not torch.equal(a, b):
                mismatches.append((str(dt), str(red), a.tolist(), b.tolist(), ea, eb))
    check("all_reduce: native = python, every dtype x op", not mismatches, mismatches[:3])

    # the context's own allreduce (ddplug.Context.allreduce), every dtype x op name, and what
    # the Python method takes that the native one hands it (out=, numpy, a strided view)
    from ddplug import Context
    from ddplug.distributed import context_of

    ctx = context_of()
    check("the context's allreduce is native", type(vars(ctx).get("allreduce")).__name__ == "FastMethod",
          vars(ctx).get("allreduce"))

    def ctx_outcome(fn, *args, **kw):
        try:
            r = fn(*args, **kw)
            return None, r
        except Exception as e:  # noqa: BLE001 (compared, not handled)
            return f"{type(e).__name__}: {e}", None

    mismatches = []
    for dt in dtypes:
        for name in ("sum", "prod", "min", "max", "avg", "band", "bor", "nope"):
            base = torch.arange(1, 6) % 2 == RANK % 2 if dt is torch.bool else (torch.arange(1, 6) + RANK).to(dt)
            a, b = base.clone(), base.clone()
            (ea, ra), (eb, rb) = ctx_outcome(ctx.allreduce, a, name), ctx_outcome(Context.allreduce, ctx, b, name)
            if ea != eb or not torch.equal(a, b) or (ea is None and (ra is not a or rb is not b)):
                mismatches.append((str(dt), name, a.tolist(), b.tolist(), ea, eb))
    import numpy as np

    for args in ((torch.ones(4)[::2],), (torch.ones(3), "sum", torch.zeros(3)), (np.ones(3, np.float32),),
                 (torch.nn.Parameter(torch.ones(2)),)):
        (ea, ra), (eb, rb) = ctx_outcome(ctx.allreduce, *args), ctx_outcome(Context.allreduce, ctx, *args)
        if ea != eb or type(ra) is not type(rb):
            mismatches.append((repr(args)[:60], ea, eb))
    # keyword arguments: Context.allreduce's own names are taken natively, anything else as Python does
    for args, kw in (((), {"x": None, "op": "max"}), ((None,), {"op": "min"}), ((None,), {"op": "sum", "out": None}),
                     ((None,), {"out": None}), ((None,), {"opp": "sum"}), ((None, "sum"), {"op": "max"}),
                     ((None,), {"x": None}), ((None,), {"op\0x": "max"})):
        a, b = (torch.arange(1.0, 4.0) + RANK for _ in range(2))
        def fill(t, args=args, kw=kw):  # None in args, and x=, stand for the tensor
            return tuple(t if v is None else v for v in args), {k: (t if k == "x" else v) for k, v in kw.items()}
        (ea, ra), (eb, rb) = ctx_outcome(ctx.allreduce, *fill(a)[0], **fill(a)[1]), \
            ctx_outcome(Context.allreduce, ctx, *fill(b)[0], **fill(b)[1])
        if ea != eb or not torch.equal(a, b) or (ea is None and (ra is not a or rb is not b)):
            mismatches.append((repr((args, kw))[:60], a.tolist(), b.tolist(), ea, eb))
    check("Context.allreduce: native = python, every dtype x op name, keywords, and the calls it hands over",
          not mismatches, mismatches[:3])

    # the common case runs no Python at all
    calls: list = []
    t = torch.ones(4)
    o = dist.AllreduceOptions()
    o.asyncOp = False
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
    try:
        pg.allreduce([t], o)
        dist.all_reduce(t)
        ctx.allreduce(t)
        ctx.allreduce(t, op="sum")
        ctx.allreduce(x=t, op="sum", out=None)
    finally:
        sys.setprofile(None)
    check("native all_reduce runs no Python of ddplug's", "allreduce" not in calls and torch.equal(
        t, torch.full((4,), float(WORLD ** 5))), calls)

    bo = dist.BroadcastOptions()
    bo.rootRank, bo.asyncOp = WORLD - 1, False
    a, b = torch.full((3,), float(RANK)), torch.full((3,), float(RANK))
    ea, eb = outcome(pg.broadcast, [a], bo), outcome(python("broadcast"), [b], bo)
    check("broadcast: native = python", ea is None and eb is None and torch.equal(a, b)
          and torch.equal(a, torch.full((3,), float(WORLD - 1))), (a, b, ea, eb))

    # point-to-point between ranks 0 and 1, each case on both paths
    for path in ("native", "python"):
        op = (lambda n: getattr(pg, n)) if path == "native" else python
        if RANK == 0:
            import numpy as np

            store.wait([f"sent-mismatch-{path}"])  # a receive that fails as it starts: 4 floats are there, it takes 3
            w = op("recv")([torch.zeros(3)], 1, 14)
            result[f"mismatch {path}"] = outcome(lambda: w)
            store.wait([f"sent-first-{path}"])  # a message that is there before its receive is posted
            x = torch.zeros(3)
            w = op("recv_anysource")([x], 13)
            check(f"{path}: recv from any rank of a message already there", w.wait() and w.is_completed()
                  and w.is_success() and w.exception() is None and w._source_rank() == 1
                  and torch.equal(x, torch.full((3,), 13.0)), (x, w._source_rank()))
            op("send")([torch.full((2,), 12.0)], np.int64(1), 12).wait()  # a peer as numpy gives it
            w = op("send")([torch.arange(5.0)], 1, 3)
            check(f"{path}: send is a Work", isinstance(w, dist.Work) and w.wait(), w)
            x = torch.zeros(5)
            w = op("recv_anysource")([x], 4)
            check(f"{path}: recv from any rank", w.wait() and w._source_rank() == 1
                  and torch.equal(x, torch.arange(5.0) * 2), (x, w._source_rank()))
            x = torch.zeros(2, dtype=torch.int64)
            w = op("recv")([x], 1, 5)
            store.set(f"polling-{path}", "1")
            while not w.is_completed():
                time.sleep(0.001)
            check(f"{path}: is_completed, then result", [r.tolist() for r in w.result()] == [[7, 8]]
                  and torch.equal(x, torch.tensor([7, 8])), x)
            x = torch.zeros(3)
            w = op("recv")([x], 1, 6)
            fut = w.get_future()
            store.set(f"future-{path}", "1")
            val = fut.wait()
            check(f"{path}: get_future", torch.equal(val[0], torch.tensor([1.0, 2.0, 3.0])) and w.wait(), val)
            store.wait([f"timed-out-{path}"])
            op("send")([torch.full((2,), 9.0)], 1, 9).wait()
            store.wait([f"dropped-{path}"])
            op("send")([torch.full((2,), 11.0)], 1, 11).wait()
        elif RANK == 1:
            op("send")([torch.full((4,), 14.0)], 0, 14).wait()
            store.set(f"sent-mismatch-{path}", "1")
            op("send")([torch.full((3,), 13.0)], 0, 13).wait()
            store.set(f"sent-first-{path}", "1")
            z = torch.zeros(2)
            op("recv")([z], 0, 12).wait()
            check(f"{path}: a peer given as a numpy int", torch.equal(z, torch.full((2,), 12.0)), z)
            x = torch.zeros(5)
            w = op("recv")([x], 0, 3)
            check(f"{path}: recv with a tag", w.wait() and torch.equal(x, torch.arange(5.0)), x)
            op("send")([x * 2], 0, 4).wait()
            store.wait([f"polling-{path}"])
            op("send")([torch.tensor([7, 8])], 0, 5).wait()
            store.wait([f"future-{path}"])
            op("send")([torch.tensor([1.0, 2.0, 3.0])], 0, 6).wait()
            x = torch.zeros(2)
            w = op("recv")([x], 0, 9)
            try:
                w.wait(datetime.timedelta(milliseconds=50))
                err = None
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            result[f"own timeout {path}"] = err
            store.set(f"timed-out-{path}", "1")
            check(f"{path}: a wait's own timeout leaves it pending", err and "still pending" in err and w.wait()
                  and torch.equal(x, torch.full((2,), 9.0)), (err, x))
            y = torch.zeros(2)
            w = op("recv")([y], 0, 11)
            del w
            gc.collect()
            orphans = len(pg._orphans)
            store.set(f"dropped-{path}", "1")
            result[f"orphans {path}"] = orphans
            check(f"{path}: a receive dropped while pending is kept", orphans == 1, orphans)
            dist.barrier()  # rank 0's send completed
            while pg._orphans:  # released once completed (the next call that issues does this)
                with pg.lock:
                    pg._reap()
                time.sleep(0.001)
            check(f"{path}: the dropped receive completed into its tensor", torch.equal(
                y, torch.full((2,), 11.0)), y)
        if RANK != 1:
            dist.barrier()
    if RANK == 1:
        check("own timeout: native = python", result["own timeout native"] == result["own timeout python"],
              (result["own timeout native"], result["own timeout python"]))
    if RANK == 0:
        m = (result["mismatch native"], result["mismatch python"])
        check("a receive that failed as it started: native = python, with the plugin's sentence",
              m[0] and m[0] == m[1] and "rank 1 sent 4 float32 with tag 14" in m[0], m)
    # refusals are worded the same (both are the Python method's)
    bad = [outcome(pg.send, [torch.ones(1)], WORLD + 3), outcome(python("send"), [torch.ones(1)], WORLD + 3)]
    check("a bad peer: native = python", bad[0] and bad[0] == bad[1], bad)
    # refused by the library once started (the native path words it itself)
    me = [outcome(pg.send, [torch.ones(1)], RANK), outcome(python("send"), [torch.ones(1)], RANK)]
    check("a send to itself: native = python", me[0] and me[0] == me[1], me)
    # a blocking all_reduce that fails (the ranks' counts differ: the run ends) is
    # worded by the native path as by the Python method
    o = dist.AllreduceOptions()
    o.asyncOp = False
    err = outcome(pg.allreduce, [torch.ones(RANK + 1)], o)
    result["native all_reduce failure"] = err
    check("a failed native all_reduce names it", err and "SystemError" not in err
          and f"rank {RANK}: all_reduce({RANK + 1} x float32 on cpu, ReduceOp.SUM)" in err, err)
    dist.destroy_process_group()
    o = dist.AllreduceOptions()
    o.asyncOp = False
    closed = [outcome(pg.allreduce, [torch.ones(1)], o), outcome(python("allreduce"), [torch.ones(1)], o)]
    check("after destroy_process_group: native = python", closed[0] and closed[0] == closed[1], closed)
    closed = [ctx_outcome(ctx.allreduce, torch.ones(1))[0], ctx_outcome(Context.allreduce, ctx, torch.ones(1))[0]]
    check("a closed context's allreduce: native = python", closed[0] and closed[0] == closed[1], closed)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["client", "adapter", "failure", "gpu", "native"])
    p.add_argument("--init", default="coqui", choices=["coqui", "speechbrain"])
    p.add_argument("--kind", default="kill", choices=["kill", "raise", "prepare", "timeout0"])
    p.add_argument("--victim", type=int, default=1)
    a = p.parse_args()
    try:
        if a.scenario == "client":
            client(a.init)
        elif a.scenario == "adapter":
            adapter()
        elif a.scenario == "gpu":
            gpu()
        elif a.scenario == "native":
            native()
        else:
            failure(a.kind, a.victim)
    except BaseException as exc:
        result.setdefault("type", type(exc).__name__)
        result.setdefault("error", str(exc))
        result["traceback"] = traceback.format_exc()
        write()
        raise
    write()


if __name__ == "__main__":
    sys.exit(main())
