"""Composites whose implementation the native device chooses (ops/kernels/native_choices.h) and implicit
composites with a native kernel of their own (routed directly at set-up): on flagos they compute what the
native device computes. Here the native device is the CPU, so results, running statistics and gradients
must equal CPU's bitwise; tests/ops/test_semantics_backed.py checks the cuDNN choices against cuda."""

from __future__ import annotations

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


def run(fn, device, *tensors):
    """fn on copies of `tensors` on `device` (those requiring grad stay leaves); its outputs and the grads
    of a scalar made from them, on the CPU."""
    args = [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]
    outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum(
        (o.float() * torch.linspace(-1, 1, o.numel(), device=device).view(o.shape)).sum() for o in outs
    )
    if loss.requires_grad:
        loss.backward()
    grads = [a.grad.cpu() if a.grad is not None else None for a in args]
    return [o.detach().cpu() for o in outs], [a.detach().cpu() for a in args], grads


def assert_bitwise_as_cpu(fn, *tensors):
    f_out, f_args, f_grads = run(fn, DEVICE, *tensors)
    c_out, c_args, c_grads = run(fn, "cpu", *tensors)
    for a, e in zip(f_out + f_args, c_out + c_args, strict=True):  # args: running statistics updated in place
        assert torch.equal(a, e), (a, e)
    for a, e in zip(f_grads, c_grads, strict=True):
        assert (a is None) == (e is None)
        if e is not None:
            assert torch.equal(a, e), (a, e)


def g(*shape, grad=True, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_(grad)


@cpu_is_native
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_batch_norm(training, shape, dtype):
    def fn(x, w, b, rm, rv):
        return F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3, eps=1e-5)

    c, p = shape[1], torch.float64 if dtype == torch.float64 else torch.float32  # bf16 takes float32 params
    assert_bitwise_as_cpu(
        fn,
        g(*shape, dtype=dtype),
        g(c, dtype=p),
        g(c, seed=1, dtype=p),
        g(c, grad=False, dtype=p),
        g(c, grad=False, dtype=p).abs() + 0.5,
    )


@cpu_is_native
def test_batch_norm_variants():
    x = g(2, 3, 4, 4)
    assert_bitwise_as_cpu(lambda x: F.batch_norm(x, None, None, training=True), x)  # no stats, no affine
    assert_bitwise_as_cpu(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, g(3), g(3))
    assert_bitwise_as_cpu(
        lambda x: F.batch_norm(x.to(memory_format=torch.channels_last), None, None, training=True), x
    )
    m_f, m_c = torch.nn.BatchNorm2d(3).to(DEVICE), torch.nn.BatchNorm2d(3)
    for _ in range(2):
        m_f(x.detach().to(DEVICE))
        m_c(x.detach())
    assert torch.equal(m_f.running_mean.cpu(), m_c.running_mean) and m_f.num_batches_tracked.item() == 2
    assert torch.equal(m_f.eval()(x.detach().to(DEVICE)).cpu(), m_c.eval()(x.detach()))
    with torch.inference_mode():
        assert torch.equal(m_f(x.detach().to(DEVICE)).cpu(), m_c(x.detach()))


@cpu_is_native
@pytest.mark.parametrize("use_input_stats", [True, False])
def test_instance_norm(use_input_stats):
    def fn(x, w, b, rm, rv):
        return F.instance_norm(x, rm, rv, w, b, use_input_stats=use_input_stats, momentum=0.2)

    assert_bitwise_as_cpu(
        fn, g(2, 3, 4, 5), g(3), g(3, seed=1), g(3, grad=False), g(3, grad=False).abs() + 0.5
    )


def test_batch_norm_errors_as_on_cpu():
    for device in ("cpu", DEVICE):
        x = torch.randn(2, 3, 4, device=device)
        with pytest.raises(RuntimeError, match="running_mean should contain 3 elements not 4"):
            F.batch_norm(x, torch.zeros(4, device=device), torch.ones(3, device=device))
        with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
            torch.batch_norm(x, None, None, None, None, False, 0.1, 1e-5, True)


@cpu_is_native
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [True, False])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    def fn(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)

    assert_bitwise_as_cpu(fn, g(2, 3, 5, 6), (g(2, 4, 3, 2, grad=False) * 0.7).requires_grad_())


@cpu_is_native
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d(mode):
    def fn(x, grid):
        return F.grid_sample(x, grid, mode=mode, align_corners=True)

    assert_bitwise_as_cpu(fn, g(1, 2, 3, 4, 5), (g(1, 2, 3, 2, 3, grad=False) * 0.7).requires_grad_())


@cpu_is_native
@pytest.mark.parametrize("fn", [F.silu, F.mish, F.hardswish, F.gelu], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_activation_backward(fn, dtype):
    # silu_backward and mish_backward: implicit composites with a CPU kernel of their own, routed directly.
    assert_bitwise_as_cpu(fn, g(257, dtype=dtype))


@cpu_is_native
def test_rms_norm():
    for dtype in (torch.float32, torch.float64):
        assert_bitwise_as_cpu(
            lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), g(4, 8, dtype=dtype), g(8, dtype=dtype)
        )


def test_kernels_registered():
    torch.empty(1, device=DEVICE)  # the set-up step has run
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op in ("aten::_batch_norm_impl_index", "aten::grid_sampler"):
        assert has(op, "PrivateUse1") and has(op, "AutogradPrivateUse1")
    for op in ("aten::silu_backward", "aten::mish_backward"):
        assert has(op, "PrivateUse1")
        assert torch_fl.routing.explain(op).startswith(op + " -> native")
