"""Qwen3 checkpoints and flagos: Hugging Face save_pretrained/from_pretrained and torch.save/torch.load
round-trip bit for bit (weights and logits)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import harness.qwen3

pytest.importorskip("transformers", minversion="5.0")


@pytest.fixture(scope="module")
def source(qwen3, master_model):
    """The model on flagos, in the dtype under test."""
    return harness.qwen3.copy_to(master_model, "flagos", qwen3.dtype)


def logits(model, ids):
    with torch.no_grad():
        return model(ids.to("flagos")).logits.cpu()


def assert_same_weights(actual, expected):
    a, e = actual.state_dict(), expected.state_dict()
    assert a.keys() == e.keys()
    for name in e:
        assert a[name].device.type == "flagos", f"{name} is on {a[name].device}"
        assert a[name].dtype == e[name].dtype, name
        assert torch.equal(a[name].cpu(), e[name].cpu()), f"{name} differs after the round trip"


def test_save_pretrained_from_pretrained_to_flagos(tmp_path, qwen3, source, prompt_ids):
    from transformers import Qwen3ForCausalLM

    source.save_pretrained(tmp_path)  # from flagos tensors
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=qwen3.dtype).to("flagos").eval()
    assert_same_weights(loaded, source)
    assert torch.equal(logits(loaded, prompt_ids), logits(source, prompt_ids))


def test_bfloat16_copy_matches_a_bfloat16_checkpoint(tmp_path, master_model, prompt_ids):
    """A model cast to bfloat16 by the tests computes what the same weights loaded from a bfloat16
    checkpoint compute: from_pretrained keeps the rotary frequencies in float32, and so must the cast
    (with them in bfloat16, every position but the first differed by about 1% at the 0.6B shape)."""
    from transformers import Qwen3ForCausalLM

    source = harness.qwen3.copy_to(master_model, "flagos", torch.bfloat16)
    assert source.model.rotary_emb.inv_freq.dtype == torch.float32
    source.save_pretrained(tmp_path)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).to("flagos").eval()
    assert torch.equal(logits(loaded, prompt_ids), logits(source, prompt_ids))


def test_from_pretrained_device_map_flagos(tmp_path, qwen3, source, prompt_ids):
    """transformers routes device_map through accelerate; with it, device_map="flagos" loads straight
    onto the device (and keeps the tied embeddings tied)."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("device_map needs accelerate, which is not installed")
    from transformers import Qwen3ForCausalLM

    source.save_pretrained(tmp_path)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=qwen3.dtype, device_map="flagos").eval()
    assert_same_weights(loaded, source)
    assert {b.device.type for b in loaded.buffers()} == {"flagos"}
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(logits(loaded, prompt_ids), logits(source, prompt_ids))


def test_torch_save_load_map_location_flagos(tmp_path, qwen3, master_model, source, prompt_ids):
    path = tmp_path / "qwen3.pt"
    torch.save(source.state_dict(), path)  # flagos storages
    state = torch.load(path, map_location="flagos", weights_only=True)
    assert {t.device.type for t in state.values()} == {"flagos"}
    fresh = harness.qwen3.copy_to(harness.qwen3.build_model(qwen3.shape, seed=1), "flagos", qwen3.dtype)
    assert not torch.equal(logits(fresh, prompt_ids), logits(source, prompt_ids)), "seed 1 must differ"
    fresh.load_state_dict(state)
    assert_same_weights(fresh, source)
    assert torch.equal(logits(fresh, prompt_ids), logits(source, prompt_ids))
    on_cpu = torch.load(path, map_location="cpu", weights_only=True)
    for name, tensor in master_model.state_dict().items():
        assert torch.equal(on_cpu[name], tensor.to(qwen3.dtype)), name


def test_module_to_flagos_keeps_tied_weights(master_model):
    import copy

    model = copy.deepcopy(master_model)
    param = model.model.embed_tokens.weight
    assert model.lm_head.weight is param
    model.to("flagos")
    assert model.lm_head.weight is model.model.embed_tokens.weight, "tied embeddings came apart"
    assert model.model.embed_tokens.weight is param, "the parameter object was replaced"
