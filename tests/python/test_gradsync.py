"""The bucketed gradient sync: when the buckets' allreduces start, their order
following the first backward, gradients as views of their buckets (the copy path
for a replaced .grad, ordinary memory after detach) — in one process — and, on
two ranks, training with bucket views bit-identical to the copy path. The values
are checked against a reference on 2 and 3 ranks in test_context.py, and per
optimizer step through Lightning in test_lightning.py and test_fabric.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ddplug
from ddplug.nn.gradsync import GradientSync

from conftest import TEST_PLUGIN, config, run_ranks


@pytest.fixture
def ctx():
    c = ddplug.Context({"plugin": TEST_PLUGIN}, framework="test")
    yield c
    c.close()


def spied(ctx: ddplug.Context, events: list) -> None:
    start = ctx.iallreduce

    def iallreduce(x, op="sum"):
        events.append("start")
        return start(x, op)

    ctx.iallreduce = iallreduce


def model_of_small_buckets(ctx: ddplug.Context) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(5)])
    gs = GradientSync(ctx, model.parameters(), bucket_mb=0.001, first_bucket_mb=0.001)  # a layer each
    gs.attach()
    return model, gs


def test_buckets_start_while_backward_runs(ctx: ddplug.Context) -> None:
    """A bucket's allreduce starts as soon as its last gradient is in, while
    backward goes on to the earlier layers — not when finish() runs."""
    model, gs = model_of_small_buckets(ctx)
    assert len(gs.buckets) >= 4
    events: list = []
    spied(ctx, events)
    x = torch.randn(4, 16, requires_grad=True)
    x.register_hook(lambda g: events.append("input gradient"))  # the end of backward
    model(x).pow(2).sum().backward()
    events.append("backward returned")
    gs.finish()
    assert "start" in events[: events.index("input gradient")], events
    assert events[: events.index("backward returned")].count("start") == len(gs.buckets), events
    assert gs.syncs == 1
    gs.detach()


def test_nothing_starts_inside_no_sync(ctx: ddplug.Context) -> None:
    model, gs = model_of_small_buckets(ctx)
    events: list = []
    spied(ctx, events)
    with gs.no_sync():
        model(torch.randn(4, 16)).sum().backward()
        gs.finish()
    assert events == [] and gs.syncs == 0
    model(torch.randn(4, 16)).sum().backward()
    gs.finish()
    assert events.count("start") == len(gs.buckets) and gs.syncs == 1
    gs.detach()


# ---- gradients as bucket views -------------------------------------------------------

def test_bucket_order_follows_the_first_backward(ctx: ddplug.Context) -> None:
    """Buckets start in reverse registration order, and from the second step in
    the order the first backward produced gradients: here the layers run in an
    order unlike their registration, so the rebuilt first bucket holds the last
    layer run — the first gradients backward produces."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(4)])
    run = [2, 0, 3, 1]  # forward order; backward produces 1, 3, 0, 2

    def loss(x):
        for i in run:
            x = torch.tanh(layers[i](x))
        return x.pow(2).sum()

    gs = GradientSync(ctx, layers.parameters(), bucket_mb=0.001, first_bucket_mb=0.001)
    gs.attach()
    layer_of = lambda b: b.slots[0].index // 2  # noqa: E731  (weight, bias per layer)
    assert [layer_of(b) for b in gs.buckets] == [3, 2, 1, 0]
    loss(torch.randn(4, 16)).backward()
    gs.finish()
    assert gs.rebuilt and [layer_of(b) for b in gs.buckets] == [1, 3, 0, 2]
    events: list = []
    spied(ctx, events)
    x = torch.randn(4, 16, requires_grad=True)
    x.register_hook(lambda g: events.append("input gradient"))
    loss(x).backward()
    gs.finish()
    assert events.index("start") < events.index("input gradient")
    gs.detach()


