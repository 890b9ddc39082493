"""Qwen3 training on flagos: AdamW steps and bf16 autocast against the same run on the reference device."""

from __future__ import annotations

import pytest
import torch

import harness.processes
import harness.qwen3

pytest.importorskip("transformers", minversion="5.0")

# A training run in a fresh process (the 0.6B shape's bf16 reference on a GPU takes about a minute).
CLEAN_PROCESS_TIMEOUT_S = 900


def train(qwen3, master, device, dtype, ids, **kw) -> dict:
    """harness.qwen3.train on ``device``; where a backward on it cannot run in this process (cuda, once
    torch_fl is imported: see harness.processes.backward_runs_here) in a fresh process that rebuilds the same
    master model."""
    if harness.processes.backward_runs_here(device):
        result = harness.qwen3.train(master, device, dtype, ids, **kw)
    else:
        spec = dict(shape=qwen3.shape, seed=0, dtype=torch.float32)  # as the master_model fixture
        result = harness.processes.run_in_clean_process(
            "harness.qwen3:train",
            spec,
            device=device,
            dtype=dtype,
            ids=ids,
            timeout=CLEAN_PROCESS_TIMEOUT_S,
            **kw,
        )
    assert result["state_devices"] == [torch.device(device).type], (
        f"optimizer state on {result['state_devices']}"
    )
    return result


def check_tracks(reference, flagos, initial, tol, lr, elementwise: bool):
    ref_losses, ref_w = reference["losses"], reference["weights"]
    fl_losses, fl_w = flagos["losses"], flagos["weights"]
    assert ref_losses[-1] < ref_losses[0], (
        f"the reference did not learn ({ref_losses}): the test would be vacuous"
    )
    torch.testing.assert_close(
        torch.tensor(fl_losses),
        torch.tensor(ref_losses),
        rtol=tol.loss_rtol,
        atol=0,
        msg=lambda m: f"losses: {m}",
    )
    assert fl_w.keys() == ref_w.keys()
    update = sum(float((ref_w[k] - initial[k]).pow(2).sum()) for k in ref_w) ** 0.5
    diff = sum(float((fl_w[k] - ref_w[k]).pow(2).sum()) for k in ref_w) ** 0.5
    assert update > 0
    assert diff <= tol.update_rtol * update, (
        f"||flagos update - reference update|| = {diff:.3g}, {diff / update:.3g} of the reference's update "
        f"{update:.3g} (bound {tol.update_rtol})"
    )
    if elementwise and tol.weight_atol is not None:
        for name in ref_w:
            torch.testing.assert_close(
                fl_w[name], ref_w[name], rtol=0, atol=tol.weight_atol * lr, msg=lambda m, n=name: f"{n}: {m}"
            )


@pytest.fixture(scope="module")
def train_ids(qwen3, master_model):
    g = torch.Generator().manual_seed(99)
    return torch.randint(0, master_model.config.vocab_size, (qwen3.batch, qwen3.prompt_length), generator=g)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
def test_adamw_matches_reference(qwen3, master_model, train_ids, foreach):
    kw = dict(steps=qwen3.train_steps, lr=qwen3.lr, foreach=foreach)
    initial = {name: p.detach().to(qwen3.dtype).float() for name, p in master_model.named_parameters()}
    reference = train(qwen3, master_model, qwen3.reference, qwen3.dtype, train_ids, **kw)
    flagos = train(qwen3, master_model, "flagos", qwen3.dtype, train_ids, **kw)
    check_tracks(reference, flagos, initial, qwen3.tol, qwen3.lr, elementwise=True)


def test_bf16_autocast_training_tracks_reference(qwen3, master_model, train_ids):
    """float32 weights, bf16 autocast: torch.autocast("flagos") against torch.autocast(<reference>).
    The two devices' autocast policies may differ in detail, so the bound is bf16's, not float32's."""
    kw = dict(steps=qwen3.train_steps, lr=qwen3.lr, foreach=True, autocast=True)
    initial = {name: p.detach().float() for name, p in master_model.named_parameters()}
    reference = train(qwen3, master_model, qwen3.reference, torch.float32, train_ids, **kw)
    flagos = train(qwen3, master_model, "flagos", torch.float32, train_ids, **kw)
    assert flagos["logits_dtype"] == torch.bfloat16, (
        "torch.autocast('flagos') did not run the model in bfloat16"
    )
    assert reference["logits_dtype"] == torch.bfloat16
    check_tracks(
        reference, flagos, initial, harness.qwen3.TOLERANCES[torch.bfloat16], qwen3.lr, elementwise=False
    )


def test_training_in_a_clean_process_is_the_same_training(qwen3, master_model, train_ids):
    """The clean process (how the CUDA reference trains beside flagos) rebuilds the same master model and
    runs the same steps: on the CPU its result equals this process's."""
    kw = dict(dtype=torch.float32, ids=train_ids, steps=2, lr=qwen3.lr, foreach=True)
    here = harness.qwen3.train(master_model, "cpu", **kw)
    spec = dict(shape=qwen3.shape, seed=0, dtype=torch.float32)
    there = harness.processes.run_in_clean_process(
        "harness.qwen3:train", spec, device="cpu", timeout=CLEAN_PROCESS_TIMEOUT_S, **kw
    )
    assert there["losses"] == pytest.approx(here["losses"], rel=1e-6)
    for name, weight in here["weights"].items():
        torch.testing.assert_close(there["weights"][name], weight, rtol=1e-5, atol=1e-6)
