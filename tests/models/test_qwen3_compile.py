"""Qwen3 under torch.compile on flagos: compiled against eager on flagos, in the model's dtype.

The forward's logits, a few AdamW training steps with the whole step compiled (losses and weights), and
Hugging Face's static-cache ``generate`` with its decoding step compiled (docs/compile.md's recipe): the
token ids of eager ``generate``. With ``FLAGOS_QWEN3_SHAPE=0.6b`` (GPU, bf16) the same tests run at
Qwen3-0.6B's shape on the cuda accelerator.
"""

from __future__ import annotations

import pytest
import torch

import harness.processes
import harness.qwen3

transformers = pytest.importorskip("transformers", minversion="5.0")


@pytest.fixture(scope="module")
def flagos_model(qwen3, master_model):
    return harness.qwen3.copy_to(master_model, "flagos", qwen3.dtype)


def test_compiled_forward_matches_eager(qwen3, flagos_model, prompt_ids):
    ids = prompt_ids.to("flagos")
    with torch.no_grad():
        expected = flagos_model(ids).logits
        compiled = torch.compile(flagos_model)
        actual = compiled(ids).logits
        again = compiled(ids).logits
    assert actual.device.type == "flagos" and actual.dtype == expected.dtype
    harness.qwen3.assert_logits_close(actual, expected, qwen3.dtype, "compiled forward")
    assert torch.equal(again.cpu(), actual.cpu()), "a second compiled call gave other logits"


def test_compiled_training_step_matches_eager(qwen3, master_model):
    """The whole step compiled (forward, AOTAutograd's backward, foreach AdamW) against eager steps."""
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, master_model.config.vocab_size, (qwen3.batch, qwen3.prompt_length), generator=g)
    kw = dict(steps=3, lr=qwen3.lr, foreach=True)
    eager = harness.qwen3.train(master_model, "flagos", qwen3.dtype, ids, **kw)
    compiled = harness.qwen3.train(master_model, "flagos", qwen3.dtype, ids, compile=True, **kw)
    harness.processes.let_autograd_threads_finish()
    assert compiled["state_devices"] == ["flagos"]
    assert eager["losses"][-1] < eager["losses"][0], f"eager did not learn: {eager['losses']}"
    torch.testing.assert_close(
        torch.tensor(compiled["losses"]), torch.tensor(eager["losses"]), rtol=qwen3.tol.loss_rtol, atol=0
    )
    initial = {name: p.detach().to(qwen3.dtype).float() for name, p in master_model.named_parameters()}
    update = sum(float((eager["weights"][k] - initial[k]).pow(2).sum()) for k in initial) ** 0.5
    diff = sum(float((compiled["weights"][k] - eager["weights"][k]).pow(2).sum()) for k in initial) ** 0.5
    assert 0 < diff <= qwen3.tol.update_rtol * update or diff == 0, (
        f"||compiled update - eager update|| = {diff:.3g}, {diff / update:.3g} of eager's update"
    )


def test_static_cache_generate_with_compiled_decoding(qwen3, flagos_model, prompt_ids):
    """Hugging Face compiles ``generate``'s decoding step for a static cache on its own only on cuda-like
    devices; a ``CompileConfig`` that compiles on every device does it on flagos (docs/compile.md), and the
    token ids are eager's (or part from them only at a near tie of eager's logits, in low precision). Its
    default mode, reduce-overhead, replays flagos graphs (no Inductor skip), on either accelerator."""
    from torch._dynamo.utils import counters

    from torch_fl._compile import graph_replay

    ids = prompt_ids[:1].to("flagos")
    new_tokens = 8
    expected = harness.qwen3.greedy_generate(flagos_model, ids, new_tokens, cache_implementation="static")
    compile_config = transformers.CompileConfig()
    compile_config._compile_all_devices = True  # transformers' switch for devices it does not list
    skips, before = counters["inductor"]["cudagraph_skips"], graph_replay.stats()
    actual = harness.qwen3.greedy_generate(
        flagos_model, ids, new_tokens, cache_implementation="static", compile_config=compile_config
    )
    assert hasattr(flagos_model, "_compiled_call"), "generate did not compile the decoding step"
    replayed = graph_replay.stats()["replayed"] - before["replayed"]
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert replayed >= new_tokens - 3, f"{replayed} graph replays for {new_tokens} tokens"
    assert actual.sequences.device.type == "flagos"
    problem = harness.qwen3.greedy_divergence(
        expected.sequences, actual.sequences, expected.logits, ids.shape[1], qwen3.dtype
    )
    assert problem is None, problem
    if qwen3.dtype == torch.float32:
        assert torch.equal(actual.sequences.cpu(), expected.sequences.cpu())
