"""ddplug.Context under torchrun-style ranks: collectives on torch tensors and
numpy arrays, Python objects, async requests, argument errors; the gradient sync
against a reference computed from every rank's batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_ranks


def results(out: Path, world: int, codes: list, outs: list) -> list:
    assert codes == [0] * world, "\n".join(outs)[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_collectives(out: Path, world: int) -> None:
    codes, outs = run_ranks("ctx_worker.py", world, "collectives", out_dir=out)
    res = results(out, world, codes, outs)
    total = sum(range(1, world + 1))
    for r in res:
        assert r["plugin"] in ("cpu", "example")
        assert r["sum"] == [float(total)] * 5
        assert r["avg"] == pytest.approx([total / world] * 3)
        assert r["max"] == [world - 1, 0]
        assert r["min_np"] == [0, 1, 2, 3]
        assert r["bool_and"] == [True, False]
        assert r["bcast"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert r["gather"] == [v for k in range(world) for v in (k, k * k)]
        assert r["obj"] == {"hello": "from 0", "r": 0}
        assert r["objs"] == [["rank", k, "x" * (k * 100)] for k in range(world)]
        assert r["async_done"] == [True] * 4
        assert r["store_get"] == "hello\x00bytes"
        assert r["store_total"] == total
        if r["plugin"] == "cpu":
            assert r["bf16"] == pytest.approx([0.5 * total] * 7, rel=1e-2)


def test_argument_errors_are_clear(out: Path) -> None:
    codes, outs = run_ranks("ctx_worker.py", 2, "errors", out_dir=out)
    for r in results(out, 2, codes, outs):
        assert "complex64 has no ddplug equivalent" in r["complex"]
        assert "contiguous" in r["noncontig"]
        assert "unknown reduce op 'median'" in r["op"]


@pytest.mark.parametrize("world", [2, 3])
def test_gradient_sync_matches_the_average_of_local_gradients(out: Path, world: int) -> None:
    codes, outs = run_ranks("ctx_worker.py", world, "gradsync", out_dir=out)
    res = results(out, world, codes, outs)
    assert len(res[0]["buckets"]) >= 3, "small buckets: several allreduces per step"
    assert res[0]["buckets"][0] < res[0]["buckets"][1], "the first bucket is the small one"
    for r in res:
        assert r["buffer"] == 0.0, "buffers come from rank 0"
        assert r["params"] == res[0]["params"], "parameters broadcast from rank 0"
        assert r["syncs"] == 4
        for step in range(3):
            for got, want in zip(r["grads"][step], r["ref"][step]):
                assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
        # accumulation: first micro-batch local only, the sum synchronized once
        assert r["accum"] == res[0]["accum"]
    assert res[0]["local_first"] != res[1]["local_first"], "no communication inside no_sync"
