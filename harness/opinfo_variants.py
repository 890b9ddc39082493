"""The ways an OpInfo sample is run (tools/flaggems_sweep.py): the OpInfo's function, its in-place
variant, with out=, or forward and backward. On flagos backed by CUDA each reaches other ATen overloads
(aten::abs, aten::abs_, aten::abs.out; for the backward aten::silu_backward, ...), so a sweep that wants
every overload exercised runs every variant an OpInfo has."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from harness import opinfo as opinfo_harness

# "": the function; "grad": forward and backward. A case is an OpInfo key with its variant: "abs@inplace".
VARIANTS = ("", "inplace", "out", "grad")


def case_key(opinfo_key: str, variant: str) -> str:
    return f"{opinfo_key}@{variant}" if variant else opinfo_key


def split_case(key: str) -> tuple[str, str]:
    opinfo_key, _, variant = key.partition("@")
    return opinfo_key, variant


def has_variant(opinfo, variant: str) -> bool:
    if variant == "inplace":
        return opinfo.inplace_variant is not None
    if variant == "out":
        return bool(opinfo.supports_out)
    if variant == "grad":
        return bool(opinfo.supports_autograd)
    return True


def sample_applies(sample, variant: str) -> bool:
    """Whether `sample` can run the `variant` way: an ``as_tuple=True`` call (nonzero) returns a tuple,
    which no out= overload writes."""
    return not (variant == "out" and sample.kwargs.get("as_tuple") is True)


def move_for_variant(sample, variant: str, device: str):
    """`sample` on `device`; for "grad" its tensors that require grad do on `device` too (leaves)."""
    if variant != "grad":
        return opinfo_harness.move_sample(sample, device)

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(device, copy=True).requires_grad_(x.requires_grad)

    return opinfo_harness.MovedSample(
        tree_map(move, sample.input),
        tuple(tree_map(move, tuple(sample.args))),
        tree_map(move, dict(sample.kwargs)),
    )


def run_variant(opinfo, variant: str, sample):
    """Runs `sample` the `variant` way; for "grad": (outputs, gradients of the inputs that require grad,
    for fixed random output gradients)."""
    args, kwargs = sample.args, sample.kwargs
    if variant == "inplace":
        return opinfo.inplace_variant(sample.input, *args, **kwargs)
    result = opinfo(sample.input, *args, **kwargs)
    if variant == "out":
        # out= tensors of the functional result's shape and strides, as compiled code passes them (an empty
        # one would be resized: host work that keeps a FlagGems call from replaying). Filled with a value
        # the op must overwrite, so that an element it leaves unwritten differs from the reference.
        def sized_like(t):
            return torch.full_like(t, 7) if isinstance(t, torch.Tensor) else t

        out = tuple(map(sized_like, result)) if isinstance(result, tuple) else sized_like(result)
        return opinfo(sample.input, *args, **kwargs, out=out)
    if variant != "grad":
        return result
    outputs = [t for t in opinfo_harness._tensors(result) if t.requires_grad]
    inputs = [
        t for t in opinfo_harness._tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad
    ]
    if not outputs or not inputs:
        return result
    generator = torch.Generator().manual_seed(0)
    grad_outputs = [torch.randn(o.shape, generator=generator).to(o.device, o.dtype) for o in outputs]
    grads = torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
    return [o.detach() for o in outputs], [g for g in grads if g is not None]
