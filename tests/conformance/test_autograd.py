"""Autograd on the device: engine threads, gradients against CPU, across devices and streams, gradcheck.

Counterpart of torch_openreg's tests/test_autograd.py (plus the custom autograd functions of its test_ops.py).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

DEVICE = "flagos"
F32 = dict(rtol=1e-4, atol=1e-5)


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_engine_starts_one_worker_thread_per_device():
    torch.ones(2, requires_grad=True, device=DEVICE).sum().backward()
    task_dir = f"/proc/{os.getpid()}/task"
    names = set()
    for tid in os.listdir(task_dir):
        with open(f"{task_dir}/{tid}/comm") as comm:
            names.add(comm.read().strip())
    for index in range(torch.accelerator.device_count()):
        assert f"pt_autograd_{index}" in names


def test_gradients_match_cpu():
    model_cpu = make_mlp()
    model_dev = make_mlp().to(DEVICE)
    x = torch.randn(5, 8)
    target = torch.randint(0, 3, (5,))
    torch.nn.functional.cross_entropy(model_cpu(x), target).backward()
    loss = torch.nn.functional.cross_entropy(model_dev(x.to(DEVICE)), target.to(DEVICE))
    assert loss.grad_fn is not None and loss.device.type == DEVICE
    loss.backward()
    for p_cpu, p_dev in zip(model_cpu.parameters(), model_dev.parameters(), strict=True):
        assert p_dev.grad.device == p_dev.device
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, **F32)


def test_training_steps_match_cpu():
    model_cpu, model_dev = make_mlp(1), make_mlp(1).to(DEVICE)
    opt_cpu = torch.optim.SGD(model_cpu.parameters(), lr=0.1, momentum=0.9)
    opt_dev = torch.optim.SGD(model_dev.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 8), torch.randn(16, 3)
    for _ in range(3):
        for model, opt, inp, tgt in (
            (model_cpu, opt_cpu, x, y),
            (model_dev, opt_dev, x.to(DEVICE), y.to(DEVICE)),
        ):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(inp), tgt).backward()
            opt.step()
    for p_cpu, p_dev in zip(model_cpu.parameters(), model_dev.parameters(), strict=True):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), **F32)


def test_gradient_flows_back_to_host():
    x = torch.randn(6, requires_grad=True)
    (x.to(DEVICE) ** 2).sum().backward()
    assert x.grad.device.type == "cpu"
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_gradient_flows_across_devices(two_devices):
    x = torch.randn(6, device=f"{DEVICE}:0", requires_grad=True)
    y = (x.to(f"{DEVICE}:1") * 3).sin()
    y.sum().backward()
    assert x.grad.device == x.device
    torch.testing.assert_close(x.grad.cpu(), 3 * torch.cos(3 * x.detach().cpu()), **F32)


def test_backward_of_work_on_a_side_stream():
    stream = torch.Stream(device=f"{DEVICE}:0")
    x = torch.randn(4096, device=DEVICE, requires_grad=True)
    with stream:
        loss = (x * x).sum()
    torch.accelerator.current_stream().wait_stream(stream)
    loss.backward()
    torch.accelerator.synchronize()
    torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu())


def test_gradcheck_in_double():
    a = torch.randn(3, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    b = torch.randn(4, 2, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p, q: torch.tanh(p @ q).softmax(-1), (a, b))
    assert torch.autograd.gradgradcheck(lambda p: (p.sin() * p).sum(), (a,))


def test_higher_order_gradients():
    x = torch.tensor([0.5, 1.5], device=DEVICE, requires_grad=True)
    (g,) = torch.autograd.grad((x**3).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg.cpu(), 6 * x.detach().cpu())


def test_no_grad_and_inference_mode_build_no_graph():
    x = torch.randn(3, device=DEVICE, requires_grad=True)
    with torch.no_grad():
        assert (x * 2).grad_fn is None
    with torch.inference_mode():
        y = x * 2
    assert y.grad_fn is None and y.is_inference()


def test_hooks_and_retain_grad():
    x = torch.randn(4, device=DEVICE, requires_grad=True)
    seen = []
    x.register_hook(lambda grad: seen.append(grad.device) or grad * 10)
    mid = x * 2
    mid.retain_grad()
    mid.sum().backward()
    assert seen == [x.device]
    assert torch.equal(mid.grad.cpu(), torch.ones(4))
    assert torch.equal(x.grad.cpu(), torch.full((4,), 20.0))


class _ReturnsSelf(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(1)

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


class _ReturnsView(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


def test_custom_functions_returning_self_or_a_view():
    leaf = torch.randn(4, device=DEVICE, requires_grad=True)
    x = leaf.clone()
    out = _ReturnsSelf.apply(x)
    assert out.data_ptr() == x.data_ptr()
    out.sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), torch.full((4,), 0.5))

    y = torch.randn(4, device=DEVICE, requires_grad=True)
    view = _ReturnsView.apply(y)
    assert view.data_ptr() == y.data_ptr() and view.requires_grad
    view.sum().backward()
    torch.testing.assert_close(y.grad.cpu(), torch.full((4,), 0.5))