def test_a_replaced_grad_takes_the_copy_path(ctx: ddplug.Context, caplog: pytest.LogCaptureFixture) -> None:
    """An optimizer that assigns a new tensor to .grad keeps it: the sync copies
    into the bucket and back instead of rebinding .grad, and says so once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    gs = GradientSync(ctx, model.parameters(), bucket_mb=1)
    gs.attach()
    model(torch.randn(3, 8)).sum().backward()
    gs.finish()
    flat = gs.buckets[0].flat
    assert all(p.grad.data_ptr() != 0 and flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.nbytes
               for p in model.parameters()), "gradients view their bucket"
    mine = {id(p): torch.zeros_like(p) for p in model.parameters()}
    for p in model.parameters():
        p.grad = mine[id(p)]  # what an optimizer replacing .grad does
    with caplog.at_level("DEBUG", logger="ddplug.nn.gradsync"):
        for _ in range(2):
            model(torch.randn(3, 8)).sum().backward()
            gs.finish()
    for p in model.parameters():
        assert p.grad is mine[id(p)], "the replaced .grad is kept"
        assert torch.equal(p.grad, gs.buckets[0].view(gs._slots[id(p)])), "and holds the reduced gradient"
    said = [r for r in caplog.records if "was replaced outside the gradient sync" in r.getMessage()]
    assert len(said) == 4  # once per parameter
    gs.detach()


def test_detach_gives_gradients_their_own_memory(ctx: ddplug.Context) -> None:
    model = torch.nn.Linear(8, 8)
    gs = GradientSync(ctx, model.parameters())
    gs.attach()
    model(torch.randn(2, 8)).sum().backward()
    gs.finish()
    before = [p.grad.clone() for p in model.parameters()]
    flat = gs.buckets[0].flat
    gs.detach()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.grad, b)
        assert p.grad.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
    assert all(b.flat is None for b in gs.buckets)


@pytest.mark.parametrize("options", [{"cma": "on"}, {"cma": "off"}], ids=["single-copy", "no-single-copy"])
def test_bucket_views_train_like_the_copy_path(out: Path, options: dict) -> None:
    """Two ranks train one model per case twice — gradients as views of registered
    buckets, and the copy path into ordinary buckets — and end with the same
    weights, bit for bit: zero_grad(set_to_none=True) and (False), gradient
    accumulation, clipping, an optimizer that replaces .grad; a layer unused on
    some steps and ranks; a parameter large enough for a bucket of its own."""
    codes, outs = run_ranks("ctx_worker.py", 2, "bucketviews", config(plugin_options=options), out_dir=out)
    assert codes == [0, 0], outs
    for r in range(2):
        res = json.loads((out / f"rank{r}.json").read_text())
        for case in ("set_to_none", "zero", "accumulate", "clip", "replace"):
            c = res[case]
            assert c["equal"], (r, case, c["max_diff"])
            assert c["moved"], (r, case)
            v = c["view"]
            assert v["rebuilt"] and v["grads_own_memory"]
            assert v["memory"][0] == "registered", v["memory"]
            if case != "replace":
                assert v["views"] >= v["flat_params"], (case, v)  # every bucketed gradient views its bucket
        # a gradient with a bucket of its own is reduced where it lies while it is a
        # new tensor every step — born in registered memory where the native module
        # is built (the gradient pool), ordinary memory without it — and moves once
        # into registered memory when it persists
        v = res["set_to_none"]["view"]
        if v["pool_native"]:
            assert "in place: registered" in v["memory"][1:], v
            assert v["pool"]["served"] > v["pool"]["reused"] > 0, v["pool"]  # recycled from step to step
            assert v["pool"]["refused"] == 0, v["pool"]
            # detach gave the pool's gradients their own memory and released every block
            assert v["pool_holds"] == 0 and v["pool_after"]["bytes"] == 0, v
            assert not v["pool_after"]["active"], v
        else:
            assert not any(m.endswith("registered") for m in v["memory"][1:]), v
        assert "registered" in res["zero"]["view"]["memory"][1:], res["zero"]["view"]
        assert res["replace"]["view"]["copy_slots"] >= 2
        assert res["replace"]["view"]["still_assigned"] == 8


def test_a_second_backward_finishes_the_round_before_accumulating(ctx: ddplug.Context) -> None:
    """Two backward passes before finish(): the first round is reduced before
    the second accumulates into the same buckets, and the result is the sum."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    gs = GradientSync(ctx, model.parameters())
    gs.attach()
    x1, x2 = torch.randn(3, 8), torch.randn(3, 8)
    model(x1).sum().backward()
    first = [p.grad.clone() for p in model.parameters()]
    seen: list = []
    finish = gs.finish

    def spy() -> None:
        seen.append([p.grad.clone() for p in model.parameters()])
        finish()

    gs.finish = spy
    model(x2).sum().backward()
    assert gs.syncs == 1 and len(seen) == 1
    assert all(torch.equal(a, b) for a, b in zip(seen[0], first)), \
        "the first round finished before the second backward accumulated"
    gs.finish = finish
    gs.finish()
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(model.state_dict())
    ref(x2).sum().backward()
    for p, f, r in zip(model.parameters(), first, ref.parameters()):
        assert torch.allclose(p.grad, f + r.grad)
    gs.detach()


