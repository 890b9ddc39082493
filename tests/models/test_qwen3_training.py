"""Qwen3 training on flagos: AdamW steps and bf16 autocast against the same run on the reference device."""

from __future__ import annotations

import pytest
import torch

from torch_fl import _qwen3

pytest.importorskip("transformers", minversion="5.0")


def train(master, device, dtype, ids, *, steps, lr, foreach, autocast=False):
    """``steps`` AdamW steps of causal-LM loss on ``ids``; returns (losses, final weights on the CPU, the
    dtype of the logits in the last step)."""
    model = _qwen3.copy_to(master, device, dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=foreach)
    ids = ids.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            out = model(ids, labels=ids)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    state_devices = {
        t.device.type for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()
    }
    assert state_devices == {torch.device(device).type}, f"optimizer state on {state_devices}"
    weights = {name: p.detach().float().cpu() for name, p in model.named_parameters()}
    return losses, weights, out.logits.dtype


def check_tracks(reference, flagos, initial, tol, lr, elementwise: bool):
    ref_losses, ref_w, _ = reference
    fl_losses, fl_w, _ = flagos
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
    reference = train(master_model, qwen3.reference, qwen3.dtype, train_ids, **kw)
    flagos = train(master_model, "flagos", qwen3.dtype, train_ids, **kw)
    check_tracks(reference, flagos, initial, qwen3.tol, qwen3.lr, elementwise=True)


def test_bf16_autocast_training_tracks_reference(qwen3, master_model, train_ids):
    """float32 weights, bf16 autocast: torch.autocast("flagos") against torch.autocast(<reference>).
    The two devices' autocast policies may differ in detail, so the bound is bf16's, not float32's."""
    kw = dict(steps=qwen3.train_steps, lr=qwen3.lr, foreach=True, autocast=True)
    initial = {name: p.detach().float() for name, p in master_model.named_parameters()}
    reference = train(master_model, qwen3.reference, torch.float32, train_ids, **kw)
    flagos = train(master_model, "flagos", torch.float32, train_ids, **kw)
    assert flagos[2] == torch.bfloat16, "torch.autocast('flagos') did not run the model in bfloat16"
    assert reference[2] == torch.bfloat16
    check_tracks(reference, flagos, initial, _qwen3.TOLERANCES[torch.bfloat16], qwen3.lr, elementwise=False)
