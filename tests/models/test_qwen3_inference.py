"""Qwen3 inference on flagos: logits and greedy token ids against the reference device."""

from __future__ import annotations

import pytest
import torch

import harness.qwen3

pytest.importorskip("transformers", minversion="5.0")


@pytest.fixture(scope="module")
def models(qwen3, master_model):
    reference = harness.qwen3.copy_to(master_model, qwen3.reference, qwen3.dtype)
    flagos = harness.qwen3.copy_to(master_model, "flagos", qwen3.dtype)
    return reference, flagos


def test_model_lives_on_flagos(models, qwen3):
    _, flagos = models
    devices = {p.device.type for p in flagos.parameters()} | {b.device.type for b in flagos.buffers()}
    assert devices == {"flagos"}
    assert {p.dtype for p in flagos.parameters()} == {qwen3.dtype}


@pytest.mark.parametrize("padding", ["none", "left"])
def test_logits_match_reference(models, qwen3, prompt_ids, padding):
    reference, flagos = models
    mask = torch.ones_like(prompt_ids)
    if padding == "left":  # row 1 is a shorter prompt, left-padded: exercises the attention mask path
        mask[1, : qwen3.prompt_length // 4] = 0
    with torch.no_grad():
        expected = reference(prompt_ids.to(qwen3.reference), attention_mask=mask.to(qwen3.reference)).logits
        actual = flagos(prompt_ids.to("flagos"), attention_mask=mask.to("flagos")).logits
    assert actual.device.type == "flagos" and actual.dtype == expected.dtype
    keep = mask.bool()  # logits at padded positions are meaningless on every device
    expected, actual = expected.cpu()[keep], actual.cpu()[keep]
    harness.qwen3.assert_logits_close(actual, expected, qwen3.dtype)


def test_greedy_generate_matches_reference(models, qwen3, prompt_ids):
    reference, flagos = models
    expected = harness.qwen3.greedy_generate(reference, prompt_ids.to(qwen3.reference), qwen3.new_tokens)
    actual = harness.qwen3.greedy_generate(flagos, prompt_ids.to("flagos"), qwen3.new_tokens)
    assert actual.sequences.device.type == "flagos"
    assert actual.sequences.shape == (qwen3.batch, qwen3.prompt_length + qwen3.new_tokens)
    problem = harness.qwen3.greedy_divergence(
        expected.sequences, actual.sequences, expected.logits, qwen3.prompt_length, qwen3.dtype
    )
    assert problem is None, problem
    new = expected.sequences[:, qwen3.prompt_length :]
    assert new.unique().numel() > 1, "the reference repeats one token: token parity would prove little"
    # The per-step logits (prefill, then one token at a time through the KV cache) agree as long as the
    # two sequences do.
    same = (expected.sequences.cpu() == actual.sequences.cpu()).all(dim=0)
    for step, (e, a) in enumerate(zip(expected.logits, actual.logits, strict=True)):
        if not bool(same[: qwen3.prompt_length + step].all()):
            break
        harness.qwen3.assert_logits_close(a, e, qwen3.dtype, f"new token {step}")


def test_greedy_divergence_rejects_a_changed_token(models, qwen3, prompt_ids):
    """The comparison above can fail: a token that is not a near tie of the reference is rejected."""
    reference, _ = models
    out = harness.qwen3.greedy_generate(reference, prompt_ids.to(qwen3.reference), 4)
    changed = out.sequences.clone().cpu()
    step_logits = out.logits[0][0].float().cpu()
    changed[0, qwen3.prompt_length] = int(step_logits.argmin())  # the reference's least likely token
    assert (
        harness.qwen3.greedy_divergence(
            out.sequences, out.sequences, out.logits, qwen3.prompt_length, qwen3.dtype
        )
        is None
    )
    problem = harness.qwen3.greedy_divergence(
        out.sequences, changed, out.logits, qwen3.prompt_length, qwen3.dtype
    )
    assert problem is not None and "not a near tie" in problem
