"""One rank of the seed systems' own distributed code on the "ddplug"
torch.distributed backend, with CUDA tensors: the real coqui-tts-trainer and
SpeechBrain functions, not reproductions of them.

    python seed_systems.py coqui|speechbrain

coqui: trainer.utils.distributed.init_distributed (its CUDA device choice and
init_process_group with the backend and URL from its config), its
reduce_tensor, and torch's DDP over the group: gradients equal the
single-process whole-batch gradients.
speechbrain: its ddp_init_group refuses a backend it does not list (recorded);
ddplug.torch.init() joins instead, and SpeechBrain's run_on_main (a
preparation on the main process, the others waiting in its barrier),
ddp_barrier and ddp_broadcast run on the run; a preparation that raises on the
main process ends the others' barrier with its error.

Started torchrun-style by tests/python/conftest.py::run_ranks; each rank writes
$DDPLUG_TEST_OUT/rank<r>.json ({"checks": {name: [ok, detail]}}).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

import ddplug  # noqa: F401  (registers the backend "ddplug")

OUT = os.environ["DDPLUG_TEST_OUT"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
checks: dict = {}
result: dict = {"checks": checks}


def check(name: str, ok: bool, detail: object = "") -> None:
    checks[name] = [bool(ok), str(detail)[:500]]


def write() -> None:
    with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
        json.dump(result, f)


def model_and_batch() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8 * WORLD, 16)
    y = torch.randn(8 * WORLD, 4)
    return model, x, y


def coqui() -> None:
    import torch.distributed as dist
    from trainer.utils.distributed import init_distributed, reduce_tensor

    url = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
    init_distributed(RANK, WORLD, "group_coqui", "ddplug", url)  # what coqui's Trainer calls
    check("init_distributed on the ddplug backend", dist.get_backend() == "ddplug", dist.get_backend())
    t = torch.full((4,), float(RANK + 1), device="cuda")
    got = reduce_tensor(t, WORLD)  # coqui's all_reduce(SUM) / num_gpus
    want = sum(range(1, WORLD + 1)) / WORLD
    check("reduce_tensor of CUDA tensors", bool(torch.all(got == want)), got.tolist())

    model, x, y = model_and_batch()
    reference = [p.detach().clone() for p in model.parameters()]
    full = torch.nn.Sequential(*[m for m in model_and_batch()[0]])
    torch.nn.functional.mse_loss(full(x), y).backward()
    want_grads = [p.grad.clone() for p in full.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[torch.cuda.current_device()])
    shard = slice(RANK * 8, (RANK + 1) * 8)
    torch.nn.functional.mse_loss(ddp(x[shard].cuda()), y[shard].cuda()).backward()
    grads = [p.grad.detach().cpu() for p in ddp.parameters()]
    ok = all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(grads, want_grads))
    check("DDP gradients on CUDA equal the whole batch's", ok,
          max(float((g - w).abs().max()) for g, w in zip(grads, want_grads)))
    check("parameters start equal", all(torch.equal(p.detach().cpu(), r)
                                        for p, r in zip(ddp.parameters(), reference)))
    dist.destroy_process_group()


def speechbrain() -> None:
    import torch.distributed as dist
    from speechbrain.utils.distributed import ddp_barrier, ddp_broadcast, ddp_init_group, run_on_main

    try:
        ddp_init_group({"distributed_backend": "ddplug"})
        check("SpeechBrain's ddp_init_group with backend ddplug", dist.is_initialized(), "initialised")
    except ValueError as exc:  # SpeechBrain lists nccl, gloo and mpi only
        result["ddp_init_group"] = str(exc)
    import ddplug.torch

    ddplug.torch.init()
    check("on the ddplug backend", dist.get_backend() == "ddplug", dist.get_backend())
    marker = os.path.join(OUT, "prepared")

    def prepare() -> str:
        with open(marker, "w") as f:
            f.write("done")
        return "prepared"

    run_on_main(prepare)  # the main process prepares, the others wait in its barrier
    check("run_on_main: the preparation is there after the barrier", os.path.exists(marker))
    ddp_barrier()
    obj = ddp_broadcast({"vocab": 512} if RANK == 0 else None, src=0)
    check("ddp_broadcast", obj == {"vocab": 512}, obj)
    t = torch.full((3,), float(RANK), device="cuda")
    dist.all_reduce(t)
    check("all_reduce of a CUDA tensor", bool(torch.all(t == sum(range(WORLD)))), t.tolist())

    def fails() -> None:
        raise RuntimeError("the download of the corpus failed on the main process")

    try:
        run_on_main(fails)
        check("a failed preparation reaches every rank", False, "no error")
    except Exception as exc:  # the main process raises its own error; the others the run's
        check("a failed preparation reaches every rank", "download of the corpus failed" in str(exc),
              f"{type(exc).__name__}: {exc}")


def main() -> int:
    try:
        {"coqui": coqui, "speechbrain": speechbrain}[sys.argv[1]]()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
