"""Autograd through routed ops: a small MLP trains on flagos to the same losses and weights as on CPU.

The same model (same initial weights), data and optimizer run for a few steps on CPU and on flagos; the
losses of every step and the final weights must agree within float32 tolerance, and every gradient must
be a flagos tensor. Also with routes in effect (the forward's addmm, or mm and the backward's ops, on the
cpu route), which must not change the values, and with the route actually taken (routing.counts()).
Autograd on the device itself (engine threads, gradcheck, hooks) is tests/conformance/test_autograd.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from torch_fl import routing

STEPS = 5
# float32 tolerance for a few optimizer steps: the two devices run the same kernels (CPU on the simulated
# accelerator) but may reduce in another order on another accelerator.
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _clean_routing():
    routing.reset()
    yield
    routing.reset()


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))


def make_data(loss_name: str):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 12, generator=g)
    if loss_name == "mse":
        y = torch.randn(16, 5, generator=g)
    else:
        y = torch.randint(0, 5, (16,), generator=g)
    return x, y


def loss_fn(loss_name: str, out, y):
    return F.mse_loss(out, y) if loss_name == "mse" else F.cross_entropy(out, y)


def make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train(model, x, y, loss_name: str, optimizer_name: str, device: str):
    """Trains `model` on `device` for STEPS steps; returns (losses, model, gradients of the last step)."""
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    optimizer = make_optimizer(optimizer_name, model.parameters())
    losses = []
    grads = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(loss_name, model(x), y)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        optimizer.step()
        losses.append(loss.item())
    return losses, model, grads


def check_same_training(loss_name: str, optimizer_name: str):
    x, y = make_data(loss_name)
    initial = make_mlp()
    cpu_losses, cpu_model, _ = train(copy.deepcopy(initial), x, y, loss_name, optimizer_name, "cpu")
    fl_losses, fl_model, fl_grads = train(copy.deepcopy(initial), x, y, loss_name, optimizer_name, "flagos")

    assert cpu_losses[-1] < cpu_losses[0], f"the reference did not train: {cpu_losses}"
    torch.testing.assert_close(torch.tensor(fl_losses), torch.tensor(cpu_losses), **TOL)
    for grad in fl_grads:
        assert grad is not None and grad.device.type == "flagos", grad
    for (name, p_fl), p_cpu in zip(fl_model.named_parameters(), cpu_model.parameters(), strict=True):
        assert p_fl.device.type == "flagos", name
        torch.testing.assert_close(p_fl.detach().cpu(), p_cpu.detach(), **TOL, msg=f"parameter {name}")


@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
@pytest.mark.parametrize("loss_name", ["mse", "cross_entropy"])
def test_mlp_trains_like_cpu(loss_name, optimizer_name):
    check_same_training(loss_name, optimizer_name)


@pytest.mark.parametrize(
    "routes",
    [
        {"aten::addmm": "cpu"},  # the forward's Linear layers
        {"aten::mm": "cpu", "aten::threshold_backward.grad_input": "cpu"},  # backward ops
    ],
    ids=["addmm-cpu", "backward-on-cpu"],
)
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_mlp_trains_like_cpu_with_routes(routes, optimizer_name):
    routing.reset_counts()
    with routing.override(routes):
        check_same_training("cross_entropy", optimizer_name)
    # Each Linear runs one addmm per step forward and the backward one or two mm per layer.
    assert routing.counts()["cpu"] >= STEPS * 2, routing.counts()


def test_gradients_of_a_routed_op_match():
    """The derivative of an op on the cpu route is computed like any other (its autograd kernel is
    torch's), and lands on flagos."""
    a = torch.randn(6, 4, requires_grad=True)
    b = torch.randn(4, 3, requires_grad=True)
    fa = a.detach().to("flagos").requires_grad_()
    fb = b.detach().to("flagos").requires_grad_()
    with routing.override({"aten::mm": "cpu"}):
        routing.reset_counts()
        out = torch.mm(fa, fb)
        out.square().sum().backward()
        counts = routing.counts()
    torch.mm(a, b).square().sum().backward()
    assert counts["cpu"] == 3, f"forward mm and the two backward mm all on the cpu route: {counts}"
    for got, expected in [(fa.grad, a.grad), (fb.grad, b.grad)]:
        assert got.device.type == "flagos"
        torch.testing.assert_close(got.cpu(), expected)
