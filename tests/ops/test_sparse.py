"""Sparse COO and compressed (CSR, CSC, BSR) tensors on flagos: created on flagos or moved there, their
members (indices and values) ordinary flagos tensors, every op run by the native device's kernel for the
same layout on zero-copy aliases (SparseCPU here). Values, layouts, members and exception types are
compared with the same calls on CPU."""

from __future__ import annotations

import pytest
import torch

import torch_fl

DEVICE = "flagos"

# The CPU is the reference here because it is flagos's native device on the simulated accelerator; backed by
# CUDA, flagos runs CUDA's kernels, and tests/ops/test_semantics_backed.py compares the same cases with cuda.
cpu_is_native = pytest.mark.skipif(
    torch_fl._C._backing_type() is not None,
    reason="compares with the CPU, flagos's native device on sim; test_semantics_backed.py compares with cuda",
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse (CSR|BSR|CSC) tensor support is in beta state"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]


def coo(d, dtype=torch.float32, coalesced=False):
    # Index (1, 0) appears twice: uncoalesced until coalesce() sums the duplicates.
    indices = torch.tensor([[1, 0, 1, 2], [0, 2, 0, 1]], device=d)
    values = torch.tensor([1.0, 2.0, 3.0, 4.0], device=d).to(dtype)
    s = torch.sparse_coo_tensor(indices, values, (3, 4))
    return s.coalesce() if coalesced else s


def dense(d, dtype=torch.float32):
    return torch.tensor([[0.0, 1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 3.0], [4.0, 0.0, 5.0, 0.0]], device=d).to(
        dtype
    )


def on_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(on_cpu(e) for e in x)
    return x


def assert_same(actual, expected):
    """actual (from flagos, moved to the CPU) equals expected: layout, members, values."""
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert (
        actual.layout == expected.layout and actual.dtype == expected.dtype and actual.shape == expected.shape
    )
    if expected.layout == torch.sparse_coo:
        assert actual.is_coalesced() == expected.is_coalesced()
        assert actual.sparse_dim() == expected.sparse_dim() and actual.dense_dim() == expected.dense_dim()
        assert torch.equal(actual._indices(), expected._indices())
        torch.testing.assert_close(actual._values(), expected._values())
    elif expected.layout != torch.strided:
        for a, e in zip(members(actual), members(expected), strict=True):
            torch.testing.assert_close(a, e)
    else:
        torch.testing.assert_close(actual, expected)


def members(t):
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices(), t.values()
    return t.ccol_indices(), t.row_indices(), t.values()


def assert_on_flagos(x):
    if isinstance(x, (tuple, list)):
        for e in x:
            assert_on_flagos(e)
    elif isinstance(x, torch.Tensor):
        assert x.device.type == DEVICE, x.device
        if x.layout == torch.sparse_coo:
            assert x._indices().device == x.device and x._values().device == x.device
        elif x.layout != torch.strided:
            assert all(m.device == x.device for m in members(x))


def run_both(fn):
    flagos = fn(DEVICE)
    assert_on_flagos(flagos)
    assert_same(on_cpu(flagos), fn("cpu"))
    return flagos


CASES = {
    "create": lambda d: coo(d),
    "create_coalesced": lambda d: coo(d, coalesced=True),
    "create_empty": lambda d: torch.empty(2, 3, layout=torch.sparse_coo, device=d),
    "sparse_zeros": lambda d: torch.zeros(2, 3, layout=torch.sparse_coo, device=d),
    "to_sparse": lambda d: dense(d).to_sparse(),
    "to_sparse_dim1": lambda d: dense(d).to_sparse(sparse_dim=1),
    "to_dense": lambda d: coo(d).to_dense(),
    "coalesce": lambda d: coo(d).coalesce(),
    "indices_values": lambda d: (coo(d, coalesced=True).indices(), coo(d, coalesced=True).values()),
    "private_members": lambda d: (coo(d)._indices(), coo(d)._values(), coo(d)._nnz()),
    "add_sparse": lambda d: coo(d) + coo(d, coalesced=True),
    "add_dense_sparse": lambda d: dense(d) + coo(d),
    "sub": lambda d: coo(d, coalesced=True) - coo(d),
    "mul_sparse": lambda d: coo(d, coalesced=True) * coo(d, coalesced=True),
    "mul_scalar": lambda d: coo(d) * 2.5,
    "mul_dense": lambda d: coo(d, coalesced=True) * dense(d),
    "mm_dense": lambda d: torch.mm(coo(d), dense(d).t()),
    "sparse_mm": lambda d: torch.sparse.mm(coo(d), dense(d).t()),
    "addmm": lambda d: torch.addmm(torch.ones(3, 3, device=d), coo(d), dense(d).t(), beta=0.5, alpha=2.0),
    "matmul_dense_sparse": lambda d: dense(d) @ coo(d).t(),
    "sum": lambda d: coo(d).sum(),
    "sparse_sum_dim": lambda d: torch.sparse.sum(coo(d), dim=1),
    "sparse_sum_all": lambda d: torch.sparse.sum(coo(d)),
    "transpose": lambda d: coo(d).t().coalesce(),
    "clone": lambda d: coo(d).clone(),
    "empty_like": lambda d: torch.empty_like(coo(d)),
    "zeros_like": lambda d: torch.zeros_like(coo(d)),
    "add_": lambda d: coo(d, coalesced=True).add_(coo(d)),
    "mul_": lambda d: coo(d).mul_(3.0),
    "zero_": lambda d: coo(d).zero_(),
    "neg": lambda d: -coo(d),
    "dtype_conversion": lambda d: coo(d).to(torch.float64),
    "int_values": lambda d: coo(d, dtype=torch.int64, coalesced=True) * 3,
    "hybrid": lambda d: dense(d).to_sparse(sparse_dim=1).coalesce() * 2,
    # compressed layouts
    "to_csr": lambda d: dense(d).to_sparse_csr(),
    "to_csc": lambda d: dense(d).to_sparse_csc(),
    "to_bsr": lambda d: torch.arange(16.0, device=d).view(4, 4).to_sparse_bsr((2, 2)),
    "csr_to_dense": lambda d: dense(d).to_sparse_csr().to_dense(),
    "csr_members": lambda d: members(dense(d).to_sparse_csr()),
    "csr_mm": lambda d: dense(d).to_sparse_csr() @ dense(d).t(),
    "csr_addmm": lambda d: torch.addmm(torch.ones(3, 3, device=d), dense(d).to_sparse_csr(), dense(d).t()),
    "csr_add": lambda d: dense(d).to_sparse_csr() + dense(d).to_sparse_csr(),
    "csr_mul_scalar": lambda d: dense(d).to_sparse_csr() * 2.0,
    "csr_sum": lambda d: dense(d).to_sparse_csr().sum(),
    "csr_to_coo": lambda d: dense(d).to_sparse_csr().to_sparse(),
    "coo_to_csr": lambda d: coo(d).to_sparse_csr(),
    "csr_create": lambda d: torch.sparse_csr_tensor(
        torch.tensor([0, 2, 3], device=d),
        torch.tensor([0, 2, 1], device=d),
        torch.tensor([1.0, 2, 3], device=d),
    ),
}


@cpu_is_native
@pytest.mark.parametrize("name", list(CASES))
def test_as_on_cpu(name):
    run_both(CASES[name])


@cpu_is_native
def test_moved_to_flagos_and_back():
    for s in (
        coo("cpu"),
        coo("cpu", coalesced=True),
        dense("cpu").to_sparse_csr(),
        dense("cpu").to_sparse_csc(),
    ):
        f = s.to(DEVICE)
        assert_on_flagos(f)
        back = f.cpu()
        assert back.device.type == "cpu"
        assert all(m.device.type == "cpu" for m in ([back._indices()] if s.is_sparse else members(back)))
        assert_same(back, s)
        assert_same(f.to(DEVICE, copy=True).cpu(), s)


def test_members_are_the_callers_tensors():
    indices = torch.tensor([[0, 1], [1, 0]], device=DEVICE)
    values = torch.tensor([5.0, 6.0], device=DEVICE)
    s = torch.sparse_coo_tensor(indices, values, (2, 2))
    # As on CPU: the sparse tensor holds the given tensors (zero-copy), so writes through them show.
    assert s._indices().data_ptr() == indices.data_ptr() and s._values().data_ptr() == values.data_ptr()
    values.mul_(2)
    assert torch.equal(s.to_dense().cpu(), torch.tensor([[0.0, 10.0], [12.0, 0.0]]))
    # A sparse result made by a kernel has flagos members: their memory is flagos memory.
    r = dense(DEVICE).to_sparse()
    assert r._values().untyped_storage().device == r.device


def test_device_argument_places_the_result(two_devices_only):
    s = coo(DEVICE, coalesced=True)
    for device in ("cpu", "flagos:1"):
        r = torch.empty_like(s, device=device)
        assert r.device == torch.device(device) and r._values().device == r.device
        assert r.layout == torch.sparse_coo and r.shape == s.shape


@cpu_is_native
def test_on_the_second_device(two_devices_only):
    s = dense("flagos:1").to_sparse()
    assert s.device == torch.device("flagos", 1)
    assert s._indices().device == s.device and s._values().device == s.device
    r = torch.mm(s, dense("flagos:1").t())
    assert r.device == s.device
    assert_same(r.cpu(), torch.mm(dense("cpu").to_sparse(), dense("cpu").t()))


@cpu_is_native
def test_autograd_as_on_cpu():
    grads = {}
    for d in ("cpu", DEVICE):
        s = coo(d, coalesced=True)
        w = dense(d).t().clone().requires_grad_(True)
        v = s._values().clone().requires_grad_(True)
        sv = torch.sparse_coo_tensor(s._indices(), v, s.shape)
        torch.sparse.mm(sv, w).pow(2).sum().backward()
        grads[d] = (w.grad.cpu(), v.grad.cpu())
    for a, e in zip(grads[DEVICE], grads["cpu"], strict=True):
        torch.testing.assert_close(a, e)


ERROR_CASES = {
    "values_of_uncoalesced": lambda d: coo(d).values(),
    "cumsum_unsupported": lambda d: torch.cumsum(coo(d), 0),
    "storage": lambda d: coo(d).untyped_storage(),
    "mm_shape_mismatch": lambda d: torch.mm(coo(d), dense(d)),
    "bad_indices": lambda d: torch.sparse_coo_tensor(
        torch.tensor([[0, 5]], device=d), torch.tensor([1.0, 2.0], device=d), (3,), check_invariants=True
    ),
}


@cpu_is_native
@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_as_on_cpu(name):
    with pytest.raises(Exception) as cpu:
        ERROR_CASES[name]("cpu")
    with pytest.raises(Exception) as flagos:
        ERROR_CASES[name](DEVICE)
    assert type(flagos.value) is type(cpu.value)
    assert str(cpu.value).splitlines()[0].split(" (while running")[0] in str(flagos.value)


def test_counted_as_native_calls():
    s = coo(DEVICE)
    torch_fl.routing.reset_counts()
    s.coalesce()
    assert torch_fl.routing.counts()["native"] > 0
    assert torch_fl.routing.counts()["cpu"] == 0


@cpu_is_native
def test_in_place_ops_return_the_callers_tensor():
    s = coo(DEVICE, coalesced=True)
    indices_before = s._indices()
    assert s.add_(coo(DEVICE)) is s
    assert s.mul_(2.0) is s
    expected = coo("cpu", coalesced=True).add_(coo("cpu")).mul_(2.0)
    assert_same(s.cpu(), expected)
    assert s._indices().device == s.device
    assert indices_before.device == s.device  # the caller's old member stays a valid flagos tensor
    z = s.zero_()
    assert z is s and s._nnz() == 0


def test_no_memory_kept_after_use():
    torch.flagos.synchronize()
    base = torch.flagos.memory_allocated()
    for _ in range(3):
        s = dense(DEVICE).to_sparse()
        r = (s + s).coalesce()
        m = torch.mm(r, dense(DEVICE).t())
        c = dense(DEVICE).to_sparse_csr() @ dense(DEVICE).t()
        del s, r, m, c
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() == base


FIRST_USE = """
import warnings, torch, torch_fl
warnings.simplefilter("ignore")
has = lambda op: torch._C._dispatch_has_kernel_for_dispatch_key(op, "SparsePrivateUse1")
before = has("aten::clone") or has("aten::empty_like")
d = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
s = {make}
after = has("aten::clone") and has("aten::empty_like") and has("aten::copy_")
ref = d.to_sparse()
ok = torch.equal(s.clone().to_dense().cpu(), d) and torch.empty_like(s).layout == torch.sparse_coo
ok = ok and torch.equal(s.cpu().to_dense(), ref.to_dense())
import json; print("RESULT", json.dumps([before, after, ok]))
"""


@pytest.mark.parametrize(
    "make",
    [
        "d.to('flagos').to_sparse()",  # a dense op's sparse result, adopted
        "d.to_sparse().to('flagos')",  # a copy from the CPU
        "torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]], device='flagos'),"
        " torch.tensor([2.0, 3.0], device='flagos'), (2, 2))",  # a factory with flagos members
        "torch.zeros(2, 2, layout=torch.sparse_coo, device='flagos') + d.to('flagos').to_sparse()",
    ],
)
def test_layout_kernels_registered_before_the_first_sparse_tensor(run_python, make):
    # A process that never makes a sparse or quantized flagos tensor registers nothing for them; the first
    # one, however it is made, finds the kernels in place (the composite kernels never see one).
    result = run_python(FIRST_USE.format(make=make)).check().json()
    assert result == [False, True, True]


def test_save_load_and_deepcopy():
    import copy
    import io

    for s in (coo(DEVICE, coalesced=True), dense(DEVICE).to_sparse_csr()):
        buffer = io.BytesIO()
        torch.save(s, buffer)
        buffer.seek(0)
        for r in (torch.load(buffer, weights_only=False), copy.deepcopy(s)):
            assert_on_flagos(r)
            assert_same(r.cpu(), s.cpu())


@cpu_is_native
def test_sparse_embedding_training_step_as_on_cpu():
    def step(d):
        torch.manual_seed(0)
        m = torch.nn.Embedding(10, 3, sparse=True).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.tensor([1, 2, 1], device=d)).pow(2).sum().backward()
        grad = m.weight.grad
        opt.step()
        return grad, m.weight

    grad_f, weight_f = step(DEVICE)
    grad_c, weight_c = step("cpu")
    assert grad_f.layout == torch.sparse_coo and grad_f.device.type == DEVICE
    assert_same(grad_f.cpu(), grad_c)
    assert torch.equal(weight_f.detach().cpu(), weight_c.detach())
