"""Qwen3 on flagos: what the demo (``examples/qwen3_demo.py``), the benchmarks and ``tests/models`` share.

Needs Hugging Face ``transformers`` (5.x), which torch_fl itself does not depend on.

- Shapes: ``tiny`` (CI: 2 layers, hidden 64) and ``0.6b`` (Qwen3-0.6B: 28 layers, hidden 1024, vocab
  151936), built from a ``Qwen3Config`` with random weights from a fixed seed; or a local Hugging Face
  directory (``--model PATH``).
- The reference device: ``cuda`` when flagos runs on CUDA, else ``cpu`` (the simulated accelerator's
  native device), and the dtype that fits it (bfloat16 on CUDA, float32 on CPU).
- Tolerances fit for the dtype, and the comparisons the entry points make with them.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import torch

# torch_fl itself is imported where it is needed, not here: the reference's training runs in a process
# that imports this module without ever importing torch_fl (harness.processes.run_in_clean_process).

SHAPES: dict[str, dict] = {
    # CI size: every tests/models run and the demo on the simulated accelerator take seconds on 2 cores.
    "tiny": dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        # Qwen3's 0.02 is small for hidden 64: the tied embeddings then decide alone and greedy decoding
        # just repeats the last prompt token. At 0.2 the layers matter and the text varies.
        initializer_range=0.2,
    ),
    # Qwen3-0.6B's architecture (its config.json), with random weights.
    "0.6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        initializer_range=0.02,
    ),
}
# Shared by both shapes, as in Qwen3-0.6B (tied input and output embeddings included). No bos/eos/pad
# token: greedy generation from random weights always runs for the number of tokens asked.
_COMMON = dict(
    hidden_act="silu",
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How close flagos must be to the reference for one dtype.

    Logits: elementwise ``|flagos - reference| <= atol * RMS + rtol * |reference|``, with RMS the reference
    logits' root mean square (logits grow with the hidden size, so a fixed absolute tolerance would mean
    different things for the two shapes), and a relative RMS error ||flagos - reference|| / ||reference||
    of at most ``rel_rms``, which catches a small systematic error that the elementwise bound lets pass.
    ``loss_rtol`` is for training losses; ``update_rtol`` bounds ||flagos update - reference update|| /
    ||reference update|| over all weights after a few AdamW steps (Adam turns the sign of a tiny gradient
    into a full step, so weights after low-precision training are compared as a whole, not elementwise);
    ``weight_atol`` (in units of the learning rate) is the elementwise bound where one is meaningful.
    """

    rtol: float
    atol: float
    rel_rms: float
    loss_rtol: float
    update_rtol: float
    weight_atol: float | None


# Measured on the simulated accelerator against the CPU (flagos runs SDPA as its math decomposition, the
# CPU its fused kernel; every other op is the same CPU kernel). float32: logits differ by ~5e-6 RMS at
# most, relative RMS error ~1e-6, at both shapes; the bounds are 10-20x that. bfloat16 at the 0.6B shape:
# up to 0.085 RMS elementwise and 1.45% relative RMS error (as much as bf16 against float32 itself: this
# random model amplifies rounding); the bounds are about 2.5x that, below what one wrong kernel does (a
# matmul 5% off, or about 1 RMS for a broken one). Training, 4 AdamW steps: float32 losses agree to 2e-7
# and updates to 1.2e-5 (tiny); bf16 losses to 0.3% and updates to 8.3% at the 0.6B shape (4.2% tiny,
# autocast); untied embeddings, a real bug, gave 36%.
TOLERANCES = {
    torch.float32: Tolerance(
        rtol=1e-4, atol=1e-4, rel_rms=1e-5, loss_rtol=1e-4, update_rtol=1e-3, weight_atol=0.05
    ),
    torch.bfloat16: Tolerance(
        rtol=5e-2, atol=2e-1, rel_rms=4e-2, loss_rtol=2e-2, update_rtol=0.2, weight_atol=None
    ),
    torch.float16: Tolerance(
        rtol=1e-2, atol=5e-2, rel_rms=1e-2, loss_rtol=5e-3, update_rtol=0.05, weight_atol=None
    ),
}


def reference_device() -> str:
    """The device flagos is compared with: ``cuda`` where flagos runs on CUDA, else ``cpu``."""
    import torch_fl

    if torch.cuda.is_available() and torch_fl.accelerator() == "cuda":
        return "cuda"
    return "cpu"


def default_dtype(reference: str) -> torch.dtype:
    """bfloat16 against CUDA (what the model is run in there), float32 against the CPU."""
    return torch.bfloat16 if reference == "cuda" else torch.float32


def default_shape(reference: str) -> str:
    return "0.6b" if reference == "cuda" else "tiny"


def parse_dtype(name: str, reference: str) -> torch.dtype:
    if name in ("", "auto"):
        return default_dtype(reference)
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (valid: auto, {', '.join(DTYPES)})") from None


