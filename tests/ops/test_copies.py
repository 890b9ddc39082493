"""Factories, views, resize_/set_, .item() and every copy direction, compared value by value with CPU."""

from __future__ import annotations

import pytest
import torch

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def _sample(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g).to(dtype)


def _same(actual: torch.Tensor, expected: torch.Tensor):
    assert actual.device.type == "cpu"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected)


# --- factories --------------------------------------------------------------------------------------------


def test_factories():
    x = torch.empty(2, 3, 4, device="flagos", dtype=torch.float16)
    assert x.shape == (2, 3, 4) and x.dtype == torch.float16 and x.device.type == "flagos"
    assert x.stride() == (12, 4, 1)
    s = torch.empty_strided((3, 4), (1, 3), device="flagos")
    assert s.stride() == (1, 3) and s.shape == (3, 4) and not s.is_contiguous()
    like = torch.empty_like(s)
    assert like.device == s.device and like.shape == s.shape and like.dtype == s.dtype
    cl = torch.empty(2, 3, 4, 5, device="flagos", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    z = torch.empty(0, device="flagos")
    assert z.numel() == 0 and z.cpu().numel() == 0
    new = x.new_empty((5,))
    assert new.device == x.device and new.dtype == torch.float16 and new.shape == (5,)


def test_tensor_constructor_on_flagos():
    t = torch.tensor([[1.5, -2.0], [3.25, 4.0]], device="flagos")
    assert t.device.type == "flagos"
    _same(t.cpu(), torch.tensor([[1.5, -2.0], [3.25, 4.0]]))
    i = torch.tensor([1, 2, 3], dtype=torch.int64, device="flagos:0")
    _same(i.cpu(), torch.tensor([1, 2, 3]))
    assert torch.as_tensor([7, 8], device="flagos").cpu().tolist() == [7, 8]


def test_item():
    assert torch.tensor(3.5, device="flagos").item() == 3.5
    assert torch.tensor(-7, device="flagos").item() == -7
    assert torch.tensor(True, device="flagos").item() is True
    assert torch.tensor([2**40 + 1], dtype=torch.int64, device="flagos").item() == 2**40 + 1
    assert torch.tensor(1 + 2j, dtype=torch.complex64, device="flagos").item() == 1 + 2j
    x = torch.arange(10, dtype=torch.float32).to("flagos")
    assert x[7].item() == 7.0
    assert x.view(2, 5)[1, 3].item() == 8.0
    assert float(x[3]) == 3.0 and int(x[4]) == 4


# --- host <-> device --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_dtypes(dtype):
    src = _sample((33, 17), dtype)
    d = src.to("flagos")
    assert d.device == torch.device("flagos", 0) and d.dtype == dtype
    _same(d.cpu(), src)
    _same(d.to("cpu"), src)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (5, 0, 3), (1 << 22,), (3, 1, 1, 2)], ids=str)
def test_roundtrip_shapes(shape):
    src = _sample(shape, torch.float32, seed=1)
    d = src.to("flagos")
    assert d.shape == src.shape
    _same(d.cpu(), src)


def test_h2d_non_contiguous_source():
    src = _sample((40, 30), torch.float32)
    for view in (src.t(), src[:, ::3], src[5:25:2, 1:], src.unsqueeze(0).expand(3, 40, 30)):
        d = view.to("flagos")
        _same(d.cpu(), view.contiguous())


def test_channels_last_layout_preserved():
    src = _sample((2, 3, 4, 5), torch.float32).contiguous(memory_format=torch.channels_last)
    d = src.to("flagos")
    assert d.stride() == src.stride()
    _same(d.cpu(), src)
    assert d.cpu().stride() == src.stride()
    dc = d.contiguous()
    assert dc.is_contiguous() and dc.device.type == "flagos"
    _same(dc.cpu(), src.contiguous())


def test_h2d_with_dtype_conversion():
    src = _sample((64,), torch.float32)
    _same(src.to("flagos", torch.float16).cpu(), src.to(torch.float16))
    _same(src.to("flagos", dtype=torch.int32).cpu(), src.to(torch.int32))
    dst = torch.empty(64, dtype=torch.bfloat16, device="flagos")
    dst.copy_(src)
    _same(dst.cpu(), src.to(torch.bfloat16))


def test_d2h_with_dtype_conversion():
    src = _sample((64,), torch.float32)
    d = src.to("flagos")
    out = torch.empty(64, dtype=torch.float64)
    out.copy_(d)
    _same(out, src.to(torch.float64))
    _same(d.to("cpu", torch.float16), src.to(torch.float16))


