"""torch.flagos.make_graphed_callables: training through the captured forward and backward graphs gives
eager's gradients and parameters at every step (against eager on the CPU, and against eager on flagos on a
GPU), however the gradients are zeroed or accumulated; the gradients autograd receives are not the graph's
memory; misuse raises. The same tests run on the simulated accelerator (CI) and backed by CUDA (GPU)."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_fl  # noqa: F401

DEV = "flagos"
STEPS = 6
BATCH, WIDTH = 4, 8


class MLP(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(WIDTH, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class ResidualBlock(torch.nn.Module):
    """A pre-norm residual block: LayerNorm, Linear, GELU, added to the input."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.fc = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


# How a training step zeroes and accumulates gradients: (set_to_none, micro-batches per optimizer step).
GRAD_MODES = {
    "set_to_none": (True, 1),
    "zeroed": (False, 1),
    "accumulated": (True, 2),
    "zeroed_accumulated": (False, 2),
}


def _batches(steps: int, micro: int, out_width: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(1)
    return [
        [
            (
                torch.randn(BATCH, WIDTH, generator=gen).to(dtype),
                torch.randn(BATCH, out_width, generator=gen).to(dtype),
            )
            for _ in range(micro)
        ]
        for _ in range(steps)
    ]


def _train(model, device, batches, set_to_none: bool, input_grad: bool):
    """SGD with momentum over `batches`; per step the parameters' gradients (before the optimizer's step),
    the inputs' gradients and the parameters after the step, on the CPU."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = []
    for micro_batches in batches:
        opt.zero_grad(set_to_none=set_to_none)
        inputs = []
        for x, y in micro_batches:
            x = x.to(device).detach().requires_grad_(input_grad)
            inputs.append(x)
            torch.nn.functional.mse_loss(model(x), y.to(device)).backward()
        grads = [p.grad.cpu().clone() for p in model.parameters()]
        input_grads = [x.grad.cpu().clone() for x in inputs] if input_grad else []
        opt.step()
        history.append((grads, input_grads, [p.detach().cpu().clone() for p in model.parameters()]))
    return history


def _graphed_copy(reference: torch.nn.Module, input_grad: bool, dtype: torch.dtype) -> torch.nn.Module:
    model = copy.deepcopy(reference).to(DEV)
    sample = torch.randn(BATCH, WIDTH, device=DEV, dtype=dtype, requires_grad=input_grad)
    return torch.flagos.make_graphed_callables(model, (sample,))


def _assert_same_history(got, expected, **tolerance):
    for step, ((grads, input_grads, params), (ref_grads, ref_input_grads, ref_params)) in enumerate(
        zip(got, expected, strict=True)
    ):
        for kind, a, b in (("grad", grads, ref_grads), ("input grad", input_grads, ref_input_grads)):
            for k, (x, y) in enumerate(zip(a, b, strict=True)):
                torch.testing.assert_close(
                    x, y, **tolerance, msg=lambda m, s=step, k=k, n=kind: f"step {s} {n} {k}: {m}"
                )
        for k, (x, y) in enumerate(zip(params, ref_params, strict=True)):
            torch.testing.assert_close(
                x, y, **tolerance, msg=lambda m, s=step, k=k: f"step {s} param {k}: {m}"
            )


# fp32 against the CPU: the device's kernels may sum in another order (cuBLAS backed by CUDA).
CPU_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
@pytest.mark.parametrize(
    "module, input_grad",
    [(MLP, True), (ResidualBlock, False)],
    ids=["mlp-input-grad", "residual-layernorm"],
)
def test_graphed_training_matches_cpu_eager(module, input_grad, grad_mode):
    set_to_none, micro = GRAD_MODES[grad_mode]
    torch.manual_seed(0)
    reference = module()
    graphed = _graphed_copy(reference, input_grad, torch.float32)
    out_width = reference(torch.zeros(1, WIDTH)).shape[-1]
    batches = _batches(STEPS, micro, out_width, torch.float32)
    expected = _train(reference, "cpu", batches, set_to_none, input_grad)
    got = _train(graphed, DEV, batches, set_to_none, input_grad)
    _assert_same_history(got, expected, **CPU_TOLERANCE)


def test_graphed_callables_chained_match_cpu_eager():
    """Two callables graphed together (one pool, forwards then backwards in reverse): the second's input
    gradient flows into the first's backward graph."""
    torch.manual_seed(0)
    block, head = ResidualBlock(), MLP()
    reference = torch.nn.Sequential(block, head)
    g_block, g_head = copy.deepcopy(block).to(DEV), copy.deepcopy(head).to(DEV)
    x = torch.randn(BATCH, WIDTH, device=DEV, requires_grad=True)
    h = torch.randn(BATCH, WIDTH, device=DEV, requires_grad=True)
    torch.flagos.make_graphed_callables((g_block, g_head), ((x,), (h,)))
    graphed = torch.nn.Sequential(g_block, g_head)
    for set_to_none, micro in GRAD_MODES.values():
        batches = _batches(STEPS, micro, 4, torch.float32)
        expected = _train(copy.deepcopy(reference), "cpu", batches, set_to_none, input_grad=True)
        got = _train(graphed, DEV, batches, set_to_none, input_grad=True)
        _assert_same_history(got, expected, **CPU_TOLERANCE)
        graphed.load_state_dict({k: v.to(DEV) for k, v in reference.state_dict().items()})


def test_gradients_are_not_the_graphs_memory():
    """A gradient kept from one step keeps its values through the next replay, parameters' and inputs'."""
    torch.manual_seed(0)
    graphed = _graphed_copy(MLP(), input_grad=True, dtype=torch.float32)
    x1 = torch.randn(BATCH, WIDTH, device=DEV, requires_grad=True)
    graphed(x1).square().sum().backward()
    kept = [p.grad for p in graphed.parameters()] + [x1.grad]
    values = [g.cpu().clone() for g in kept]
    for p in graphed.parameters():
        p.grad = None
    x2 = torch.randn(BATCH, WIDTH, device=DEV, requires_grad=True)
    graphed(x2).square().sum().backward()
    for g, v in zip(kept, values, strict=True):
        assert torch.equal(g.cpu(), v)


def test_capture_keeps_no_autograd_graph():
    """After capture nothing keeps the capture's autograd graph: training's forward makes the parameters'
    gradient accumulators anew, on the stream it runs on (a kept one would be the capture stream's, and
    every backward would synchronise the two streams)."""
    torch.manual_seed(0)
    graphed = _graphed_copy(MLP(), input_grad=False, dtype=torch.float32)
    reached = []
    for name, p in graphed.named_parameters():
        # The parameter's live accumulator, or a new one that nothing holds once this statement ends.
        p.view_as(p).grad_fn.next_functions[0][0].register_prehook(
            lambda grads, name=name: reached.append(name)
        )
    graphed(torch.randn(BATCH, WIDTH, device=DEV)).sum().backward()
    assert reached == []


def test_function_with_input_grads():
    w = torch.randn(5, 5, device=DEV, requires_grad=True)

    def f(a):
        return (a @ w).tanh()

    sample = torch.randn(3, 5, device=DEV, requires_grad=True)
    gf = torch.flagos.make_graphed_callables(f, (sample,))
    a = torch.randn(3, 5, device=DEV, requires_grad=True)
    gf(a).sum().backward()
    a2 = a.detach().clone().requires_grad_()
    w.grad = None
    f(a2).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), a2.grad.cpu())


