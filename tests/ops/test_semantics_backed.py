"""PyTorch semantics on flagos backed by CUDA, against cuda (bitwise): deterministic mode (the fills and the
ops that raise), memory-overlap checks, sparse and quantized tensors, and the composites whose
implementation CUDA chooses by device type (cuDNN batch norm and grid sampler, fused rms_norm). The cases
are the simulated accelerator's tests (tests/ops/test_deterministic.py, test_overlap.py, test_sparse.py,
test_quantized.py, test_native_choices.py) with cuda as the reference. What needs cuda's autograd runs on
cuda in a fresh process (tests/ops/semantics_cuda_cases.py).

GPU-only: these run on the NVIDIA machine with FLAGOS_ACCELERATOR=auto (or cuda)."""

from __future__ import annotations

import os
import sys

import pytest
import semantics_cuda_cases as cases
import test_deterministic
import test_overlap
import test_quantized
import test_sparse
import torch

import torch_fl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("backed_by_cuda"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def canonical(x):
    """A comparable form of a result: tensors as (layout, dtype, shape, exact bytes or members)."""
    if isinstance(x, (tuple, list)):
        return [canonical(e) for e in x]
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.is_quantized:  # compared on its device: a quantized tensor's .cpu() keeps gaps only on the CPU
        params = (
            (x.q_scale(), x.q_zero_point())
            if x.qscheme() == torch.per_tensor_affine
            else canonical([x.q_per_channel_scales(), x.q_per_channel_zero_points(), x.q_per_channel_axis()])
        )
        return (
            "quantized",
            x.dtype,
            tuple(x.shape),
            x.stride(),
            str(x.qscheme()),
            params,
            canonical(x.int_repr()),
        )
    x = x.cpu()
    if x.layout == torch.sparse_coo:
        return ("coo", x.dtype, tuple(x.shape), x.is_coalesced(), canonical([x._indices(), x._values()]))
    if x.layout != torch.strided:
        return (str(x.layout), x.dtype, tuple(x.shape), canonical(list(test_sparse.members(x))))
    return ("strided", x.dtype, tuple(x.shape), x.contiguous().reshape(-1).view(torch.uint8).tolist())


def outcome(fn, device):
    """("ok", canonical result) or ("raise", exception type name, first line without flagos's context)."""
    try:
        result = fn(device)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("raise", type(e).__name__, str(e).splitlines()[0].split(" (while running")[0])
    return ("ok", canonical(result))


def assert_same_as_cuda(fn):
    assert outcome(fn, "flagos") == outcome(fn, "cuda")


@pytest.fixture(scope="module")
def cuda_reference(tmp_path_factory, run_python):
    """The cases of semantics_cuda_cases.py run on cuda in a process that never imports torch_fl."""
    path = tmp_path_factory.mktemp("semantics") / "cuda.pt"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    run_python("", args=[os.path.join(tests_dir, "semantics_cuda_cases.py"), str(path)], timeout=300).check()
    return torch.load(path, weights_only=False)


# ---- 1. Deterministic mode -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(cases.alert_cases("cpu")))
def test_nondeterministic_alerts_as_on_cuda(cuda_reference, name):
    if name in cases.PYTHON_LEVEL_IS_CUDA:
        pytest.xfail("torch.nn.functional decomposes this op for is_cuda tensors in deterministic mode")
    flagos = cases.deterministic_outcomes("flagos")[name]
    expected = cuda_reference["deterministic"][name]
    assert flagos[0] == expected[0]
    if expected[0] == "raise":
        assert flagos[1:] == expected[1:]
    else:
        assert canonical(flagos[1]) == canonical(expected[1])


@pytest.mark.parametrize("dtype", test_deterministic.DTYPES, ids=str)
def test_fills_as_on_cuda(dtype):
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for make in (
            lambda d: torch.empty(3, 5, dtype=dtype, device=d),
            lambda d: torch.empty_strided((3, 2), (1, 4), dtype=dtype, device=d),
            lambda d: torch.empty_like(torch.zeros(4, 2, dtype=dtype, device=d)),
            lambda d: torch.zeros(4, dtype=dtype, device=d)[1:3].resize_(5),
        ):
            assert_same_as_cuda(make)
    finally:
        torch.use_deterministic_algorithms(was)


# ---- 2. Overlap checks -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(test_overlap.CASES))
def test_overlap_as_on_cuda(name):
    assert_same_as_cuda(test_overlap.CASES[name])


# ---- 3. Sparse tensors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(test_sparse.CASES) + list(test_sparse.ERROR_CASES))
def test_sparse_as_on_cuda(name):
    assert_same_as_cuda({**test_sparse.CASES, **test_sparse.ERROR_CASES}[name])


def test_sparse_copies_to_flagos_and_back():
    for s in (
        test_sparse.coo("cpu"),
        test_sparse.dense("cpu").to_sparse_csr(),
        test_sparse.dense("cpu").to_sparse_csc(),
    ):
        f, c = s.to("flagos"), s.to("cuda")
        assert f.device.type == "flagos"
        assert canonical(f) == canonical(c) == canonical(s)
        assert canonical(f.cpu()) == canonical(s)


# ---- 4. Quantized tensors --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(test_quantized.CASES) + list(test_quantized.ERROR_CASES))
def test_quantized_as_on_cuda(name):
    # CUDA has few quantized kernels: where cuda raises (NotImplementedError for QuantizedCUDA), flagos must
    # raise the same.
    assert_same_as_cuda({**test_quantized.CASES, **test_quantized.ERROR_CASES}[name])


def test_quantized_copies_to_flagos_and_back():
    q = test_quantized.per_tensor("cpu")
    assert canonical(q.to("flagos").cpu()) == canonical(q.to("cuda").cpu()) == canonical(q)


# ---- 5. Implementations chosen by device type (cuDNN) ----------------------------------------------------
@pytest.mark.parametrize("name", list(cases.choice_cases()))
def test_choice_bitwise_as_cuda(cuda_reference, name):
    flagos = cases.run_choice(name, "flagos")
    expected = cuda_reference["choices"][name]
    assert flagos["grad_fn"] == expected["grad_fn"]  # the same implementation (CudnnBatchNormBackward0, ...)
    for key in ("out", "inputs", "grads"):
        assert canonical(flagos[key]) == canonical(expected[key]), key


def test_batch_norm_takes_cudnn():
    x = torch.randn(4, 3, 5, 5, device="flagos", requires_grad=True)
    out = torch.nn.functional.batch_norm(
        x, None, None, torch.ones(3, device="flagos"), torch.zeros(3, device="flagos"), True
    )
    assert out.grad_fn.name() == "CudnnBatchNormBackward0"
    with torch.backends.cudnn.flags(enabled=False):
        out = torch.nn.functional.batch_norm(
            x, None, None, torch.ones(3, device="flagos"), torch.zeros(3, device="flagos"), True
        )
    assert out.grad_fn.name() == "NativeBatchNormBackward0"


def test_fused_rms_norm_is_routed_directly():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "PrivateUse1")
    assert torch_fl.routing.explain("aten::_fused_rms_norm").startswith("aten::_fused_rms_norm -> native")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