def test_copy_into_non_contiguous_destination():
    base_cpu = torch.zeros(6, 5)
    base = base_cpu.to("flagos")
    col = _sample((6,), torch.float32, seed=3)
    base[:, 2].copy_(col)
    base_cpu[:, 2] = col
    _same(base.cpu(), base_cpu)
    block = _sample((2, 3), torch.float32, seed=4)
    base[1:3, 1:4].copy_(block.to("flagos"))
    base_cpu[1:3, 1:4] = block
    _same(base.cpu(), base_cpu)
    # device -> host into a strided CPU view
    host = torch.zeros(5, 6)
    host.t().copy_(base)
    _same(host.t(), base_cpu)


def test_copy_broadcasts():
    row = torch.tensor([1.0, 2.0, 3.0])
    dst = torch.empty(4, 3, device="flagos")
    dst.copy_(row)
    _same(dst.cpu(), row.expand(4, 3))
    dst2 = torch.empty(2, 3, device="flagos")
    dst2.copy_(row.to("flagos"))
    _same(dst2.cpu(), row.expand(2, 3))


# --- device <-> device ------------------------------------------------------------------------------------


def test_d2d_same_device():
    src = _sample((20, 30), torch.float32)
    d = src.to("flagos")
    e = torch.empty_like(d)
    e.copy_(d)
    assert e.data_ptr() != d.data_ptr()
    _same(e.cpu(), src)
    c = d.clone()
    assert c.data_ptr() != d.data_ptr()
    _same(c.cpu(), src)
    assert d.to("flagos") is d


@pytest.mark.parametrize(
    "dtype_from,dtype_to",
    [
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.float16, torch.float64),
        (torch.float32, torch.int64),
        (torch.int32, torch.float32),
        (torch.uint8, torch.bool),
        (torch.float32, torch.complex64),
    ],
    ids=str,
)
def test_d2d_dtype_conversion(dtype_from, dtype_to):
    src = _sample((17, 9), dtype_from)
    d = src.to("flagos")
    converted = d.to(dtype_to)
    assert converted.device == d.device and converted.dtype == dtype_to
    _same(converted.cpu(), src.to(dtype_to))
    strided = d.t().to(dtype_to)
    _same(strided.cpu(), src.t().to(dtype_to))


def test_d2d_non_contiguous_layouts():
    src = _sample((12, 10), torch.float32)
    d = src.to("flagos")
    t = d.t().contiguous()
    assert t.is_contiguous() and t.device.type == "flagos"
    _same(t.cpu(), src.t().contiguous())
    sliced = d[::2, 3:].contiguous()
    _same(sliced.cpu(), src[::2, 3:].contiguous())
    dst = torch.empty(10, 12, device="flagos").t()  # non-contiguous destination
    dst.copy_(d)
    _same(dst.cpu(), src)
    perm = _sample((2, 3, 4), torch.int64).to("flagos").permute(2, 0, 1)
    _same(perm.contiguous().cpu(), perm.cpu().contiguous())


def test_cross_device_copies(two_devices_only):
    src = _sample((50, 40), torch.float32)
    d0 = src.to("flagos:0")
    d1 = d0.to("flagos:1")
    assert d1.device == torch.device("flagos", 1)
    _same(d1.cpu(), src)
    back = torch.empty_like(d0)
    back.copy_(d1)
    _same(back.cpu(), src)
    _same(d0.t().to("flagos:1").cpu(), src.t())
    _same(d0.to("flagos:1", torch.float16).cpu(), src.to(torch.float16))
    _same(d0.flagos(1).cpu(), src)
    dst = torch.empty(40, 50, device="flagos:1").t()
    dst.copy_(d0)
    _same(dst.cpu(), src)
    with torch.flagos.device(1):
        on_current = d0.to("flagos")
    assert on_current.device.index == 1
    _same(on_current.cpu(), src)


def test_copy_size_mismatch_is_an_error():
    dst = torch.empty(3, device="flagos")
    with pytest.raises(RuntimeError):
        dst.copy_(torch.ones(4))
    with pytest.raises(RuntimeError):
        dst.copy_(torch.ones(4).to("flagos"))


# --- views ------------------------------------------------------------------------------------------------


