"""The python route's call plans (csrc/python/python_route_caller.cpp): made once per op and routing
version, they must follow every change of implementation, survive an implementation that changes them
while it runs, and run an ``out`` adapter of torch_fl/_flaggems.py exactly as the adapter would run.

The adapter's ``out`` overload is routed to the python backend here (FlagGems itself is not needed: the
route recognises the adapter, whichever backend registered it)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl
from torch_fl import _flaggems, routing

ADD = "aten::add.out"
MAX = "aten::max.dim_max"


@pytest.fixture(autouse=True)
def _clean_routing():
    routing.reset()
    yield
    for op in (ADD, MAX):
        routing.unregister_python_impl(op)
    routing.reset()


class Sub(torch.Tensor):
    pass


# What FlagGems' functional add returns, per case, for inputs of shape (2, 3).
RESULTS = {
    "plain": lambda r: r,
    "castable dtype": lambda r: r.to(torch.int64),
    "wider dtype": lambda r: r.double(),
    "needs resizing": lambda r: torch.cat([r, r]),
    "not castable": lambda r: r.to(torch.complex64),
    "subclass": lambda r: r.as_subclass(Sub),
    "python number": lambda r: 3.0,
}


def outcome(call):
    """What a call did: its result or its exception, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = ("returned", call())
        except Exception as exc:  # noqa: BLE001  (the exception is the outcome)
            value = ("raised", type(exc).__name__, str(exc))
    return value, [(w.category.__name__, str(w.message)) for w in caught]


@pytest.fixture
def python_tail_calls(monkeypatch):
    """Calls of the adapters' Python tail, which the route takes only for results that need more than a
    copy (patched before any plan is made, which is when the route looks it up)."""
    calls = []
    tail = _flaggems._copy_results

    def counted(outs, result):
        calls.append(type(result).__name__)
        return tail(outs, result)

    monkeypatch.setattr(_flaggems, "_copy_results", counted)
    return calls


@pytest.mark.parametrize("case", list(RESULTS))
@pytest.mark.parametrize("out_shape", [(2, 3), (0,), (5,)])
def test_out_adapter_on_the_route_does_what_the_adapter_does(case, out_shape, python_tail_calls):
    make = RESULTS[case]
    adapter = _flaggems._out_adapter(
        lambda self, other, *, alpha=1: make(torch.add(self, other, alpha=alpha)), "aten::add.Tensor", ["out"]
    )
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    out = torch.zeros(out_shape)
    direct_out = out.clone()
    direct, direct_warnings = outcome(lambda: adapter(a, b, alpha=1, out=direct_out))

    routing.register_python_impl(ADD, adapter)
    flagos_out = out.to("flagos")
    python_tail_calls.clear()
    routed, routed_warnings = outcome(lambda: torch.add(a.to("flagos"), b.to("flagos"), out=flagos_out))

    copy_only = out_shape == (2, 3) and case in ("plain", "castable dtype", "wider dtype")
    assert len(python_tail_calls) == (0 if copy_only else 1)
    assert routed_warnings == direct_warnings
    if direct[0] == "raised":
        assert routed == direct
    else:
        assert routed[0] == "returned" and routed[1] is flagos_out
        assert flagos_out.shape == direct_out.shape
        torch.testing.assert_close(flagos_out.cpu(), direct_out)


@pytest.mark.parametrize("case", ["plain", "wrong length", "not a tuple"])
def test_out_adapter_with_two_outs(case):
    def max_dim(self, dim, keepdim=False):
        values, indices = torch.max(self, dim, keepdim)
        return {"plain": (values, indices), "wrong length": (values,), "not a tuple": [values, indices]}[case]

    adapter = _flaggems._out_adapter(max_dim, "aten::max.dim", ["max", "max_values"])
    x = torch.randn(4, 5)
    direct_outs = torch.empty(4), torch.empty(4, dtype=torch.int64)
    direct, _ = outcome(lambda: adapter(x, 1, max=direct_outs[0], max_values=direct_outs[1]))

    routing.register_python_impl(MAX, adapter)
    outs = torch.empty(4, device="flagos"), torch.empty(4, dtype=torch.int64, device="flagos")
    routed, _ = outcome(lambda: torch.max(x.to("flagos"), 1, out=outs))

    if direct[0] == "raised":
        assert routed == direct
    else:
        assert routed[0] == "returned" and routed[1][0] is outs[0] and routed[1][1] is outs[1]
        torch.testing.assert_close(outs[0].cpu(), direct_outs[0])
        torch.testing.assert_close(outs[1].cpu(), direct_outs[1])


