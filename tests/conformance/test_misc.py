"""Backend registration: the PrivateUse1 name, the device module, generated methods and type names.

Counterpart of torch_openreg's tests/test_misc.py.
"""

from __future__ import annotations

import types
import warnings

import pytest
import torch

DEVICE = "flagos"


TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def is_on_device(obj) -> bool:
    """The generated ``is_<device>`` property."""
    return getattr(obj, f"is_{DEVICE}")


def to_device(obj, *args):
    """The generated ``<device>()`` method (like ``.cuda()``)."""
    return getattr(obj, DEVICE)(*args)


def test_backend_name_is_set_once():
    assert torch._C._get_privateuse1_backend_name() == DEVICE
    torch.utils.rename_privateuse1_backend(DEVICE)  # renaming to the same name is allowed
    with pytest.raises(RuntimeError, match="has already been set"):
        torch.utils.rename_privateuse1_backend("another_device")


def test_enum_aliases_name_the_device():
    from torch._C._autograd import DeviceType
    from torch._C._profiler import ProfilerActivity

    if TORCH_VERSION < (2, 13):
        pytest.skip("rename_privateuse1_backend names these enum members from torch 2.13 on")
    alias = DEVICE.upper()
    assert getattr(ProfilerActivity, alias) == ProfilerActivity.PrivateUse1
    assert getattr(ProfilerActivity, alias).name == alias
    assert getattr(DeviceType, alias) == DeviceType.PrivateUse1
    assert str(getattr(DeviceType, alias)) == f"DeviceType.{alias}"


def test_device_module_registration_is_guarded():
    with pytest.raises(RuntimeError, match="Expected one of cpu"):
        torch._register_device_module("not_a_device", types.ModuleType("fake"))
    with pytest.raises(RuntimeError, match="has already been registered"):
        torch._register_device_module(DEVICE, types.ModuleType("fake"))


def test_device_module_functions_are_reachable_by_torch():
    get = torch.utils.backend_registration._get_custom_mod_func
    assert get("device_count")() == torch.accelerator.device_count()
    with pytest.raises(RuntimeError, match=f"Try to call torch.{DEVICE}"):
        get("no_such_function")


def test_device_module_has_what_torch_calls():
    module = torch.get_device_module(DEVICE)
    for name in (
        "_lazy_init",
        "is_available",
        "device_count",
        "current_device",
        "set_device",
        "device",
        "synchronize",
        "current_stream",
        "set_stream",
        "get_rng_state",
        "set_rng_state",
        "manual_seed_all",
        "is_initialized",
        "get_amp_supported_dtype",
    ):
        assert callable(getattr(module, name, None)), name


def test_generated_methods_exist_once():
    with pytest.raises(RuntimeError, match="already been registered"):
        torch.utils.generate_methods_for_privateuse1_backend()
    for owner in (torch.Tensor, torch.TypedStorage, torch.UntypedStorage, torch.nn.utils.rnn.PackedSequence):
        assert hasattr(owner, f"is_{DEVICE}") and hasattr(owner, DEVICE), owner
    assert hasattr(torch.nn.Module, DEVICE)


def test_generated_tensor_methods(two_devices):
    x = torch.empty(4, 4)
    assert not is_on_device(x)
    for arg, index in ((torch.device(DEVICE), 0), (torch.device(f"{DEVICE}:0"), 0), (0, 0), (1, 1)):
        moved = to_device(x, arg)
        assert is_on_device(moved) and moved.device.index == index
    assert to_device(x).device == torch.device(DEVICE, torch.accelerator.current_device_index())


def test_generated_module_method_and_to(two_devices):
    model = torch.nn.Linear(3, 3)
    to_device(model)
    assert all(p.device == torch.device(DEVICE, 0) for p in model.parameters())
    model.to(f"{DEVICE}:1")
    assert all(p.device == torch.device(DEVICE, 1) for p in model.parameters())
    assert isinstance(model.weight, torch.nn.Parameter)


def test_packed_sequence_methods():
    seq = torch.nn.utils.rnn.PackedSequence(torch.rand(5, 3), torch.tensor([1, 1, 1, 1, 1]))
    assert not is_on_device(seq)
    moved = to_device(seq)
    assert is_on_device(moved) and moved.data.device.type == DEVICE
    assert torch.equal(moved.data.cpu(), seq.data)


def test_legacy_type_names():
    names = {
        torch.bool: "BoolTensor",
        torch.double: "DoubleTensor",
        torch.float32: "FloatTensor",
        torch.half: "HalfTensor",
        torch.bfloat16: "BFloat16Tensor",
        torch.int32: "IntTensor",
        torch.int64: "LongTensor",
        torch.int8: "CharTensor",
        torch.short: "ShortTensor",
        torch.uint8: "ByteTensor",
    }
    for dtype, name in names.items():
        assert torch.empty(2, dtype=dtype, device=DEVICE).type() == f"torch.{DEVICE}.{name}"
    converted = torch.randn(8).type(f"torch.{DEVICE}.FloatTensor")
    assert converted.device.type == DEVICE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        storage = torch.randn(4, 4, device=DEVICE).storage()
        assert is_on_device(storage) and storage.size() == 16
        assert storage.type() == f"torch.{DEVICE}.FloatStorage"


def test_default_device_can_be_the_device():
    try:
        torch.set_default_device(DEVICE)
        assert torch.empty(2).device.type == DEVICE
        assert torch.get_default_device().type == DEVICE
    finally:
        torch.set_default_device(None)
    assert torch.empty(2).device.type == "cpu"
