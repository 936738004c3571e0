"""The bucketed gradient sync in one process (a world of one): when the buckets'
allreduces start. The values are checked against a reference on 2 and 3 ranks in
test_context.py, and per optimizer step through Lightning in test_lightning.py
and test_fabric.py."""

from __future__ import annotations

import pytest
import torch

import ddplug
from ddplug.gradsync import GradientSync

from conftest import TEST_PLUGIN


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