def test_plan_follows_the_registered_implementation():
    calls = []

    def impl(tag):
        def add_out(self, other, *, alpha=1, out):
            calls.append(tag)
            return torch.add(self, other, alpha=alpha, out=out)

        return add_out

    a = torch.ones(3, device="flagos")
    out = torch.empty(3, device="flagos")
    routing.register_python_impl(ADD, impl("first"))
    torch.add(a, a, out=out)
    routing.register_python_impl(ADD, impl("second"))
    torch.add(a, a, out=out)
    routing.unregister_python_impl(ADD)
    torch.add(a, a, out=out)  # native again
    assert calls == ["first", "second"]
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))


def test_implementation_that_replaces_itself_while_it_runs():
    # The nested call makes a new plan for the op while the outer call still runs on its own.
    calls = []
    nested = torch.empty(2, device="flagos")

    def inner(self, other, *, alpha=1, out):
        calls.append("inner")
        return torch.add(self, other, alpha=alpha, out=out)

    def outer(self, other, *, alpha=1, out):
        calls.append("outer")
        routing.register_python_impl(ADD, inner)
        torch.add(torch.ones(2, device="flagos"), torch.ones(2, device="flagos"), alpha=3, out=nested)
        return torch.add(self, other, alpha=alpha, out=out)

    routing.register_python_impl(ADD, outer)
    out = torch.empty(3, device="flagos")
    assert torch.add(torch.ones(3, device="flagos"), torch.ones(3, device="flagos"), alpha=2, out=out) is out
    assert calls == ["outer", "inner"]
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0))
    torch.testing.assert_close(nested.cpu(), torch.full((2,), 4.0))


@pytest.mark.skipif(
    torch_fl._C._backing_type() is not None,
    reason="the simulated accelerator's host memory (a cuda route would mix cuda and cpu tensors here)",
)
def test_python_code_allocates_host_memory_for_host_tensors():
    # On the simulated accelerator a native host kernel's allocations are flagos memory (adopted without a
    # copy); Python code's are not: its .cpu() copies, kept tensors and results are host memory.
    kept = []

    def add_out(self, other, *, alpha=1, out):
        host = torch.full((3,), 2.0, device="flagos").cpu()  # a device-to-host copy inside the route
        kept.append(host)
        return torch.add(self, other * host, alpha=alpha, out=out)

    routing.register_python_impl(ADD, add_out)
    a = torch.ones(3, device="flagos")
    out = torch.empty(3, device="flagos")
    assert torch.add(a, a, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0))
    torch.testing.assert_close(kept[0] + 1, torch.full((3,), 3.0))


def shape_checking_add_out(self, other, *, alpha=1, out):
    """An out function as FlagGems writes them: it checks the out's shape instead of resizing it."""
    shape = torch.broadcast_shapes(self.shape, other.shape)
    if out.shape != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    return out.copy_(torch.add(self, other, alpha=alpha))


def test_empty_out_is_resized_before_an_out_function_runs():
    # torch resizes an empty out= tensor to the result's shape for its kernels; the route does it for an
    # implementation of the out overload, which may only check it (or, FlagGems' mm.out, write past its
    # end).
    routing.register_python_impl(ADD, shape_checking_add_out)
    a = torch.randn(4, 3, 2).permute(2, 0, 1)
    b = torch.randn(2, 4, 3)
    out = torch.empty(0, device="flagos")
    assert torch.add(a.to("flagos"), b.to("flagos"), out=out) is out
    expected = torch.add(a, b, out=torch.empty(0))
    assert out.shape == expected.shape
    torch.testing.assert_close(out.cpu(), expected)


def test_out_with_elements_is_the_callers_and_shape_errors_are_the_ops():
    routing.register_python_impl(ADD, shape_checking_add_out)
    a = torch.ones(2, 3, device="flagos")
    wrong = torch.zeros(5, device="flagos")
    with pytest.raises(ValueError, match=r"out has shape \(5,\), expected \(2, 3\)"):
        torch.add(a, a, out=wrong)
    empty = torch.empty(0, device="flagos")
    with pytest.raises(RuntimeError, match="broadcast"):
        torch.add(a, torch.ones(4, 3, device="flagos"), out=empty)  # the meta kernel's error
    assert wrong.shape == (5,) and empty.shape == (0,)
    assert torch.equal(wrong.cpu(), torch.zeros(5))


