"""The flagos device through its device module, torch.flagos: registration, availability, device selection,
properties, and the simulated accelerator's configuration from the environment. The generic contract
(torch.device, torch.accelerator) is tests/conformance/test_device.py."""

from __future__ import annotations

import pytest
import torch

import torch_fl


def test_device_is_registered_as_privateuse1():
    assert torch._C._get_privateuse1_backend_name() == "flagos"
    assert torch.flagos is torch_fl.flagos
    assert torch.get_device_module("flagos") is torch_fl.flagos
    dev = torch.device("flagos:1")
    assert (dev.type, dev.index) == ("flagos", 1)


def test_available_with_devices(device_count):
    assert torch.flagos.is_available()
    assert device_count >= 1
    assert device_count == torch.flagos.device_count()


def test_default_sim_configuration_in_fresh_process(run_python):
    result = run_python(
        """
        import json, sys, torch, torch_fl
        out = {"init_after_import": torch.flagos.is_initialized(),
               "count": torch.flagos.device_count(),
               "available": torch.flagos.is_available(),
               "init_after_count": torch.flagos.is_initialized(),
               "accelerator": torch_fl.accelerator(),
               "flag_gems_imported": "flag_gems" in sys.modules}
        x = torch.empty(3, device="flagos")
        out["init_after_tensor"] = torch.flagos.is_initialized()
        out["device"] = str(x.device)
        out["current"] = torch.flagos.current_device()
        out["total_memory"] = torch.flagos.get_device_properties(0).total_memory
        print("RESULT " + json.dumps(out))
        """,
        env={"FLAGOS_ACCELERATOR": "sim"},
    ).check()
    out = result.json()
    assert out["init_after_import"] is False, "import torch_fl must not initialise the accelerator"
    assert out["init_after_count"] is False, "device_count()/is_available() must not initialise"
    assert out["flag_gems_imported"] is False
    assert out["count"] == 2 and out["available"] is True
    assert out["accelerator"] == "sim"
    assert out["init_after_tensor"] is True
    assert out["device"] == "flagos:0" and out["current"] == 0
    assert out["total_memory"] == 16 * 2**30


def test_sim_device_count_and_memory_from_env(run_python):
    out = (
        run_python(
            """
        import json, torch, torch_fl
        props = [torch.flagos.get_device_properties(i) for i in range(torch.flagos.device_count())]
        free, total = torch.flagos.mem_get_info(3)
        x = torch.empty(2, device="flagos:3")
        print("RESULT " + json.dumps({"count": torch.flagos.device_count(),
                                       "totals": [p.total_memory for p in props],
                                       "mem_total": total, "free": free, "x": str(x.device)}))
        """,
            env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_DEVICES": "4", "FLAGOS_SIM_MEMORY_BYTES": "256M"},
        )
        .check()
        .json()
    )
    assert out["count"] == 4
    assert out["totals"] == [256 * 2**20] * 4
    assert out["mem_total"] == 256 * 2**20
    assert 0 < out["free"] <= out["mem_total"]
    assert out["x"] == "flagos:3"


def test_tensor_lands_on_current_device(two_devices_only):
    assert torch.flagos.current_device() == 0
    assert torch.empty(2, device="flagos").device == torch.device("flagos", 0)
    torch.flagos.set_device(1)
    assert torch.flagos.current_device() == 1
    x = torch.empty(2, device="flagos")
    assert x.device == torch.device("flagos", 1)
    assert x.get_device() == 1
    # An explicit index wins over the current device, and does not change it.
    assert torch.empty(2, device="flagos:0").device.index == 0
    assert torch.flagos.current_device() == 1
    torch.flagos.set_device("flagos:0")
    assert torch.flagos.current_device() == 0
    torch.flagos.set_device(torch.device("flagos", 1))
    assert torch.flagos.current_device() == 1


def test_device_context_manager_restores(two_devices_only):
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(1):
        assert torch.flagos.current_device() == 1
        assert torch.empty(1, device="flagos").device.index == 1
        with torch.flagos.device("flagos:0"):
            assert torch.flagos.current_device() == 0
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(None):
        assert torch.flagos.current_device() == 0
    with pytest.raises(ZeroDivisionError):
        with torch.flagos.device(torch.device("flagos", 1)):
            assert torch.flagos.current_device() == 1
            raise ZeroDivisionError
    assert torch.flagos.current_device() == 0


def test_device_of(two_devices_only):
    x = torch.empty(1, device="flagos:1")
    with torch.flagos.device_of(x):
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    with torch.flagos.device_of(torch.empty(1)):
        assert torch.flagos.current_device() == 0


def test_tensor_device_attributes():
    x = torch.empty(2, 3, device="flagos")
    assert x.is_flagos
    assert not torch.empty(1).is_flagos
    assert x.device.type == "flagos"
    assert x.shape == (2, 3) and x.dtype == torch.float32
    assert x.is_contiguous()


def test_device_properties(device_count):
    for index in range(device_count):
        props = torch.flagos.get_device_properties(index)
        assert isinstance(props.name, str) and props.name
        assert props.total_memory > 0
        assert isinstance(props.major, int) and isinstance(props.minor, int)
        assert props.multi_processor_count > 0
        assert torch.flagos.get_device_name(index) == props.name
        assert torch.flagos.get_device_capability(index) == (props.major, props.minor)
        assert torch.flagos.get_device_properties(f"flagos:{index}").name == props.name
        assert "total_memory" in repr(props)
        free, total = torch.flagos.mem_get_info(index)
        assert total == props.total_memory
        assert 0 <= free <= total
    assert torch.flagos.get_device_name() == torch.flagos.get_device_name(0)
    assert isinstance(torch.flagos.is_bf16_supported(), bool)


def test_mem_get_info_sees_allocations():
    torch.flagos.synchronize()
    torch.flagos.empty_cache()
    free_before, _ = torch.flagos.mem_get_info()
    nbytes = 64 * 2**20
    x = torch.empty(nbytes, dtype=torch.uint8, device="flagos")
    free_during, _ = torch.flagos.mem_get_info()
    assert free_before - free_during >= nbytes
    del x
    torch.flagos.empty_cache()
    free_after, _ = torch.flagos.mem_get_info()
    assert free_after - free_during >= nbytes


def test_synchronize_forms(device_count):
    x = torch.arange(16, dtype=torch.float32).to("flagos", non_blocking=True)
    torch.flagos.synchronize()
    torch.flagos.synchronize(0)
    torch.flagos.synchronize("flagos:0")
    torch.flagos.synchronize(torch.device("flagos", device_count - 1))
    assert torch.equal(x.cpu(), torch.arange(16, dtype=torch.float32))


def test_init_and_state():
    torch.flagos.init()
    assert torch.flagos.is_initialized()
    torch.flagos._lazy_init()
    assert not torch.flagos._is_in_bad_fork()
    assert torch.flagos.accelerator() == torch_fl.accelerator()
    assert torch_fl.accelerator() in ("sim", "cuda")
