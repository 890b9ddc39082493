"""Cases of tests/ops/test_semantics_backed.py that need cuda's autograd: they run once on flagos in the test
process and once on cuda in a fresh process that never imports torch_fl (a CUDA backward cannot run in a
process that imported it, pytorch#161129; see harness.processes.run_in_clean_process). This module must not
import torch_fl.

    python tests/ops/semantics_cuda_cases.py RESULT.pt  # the cuda side: every case, saved to RESULT.pt
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def outcome(fn):
    """("ok", outputs on the CPU) or ("raise", exception type name, first line of the message without
    flagos's context)."""
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("raise", type(e).__name__, str(e).splitlines()[0].split(" (while running")[0])
    return ("ok", to_cpu(result))


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (tuple, list)):
        return [to_cpu(e) for e in x]
    return x


def backward_grads(loss_of, *tensors):
    """The gradients of loss_of(*tensors) with respect to `tensors` (made leaves requiring grad)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    loss_of(*leaves).sum().backward()
    return [t.grad for t in leaves]


# ---- Deterministic mode: which ops raise "does not have a deterministic implementation" -------------------
def alert_cases(d):
    idx = torch.tensor([0, 0, 1], device=d)
    ones = torch.ones(3, device=d)
    x4 = torch.arange(16.0, device=d).view(1, 1, 4, 4)
    return {
        "put_": lambda: torch.zeros(5, device=d).put_(idx, ones),
        "put_accumulate": lambda: torch.zeros(5, device=d).put_(idx, ones, accumulate=True),
        "index_put_accumulate": lambda: torch.zeros(5, device=d).index_put_((idx,), ones, accumulate=True),
        "index_put": lambda: torch.zeros(5, device=d).index_put_((idx,), ones),
        "index_add_": lambda: torch.zeros(5, device=d).index_add_(0, idx, ones),
        "index_copy_": lambda: torch.zeros(5, device=d).index_copy_(0, idx, ones),
        "scatter_add_": lambda: torch.zeros(5, device=d).scatter_add_(0, idx, ones),
        "scatter_reduce_sum": lambda: torch.zeros(5, device=d).scatter_reduce_(0, idx, ones, "sum"),
        "scatter_reduce_prod": lambda: torch.ones(5, device=d).scatter_reduce_(0, idx, ones * 2, "prod"),
        "histc": lambda: torch.histc(ones),
        "bincount": lambda: torch.bincount(idx),
        "bincount_weights": lambda: torch.bincount(idx, ones),
        "kthvalue": lambda: torch.kthvalue(ones, 2),
        "median_dim": lambda: torch.median(ones.view(3, 1), 0),
        "cumsum": lambda: torch.cumsum(ones, 0),
        "mm": lambda: torch.mm(x4[0, 0], x4[0, 0]),
        "max_unpool1d": lambda: F.max_unpool1d(torch.ones(1, 1, 2, device=d), idx[:2].view(1, 1, 2), 2),
        "nll_loss2d": lambda: F.nll_loss(
            x4.expand(1, 3, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long, device=d)
        ),
        "embedding_backward": lambda: backward_grads(
            lambda w: F.embedding(idx, w), torch.ones(3, 2, device=d)
        ),
        "embedding_bag_backward": lambda: backward_grads(
            lambda w: F.embedding_bag(idx, w, torch.tensor([0], device=d)), torch.ones(3, 2, device=d)
        ),
        "interpolate_linear_backward": lambda: backward_grads(
            lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), x4
        ),
        "adaptive_avg_pool2d_backward": lambda: backward_grads(lambda t: F.adaptive_avg_pool2d(t, 3), x4),
        "grid_sample_backward": lambda: backward_grads(
            lambda t: F.grid_sample(t, torch.zeros(1, 2, 2, 2, device=d), align_corners=False), x4
        ),
        "ctc_loss_backward": lambda: backward_grads(
            lambda lp: F.ctc_loss(lp.log_softmax(2), torch.tensor([[1, 2]], device=d), (4,), (2,)),
            torch.ones(4, 1, 3, device=d),
        ),
        "max_pool3d_backward": lambda: backward_grads(
            lambda t: F.max_pool3d(t, 2), torch.arange(8.0, device=d).view(1, 1, 2, 2, 2)
        ),
        "replication_pad_backward": lambda: backward_grads(
            lambda t: F.pad(t, (1, 1, 1, 1), mode="replicate"), x4
        ),
    }


# torch.nn.functional itself picks a decomposition for cuda tensors in deterministic mode (`input.is_cuda` in
# Python, before any operator runs): flagos tensors take the operator, whose CUDA backward has no
# deterministic implementation. Not something an operator-level backend can change.
PYTHON_LEVEL_IS_CUDA = {"max_pool3d_backward", "replication_pad_backward"}


def deterministic_outcomes(d, warn_only=False):
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        return {name: outcome(fn) for name, fn in alert_cases(d).items()}
    finally:
        torch.use_deterministic_algorithms(was)


# ---- Composites whose implementation CUDA chooses by device type ----------------------------------------
def _t(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def choice_cases():
    """name -> (function of device tensors returning outputs, CPU input tensors, indices of the inputs the
    loss is differentiated against)."""
    x4, w, b = _t(4, 3, 5, 6, seed=1), _t(3, seed=2), _t(3, seed=3)
    rm, rv = _t(3, seed=4), _t(3, seed=5).abs() + 0.5
    grid = _t(4, 2, 3, 2, seed=6).clamp(-1, 1)
    x3 = _t(6, 3, 7, seed=7)
    return {
        "batch_norm_train": (
            lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5),
            (x4, w, b, rm, rv),
            (0, 1, 2),
        ),
        "batch_norm_eval": (
            lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, False),
            (x4, w, b, rm, rv),
            (0, 1, 2),
        ),
        "batch_norm_3d_no_stats": (
            lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
            (x3, w, b),
            (0, 1, 2),
        ),
        "batch_norm_half": (
            lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, True),
            (x4.half(), w, b, rm, rv),
            (0, 1, 2),
        ),
        "batch_norm_channels_last": (
            lambda x, w, b, rm, rv: F.batch_norm(
                x.contiguous(memory_format=torch.channels_last), rm, rv, w, b, True
            ),
            (x4, w, b, rm, rv),
            (0, 1, 2),
        ),
        "batch_norm_bfloat16": (
            lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
            (x4.bfloat16(), w, b),
            (0,),
        ),
        "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (x4, w, b), (0, 1, 2)),
        "grid_sample_cudnn": (lambda x, g: F.grid_sample(x, g, align_corners=True), (x4, grid), (0, 1)),
        "grid_sample_generic": (lambda x, g: F.grid_sample(x, g, align_corners=False), (x4, grid), (0, 1)),
        "rms_norm_float32": (lambda x, w: F.rms_norm(x, (6,), w), (x4, _t(6, seed=8)), (0, 1)),
        "rms_norm_float64": (
            lambda x, w: F.rms_norm(x, (6,), w),
            (x4.double(), _t(6, seed=8).double()),
            (0, 1),
        ),
        "silu": (F.silu, (x4,), (0,)),
    }


def run_choice(name, d):
    """Outputs, updated inputs (running statistics), grad_fn names and gradients of a case on device d."""
    fn, cpu_inputs, diff = choice_cases()[name]
    inputs = [t.to(d) for t in cpu_inputs]
    for i in diff:
        inputs[i].requires_grad_()
    out = fn(*inputs)
    grad_fn = out.grad_fn.name() if out.grad_fn is not None else None
    weight = torch.linspace(-1, 1, out.numel(), device=d).view(out.shape).to(out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), [inputs[i] for i in diff])
    return {"out": to_cpu(out), "inputs": to_cpu(inputs), "grad_fn": grad_fn, "grads": to_cpu(list(grads))}


def main(result_path):
    assert "torch_fl" not in sys.modules
    results = {
        "deterministic": deterministic_outcomes("cuda"),
        "choices": {name: run_choice(name, "cuda") for name in choice_cases()},
    }
    assert "torch_fl" not in sys.modules, "the reference process imported torch_fl"
    torch.save(results, result_path)


if __name__ == "__main__":
    main(sys.argv[1])
