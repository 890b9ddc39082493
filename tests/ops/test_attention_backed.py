"""Scaled-dot-product attention on flagos backed by torch's CUDA: flagos picks the fused backend cuda picks
(cuDNN attention for bf16 on an H200 with torch 2.11), runs the same kernel on the same memory, so the
forward is bitwise cuda's. Gradients are checked against a float32 math-backend reference on flagos: a
backward over CUDA tensors cannot run beside flagos (docs/design.md).

GPU-only: these run on the NVIDIA machine with FLAGOS_ACCELERATOR=auto (or cuda)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import torch_fl

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("backed_by_cuda")]

FUSED_OP = {  # the op torch's composite runs for a choice, on cuda
    SDPBackend.FLASH_ATTENTION.value: "aten::_scaled_dot_product_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION.value: "aten::_scaled_dot_product_efficient_attention",
    SDPBackend.CUDNN_ATTENTION.value: "aten::_scaled_dot_product_cudnn_attention",
}
MATH_OPS = {"aten::bmm", "aten::matmul", "aten::_softmax", "aten::softmax", "aten::baddbmm"}

# name -> (dtype, query heads, kv heads, head dim, mask, is_causal, enable_gqa); Qwen3-0.6B's attention
# is 16 query heads, 8 kv heads, head dim 128, causal, bf16.
CASES = {
    "bf16": (torch.bfloat16, 16, 16, 128, False, False, False),
    "bf16_causal": (torch.bfloat16, 16, 16, 128, False, True, False),
    "bf16_gqa_causal": (torch.bfloat16, 16, 8, 128, False, True, True),
    "bf16_head_dim_72": (torch.bfloat16, 8, 8, 72, False, True, False),  # padded to 80 for flash
    "bf16_float_mask": (torch.bfloat16, 8, 8, 64, True, False, False),
    "fp16_causal": (torch.float16, 8, 8, 64, False, True, False),
    "fp32": (torch.float32, 8, 8, 64, False, False, False),
    "fp32_mask": (torch.float32, 8, 8, 64, True, False, False),
}


def make_inputs(case, length=256, seed=0):
    dtype, heads, kv_heads, head_dim, mask, is_causal, gqa = CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    q, k, v = (
        randn(2, heads, length, head_dim),
        randn(2, kv_heads, length, head_dim),
        randn(2, kv_heads, length, head_dim),
    )
    kwargs = dict(
        attn_mask=randn(1, 1, length, length) if mask else None, is_causal=is_causal, enable_gqa=gqa
    )
    return (q, k, v), kwargs


def to_flagos(tensors, kwargs, grad=False):
    moved = [t.detach().to("flagos").requires_grad_(grad) for t in tensors]
    mask = kwargs["attn_mask"]
    return moved, dict(kwargs, attn_mask=None if mask is None else mask.to("flagos"))


def op_names(fn) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_backend_as_cuda_and_bitwise_forward(case):
    tensors, kwargs = make_inputs(case)
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs)
    choice = torch._fused_sdp_choice(*tensors, **kwargs)
    assert torch._fused_sdp_choice(*flagos_in, **flagos_kwargs) == choice
    if case.startswith("bf16") and "mask" not in case and torch.cuda.get_device_capability() >= (8, 0):
        assert choice in FUSED_OP, choice  # a fused kernel (which one is torch's choice per version)
    want = F.scaled_dot_product_attention(*tensors, **kwargs)
    names = op_names(lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs))
    got = F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs)
    if choice in FUSED_OP:
        assert FUSED_OP[choice] in names and not names & MATH_OPS, sorted(names)
    assert got.device.type == "flagos" and got.shape == want.shape
    assert torch.equal(torch_fl.as_cuda(got), want)


@pytest.mark.parametrize(
    "case", ["bf16_causal", "bf16_gqa_causal", "bf16_head_dim_72", "bf16_float_mask", "fp32"]
)
def test_backward_runs_the_fused_backward_and_matches_cuda(case):
    tensors, kwargs = make_inputs(case)
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs, grad=True)
    choice = torch._fused_sdp_choice(*tensors, **kwargs)
    grad = torch.randn(F.scaled_dot_product_attention(*tensors, **kwargs).shape, device="cuda").to(
        tensors[0].dtype
    )
    names = op_names(
        lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs).backward(grad.to("flagos"))
    )
    if choice in FUSED_OP:
        assert FUSED_OP[choice] + "_backward" in names and not names & MATH_OPS, sorted(names)
    # Reference: the math backend in float32 on flagos (on CUDA kernels). The fused kernels compute in
    # the input dtype and accumulate with atomics, so the bound is on the relative error of each gradient.
    ref_in = [t.detach().float().requires_grad_() for t in flagos_in]
    ref_kwargs = dict(flagos_kwargs)
    if ref_kwargs["attn_mask"] is not None:
        ref_kwargs["attn_mask"] = ref_kwargs["attn_mask"].float()
    with sdpa_kernel([SDPBackend.MATH]):
        F.scaled_dot_product_attention(*ref_in, **ref_kwargs).backward(grad.to("flagos").float())
    bound = 1e-5 if tensors[0].dtype == torch.float32 else 2e-2
    for got, want in zip(flagos_in, ref_in, strict=True):
        error = ((got.grad.float() - want.grad).norm() / want.grad.norm()).item()
        assert error < bound, f"relative error {error:.2e} of a gradient (bound {bound})"


def test_flash_forward_outputs_and_backward_through_the_overrideable_op():
    """torch's composite runs CUDA flash only for cuda tensors; flagos reaches it through
    aten::_scaled_dot_product_fused_attention_overrideable, whose kernels call the routed flash ops."""
    tensors, kwargs = make_inputs("bf16_head_dim_72")
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs, grad=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # torch may prefer cuDNN by default (2.11 on Hopper)
        names = op_names(lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs).sum().backward())
    assert {
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
    } <= names
    assert torch_fl.routing.explain("aten::_scaled_dot_product_flash_attention").startswith(
        "aten::_scaled_dot_product_flash_attention -> native (default: native has a CUDA kernel)"
    )


def test_sdpa_kernel_context_applies_on_flagos():
    tensors, kwargs = make_inputs("bf16_causal")
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs)
    for backends, expected in [
        ([SDPBackend.EFFICIENT_ATTENTION], SDPBackend.EFFICIENT_ATTENTION.value),
        ([SDPBackend.MATH], SDPBackend.MATH.value),
    ]:
        with sdpa_kernel(backends):
            assert torch._fused_sdp_choice(*tensors, **kwargs) == expected
            assert torch._fused_sdp_choice(*flagos_in, **flagos_kwargs) == expected
            want = F.scaled_dot_product_attention(*tensors, **kwargs)
            names = op_names(lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs))
            got = F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs)
        assert (FUSED_OP.get(expected) in names) if expected in FUSED_OP else bool(names & MATH_OPS)
        assert torch.equal(torch_fl.as_cuda(got), want)


def test_fused_op_routed_to_cpu_falls_back_to_math():
    """The CPU has no kernel for CUDA flash: routed there, flagos runs the math decomposition instead."""
    tensors, kwargs = make_inputs("bf16_causal")
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs)
    want = F.scaled_dot_product_attention(*tensors, **kwargs)
    route = {"aten::_scaled_dot_product_flash_attention": "cpu"}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]), torch_fl.routing.override(route):
        names = op_names(lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs))
        got = F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs)
    assert "aten::_scaled_dot_product_flash_attention" not in names and names & MATH_OPS
    torch.testing.assert_close(torch_fl.as_cuda(got), want, rtol=2e-2, atol=2e-2)


def test_choice_routed_to_cpu_runs_the_cpu_kernel():
    tensors, kwargs = make_inputs("bf16_causal", length=64)
    flagos_in, flagos_kwargs = to_flagos(tensors, kwargs)
    want = F.scaled_dot_product_attention(*tensors, **kwargs)
    with torch_fl.routing.override({"aten::_fused_sdp_choice": "cpu"}):
        torch_fl.routing.reset_counts()
        names = op_names(lambda: F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs))
        counts = torch_fl.routing.counts()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names and counts["cpu"] >= 2, counts
    torch.testing.assert_close(
        torch_fl.as_cuda(F.scaled_dot_product_attention(*flagos_in, **flagos_kwargs)),
        want,
        rtol=2e-2,
        atol=2e-2,
    )


def test_module_to_flagos_from_cuda_keeps_tied_weights():
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False)).cuda()
    model[1].weight = model[0].weight
    weight = model[0].weight
    model.to("flagos")
    assert model[1].weight is model[0].weight is weight and weight.device.type == "flagos"
    model.to("cuda")
    assert model[1].weight is weight and weight.device.type == "cuda"