def test_backward_gradients_come_from_the_pool_and_nothing_else(ctx: ddplug.Context) -> None:
    """The gradient pool (native module): a large gradient made by backward is a
    pool block, recycled from step to step; the forward's activations and the
    optimizer's state of the same size are not; closing the context gives the
    gradients their own memory, with their values, and releases every block."""
    from ddplug import _native

    if _native.load() is None:
        pytest.skip(f"the native module is off: {_native.status()}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.Linear(256, 256, bias=False))
    gs = GradientSync(ctx, model.parameters(), bucket_mb=0.1, first_bucket_mb=0.1)
    gs.attach()
    assert gs._pool is not None
    pool = gs._pool
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 256)  # an activation of a gradient's size, made outside backward
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        h = model[0](x)
        model[1](h).sum().backward()
        gs.finish()
        assert not pool.holds(h.untyped_storage().data_ptr())
        assert all(pool.holds(p.grad.untyped_storage().data_ptr()) for p in model.parameters()), step
        opt.step()
    for p in model.parameters():
        for s in opt.state[p].values():
            assert not (torch.is_tensor(s) and s.dim() and pool.holds(s.untyped_storage().data_ptr()))
    stats = pool.stats()
    assert stats["refused"] == 0 and stats["reused"] >= 4, stats  # steps 1 and 2 reuse step 0's blocks
    grads = [p.grad.clone() for p in model.parameters()]
    ctx.close()  # the gradient sync releases first: the gradients keep their values in their own memory
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)
        assert not pool.holds(p.grad.untyped_storage().data_ptr())
    assert pool.stats()["bytes"] == 0 and not pool.stats()["active"], pool.stats()
    # torch's allocator serves ordinary memory again
    y = torch.randn(256, 256, requires_grad=True)
    (y * 2).sum().backward()
    assert not pool.holds(y.grad.untyped_storage().data_ptr())


def test_a_pool_gradient_kept_past_detach_goes_back_when_dropped(ctx: ddplug.Context) -> None:
    """detach gives .grad its own memory and the pool's free blocks back to the
    plugin; a pool gradient the user still holds goes back when it is dropped,
    not only when the context closes."""
    from ddplug import _native

    if _native.load() is None:
        pytest.skip(f"the native module is off: {_native.status()}")
    model = torch.nn.Linear(256, 256, bias=False)
    gs = GradientSync(ctx, model.parameters(), bucket_mb=0.1, first_bucket_mb=0.1)
    gs.attach()
    pool = gs._pool
    model(torch.randn(4, 256)).sum().backward()
    gs.finish()
    kept = model.weight.grad
    assert pool.holds(kept.untyped_storage().data_ptr())
    gs.detach()
    assert not pool.holds(model.weight.grad.untyped_storage().data_ptr())
    assert torch.equal(model.weight.grad, kept)
    assert pool.stats()["bytes"] == 256 * 256 * 4 and not pool.stats()["active"], pool.stats()
    del kept
    assert pool.stats()["bytes"] == 0, pool.stats()
