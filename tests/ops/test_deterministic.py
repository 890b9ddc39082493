"""Deterministic mode on flagos as on CPU (and CUDA): with ``torch.use_deterministic_algorithms(True)`` and
``torch.utils.deterministic.fill_uninitialized_memory`` (on by default), memory that ``empty``,
``empty_strided``, ``empty_like`` and a growing ``resize_`` hand out is filled (NaN for floating and complex
dtypes, the dtype's largest value for integers and bool), and ops without a deterministic implementation on
the native device raise (or warn, with ``warn_only=True``) as they do there. Each behaviour is compared with
the same call on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_fl

DEVICE = "flagos"

# The CPU is the reference here because it is flagos's native device on the simulated accelerator; backed by
# CUDA, flagos runs CUDA's kernels, and tests/ops/test_semantics_backed.py compares the same cases with cuda.
cpu_is_native = pytest.mark.skipif(
    torch_fl._C._backing_type() is not None,
    reason="compares with the CPU, flagos's native device on sim; test_semantics_backed.py compares with cuda",
)

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
]


@pytest.fixture
def deterministic():
    was, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def raw(t: torch.Tensor) -> torch.Tensor:
    """t's bytes on the CPU (NaN payloads and float8 compared exactly)."""
    return t.detach().cpu().contiguous().view(torch.uint8)


def assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor):
    assert actual.device.type == DEVICE
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(raw(actual), raw(expected)), (actual.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factories_fill_as_cpu(deterministic, dtype):
    for make in (
        lambda d: torch.empty(3, 5, dtype=dtype, device=d),
        lambda d: torch.empty_strided((3, 2), (1, 4), dtype=dtype, device=d),
        lambda d: torch.empty_like(torch.zeros(4, 2, dtype=dtype, device=d)),
        lambda d: torch.zeros(2, dtype=dtype, device=d).new_empty((2, 3)),
        lambda d: torch.empty_permuted((2, 3, 4), (2, 0, 1), dtype=dtype, device=d),
    ):
        assert_same_bytes(make(DEVICE), make("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool, torch.complex64], ids=str)
def test_resize_fills_the_grown_storage_as_cpu(deterministic, dtype):
    def grow(d):
        base = torch.zeros(4, dtype=dtype, device=d)
        view = base[1:3]  # grows the storage from element 4 on: elements 3 and 4 of the view are new
        view.resize_(5)
        return view, base.untyped_storage().nbytes()

    (f, f_bytes), (c, c_bytes) = grow(DEVICE), grow("cpu")
    assert_same_bytes(f, c)
    assert f_bytes == c_bytes
    # Shrinking and regrowing within the storage hands out no new memory: nothing is filled.
    f2 = torch.arange(6, device=DEVICE).to(dtype)
    c2 = torch.arange(6).to(dtype)
    for t in (f2, c2):
        t.resize_(2)
        t.resize_(6)
    assert_same_bytes(f2, c2)


def test_out_argument_grown_by_a_kernel(deterministic):
    out_f, out_c = torch.zeros(2, device=DEVICE), torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
        torch.add(torch.ones(5, device=DEVICE), 1, out=out_f)
        torch.add(torch.ones(5), 1, out=out_c)
    assert_same_bytes(out_f, out_c)


def test_fill_off_when_asked(deterministic):
    torch.utils.deterministic.fill_uninitialized_memory = False
    x = torch.full((64,), 7.0, device=DEVICE)
    del x
    # Without the fill, empty returns whatever the caching allocator's block held: here the freed 7s.
    assert torch.equal(torch.empty(64, device=DEVICE).cpu(), torch.full((64,), 7.0))


def test_fill_off_by_default():
    assert not torch.are_deterministic_algorithms_enabled()
    x = torch.full((64,), 7.0, device=DEVICE)
    del x
    assert torch.equal(torch.empty(64, device=DEVICE).cpu(), torch.full((64,), 7.0))


def test_unsupported_dtype_raises_as_on_cpu(deterministic):
    with pytest.raises(NotImplementedError) as cpu:
        torch.empty(2, dtype=torch.bits8)
    with pytest.raises(NotImplementedError) as flagos:
        torch.empty(2, dtype=torch.bits8, device=DEVICE)
    assert str(flagos.value).splitlines()[0] == str(cpu.value).splitlines()[0]


# Ops and whether the native device (CPU here) has a deterministic implementation of them; the CUDA
# counterpart of this table is tests/ops/test_semantics_backed.py.
def alert_cases(d):
    idx = torch.tensor([0, 0], device=d)
    return {
        "put_": lambda: torch.zeros(5, device=d).put_(idx, torch.ones(2, device=d)),
        "put_accumulate": lambda: torch.zeros(5, device=d).put_(
            idx, torch.ones(2, device=d), accumulate=True
        ),
        "index_put_accumulate": lambda: torch.zeros(5, device=d).index_put_(
            (idx,), torch.ones(2, device=d), True
        ),
        "index_add_": lambda: torch.zeros(5, device=d).index_add_(0, idx, torch.ones(2, device=d)),
        "scatter_add_": lambda: torch.zeros(5, device=d).scatter_add_(0, idx, torch.ones(2, device=d)),
        "max_unpool1d": lambda: F.max_unpool1d(torch.ones(1, 1, 2, device=d), idx.view(1, 1, 2), 2),
        "histc": lambda: torch.histc(torch.ones(5, device=d)),
        "bincount": lambda: torch.bincount(torch.tensor([1, 2], device=d)),
    }


@cpu_is_native
@pytest.mark.parametrize("name", list(alert_cases("cpu")))
def test_nondeterministic_alerts_as_on_cpu(deterministic, name):
    def outcome(d):
        try:
            alert_cases(d)[name]()
        except RuntimeError as e:
            return str(e).splitlines()[0].split(" (while running")[0]
        return None

    assert outcome(DEVICE) == outcome("cpu")


@cpu_is_native
@pytest.mark.parametrize("name", ["put_", "max_unpool1d"])
def test_warn_only_warns_as_on_cpu(name):
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        counts = {}
        for d in ("cpu", DEVICE):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                alert_cases(d)[name]()
            counts[d] = [str(w.message).split(".")[0] for w in caught if "deterministic" in str(w.message)]
        assert counts[DEVICE] == counts["cpu"] and counts["cpu"]
    finally:
        torch.use_deterministic_algorithms(was)
