"""CUDA routing, as far as a machine without a GPU can test it: a CUDA root
device opens the "nccl" plugin unless the config names a plugin; CPU tensors stay
on "cpu"; what the collectives give the plugin (stream, staging) per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddplug import _join, errors
from ddplug._c import _buffers
from ddplug.config import load


def _plugin_for(source, device: str) -> object:
    cfg = load(source)
    try:
        return _join.plugin_for(cfg, torch.device(device))
    finally:
        cfg.close()


def test_a_cuda_device_asks_for_nccl_unless_the_config_chooses(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The library says whether the user's document chose a plugin
    (ddplug_config_is_set): defaults do not count, and no file is read twice."""
    monkeypatch.delenv("DDPLUG_CONFIG", raising=False)
    assert _plugin_for(None, "cuda") == "nccl"
    assert _plugin_for(None, "cpu") is None
    assert _plugin_for({"sampler": {}}, "cuda") == "nccl"
    assert _plugin_for({"plugin": "cpu"}, "cuda") is None
    assert _plugin_for('{"plugin": "cpu"}', "cuda") is None
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"gradients": {"bucket_mb": 5}}))
    assert _plugin_for(str(f), "cuda") == "nccl"
    f.write_text(json.dumps({"plugin": "cpu"}))
    assert _plugin_for(f, "cuda") is None
    monkeypatch.setenv("DDPLUG_CONFIG", str(f))
    assert _plugin_for(None, "cuda") is None
    with pytest.raises(errors.NotFound, match="missing.json"):  # the library reports it
        _plugin_for(str(tmp_path / "missing.json"), "cuda")
    cfg = load({"plugin": "cpu"})
    try:
        with pytest.raises(errors.NotFound, match="did you mean 'plugin'"):
            cfg.is_set("plugn")
    finally:
        cfg.close()


def _open(device: torch.device, config=None):
    return _join.open_context(config, rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                              main_address=None, main_port=None, device=device, framework="test")


def test_cuda_device_asks_for_the_nccl_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPLUG_CONFIG", raising=False)
    with pytest.raises(errors.DdplugError) as e:
        ctx = _open(torch.device("cuda", 0))
        ctx.close()  # a machine with a GPU: nccl opened
        pytest.skip("a GPU is present: the nccl plugin opened")
    assert "nccl" in str(e.value)  # UNSUPPORTED (no device) or NOT_FOUND (not built): nccl was asked for


def test_named_plugin_wins_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import TEST_PLUGIN

    ctx = _open(torch.device("cuda", 0), {"plugin": TEST_PLUGIN})
    try:
        assert ctx.plugin["name"] == TEST_PLUGIN
    finally:
        ctx.close()


def test_cpu_buffers_have_no_stream() -> None:
    b = _buffers.of(torch.zeros(3))
    assert b.device == "cpu" and _buffers.stream_of(b) is None
    with pytest.raises(TypeError, match="complex64 has no ddplug equivalent"):
        _buffers.of(torch.zeros(2, dtype=torch.complex64))
