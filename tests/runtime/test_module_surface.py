"""The Python surface: torch.flagos names, torch_fl helpers, generated Tensor/Module/Storage methods and
torch.accelerator on flagos."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torch_fl

REQUIRED_NAMES = [
    "is_available", "device_count", "current_device", "set_device", "device", "device_of", "synchronize",
    "init", "is_initialized", "_lazy_init", "_is_in_bad_fork", "Stream", "Event", "current_stream",
    "default_stream", "set_stream", "stream", "StreamContext", "manual_seed", "manual_seed_all", "seed",
    "seed_all", "initial_seed", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
    "default_generators", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "empty_cache", "mem_get_info", "host_memory_stats", "get_device_name", "get_device_properties",
    "get_device_capability", "is_bf16_supported", "get_amp_supported_dtype", "accelerator",
]  # fmt: skip


@pytest.mark.parametrize("name", REQUIRED_NAMES)
def test_torch_flagos_has(name):
    assert hasattr(torch.flagos, name), f"torch.flagos.{name} is missing"
    assert getattr(torch.flagos, name) is getattr(torch_fl.flagos, name)


def test_stream_and_event_types():
    assert issubclass(torch.flagos.Stream, torch.Stream)
    assert issubclass(torch.flagos.Event, torch.Event)


def test_build_info():
    info = torch_fl.build_info()
    assert info["version"] == torch_fl.__version__
    major_minor = ".".join(torch.__version__.split(".")[:2])
    assert str(info["built_with_torch"]).startswith(major_minor), "built against another torch"
    assert "sim" in info["hals"]
    assert info["torch_has_cuda"] == (torch.version.cuda is not None)
    assert torch_fl.accelerator() in info["hals"]


def test_tensor_flagos_method(two_devices_only):
    src = torch.randn(5, 4)
    d = src.flagos()
    assert d.is_flagos and d.device == torch.device("flagos", 0)
    assert torch.equal(d.cpu(), src)
    d1 = src.flagos(1)
    assert d1.device == torch.device("flagos", 1)
    assert torch.equal(d1.cpu(), src)
    assert d.flagos() is d
    assert torch.equal(d.flagos(1).cpu(), src)
    assert not src.is_flagos


def test_module_flagos_moves_parameters_and_buffers(two_devices_only):
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    reference = {name: value.clone() for name, value in model.state_dict().items()}
    model.flagos()
    for name, value in model.state_dict().items():
        assert value.device == torch.device("flagos", 0), name
        assert torch.equal(value.cpu(), reference[name]), name
    assert all(p.is_flagos for p in model.parameters())
    model.flagos(1)
    for name, value in model.state_dict().items():
        assert value.device == torch.device("flagos", 1), name
        assert torch.equal(value.cpu(), reference[name]), name
    model.cpu()
    for name, value in model.state_dict().items():
        assert value.device.type == "cpu" and torch.equal(value, reference[name]), name


def test_module_to_flagos_keeps_parameter_identity():
    lin = nn.Linear(3, 2)
    weight = lin.weight
    expected = weight.detach().clone()
    lin.to("flagos")
    assert lin.weight.device.type == "flagos"
    assert isinstance(lin.weight, nn.Parameter) and lin.weight.requires_grad
    assert torch.equal(lin.weight.detach().cpu(), expected)
    del weight


def test_storage_methods(two_devices_only):
    src = torch.arange(8, dtype=torch.int32)
    storage = src.untyped_storage()
    on_dev = storage.flagos()
    assert on_dev.device == torch.device("flagos", 0)
    assert on_dev.is_flagos
    assert not storage.is_flagos
    assert on_dev.nbytes() == storage.nbytes()
    assert torch.equal(torch.tensor([], dtype=torch.int32).set_(on_dev.cpu()), src)
    on_dev1 = storage.flagos(1)
    assert on_dev1.device == torch.device("flagos", 1)
    assert torch.equal(torch.tensor([], dtype=torch.int32).set_(on_dev1.cpu()), src)


def test_torch_accelerator_device_api(two_devices_only):
    acc = torch.accelerator
    assert acc.is_available()
    assert acc.current_accelerator() == torch.device("flagos")
    assert acc.device_count() == torch.flagos.device_count()
    assert acc.current_device_index() == 0
    acc.set_device_index(1)
    assert torch.flagos.current_device() == 1
    assert torch.empty(1, device="flagos").device.index == 1
    acc.set_device_index(0)
    assert torch.flagos.current_device() == 0
    if hasattr(acc, "device_index"):
        with acc.device_index(1):
            assert torch.flagos.current_device() == 1
        assert torch.flagos.current_device() == 0


def test_torch_accelerator_stream_api():
    acc = torch.accelerator
    assert acc.current_stream() == torch.flagos.current_stream()
    s = torch.flagos.Stream()
    acc.set_stream(s)
    assert torch.flagos.current_stream() == s
    assert acc.current_stream() == s
    src = torch.randn(1000).pin_memory()
    d = src.to("flagos", non_blocking=True)
    acc.synchronize()
    assert torch.equal(d.cpu(), src)
    acc.set_stream(torch.flagos.default_stream())
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_another_privateuse1_backend_is_refused(run_python):
    result = run_python(
        """
        import torch
        torch.utils.rename_privateuse1_backend("otherdev")
        try:
            import torch_fl
        except RuntimeError as e:
            print("REFUSED", e)
        else:
            print("IMPORTED")
        """
    )
    assert result.returncode == 0, repr(result)
    assert "REFUSED" in result.stdout, repr(result)
    assert "otherdev" in result.stdout


def test_import_is_idempotent_and_quiet(run_python):
    result = run_python(
        """
        import warnings
        import torch
        warnings.simplefilter("error")
        import torch_fl
        import torch_fl as again
        assert again is torch_fl
        assert torch.flagos is torch_fl.flagos
        print("OK")
        """
    )
    assert result.returncode == 0 and "OK" in result.stdout, repr(result)