VIEWS = {
    "view": lambda t: t.view(6, 10),
    "reshape": lambda t: t.reshape(2, 30),
    "flatten": lambda t: t.flatten(),
    "transpose": lambda t: t.transpose(0, 2),
    "t": lambda t: t[0].t(),
    "permute": lambda t: t.permute(1, 2, 0),
    "slice": lambda t: t[:, 1:3, ::2],
    "negative_index": lambda t: t[-1, -2:],
    "select": lambda t: t.select(1, 2),
    "narrow": lambda t: t.narrow(2, 1, 3),
    "expand": lambda t: t[:, :1, :1].expand(3, 4, 5),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t[:, :1].squeeze(1),
    "as_strided": lambda t: t.as_strided((4, 5), (10, 2), 3),
    "diagonal": lambda t: t[0].diagonal(),
    "split": lambda t: t.split(2, dim=2)[1],
    "chunk": lambda t: t.chunk(2, dim=1)[1],
    "unbind": lambda t: t.unbind(0)[2],
    "view_dtype": lambda t: t.view(torch.int32),
    "movedim": lambda t: t.movedim(0, -1),
    "unflatten": lambda t: t.unflatten(2, (1, 5)),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views_match_cpu(name):
    host = torch.arange(120, dtype=torch.float32).reshape(3, 4, 10)[:, :, :5].contiguous()
    dev = host.to("flagos")
    view_fn = VIEWS[name]
    expected = view_fn(host)
    got = view_fn(dev)
    assert got.device == dev.device
    assert got.shape == expected.shape and got.stride() == expected.stride()
    assert got.storage_offset() == expected.storage_offset()
    assert got.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr(), "not a view"
    _same(got.cpu(), expected)


def test_writes_through_views_reach_base():
    host = torch.zeros(4, 6)
    dev = host.to("flagos")
    row = torch.arange(6, dtype=torch.float32)
    dev[2].copy_(row)
    host[2] = row
    col = torch.full((4,), -1.0)
    dev.t()[5].copy_(col)
    host.t()[5] = col
    dev.view(24)[0:3].copy_(torch.tensor([9.0, 8.0, 7.0]))
    host.view(24)[0:3] = torch.tensor([9.0, 8.0, 7.0])
    _same(dev.cpu(), host)


def test_reshape_of_non_contiguous_copies():
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dev = host.to("flagos")
    r = dev.t().reshape(12)
    _same(r.cpu(), host.t().reshape(12))


# --- resize_ and set_ -------------------------------------------------------------------------------------


def test_resize_keeps_data():
    src = torch.arange(10, dtype=torch.float32)
    d = src.to("flagos")
    d.resize_(100)
    assert d.shape == (100,)
    assert d.untyped_storage().nbytes() >= 400
    _same(d[:10].cpu(), src)
    d.resize_(4, 2)
    assert d.shape == (4, 2)
    _same(d.cpu(), src[:8].view(4, 2))
    e = torch.empty(0, device="flagos")
    e.resize_(3, 3)
    assert e.shape == (3, 3) and e.device.type == "flagos"


def test_resize_as():
    d = torch.empty(2, device="flagos")
    d.resize_as_(torch.empty(3, 7))
    assert d.shape == (3, 7)


def test_set_variants():
    src = torch.arange(12, dtype=torch.float32)
    d = src.to("flagos")
    a = torch.empty(0, device="flagos")
    a.set_(d)
    assert a.data_ptr() == d.data_ptr() and a.shape == d.shape
    _same(a.cpu(), src)
    b = torch.empty(0, device="flagos")
    b.set_(d.untyped_storage(), 4, (2, 3), (3, 1))
    _same(b.cpu(), src[4:10].view(2, 3))
    c = torch.empty(0, device="flagos")
    c.set_(d.untyped_storage())
    _same(c.cpu(), src)
    a.set_()
    assert a.numel() == 0 and a.device.type == "flagos"
    _same(d.cpu(), src)  # the original tensor is untouched


def test_set_grows_storage_like_cpu():
    src = torch.arange(4, dtype=torch.float32)
    d = src.to("flagos")
    y = torch.empty(0, device="flagos")
    y.set_(d.untyped_storage(), 2, (4,), (1,))  # needs 6 elements: the storage grows, as on CPU
    assert y.shape == (4,)
    assert d.untyped_storage().nbytes() >= 24
    assert torch.equal(y[:2].cpu(), src[2:])


def test_untyped_storage_roundtrip():
    src = torch.arange(16, dtype=torch.int16)
    d = src.to("flagos")
    storage = d.untyped_storage()
    assert storage.device.type == "flagos"
    assert storage.nbytes() == 32
    host = storage.cpu()
    assert host.device.type == "cpu"
    _same(torch.tensor([], dtype=torch.int16).set_(host), src)


def test_large_copy():
    src = torch.randn(1 << 23)
    d = src.to("flagos")
    _same(d.cpu(), src)


def test_conjugate_and_negative_views_copy_with_their_bits():
    # Regression: copying a conj/neg view to or from flagos recursed through the Conjugate fallback
    # until the process crashed.
    c = torch.randn(5, dtype=torch.complex64)
    x = c.to("flagos")
    assert torch.equal(x.conj().cpu(), c.conj())
    assert torch.equal(torch._neg_view(x).cpu(), -c)
    assert torch.equal(x.conj().resolve_conj().cpu(), c.conj())
    d = torch.empty(5, dtype=torch.complex64, device="flagos")
    d.conj().copy_(c)
    assert torch.equal(d.cpu(), c.conj())
