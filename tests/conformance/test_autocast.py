"""Mixed precision: torch.autocast(device_type), its op policies, custom_fwd and GradScaler on the device.

Counterpart of torch_openreg's tests/test_autocast.py. The policies follow CUDA's (mm/linear in the low
precision dtype, reductions and softmax in float32, mixed-input ops promoted).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

DEVICE = "flagos"
LOW_DTYPES = [torch.float16, torch.bfloat16]
# autocast result vs a float32 CPU reference: the dtype's resolution times the reduction length
TOL = {torch.float16: dict(rtol=5e-3, atol=2e-2), torch.bfloat16: dict(rtol=3e-2, atol=1.5e-1)}


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def test_autocast_is_available_with_float16_default():
    assert torch.amp.is_autocast_available(DEVICE)
    assert torch.get_autocast_dtype(DEVICE) == torch.float16
    assert set(torch.get_device_module(DEVICE).get_amp_supported_dtype()) >= set(LOW_DTYPES)


def test_unsupported_dtype_warns_and_disables():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(DEVICE, dtype=torch.float32):
            assert not torch.is_autocast_enabled(DEVICE)
            out = torch.mm(rand(4, 4), rand(4, 4))
    assert out.dtype == torch.float32
    assert any(f"In {DEVICE} autocast" in str(w.message) for w in caught)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_matmul_family_runs_in_low_precision(dtype):
    a, b = rand(8, 16), rand(16, 4)
    w, bias = rand(4, 16), rand(4)
    image, kernel = rand(1, 3, 8, 8), rand(2, 3, 3, 3)
    with torch.autocast(DEVICE, dtype=dtype):
        assert torch.is_autocast_enabled(DEVICE)
        results = {
            "mm": torch.mm(a, b),
            "matmul": a @ b,
            "addmm": torch.addmm(bias, a, w.t()),
            "linear": F.linear(a, w, bias),
            "bmm": torch.bmm(a[None], b[None]),
            "conv2d": F.conv2d(image, kernel),
        }
    reference = {
        "mm": a.cpu() @ b.cpu(),
        "matmul": a.cpu() @ b.cpu(),
        "addmm": torch.addmm(bias.cpu(), a.cpu(), w.cpu().t()),
        "linear": F.linear(a.cpu(), w.cpu(), bias.cpu()),
        "bmm": (a.cpu() @ b.cpu())[None],
        "conv2d": F.conv2d(image.cpu(), kernel.cpu()),
    }
    for name, out in results.items():
        assert out.dtype == dtype, name
        assert out.device.type == DEVICE, name
        torch.testing.assert_close(out.float().cpu(), reference[name], **TOL[dtype], msg=name)


def test_reductions_and_softmax_run_in_float32():
    x = rand(4, 32, dtype=torch.float16)
    target = rand(4, 32, dtype=torch.float16)
    with torch.autocast(DEVICE, dtype=torch.float16):
        results = {
            "softmax": torch.softmax(x, -1),
            "log_softmax": F.log_softmax(x, -1),
            "sum": x.sum(),
            "exp": torch.exp(x),
            "layer_norm": F.layer_norm(x, (32,)),
            "mse_loss": F.mse_loss(x, target),
        }
    xf = x.float().cpu()
    reference = {
        "softmax": torch.softmax(xf, -1),
        "log_softmax": F.log_softmax(xf, -1),
        "sum": xf.sum(),
        "exp": torch.exp(xf),
        "layer_norm": F.layer_norm(xf, (32,)),
        "mse_loss": F.mse_loss(xf, target.float().cpu()),
    }
    for name, out in results.items():
        assert out.dtype == torch.float32, name
        torch.testing.assert_close(out.cpu(), reference[name], rtol=1e-5, atol=1e-5, msg=name)


def test_mixed_inputs_are_promoted():
    half, full = rand(4, dtype=torch.float16), rand(4)
    with torch.autocast(DEVICE):
        assert torch.cat([half, full]).dtype == torch.float32
        assert torch.stack([half, full]).dtype == torch.float32
        assert torch.addcmul(full, half, half).dtype == torch.float32


def test_disabled_region_and_other_devices_are_untouched():
    a = rand(4, 4)
    with torch.autocast(DEVICE):
        with torch.autocast(DEVICE, enabled=False):
            assert torch.mm(a, a).dtype == torch.float32
        assert torch.mm(a, a).dtype == torch.float16
        host = torch.randn(4, 4)
        assert torch.mm(host, host).dtype == torch.float32
    assert torch.mm(a, a).dtype == torch.float32


def test_set_autocast_dtype_changes_the_default():
    try:
        torch.set_autocast_dtype(DEVICE, torch.bfloat16)
        with torch.autocast(DEVICE):
            assert torch.mm(rand(4, 4), rand(4, 4)).dtype == torch.bfloat16
    finally:
        torch.set_autocast_dtype(DEVICE, torch.float16)


def test_backward_through_autocast_gives_float32_grads():
    w_cpu = torch.randn(8, 8)
    w = w_cpu.to(DEVICE).requires_grad_()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = torch.mm(w, w)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype == torch.float32 and w.grad.device == w.device
    w_ref = w_cpu.clone().requires_grad_()
    (w_ref @ w_ref).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_ref.grad, **TOL[torch.bfloat16])


def test_custom_fwd_casts_inputs():
    class Scale(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type=DEVICE, cast_inputs=torch.float16)
        def forward(ctx, x):
            ctx.seen_dtype = x.dtype
            return x * 2

        @staticmethod
        @torch.amp.custom_bwd(device_type=DEVICE)
        def backward(ctx, grad):
            return grad * 2

    x = rand(4).requires_grad_()
    with torch.autocast(DEVICE):
        out = Scale.apply(x)
    assert out.dtype == torch.float16
    out.float().sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((4,), 2.0))


def test_grad_scaler_scales_and_skips_non_finite_steps():
    weight = torch.nn.Parameter(torch.ones(4, device=DEVICE))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=1024.0)
    loss = (weight * weight).sum()
    scaled = scaler.scale(loss)
    assert scaled.item() == pytest.approx(1024.0 * 4)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(weight.detach().cpu(), torch.zeros(4))  # 1 - 0.5 * 2
    optimizer.zero_grad()
    (weight.sum() * float("inf")).backward()
    scaler.step(optimizer)  # skipped: the gradient is not finite
    scaler.update()
    assert torch.equal(weight.detach().cpu(), torch.zeros(4))
    assert scaler.get_scale() == 512.0
