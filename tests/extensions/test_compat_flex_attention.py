"""torch_fl.compat.enable_flex_attention: FlexAttention on flagos tensors.

Eagerly, on every accelerator: forward and backward with a score modification and a block mask, against
the same attention written out on the CPU (torch's CPU FlexAttention has no backward). Compiled with a
block mask against cuda's, where flagos is backed by CUDA. Without the layer torch's refusal stands;
disabling puts torch's check back, and calls that are not all-flagos keep torch's check.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl
import torch_fl.compat

flex = pytest.importorskip("torch.nn.attention.flex_attention")

B, H, S, D = 2, 2, 64, 16


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def distance_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def written_out(q, k, v):
    """The attention flex_attention computes with distance_bias and the causal mask, in plain ops."""
    i = torch.arange(q.shape[-2])
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + (i[:, None] - i[None, :]) * 0.01
    scores = scores.masked_fill(i[:, None] < i[None, :], float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.fixture
def layer():
    torch_fl.compat.enable_flex_attention()
    yield
    torch_fl.compat.disable_flex_attention()


def inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, S, D, generator=g) for _ in range(3)]


def test_refused_without_the_layer_and_restored_after_it():
    original = flex._validate_device
    q, k, v = (t.to("flagos") for t in inputs())
    with pytest.raises((NotImplementedError, ValueError, RuntimeError), match="(?i)device"):
        flex.flex_attention(q, k, v)
    torch_fl.compat.enable_flex_attention()
    try:
        assert torch_fl.compat.is_flex_attention_enabled()
        assert flex._validate_device is not original
        # Not all three on flagos: torch's own check decides.
        with pytest.raises((NotImplementedError, ValueError, RuntimeError)):
            flex.flex_attention(q, k.cpu(), v)
    finally:
        torch_fl.compat.disable_flex_attention()
    assert flex._validate_device is original
    assert not torch_fl.compat.is_flex_attention_enabled()
    torch_fl.compat.disable_flex_attention()  # idempotent


def test_eager_forward_and_backward_match_the_written_out_attention(layer):
    q, k, v = inputs()
    fq, fk, fv = (t.to("flagos").requires_grad_() for t in (q, k, v))
    mask = flex.create_block_mask(causal, B, H, S, S, device="flagos")
    out = flex.flex_attention(fq, fk, fv, score_mod=distance_bias, block_mask=mask)
    assert out.device.type == "flagos"
    out.sum().backward()
    rq, rk, rv = (t.clone().requires_grad_() for t in (q, k, v))
    ref = written_out(rq, rk, rv)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    for got, want in ((fq, rq), (fk, rk), (fv, rv)):
        assert got.grad.device.type == "flagos"
        torch.testing.assert_close(got.grad.cpu(), want.grad)


@pytest.mark.gpu
@pytest.mark.skipif(torch_fl.accelerator() != "cuda", reason="needs flagos backed by CUDA (Triton)")
def test_compiled_with_a_block_mask_matches_cuda(layer):
    compiled = torch.compile(flex.flex_attention)
    q, k, v = (t.half() for t in inputs())
    results = []
    for device in ("cuda", "flagos"):
        mask = flex.create_block_mask(causal, B, H, S, S, device=device)
        out = compiled(q.to(device), k.to(device), v.to(device), score_mod=distance_bias, block_mask=mask)
        assert out.device.type == device
        results.append(out.float().cpu())
    torch.testing.assert_close(results[1], results[0], rtol=2e-3, atol=2e-3)