def test_forward_again_before_backward_raises():
    graphed = _graphed_copy(MLP(), input_grad=False, dtype=torch.float32)
    first = graphed(torch.randn(BATCH, WIDTH, device=DEV)).sum()
    graphed(torch.randn(BATCH, WIDTH, device=DEV))
    with pytest.raises(RuntimeError, match="ran forward again before this backward"):
        first.backward()


def test_arguments_unlike_the_samples_raise():
    graphed = _graphed_copy(MLP(), input_grad=False, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"argument 0 is \(1, 8\) torch.float32; the graph was captured for"):
        graphed(torch.randn(1, WIDTH, device=DEV))
    with pytest.raises(ValueError, match="argument 0 is"):
        graphed(torch.randn(BATCH, WIDTH, device=DEV, dtype=torch.float64))
    with pytest.raises(ValueError, match="requires grad, but its sample did not"):
        graphed(torch.randn(BATCH, WIDTH, device=DEV, requires_grad=True))
    with pytest.raises(TypeError, match="takes 1 tensors, got 2"):
        graphed(torch.randn(BATCH, WIDTH, device=DEV), torch.randn(BATCH, WIDTH, device=DEV))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("grad_mode", ["zeroed", "accumulated"])
@pytest.mark.parametrize("module", [MLP, ResidualBlock], ids=["mlp", "residual-layernorm"])
def test_graphed_training_matches_flagos_eager_gpu(module, grad_mode, dtype):
    """Backed by CUDA: graphed against eager, both on flagos (the same kernels, replayed or not)."""
    set_to_none, micro = GRAD_MODES[grad_mode]
    torch.manual_seed(0)
    reference = module().to(dtype)
    eager = copy.deepcopy(reference).to(DEV)
    graphed = _graphed_copy(reference, input_grad=True, dtype=dtype)
    out_width = reference(torch.zeros(1, WIDTH, dtype=dtype)).shape[-1]
    batches = _batches(STEPS, micro, out_width, dtype)
    expected = _train(eager, DEV, batches, set_to_none, input_grad=True)
    got = _train(graphed, DEV, batches, set_to_none, input_grad=True)
    tolerance = {"rtol": 1.6e-2, "atol": 1e-5} if dtype == torch.bfloat16 else {"rtol": 1.3e-6, "atol": 1e-5}
    _assert_same_history(got, expected, **tolerance)
