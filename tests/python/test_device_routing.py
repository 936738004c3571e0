"""CUDA routing, as far as a machine without a GPU can test it: a CUDA root
device opens the "nccl" plugin unless the config names a plugin; CPU tensors stay
on "cpu"; what the collectives give the plugin (stream, staging) per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddplug import _buffers, _host, errors


def test_config_names_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPLUG_CONFIG", raising=False)
    assert _host.config_names_plugin(None) is False
    assert _host.config_names_plugin({"sampler": {}}) is False
    assert _host.config_names_plugin({"plugin": "cpu"}) is True
    assert _host.config_names_plugin('{"plugin": "mine"}') is True
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"gradients": {"bucket_mb": 5}}))
    assert _host.config_names_plugin(str(f)) is False
    f.write_text(json.dumps({"plugin": "cpu"}))
    assert _host.config_names_plugin(f) is True
    monkeypatch.setenv("DDPLUG_CONFIG", str(f))
    assert _host.config_names_plugin(None) is True
    assert _host.config_names_plugin(str(tmp_path / "missing.json")) is False  # the library reports it


def _open(device: torch.device, config=None):
    return _host.open_context(config, rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
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
