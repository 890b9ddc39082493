"""Quantized tensors on flagos (per-tensor and per-channel affine): quantize and dequantize, int_repr, the
quantization parameters, copies to and from the CPU and between flagos tensors, and the view and shape ops
the native device supports on them, all run by the native device's quantized kernels (QuantizedCPU here)
on zero-copy aliases. Results (int_repr, quantizer, dequantized values) and exception types are compared
with the same calls on CPU."""

from __future__ import annotations

import pytest
import torch
import torch._prims_common

import torch_fl

DEVICE = "flagos"

# The CPU is the reference here because it is flagos's native device on the simulated accelerator; backed by
# CUDA (few quantized kernels), tests/ops/test_semantics_backed.py compares the same cases with cuda.
pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor, torch.quantize_per_channel"),
    pytest.mark.skipif(
        torch_fl._C._backing_type() is not None,
        reason="compares with the CPU, flagos's native device on sim; test_semantics_backed.py compares with cuda",
    ),
]

QDTYPES = [torch.qint8, torch.quint8, torch.qint32]


def values(d):
    return torch.linspace(-2.0, 2.0, 24, device=d).view(2, 3, 4)


def per_tensor(d, dtype=torch.qint8):
    return torch.quantize_per_tensor(values(d), 0.05, 3 if dtype == torch.quint8 else 0, dtype)


def per_channel(d, dtype=torch.quint8, axis=1):
    n = values(d).shape[axis]
    scales = torch.tensor([0.02, 0.05, 0.1, 0.03][:n], dtype=torch.float64, device=d)
    zero_points = torch.tensor([0, 2, 5, 1][:n], device=d)
    return torch.quantize_per_channel(values(d), scales, zero_points, axis, dtype)


def assert_same(actual, expected):
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.device.type == DEVICE, actual.device
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if not expected.is_quantized:
        torch.testing.assert_close(actual.cpu(), expected)
        return
    assert actual.stride() == expected.stride() and actual.qscheme() == expected.qscheme()
    assert torch.equal(actual.int_repr().cpu(), expected.int_repr())
    if expected.qscheme() == torch.per_tensor_affine:
        assert (actual.q_scale(), actual.q_zero_point()) == (expected.q_scale(), expected.q_zero_point())
    else:
        assert actual.q_per_channel_axis() == expected.q_per_channel_axis()
        assert torch.equal(actual.q_per_channel_scales().cpu(), expected.q_per_channel_scales())
        assert torch.equal(actual.q_per_channel_zero_points().cpu(), expected.q_per_channel_zero_points())
    assert torch.equal(actual.dequantize().cpu(), expected.dequantize())
    back = actual.cpu()  # the copy back to the CPU
    # torch's _to_copy makes the copy of a quantized tensor with gaps with empty_like(self), on the source's
    # device (a cuda tensor's .cpu() is on cuda too): only dense ones come back on the CPU.
    dense = torch._prims_common.is_non_overlapping_and_dense_or_false(actual)
    expected_device = "cpu" if dense else DEVICE
    assert back.device.type == expected_device and back.is_quantized
    assert torch.equal(back.int_repr().cpu(), expected.int_repr())


def run_both(fn):
    result = fn(DEVICE)
    assert_same(result, fn("cpu"))
    return result