def make_config(shape: str, layers: int | None = None):
    """The config of ``shape``; ``layers``: that many decoder layers instead of the shape's."""
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown Qwen3 shape {shape!r} (valid: {', '.join(SHAPES)})")
    if layers is not None and layers < 1:
        raise ValueError(f"a Qwen3 model needs at least 1 layer, got {layers}")
    return Qwen3Config(
        **{**SHAPES[shape], **({} if layers is None else {"num_hidden_layers": layers})}, **_COMMON
    )


def build_model(
    shape: str = "tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    model_path=None,
    layers: int | None = None,
):
    """A Qwen3 causal LM on the CPU in eval mode: random weights from ``seed`` (initialised in float32, so
    the same on every machine, then cast to ``dtype``), or the checkpoint at ``model_path``. ``layers``:
    that many decoder layers instead of the shape's (a shorter model that compiles faster)."""
    if model_path:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(os.fspath(model_path), dtype=dtype)
    else:
        from transformers import Qwen3ForCausalLM

        config = make_config(shape, layers)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
        cast(model, dtype)
    return model.eval()


def cast(model, dtype: torch.dtype | None):
    """``model.to(dtype)`` the way ``from_pretrained(..., dtype=dtype)`` leaves a model: the rotary
    embedding's frequencies (``inv_freq`` buffers) stay float32. Cast with the rest, they would make every
    position but the first compute other angles than a loaded checkpoint does (1% apart in bfloat16 logits)."""
    if dtype is None:
        return model
    kept = {name: buffer for name, buffer in model.named_buffers() if name.endswith("inv_freq")}
    model.to(dtype)
    for name, buffer in kept.items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        setattr(owner, attr, buffer.to(getattr(owner, attr).device))
    return model


def copy_to(model, device: str | torch.device, dtype: torch.dtype | None = None):
    """A deep copy of ``model`` on ``device`` (and ``dtype``). ``Module.to`` keeps parameter objects
    between CPU and flagos (flagos registers ``aten::_has_compatible_shallow_copy_type``), so tied
    parameters (Qwen3's embeddings) stay tied."""
    return cast(copy.deepcopy(model).to(device=device), dtype)


@dataclasses.dataclass
class LogitsComparison:
    ok: bool
    max_abs_diff: float
    atol: float
    rtol: float
    mismatched: int
    total: int
    rel_rms_error: float
    rel_rms_bound: float

    def __str__(self) -> str:
        problems = []
        if self.mismatched:
            problems.append(f"{self.mismatched} of {self.total} elements out of tolerance")
        if not self.rel_rms_error <= self.rel_rms_bound:
            problems.append("relative RMS error over its bound")
        verdict = "OK" if self.ok else f"MISMATCH ({'; '.join(problems) or 'shapes differ'})"
        return (
            f"max |diff| {self.max_abs_diff:.3g} (atol {self.atol:.3g}, rtol {self.rtol:.3g}), relative RMS "
            f"error {self.rel_rms_error:.3g} (bound {self.rel_rms_bound:.3g}): {verdict}"
        )


def compare_logits(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> LogitsComparison:
    """Logits against the reference's with the dtype's :class:`Tolerance` (elementwise and RMS)."""
    tol = TOLERANCES[dtype]
    a = actual.detach().float().cpu()
    e = expected.detach().float().cpu()
    if a.shape != e.shape:
        return LogitsComparison(False, float("nan"), 0.0, 0.0, 0, 0, float("nan"), tol.rel_rms)
    rms = max(e.pow(2).mean().sqrt().item(), 1e-6)
    diff = (a - e).abs()
    bad = ~(diff <= tol.atol * rms + tol.rtol * e.abs())  # NaN counts as a mismatch
    rel_rms_error = (diff.pow(2).mean().sqrt() / rms).item()
    return LogitsComparison(
        ok=not bool(bad.any()) and rel_rms_error <= tol.rel_rms,
        max_abs_diff=float(diff.max()) if diff.numel() else 0.0,
        atol=tol.atol * rms,
        rtol=tol.rtol,
        mismatched=int(bad.sum()),
        total=bad.numel(),
        rel_rms_error=rel_rms_error,
        rel_rms_bound=tol.rel_rms,
    )


def assert_logits_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = ""
) -> None:
    comparison = compare_logits(actual, expected, dtype)
    assert comparison.ok, f"{what + ': ' if what else ''}logits {comparison}"


def greedy_divergence(
    reference_tokens: torch.Tensor,
    tokens: torch.Tensor,
    reference_step_logits: list[torch.Tensor] | tuple[torch.Tensor, ...],
    prompt_length: int,
    dtype: torch.dtype,
) -> str | None:
    """None when ``tokens`` (greedy) is what the reference allows, else why not.

    Allowed: identical token ids; or ids that first differ at a step where the reference itself had a
    near tie, i.e. the token flagos chose has a reference logit within the dtype's tolerance of the
    reference's top logit (rounding may then break the tie either way, and the two continuations are
    different texts from there on). ``reference_step_logits[k]`` holds the reference's logits
    ``[batch, vocab]`` that chose new token ``k``.
    """
    ref = reference_tokens.cpu()
    out = tokens.cpu()
    if ref.shape != out.shape:
        return f"token ids have shape {tuple(out.shape)}, the reference's {tuple(ref.shape)}"
    if not torch.equal(ref[:, :prompt_length], out[:, :prompt_length]):
        return "the prompts differ"
    tol = TOLERANCES[dtype]
    for row in range(ref.shape[0]):
        differ = (ref[row, prompt_length:] != out[row, prompt_length:]).nonzero()
        if differ.numel() == 0:
            continue
        step = int(differ[0])
        logits = reference_step_logits[step][row].detach().float().cpu()
        rms = logits.pow(2).mean().sqrt().item()
        top = logits.max().item()
        chosen = logits[int(out[row, prompt_length + step])].item()
        window = tol.atol * rms + tol.rtol * abs(top)
        if top - chosen > window:
            return (
                f"row {row}: new token {step} is {int(out[row, prompt_length + step])}, the reference's "
                f"{int(ref[row, prompt_length + step])}; the reference's logit for it is {top - chosen:.3g} "
                f"below its top logit, beyond the tolerance {window:.3g} (not a near tie)"
            )
    return None


