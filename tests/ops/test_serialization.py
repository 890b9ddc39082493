"""torch.save / torch.load of flagos tensors, modules and storages, with and without map_location."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn


def _save(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("weights_only", [True, False])
def test_roundtrip_keeps_device_and_values(weights_only):
    src = torch.randn(6, 7)
    loaded = torch.load(_save(src.to("flagos")), weights_only=weights_only)
    assert loaded.device == torch.device("flagos", 0)
    assert torch.equal(loaded.cpu(), src)


def test_second_device_is_preserved(two_devices_only):
    src = torch.arange(10, dtype=torch.int64)
    loaded = torch.load(_save({"a": src.to("flagos:0"), "b": src.to("flagos:1")}))
    assert loaded["a"].device == torch.device("flagos", 0)
    assert loaded["b"].device == torch.device("flagos", 1)
    assert torch.equal(loaded["a"].cpu(), src) and torch.equal(loaded["b"].cpu(), src)


@pytest.mark.parametrize(
    "map_location",
    ["flagos:1", torch.device("flagos", 1), {"flagos:0": "flagos:1"}],
    ids=["str", "device", "dict"],
)
def test_map_location_to_second_device(map_location, two_devices_only):
    src = torch.randn(3, 4, dtype=torch.float64)
    loaded = torch.load(_save(src.to("flagos:0")), map_location=map_location)
    assert loaded.device == torch.device("flagos", 1)
    assert torch.equal(loaded.cpu(), src)


def test_map_location_cpu_and_from_cpu():
    src = torch.randn(5)
    to_cpu = torch.load(_save(src.to("flagos")), map_location="cpu")
    assert to_cpu.device.type == "cpu" and torch.equal(to_cpu, src)
    to_dev = torch.load(_save(src), map_location="flagos")
    assert to_dev.device.type == "flagos" and torch.equal(to_dev.cpu(), src)


def test_views_keep_sharing_storage():
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = src.to("flagos")
    loaded = torch.load(_save([d, d.t(), d[1]]))
    base, transposed, row = loaded
    assert all(t.device.type == "flagos" for t in loaded)
    assert transposed.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert row.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert torch.equal(transposed.cpu(), src.t())
    assert torch.equal(row.cpu(), src[1])


def test_module_state_dict_roundtrip(two_devices_only):
    torch.manual_seed(0)
    model = nn.Linear(4, 2).flagos()
    reference = {k: v.cpu() for k, v in model.state_dict().items()}
    state = torch.load(_save(model.state_dict()), map_location="flagos:1")
    assert all(v.device == torch.device("flagos", 1) for v in state.values())
    fresh = nn.Linear(4, 2)
    fresh.load_state_dict(state)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, reference[key]), key


def test_whole_module_roundtrip():
    model = nn.Linear(3, 3).flagos()
    expected = model.weight.detach().cpu()
    loaded = torch.load(_save(model), weights_only=False)
    assert loaded.weight.device.type == "flagos"
    assert torch.equal(loaded.weight.detach().cpu(), expected)


def test_file_roundtrip(tmp_path):
    src = torch.randn(100, dtype=torch.bfloat16)
    path = tmp_path / "t.pt"
    torch.save(src.to("flagos"), path)
    loaded = torch.load(path, map_location="flagos:0")
    assert loaded.device == torch.device("flagos", 0)
    assert torch.equal(loaded.cpu(), src)