CASES = {
    "per_tensor": lambda d: per_tensor(d),
    "per_tensor_quint8": lambda d: per_tensor(d, torch.quint8),
    "per_tensor_qint32": lambda d: per_tensor(d, torch.qint32),
    "per_tensor_tensor_params": lambda d: torch.quantize_per_tensor(
        values(d), torch.tensor(0.1, device=d), torch.tensor(1, device=d), torch.quint8
    ),
    "per_channel_axis0": lambda d: per_channel(d, axis=0),
    "per_channel_axis2": lambda d: per_channel(d, torch.qint8, axis=2),
    "dequantize": lambda d: per_tensor(d).dequantize(),
    "dequantize_per_channel": lambda d: per_channel(d).dequantize(),
    "int_repr": lambda d: per_channel(d).int_repr(),
    "params": lambda d: (
        per_tensor(d).q_scale(),
        per_tensor(d).q_zero_point(),
        per_channel(d).q_per_channel_axis(),
    ),
    "channel_params": lambda d: (
        per_channel(d).q_per_channel_scales(),
        per_channel(d).q_per_channel_zero_points(),
    ),
    "empty_affine": lambda d: (
        lambda q: (q.is_quantized, tuple(q.shape), q.dtype, q.qscheme(), q.q_scale(), q.q_zero_point())
    )(torch._empty_affine_quantized((2, 3), scale=0.5, zero_point=1, dtype=torch.quint8, device=d)),
    "make_per_tensor": lambda d: torch._make_per_tensor_quantized_tensor(
        torch.arange(6, dtype=torch.int8, device=d), 0.25, 2
    ),
    "view": lambda d: per_tensor(d).view(6, 4),
    "reshape": lambda d: per_tensor(d).reshape(4, 6),
    "flatten": lambda d: per_channel(d, axis=0).flatten(1),
    "select": lambda d: per_tensor(d)[1],
    "slice": lambda d: per_tensor(d)[:, 1:, ::2],
    "narrow": lambda d: per_tensor(d).narrow(2, 1, 2),
    "squeeze_unsqueeze": lambda d: per_tensor(d).unsqueeze(1).squeeze(1),
    "transpose": lambda d: per_tensor(d).transpose(0, 2),
    "permute": lambda d: per_tensor(d).permute(2, 0, 1),
    "contiguous": lambda d: per_tensor(d).transpose(0, 2).contiguous(),
    "clone": lambda d: per_channel(d).clone(),
    "unbind": lambda d: per_tensor(d).unbind(1),
    "chunk": lambda d: per_tensor(d).chunk(2, dim=2),
    "expand": lambda d: per_tensor(d)[:, :1].expand(2, 3, 4),
    "copy_between_flagos": lambda d: torch._empty_affine_quantized(
        (2, 3, 4), scale=0.05, zero_point=0, dtype=torch.qint8, device=d
    ).copy_(per_tensor(d)),
    "copy_from_float": lambda d: per_tensor(d).copy_(values(d) * 0.5),
    "relu": lambda d: torch.relu(per_tensor(d)),
    "quantized_add": lambda d: torch.ops.quantized.add(
        per_tensor(d, torch.quint8), per_tensor(d, torch.quint8), 0.1, 3
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_as_on_cpu(name):
    run_both(CASES[name])


@pytest.mark.parametrize("dtype", QDTYPES, ids=str)
def test_copies_to_flagos_and_back(dtype):
    for q in (per_tensor("cpu", dtype), per_channel("cpu", dtype if dtype != torch.qint32 else torch.qint8)):
        f = q.to(DEVICE)
        assert_same(f, q)
        assert_same(f.to(DEVICE, copy=True), q)


def test_views_share_memory_and_copies_do_not():
    q = per_tensor(DEVICE)
    v = q.view(-1)
    assert v.data_ptr() == q.data_ptr() and v.is_quantized and v.device == q.device
    assert q[1].data_ptr() == q.data_ptr() + 12
    c = q.clone()
    assert c.data_ptr() != q.data_ptr()
    q.copy_(torch.zeros(2, 3, 4, device=DEVICE))  # a write to q shows through its view
    assert torch.equal(v.int_repr().cpu(), torch.zeros(24, dtype=torch.int8))


def test_quantizer_follows_a_copy():
    dst = torch._empty_affine_quantized((2, 3, 4), scale=1.0, zero_point=7, dtype=torch.qint8, device=DEVICE)
    dst.copy_(per_tensor(DEVICE))
    assert (dst.q_scale(), dst.q_zero_point()) == (0.05, 0)  # as on CPU: the source's quantizer


def test_on_the_second_device(two_devices_only):
    q = per_channel("flagos:1", axis=0)
    assert q.device == torch.device("flagos", 1)
    assert q.q_per_channel_scales().device == q.device
    assert_same(q.view(2, 12).dequantize(), per_channel("cpu", axis=0).view(2, 12).dequantize())


ERROR_CASES = {
    "add_tensor": lambda d: per_tensor(d) + per_tensor(d),
    "per_channel_transpose": lambda d: per_channel(d).transpose(0, 1),
    "copy_to_float": lambda d: values(d).copy_(per_tensor(d)),
    "qscheme_mismatch": lambda d: per_channel(d, torch.qint8).copy_(per_tensor(d)),
    "dequantize_unquantized_dtype": lambda d: torch.quantize_per_tensor(values(d).int(), 0.1, 0, torch.qint8),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_as_on_cpu(name):
    with pytest.raises(Exception) as cpu:
        ERROR_CASES[name]("cpu")
    with pytest.raises(Exception) as flagos:
        ERROR_CASES[name](DEVICE)
    assert type(flagos.value) is type(cpu.value)
    first = str(cpu.value).splitlines()[0].split(" (while running")[0]
    # CPU's "from the 'QuantizedCPU' backend" names the device that ran the kernel.
    assert first in str(flagos.value)


def test_first_quantized_tensor_finds_its_kernels(run_python):
    code = """
import json, warnings, torch, torch_fl
warnings.simplefilter("ignore")
has = lambda: torch._C._dispatch_has_kernel_for_dispatch_key("aten::copy_", "QuantizedPrivateUse1")
before = has()
q = torch.quantize_per_tensor(torch.linspace(-1, 1, 8, device="flagos"), 0.1, 0, torch.qint8)
after = has()
ok = torch.equal(q.clone().int_repr().cpu(), q.cpu().int_repr())
print("RESULT", json.dumps([before, after, ok]))
"""
    assert run_python(code).check().json() == [False, True, True]


def test_save_load_and_deepcopy():
    import copy
    import io

    for q in (per_tensor(DEVICE), per_channel(DEVICE, axis=0)):
        buffer = io.BytesIO()
        torch.save(q, buffer)
        buffer.seek(0)
        for r in (torch.load(buffer, weights_only=False), copy.deepcopy(q)):
            assert r.device == q.device and r.data_ptr() != q.data_ptr()
            assert_same(r, q.cpu())


def test_device_argument_places_the_result(two_devices_only):
    q = per_tensor(DEVICE)
    for device in ("cpu", "flagos:1"):
        r = torch.empty_like(q, device=device)
        assert r.device == torch.device(device) and r.is_quantized and r.q_scale() == q.q_scale()


def test_copy_to_another_flagos_device(two_devices_only):
    q = per_channel(DEVICE, axis=0)
    r = q.to("flagos:1")
    assert r.device == torch.device("flagos", 1) and r.untyped_storage().device == r.device
    assert_same(r, q.cpu())
