"""torch_fl.compat.enable_jiterator: torch.cuda.jiterator functions on flagos tensors.

- On sim: enabling is refused with a message (the jiterator compiles CUDA kernels), and the adapter's
  choice of arguments and results to map is checked around a stand-in for torch's launch function;
- on the GPU (flagos backed by CUDA): jiterator functions, one and two outputs, give cuda's results on
  flagos tensors and return flagos tensors; without the layer torch's own error stands; disabling restores
  torch's function.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl
import torch_fl.compat
from torch_fl.compat import _jiterator

backed = torch_fl.accelerator() == "cuda"
ENTRY = "_cuda_jiterator_compile_and_launch_kernel"


@pytest.mark.skipif(backed, reason="the refusal is for flagos without CUDA behind it")
def test_enabling_is_refused_without_cuda_behind_flagos():
    before = getattr(torch._C, ENTRY, None)
    with pytest.raises(RuntimeError, match="must be backed by CUDA"):
        torch_fl.compat.enable_jiterator()
    assert not torch_fl.compat.is_jiterator_enabled()
    assert getattr(torch._C, ENTRY, None) is before
    torch_fl.compat.disable_jiterator()  # nothing to undo: no error


def test_adapter_maps_flagos_arguments_and_results():
    # Copies stand in for the CUDA views (which need CUDA): the adapter's own logic is what is checked.
    seen = []

    def stand_in(code_string, kernel_name, return_by_ref, num_outputs, tensors, kwargs):
        seen.append(tuple(t.device.type for t in tensors))
        x, y = tensors
        first = y * kwargs["alpha"] - x
        return first if num_outputs == 1 else (first, x * y)

    launch = _jiterator.adapted(stand_in, to_native=lambda t: t.cpu(), from_native=lambda t: t.to("flagos"))
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    one = launch("code", "k", False, 1, (x.to("flagos"), y.to("flagos")), {"alpha": 2.0})
    assert one.device.type == "flagos"
    torch.testing.assert_close(one.cpu(), 2.0 * y - x)
    first, second = launch("code", "k", False, 2, (x.to("flagos"), y), {"alpha": 1.0})
    assert first.device.type == second.device.type == "flagos"
    torch.testing.assert_close(first.cpu(), y - x)
    torch.testing.assert_close(second.cpu(), x * y)
    assert seen == [("cpu", "cpu"), ("cpu", "cpu")]
    # Without a flagos tensor the call reaches the function as it was made, its result untouched.
    calls = []
    plain = _jiterator.adapted(lambda *args: calls.append(args) or "torch's result")
    assert plain("code", "k", False, 1, (x, y), {}) == "torch's result"
    assert calls[0][4][0] is x and calls[0][4][1] is y


CODE = "template <typename T> T axpy_sub(T x, T y, T alpha) { return -x + alpha * y; }"
TWO = "template <typename T> void sum_diff(T x, T y, T& s, T& d) { s = x + y; d = x - y; }"


@pytest.mark.gpu
@pytest.mark.skipif(not backed, reason="needs flagos backed by CUDA")
def test_jiterator_functions_run_on_flagos_tensors():
    from torch.cuda import jiterator

    axpy_sub = jiterator._create_jit_fn(CODE, alpha=1.0)
    sum_diff = jiterator._create_multi_output_jit_fn(TWO, num_outputs=2)
    x, y = torch.randn(64, 33, device="cuda"), torch.randn(64, 33, device="cuda")
    fx, fy = x.to("flagos"), y.to("flagos")
    original = getattr(torch._C, ENTRY)
    with pytest.raises(RuntimeError, match="CUDA"):
        axpy_sub(fx, fy)  # torch's own refusal while the layer is off
    torch_fl.compat.enable_jiterator()
    try:
        out = axpy_sub(fx, fy, alpha=0.5)
        assert out.device.type == "flagos"
        torch.testing.assert_close(out.cpu(), axpy_sub(x, y, alpha=0.5).cpu(), rtol=0, atol=0)
        s, d = sum_diff(fx, fy)
        assert s.device.type == d.device.type == "flagos"
        rs, rd = sum_diff(x, y)
        torch.testing.assert_close(s.cpu(), rs.cpu(), rtol=0, atol=0)
        torch.testing.assert_close(d.cpu(), rd.cpu(), rtol=0, atol=0)
        # A half-precision, non-contiguous input: the CUDA view keeps its strides.
        h = torch.randn(40, 20, device="cuda", dtype=torch.half).t()
        torch.testing.assert_close(
            axpy_sub(h.to("flagos").t().contiguous().t(), h.to("flagos")).cpu(), axpy_sub(h, h).cpu()
        )
    finally:
        torch_fl.compat.disable_jiterator()
    assert getattr(torch._C, ENTRY) is original
    assert not torch_fl.compat.is_jiterator_enabled()