def greedy_generate(
    model, input_ids: torch.Tensor, new_tokens: int, *, fixed_length: bool = True, streamer=None, **generation
):
    """Greedy ``generate`` returning a ``GenerateDecoderOnlyOutput`` with ``sequences`` and per-step
    ``logits``. ``fixed_length`` generates exactly ``new_tokens`` (end-of-sequence tokens suppressed);
    ``generation`` adds ``GenerationConfig`` fields (``cache_implementation="static"``, ``compile_config``)."""
    from transformers import GenerationConfig

    eos = getattr(model.generation_config, "eos_token_id", None)
    pad = getattr(model.generation_config, "pad_token_id", None)
    if pad is None:
        pad = eos[0] if isinstance(eos, list) and eos else eos
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if fixed_length and eos is not None else None,
        eos_token_id=eos,
        pad_token_id=pad,
        output_logits=True,
        return_dict_in_generate=True,
        **generation,
    )
    with torch.no_grad():
        return model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, streamer=streamer
        )


def load_tokenizer(model_path):
    """The tokenizer saved with a local model directory, or None where there is none."""
    if not model_path:
        return None
    files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any(os.path.exists(os.path.join(model_path, name)) for name in files):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.fspath(model_path))
    except Exception:  # no tokenizer files, or none transformers can load without the network
        return None


def routing_counts() -> dict[str, int] | None:
    """``torch_fl.routing.counts()`` ({backend: op calls}) where this build has it, else None."""
    import torch_fl

    counts = getattr(torch_fl.routing, "counts", None)
    return dict(counts()) if counts is not None else None


def reset_routing_counts() -> None:
    import torch_fl

    reset = getattr(torch_fl.routing, "reset_counts", None)
    if reset is not None:
        reset()


def format_counts(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "n/a (this build has no torch_fl.routing.counts())"
    served = {backend: calls for backend, calls in counts.items() if calls}
    if not served:
        return "none"
    return ", ".join(f"{backend} {calls}" for backend, calls in sorted(served.items(), key=lambda kv: -kv[1]))


# ---- Training ---------------------------------------------------------------------------------------------


def train_step(model, optimizer, ids: torch.Tensor, *, autocast: bool = False):
    """One step of causal-LM loss on ``ids`` (labels = inputs): forward (under bf16 autocast if asked),
    backward, ``optimizer.step()``. Returns the model's output."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(ids, labels=ids)
    out.loss.backward()
    optimizer.step()
    return out


def compiled_train_step(model, optimizer, *, autocast: bool = False):
    """:func:`train_step` as one ``torch.compile``d function of ``ids``: the forward (and its backward,
    through AOTAutograd) and ``optimizer.step()`` compiled by Inductor; ``backward()`` itself breaks the graph
    and runs the compiled backward."""

    def step(ids: torch.Tensor):
        return train_step(model, optimizer, ids, autocast=autocast)

    return torch.compile(step)


def train(
    master,
    device: str,
    dtype: torch.dtype,
    ids: torch.Tensor,
    *,
    steps: int,
    lr: float,
    foreach: bool,
    autocast: bool = False,
    compile: bool = False,
) -> dict:
    """``steps`` AdamW steps of a copy of ``master`` on ``device`` in ``dtype`` (the whole step compiled
    with ``compile``, see compiled_train_step). Returns plain data (it crosses processes, see
    harness.processes.run_in_clean_process): ``losses``, final ``weights`` (float32, on the CPU),
    ``logits_dtype`` of the last step and ``state_devices``, the device types of the optimizer's state."""
    model = copy_to(master, device, dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=foreach)
    ids = ids.to(device)
    step = (
        compiled_train_step(model, optimizer, autocast=autocast)
        if compile
        else (lambda batch: train_step(model, optimizer, batch, autocast=autocast))
    )
    losses = []
    for _ in range(steps):
        out = step(ids)
        losses.append(out.loss.item())
    state_devices = sorted(
        {
            t.device.type
            for s in optimizer.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim()
        }
    )
    weights = {name: p.detach().float().cpu() for name, p in model.named_parameters()}
    return dict(losses=losses, weights=weights, logits_dtype=out.logits.dtype, state_devices=state_devices)
