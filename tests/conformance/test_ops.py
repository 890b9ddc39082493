"""Operators on the device: factories, copies, views, in-place/out= semantics and results against CPU.

Counterpart of torch_openreg's tests/test_ops.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

DEVICE = "flagos"
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (rtol, atol) per dtype for a result against the same computation on CPU; "long" ops reduce over ~64 terms
ELEMENTWISE_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3)}
REDUCTION_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 2e-2), torch.bfloat16: (5e-2, 1e-1)}


def assert_matches_cpu(out, ref, dtype, long=False):
    rtol, atol = (REDUCTION_TOL if long else ELEMENTWISE_TOL)[dtype]
    assert out.device.type == DEVICE and out.dtype == ref.dtype
    torch.testing.assert_close(out.cpu(), ref, rtol=rtol, atol=atol)


# --- factories --------------------------------------------------------------------------------------------


def test_factories():
    assert torch.empty(3, device=DEVICE).shape == (3,)
    assert torch.tensor((), device=DEVICE).shape == (0,)
    assert torch.equal(torch.zeros(2, 3, device=DEVICE).cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(3, 4, device=DEVICE).cpu(), torch.ones(3, 4))
    assert torch.equal(torch.full((3, 4), 5.0, device=DEVICE).cpu(), torch.full((3, 4), 5.0))
    assert torch.equal(torch.arange(10, device=DEVICE).cpu(), torch.arange(10))
    assert torch.equal(torch.eye(3, device=DEVICE).cpu(), torch.eye(3))
    assert torch.equal(torch.linspace(0, 1, 5, device=DEVICE).cpu(), torch.linspace(0, 1, 5))
    assert torch.equal(torch.triu_indices(3, 3, device=DEVICE).cpu(), torch.triu_indices(3, 3))
    x = torch.randn(3, 4, device=DEVICE)
    assert torch.equal(torch.ones_like(x).cpu(), torch.ones(3, 4)) and torch.ones_like(x).device == x.device
    strided = torch.empty_strided((3, 4), (1, 3), device=DEVICE)
    assert strided.stride() == (1, 3) and strided.device.type == DEVICE


def test_factories_under_fake_tensor_mode():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        z = torch.empty(3, 3, device=DEVICE) + torch.empty(3, 3, device=f"{DEVICE}:0")
        assert z.device == torch.device(DEVICE, 0) and z.shape == (3, 3)


# --- copies -----------------------------------------------------------------------------------------------


def test_host_device_round_trip_and_clone():
    a = torch.rand(10)
    assert torch.equal(a.to(DEVICE).add(2).cpu(), a + 2)
    x = a.to(DEVICE)
    clone = x.clone()
    assert clone.data_ptr() != x.data_ptr() and torch.equal(clone.cpu(), a)


def test_copy_between_devices(two_devices):
    a = torch.randn(10)
    assert torch.equal(a.to(f"{DEVICE}:0").to(f"{DEVICE}:1").cpu(), a)
    dst = torch.empty(10, device=f"{DEVICE}:1")
    dst.copy_(a.to(f"{DEVICE}:0"))
    assert torch.equal(dst.cpu(), a)


def test_copy_converts_dtype_and_layout():
    x = torch.randn(3, 4, device=DEVICE)
    y = torch.empty(3, 4, dtype=torch.float64, device=DEVICE).copy_(x)
    assert torch.equal(y.cpu(), x.cpu().double())
    t = torch.empty(4, 3, device=DEVICE).copy_(x.t())
    assert torch.equal(t.cpu(), x.cpu().t())
    assert torch.equal(x.to(torch.int32).cpu(), x.cpu().to(torch.int32))


def test_non_blocking_device_copy():
    x = torch.randn(3, 4, device=DEVICE)
    y = torch.empty(3, 4, device=DEVICE)
    y.copy_(x, non_blocking=True)
    assert torch.equal(y.cpu(), x.cpu())


# --- views, metadata, in-place ----------------------------------------------------------------------------


def test_views_share_memory():
    x = torch.randn(2, 3, 4, device=DEVICE)
    for view in (x.view(6, 4), x.reshape(6, 4), x.transpose(0, 2), x[0], x.unsqueeze(0)):
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    strided = torch.as_strided(x, (2, 2), (4, 1), 1)
    assert torch.equal(strided.cpu(), torch.as_strided(x.cpu(), (2, 2), (4, 1), 1))
    col = torch.tensor([[1], [2], [3]], device=DEVICE)
    expanded = col.expand(3, 2)
    assert expanded.data_ptr() == col.data_ptr()
    assert torch.equal(expanded.cpu(), torch.tensor([[1, 1], [2, 2], [3, 3]]))


def test_set_resize_and_item():
    x = torch.randn(3, 4, device=DEVICE)
    y = torch.empty(0, device=DEVICE).set_(x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y.cpu(), x.cpu())
    z = torch.randn(4, 4).to(DEVICE)
    z.resize_(2, 2, 2, 2)
    assert z.shape == (2, 2, 2, 2) and z.untyped_storage().nbytes() == 64
    z.resize_(100)
    assert z.untyped_storage().nbytes() >= 400
    assert torch.tensor([5.0], device=DEVICE).item() == 5.0
    assert torch.tensor(7, device=DEVICE).item() == 7


def test_printing_names_the_device():
    text = str(torch.ones(20, device=DEVICE))
    assert f"device='{DEVICE}:0'" in text


def test_inplace_and_out_keep_identity():
    x = torch.randn(2, 3, device=DEVICE)
    ref = x.cpu()
    assert x.abs_() is x
    out = torch.empty(2, 3, device=DEVICE)
    result = torch.mul(x, 2, out=out)
    assert result is out
    assert torch.equal(out.cpu(), ref.abs() * 2)


@pytest.mark.parametrize("step", [2, 3])
def test_out_into_strided_view(step):
    # step 3 makes TensorIterator resize the out view (a deprecation warning, the same on every device)
    x_cpu, o_cpu = torch.randn(2, 2, 3), torch.randn(2, 2, 6)
    o_dev = o_cpu.to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.abs(x_cpu.to(DEVICE), out=o_dev[:, :, 0:6:step])
        torch.abs(x_cpu, out=o_cpu[:, :, 0:6:step])
    assert torch.equal(o_dev.cpu(), o_cpu)


# --- results against CPU ----------------------------------------------------------------------------------

UNARY = {
    "abs": torch.abs,
    "neg": torch.neg,
    "exp": torch.exp,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
    "rsqrt_abs": lambda t: torch.rsqrt(t.abs() + 1),
    "clamp": lambda t: t.clamp(-0.5, 0.5),
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "where": lambda a, b: torch.where(a > b, a, b),
    "add_scalar_alpha": lambda a, b: torch.add(a, b, alpha=0.5) + 1.5,
}
REDUCTIONS = {
    "sum": lambda t: t.sum(-1),
    "mean": lambda t: t.mean(0),
    "amax": lambda t: t.amax(-1),
    "cumsum": lambda t: t.cumsum(-1),
    "softmax": lambda t: torch.softmax(t, -1),
    "log_softmax": lambda t: torch.log_softmax(t, -1),
    "layer_norm": lambda t: F.layer_norm(t, t.shape[-1:]),
    "mm": lambda t: t @ t.t(),
    "bmm": lambda t: torch.bmm(t.view(2, 4, 64), t.view(2, 64, 4)),
}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_matches_cpu(name, dtype):
    a = torch.randn(8, 64).to(dtype)
    assert_matches_cpu(UNARY[name](a.to(DEVICE)), UNARY[name](a), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_matches_cpu(name, dtype):
    a, b = torch.randn(8, 64).to(dtype), torch.randn(8, 64).to(dtype)
    assert_matches_cpu(BINARY[name](a.to(DEVICE), b.to(DEVICE)), BINARY[name](a, b), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_and_linear_algebra_match_cpu(name, dtype):
    a = torch.randn(8, 64).to(dtype)
    assert_matches_cpu(REDUCTIONS[name](a.to(DEVICE)), REDUCTIONS[name](a), dtype, long=True)


def test_integer_and_bool_ops_match_cpu():
    a, b = torch.randint(-50, 50, (64,)), torch.randint(1, 9, (64,))
    da, db = a.to(DEVICE), b.to(DEVICE)
    for out, ref in [
        (da + db, a + b),
        (da // db, a // b),
        (da % db, a % b),
        (da & db, a & b),
        (da.sum(), a.sum()),
        (da > 0, a > 0),
        ((da > 0) & (db > 4), (a > 0) & (b > 4)),
        (torch.sort(da).values, torch.sort(a).values),
    ]:
        assert out.dtype == ref.dtype and torch.equal(out.cpu(), ref)


def test_data_dependent_shapes_and_indexing():
    x_cpu = torch.randn(10)
    x = x_cpu.to(DEVICE)
    assert torch.equal(torch.masked_select(x, x.gt(0)).cpu(), x_cpu[x_cpu > 0])
    assert torch.equal(torch.nonzero(x > 0).cpu(), torch.nonzero(x_cpu > 0))
    assert torch.equal(torch.unique(torch.tensor([3, 1, 3, 2], device=DEVICE)).cpu(), torch.tensor([1, 2, 3]))
    m = torch.tensor([[1.0, 2, 3], [2, 3, 4]], device=DEVICE)
    idx = torch.tensor([1, 0], device=DEVICE)
    assert torch.equal(m[idx, idx].cpu(), torch.tensor([3.0, 1.0]))
    m[idx, idx] = 0.0
    assert torch.equal(m.cpu(), torch.tensor([[0.0, 2, 3], [2, 0, 4]]))


def test_foreach_ops():
    v = torch.tensor([1.0, 2, 3], device=DEVICE)
    results = torch._foreach_add((v, v * 2), (v, v))
    assert [r.cpu().tolist() for r in results] == [[2.0, 4.0, 6.0], [3.0, 6.0, 9.0]]


@pytest.mark.parametrize("is_causal", [False, True])
def test_scaled_dot_product_attention_matches_cpu(is_causal):
    q, k, v = (torch.rand(2, 2, 16, 8) for _ in range(3))
    out = F.scaled_dot_product_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert_matches_cpu(out, ref, torch.float32, long=True)


def test_cpu_scalar_tensors_mix_but_other_devices_do_not(two_devices):
    x = torch.ones(2, device=DEVICE)
    assert torch.equal((x + torch.tensor(2.0)).cpu(), torch.full((2,), 3.0))
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2)
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(2, device=f"{DEVICE}:1")
