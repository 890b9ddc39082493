"""Storages (torch.UntypedStorage on the device) and serialization round-trips (torch.save/load, pickle).

Counterpart of torch_openreg's tests/test_storage.py.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch

DEVICE = "flagos"


def is_on_device(obj) -> bool:
    """The generated ``is_<device>`` property."""
    return getattr(obj, f"is_{DEVICE}")


def to_device(obj, *args):
    """The generated ``<device>()`` method (like ``.cuda()``)."""
    return getattr(obj, DEVICE)(*args)


def bytes_of(storage: torch.UntypedStorage) -> list[int]:
    return list(storage.cpu())


def test_untyped_storage_on_the_device(two_devices):
    storage = torch.UntypedStorage(16, device=DEVICE)
    assert storage.device == torch.device(DEVICE, 0) and storage.nbytes() == 16
    assert is_on_device(storage) and not is_on_device(torch.UntypedStorage(4))
    assert torch.UntypedStorage(4, device=f"{DEVICE}:1").device.index == 1
    assert storage.data_ptr() != 0


def test_tensor_storage_shares_memory_and_size():
    x = torch.arange(12, dtype=torch.float32, device=DEVICE)
    storage = x.untyped_storage()
    assert storage.device == x.device and storage.nbytes() == 48
    assert storage.data_ptr() == x.data_ptr()
    assert x[4:].untyped_storage().data_ptr() == storage.data_ptr()


def test_storage_fill_copy_slice_clone():
    storage = torch.UntypedStorage(8, device=DEVICE)
    storage.fill_(7)
    assert bytes_of(storage) == [7] * 8
    storage.copy_(torch.arange(8, dtype=torch.uint8).untyped_storage())
    assert bytes_of(storage) == list(range(8))
    assert bytes_of(storage[2:5]) == [2, 3, 4]
    clone = storage.clone()
    assert clone.device == storage.device and clone.data_ptr() != storage.data_ptr()
    storage.fill_(0)
    assert bytes_of(clone) == list(range(8))


def test_storage_resize_keeps_prefix():
    storage = torch.arange(8, dtype=torch.uint8, device=DEVICE).untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64 and storage.device.type == DEVICE
    assert bytes_of(storage)[:8] == list(range(8))
    storage.resize_(4)
    assert bytes_of(storage) == [0, 1, 2, 3]


def test_storage_moves_between_host_and_devices(two_devices):
    host = torch.arange(8, dtype=torch.uint8).untyped_storage()
    for moved in (to_device(host), to_device(host, 1), host.to(device=f"{DEVICE}:1")):
        assert is_on_device(moved) and bytes_of(moved) == list(range(8))
    assert to_device(host, 1).device.index == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = to_device(torch.arange(4.0).storage())
        assert typed.device.type == DEVICE and typed.size() == 4


def test_tensor_set_from_device_storage(two_devices):
    x = torch.randn(3, 4, device=f"{DEVICE}:1")
    y = torch.empty(0, device=f"{DEVICE}:0").set_(x.untyped_storage(), 0, (3, 4))
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    assert torch.equal(y.cpu(), x.cpu())


def test_rewrapped_pinned_storage_is_pinned():
    pinned = torch.randn(10).pin_memory()
    rewrapped = torch.tensor((), dtype=torch.float32).set_(
        pinned.untyped_storage()[8:], size=(5,), stride=(1,), storage_offset=0
    )
    assert rewrapped.is_pinned()
    assert rewrapped.data_ptr() == pinned.data_ptr() + 8
    assert torch.equal(rewrapped, pinned[2:7])


# --- typed storages (the legacy classes, as torch.cuda has them) ------------------------------------------

# The dtypes torch.cuda has legacy storage classes for, with their names.
LEGACY_STORAGE_NAMES = {
    torch.double: "DoubleStorage",
    torch.float: "FloatStorage",
    torch.half: "HalfStorage",
    torch.long: "LongStorage",
    torch.int: "IntStorage",
    torch.int16: "ShortStorage",
    torch.int8: "CharStorage",
    torch.uint8: "ByteStorage",
    torch.bool: "BoolStorage",
    torch.bfloat16: "BFloat16Storage",
    torch.cdouble: "ComplexDoubleStorage",
    torch.cfloat: "ComplexFloatStorage",
}


@pytest.fixture
def typed_storage_warnings_off():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        yield


@pytest.mark.parametrize("dtype", list(LEGACY_STORAGE_NAMES), ids=str)
def test_storage_type_is_the_device_modules_class(dtype, typed_storage_warnings_off):
    x = torch.ones(5, dtype=dtype, device=DEVICE)
    storage_type = x.storage_type()
    assert storage_type is getattr(torch.get_device_module(DEVICE), LEGACY_STORAGE_NAMES[dtype])
    assert storage_type.__module__ == f"torch.{DEVICE}" and storage_type.dtype == dtype
    assert isinstance(x.storage(), storage_type)
    assert not isinstance(x.cpu().storage(), storage_type)
    assert not isinstance(x.storage(), getattr(torch, LEGACY_STORAGE_NAMES[dtype]))  # the CPU class
    assert x.storage().type() == f"torch.{DEVICE}.{LEGACY_STORAGE_NAMES[dtype]}"


def test_legacy_classes_make_device_storages(two_devices, typed_storage_warnings_off):
    FloatStorage = torch.get_device_module(DEVICE).FloatStorage
    empty = FloatStorage(4)
    assert empty.device == torch.device(DEVICE, 0) and empty.dtype == torch.float and empty.size() == 4
    assert FloatStorage([1.5, 2.5]).tolist() == [1.5, 2.5] and FloatStorage([1.5]).device.type == DEVICE
    on_1 = torch.arange(3.0, device=f"{DEVICE}:1").untyped_storage()
    wrapped = FloatStorage(wrap_storage=on_1)
    assert wrapped.device.index == 1 and wrapped.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match=f"Device of 'wrap_storage' must be {DEVICE}"):
        FloatStorage(wrap_storage=torch.arange(3.0).untyped_storage())
    with pytest.raises(RuntimeError, match="from_buffer: Not available"):
        FloatStorage.from_buffer(b"\0" * 8)


def test_typed_storage_round_trips(typed_storage_warnings_off):
    x = torch.arange(12, dtype=torch.float64, device=DEVICE).reshape(3, 4)
    storage = x.storage()
    assert storage.device == x.device and storage.size() == 12 and storage.data_ptr() == x.data_ptr()
    rebuilt = torch.tensor((), dtype=x.dtype, device=DEVICE).set_(storage).view(3, 4)
    assert rebuilt.data_ptr() == x.data_ptr() and torch.equal(rebuilt.cpu(), x.cpu())
    assert torch.equal(torch.tensor(storage, dtype=x.dtype, device=DEVICE).cpu(), x.flatten().cpu())
    host = storage.cpu()
    assert (
        host.device.type == "cpu"
        and host.type() == "torch.DoubleStorage"
        and host.tolist() == storage.tolist()
    )
    back = to_device(host)
    assert back.device.type == DEVICE and back.dtype == torch.float64 and back.tolist() == host.tolist()
    assert isinstance(back, x.storage_type())


def test_typed_storage_pickles(two_devices, typed_storage_warnings_off):
    storage = torch.arange(5, dtype=torch.int32, device=f"{DEVICE}:1").storage()
    for copied in (
        pickle.loads(pickle.dumps(storage)),
        copy.deepcopy(storage),
        save_load(storage, weights_only=True),
    ):
        assert copied.device == storage.device and copied.dtype == torch.int32
        assert copied.tolist() == [0, 1, 2, 3, 4] and copied.data_ptr() != storage.data_ptr()
        assert isinstance(copied, storage._get_legacy_storage_class())
    legacy_class = storage._get_legacy_storage_class()
    assert pickle.loads(pickle.dumps(legacy_class)) is legacy_class  # the class pickles by name


# --- serialization ----------------------------------------------------------------------------------------


def save_load(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_location_tags(two_devices):
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device=DEVICE)) == f"{DEVICE}:0"
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device=f"{DEVICE}:1")) == f"{DEVICE}:1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = torch.empty(4, 4).storage()
        for tag in (f"{DEVICE}:0", f"{DEVICE}:1"):
            restored = torch.serialization.default_restore_location(host, tag)
            assert is_on_device(restored) and restored.device == torch.device(tag)


def test_save_load_keeps_device_values_and_sharing(two_devices):
    x = torch.randn(2, 3, device=f"{DEVICE}:1")
    loaded = save_load({"x": x, "row": x[1]}, weights_only=True)
    assert loaded["x"].device == x.device and torch.equal(loaded["x"].cpu(), x.cpu())
    assert loaded["row"].untyped_storage().data_ptr() == loaded["x"].untyped_storage().data_ptr()
    assert torch.equal(loaded["row"].cpu(), x[1].cpu())


def test_map_location(two_devices):
    x = torch.randn(3, 3, device=f"{DEVICE}:0")
    on_cpu = save_load(x, map_location="cpu")
    assert on_cpu.is_cpu and torch.equal(on_cpu, x.cpu())
    on_1 = save_load(x, map_location=f"{DEVICE}:1")
    assert on_1.device.index == 1 and torch.equal(on_1.cpu(), x.cpu())
    from_host = save_load(torch.arange(6.0), map_location=DEVICE)
    assert from_host.device.type == DEVICE and torch.equal(from_host.cpu(), torch.arange(6.0))


def test_state_dict_round_trip():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to(DEVICE)
    loaded = save_load(model.state_dict(), weights_only=True)
    assert set(loaded) == set(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to(DEVICE)
    fresh.load_state_dict(loaded)
    x = torch.randn(2, 4, device=DEVICE)
    assert torch.equal(fresh(x).cpu(), model(x).cpu())


def test_mmap_load(tmp_path):
    path = tmp_path / "x.pt"
    x = torch.randn(16, device=DEVICE)
    torch.save(x, path)
    loaded = torch.load(path, mmap=True, weights_only=True)
    assert loaded.device == x.device and torch.equal(loaded.cpu(), x.cpu())


def test_skip_data_keeps_metadata():
    buffer = io.BytesIO()
    with torch.serialization.skip_data():
        torch.save(torch.empty(3, 5, device=DEVICE, dtype=torch.float16), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded.device.type == DEVICE and loaded.shape == (3, 5) and loaded.dtype == torch.float16


def test_pickle_and_deepcopy_tensors(two_devices):
    x = torch.randn(4, device=f"{DEVICE}:1", requires_grad=True)
    for copied in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert copied.device == x.device and copied.requires_grad
        assert copied.data_ptr() != x.data_ptr()
        assert torch.equal(copied.detach().cpu(), x.detach().cpu())