def test_python_code_gets_dtype_layout_and_memory_format_objects():
    # Boxed, these are ints; Python code gets torch.dtype, torch.layout and torch.memory_format objects,
    # as torch's own Python kernels do (FlagGems passes them on to torch.empty and the like).
    seen = {}

    def softmax_backward(grad_output, output, dim, input_dtype):
        seen["input_dtype"] = input_dtype
        return torch.ops.aten._softmax_backward_data(grad_output, output, dim, input_dtype)

    def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        seen.update(dtype=dtype, layout=layout, memory_format=memory_format)
        return torch.empty(
            self.shape, dtype=dtype, layout=layout, device=self.device, memory_format=memory_format
        )

    softmax_op, empty_op = "aten::_softmax_backward_data", "aten::empty_like"
    try:
        routing.register_python_impl(softmax_op, softmax_backward)
        routing.register_python_impl(empty_op, empty_like)
        y = torch.softmax(torch.randn(2, 5), 1)
        g = torch.randn(2, 5)
        got = torch.ops.aten._softmax_backward_data(g.to("flagos"), y.to("flagos"), 1, torch.float32)
        made = torch.empty_like(
            torch.ones(2, 3, device="flagos"),
            dtype=torch.float64,
            layout=torch.strided,
            memory_format=torch.contiguous_format,
        )
    finally:
        routing.unregister_python_impl(softmax_op)
        routing.unregister_python_impl(empty_op)
    assert seen == {
        "input_dtype": torch.float32,
        "dtype": torch.float64,
        "layout": torch.strided,
        "memory_format": torch.contiguous_format,
    }
    torch.testing.assert_close(got.cpu(), torch.ops.aten._softmax_backward_data(g, y, 1, torch.float32))
    assert made.device.type == "flagos" and made.shape == (2, 3) and made.dtype == torch.float64


def test_out_of_an_op_whose_shape_depends_on_the_data_is_left_to_the_implementation():
    # nonzero's meta kernel cannot know the shape (it raises NotImplementedError): the implementation
    # gets the empty out and resizes it itself.
    op, shapes_seen = "aten::nonzero.out", []

    def nonzero_out(self, *, out):
        shapes_seen.append(tuple(out.shape))
        result = torch.nonzero(self)
        return out.resize_(result.shape).copy_(result)

    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    out = torch.empty(0, dtype=torch.int64, device="flagos")
    try:
        routing.register_python_impl(op, nonzero_out)
        assert torch.nonzero(x.to("flagos"), out=out) is out
    finally:
        routing.unregister_python_impl(op)
    assert shapes_seen == [(0,)]
    assert torch.equal(out.cpu(), torch.nonzero(x))


def test_a_result_that_is_an_argument_or_views_one_is_the_callers_memory():
    # A result that nothing else holds is adopted as fresh without looking it up among the call's arguments
    # (csrc/ops/routes/native_call.cpp). One that is an argument, or a view of one, is held by the call's
    # aliases: it must still come back as the caller's tensor, or as a view over the caller's memory.
    x = torch.arange(6.0, device="flagos")
    try:
        routing.register_python_impl("aten::abs", lambda self: self)
        assert torch.abs(x) is x
        routing.register_python_impl("aten::abs", lambda self: self[2:])
        view = torch.abs(x)
        assert view.device == x.device
        # The caller's storage itself, not another storage over the same memory.
        assert view.untyped_storage()._cdata == x.untyped_storage()._cdata
        view.fill_(-1.0)
        torch.testing.assert_close(x.cpu(), torch.tensor([0.0, 1.0, -1.0, -1.0, -1.0, -1.0]))
        routing.register_python_impl("aten::abs", lambda self: self * 2)
        fresh = torch.abs(x)
        assert fresh.untyped_storage()._cdata != x.untyped_storage()._cdata
        assert fresh.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(fresh.cpu(), 2 * x.cpu())
    finally:
        routing.unregister_python_impl("aten::abs")
