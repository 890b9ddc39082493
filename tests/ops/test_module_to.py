"""Module.to between the CPU and flagos keeps parameter objects, as between the CPU and cuda: flagos answers
aten::_has_compatible_shallow_copy_type, which Module._apply and `tensor.data = ...` consult."""

from __future__ import annotations

import copy

import pytest
import torch


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, ids):
        return self.head(torch.relu(self.proj(self.embed(ids))) * self.scale)


def make_model():
    torch.manual_seed(0)
    return Tied()


@pytest.mark.parametrize(
    ("a", "b", "compatible"),
    [
        (lambda: torch.ones(2), lambda: torch.ones(2, device="flagos"), True),
        (lambda: torch.ones(2, device="flagos"), lambda: torch.ones(2), True),
        (
            lambda: torch.ones(2, device="flagos"),
            lambda: torch.ones(2, device="flagos", dtype=torch.half),
            True,
        ),
        (lambda: torch.ones(2).to_sparse(), lambda: torch.ones(2, device="flagos"), False),
        (lambda: torch.ones(2, device="flagos"), lambda: torch.ones(2).to_sparse(), False),
        (lambda: torch.ones(2, device="meta"), lambda: torch.ones(2, device="flagos"), False),
        (lambda: torch.ones(2), lambda: torch.ones(2).to_sparse(), False),  # torch's own answer, unchanged
    ],
    ids=[
        "cpu-flagos",
        "flagos-cpu",
        "flagos-flagos",
        "sparse-flagos",
        "flagos-sparse",
        "meta-flagos",
        "cpu-sparse",
    ],
)
def test_has_compatible_shallow_copy_type(a, b, compatible):
    assert torch._has_compatible_shallow_copy_type(a(), b()) is compatible
    with torch.no_grad():
        assert torch._has_compatible_shallow_copy_type(a(), b()) is compatible


def test_to_flagos_and_back_keeps_parameters_and_ties():
    model = make_model()
    params = dict(model.named_parameters())
    values = {name: p.detach().clone() for name, p in params.items()}
    ids = torch.tensor([[1, 2, 3]])
    want = model(ids)
    model.to("flagos")
    assert model.head.weight is model.embed.weight, "tied weights came apart"
    for name, p in model.named_parameters():
        assert p is params[name], name
        assert p.device.type == "flagos" and isinstance(p, torch.nn.Parameter) and p.requires_grad
        assert torch.equal(p.detach().cpu(), values[name]), name
    assert model.scale.device.type == "flagos"
    torch.testing.assert_close(model(ids.to("flagos")).cpu(), want)
    model.to("cpu")
    assert model.head.weight is model.embed.weight
    for name, p in model.named_parameters():
        assert p is params[name] and p.device.type == "cpu" and torch.equal(p.detach(), values[name]), name


def test_to_flagos_with_dtype_keeps_ties():
    model = make_model().to("flagos", torch.bfloat16)
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.dtype == torch.bfloat16 and model.embed.weight.device.type == "flagos"


def test_gradients_move_with_their_parameters():
    model = make_model()
    model(torch.tensor([[1, 2]])).sum().backward()
    grad = model.proj.weight.grad.clone()
    model.to("flagos")
    assert model.proj.weight.grad.device.type == "flagos"
    assert torch.equal(model.proj.weight.grad.cpu(), grad)
    assert model.head.weight.grad is model.embed.weight.grad


def test_optimizer_made_before_to_keeps_training_the_moved_parameters():
    model = make_model()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model.to("flagos")
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for _ in range(2):
        for m, o, device in ((model, opt, "flagos"), (reference, ref_opt, "cpu")):
            o.zero_grad()
            m(ids.to(device)).square().mean().backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.device.type == "flagos"
        torch.testing.assert_close(p.detach().cpu(), q.detach(), msg=name)


def test_data_assignment_between_cpu_and_flagos():
    p = torch.nn.Parameter(torch.zeros(3))
    version = p._version
    p.data = torch.arange(3.0, device="flagos")
    assert p.device.type == "flagos" and p.requires_grad and torch.equal(p.detach().cpu(), torch.arange(3.0))
    assert p._version == version  # set_data keeps the version counter, as between CPU and cuda
    (p * 2).sum().backward()
    assert p.grad.device.type == "flagos" and torch.equal(p.grad.cpu(), torch.full((3,), 2.0))
    p.data = torch.ones(2)  # and back, with another shape
    assert p.device.type == "cpu" and p.shape == (2,)
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        p.data = torch.ones(2).to_sparse()


def test_overwrite_module_params_on_conversion_still_replaces():
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model = make_model()
        weight = model.proj.weight
        model.to("flagos")
        assert model.proj.weight is not weight and model.proj.weight.device.type == "flagos"
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
