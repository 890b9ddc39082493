"""Qwen3 on flagos: what the demo, ``benchmarks/qwen3.py`` and ``tests/models`` share.

Needs Hugging Face ``transformers`` (5.x), which torch_fl itself does not depend on: this module is only
imported by those entry points, never by ``import torch_fl``.

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
import statistics
import subprocess
import sys
import tempfile
import time

import torch

# torch_fl itself is imported where it is needed, not here: the reference's training runs in a process
# that loads this file without ever importing torch_fl (see run_in_clean_process).

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


def synchronize(device: str | torch.device) -> None:
    kind = torch.device(device).type
    if kind == "flagos":
        torch.flagos.synchronize()
    elif kind == "cuda":
        torch.cuda.synchronize()


def let_autograd_threads_finish() -> None:
    """Lets torch's autograd device threads drop their last graph task before the interpreter exits.

    On torch 2.13 a backward pass on a non-CPU device leaves the device's autograd thread holding a
    Python object (the graph task's saved ``contextvars`` context) that it releases once it next gets
    the GIL; if the process exits first, that thread is killed inside a C++ destructor and the process
    aborts ("terminate called without an active exception", exit code 134). Entry points that end soon
    after a backward call this; sleeping releases the GIL for it."""
    time.sleep(0.05)


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


# ---- Training, and the CUDA reference's training in a process of its own -------------------------------


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
    run_in_clean_process): ``losses``, final ``weights`` (float32, on the CPU), ``logits_dtype`` of the last
    step and ``state_devices``, the device types of the optimizer's state."""
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


def time_train_steps(
    master,
    device: str,
    ids: torch.Tensor,
    repeats: int,
    compile: bool = False,
    warmup: int = 1,
    turns: dict | None = None,
) -> list[float]:
    """Seconds of each training step (forward, backward, foreach AdamW) of a copy of ``master`` on
    ``device`` (the whole step compiled with ``compile``, see compiled_train_step): ``warmup`` steps first
    (the compilation in the first), then ``repeats`` more; the warm-up steps' times included, first. With
    ``turns`` (Turns' arguments), the timed steps take turns with another process's (at least ``repeats``).
    """
    model = copy_to(master, device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = ids.to(device)
    step = compiled_train_step(model, optimizer) if compile else (lambda b: train_step(model, optimizer, b))

    def timed_step() -> float:
        synchronize(device)
        start = time.perf_counter()
        step(ids)
        synchronize(device)
        return time.perf_counter() - start

    times = [timed_step() for _ in range(warmup)]
    if turns is not None:
        return times + Turns(**turns).take(timed_step, repeats)
    return times + [timed_step() for _ in range(repeats)]


class Turns:
    """The timed steps of two processes run at the same time (benchmarks/qwen3.py and
    benchmarks/distributed.py with --side-by-side), taken in turns: once both finished their warm-up
    (compilation, the first steps), blocks of ``block`` steps alternate between them in the order ABBA
    (0 1 1 0 0 1 ...), so that only one process runs at a time, on the same GPU and CPUs, and the machine's
    drift hits both alike. They hand over through files in ``folder``: ``ready-<me>``, ``done-<turn>``;
    ``abort`` (written by the parent when the other failed) ends the wait. A launch of several ranks is one
    side: each of its ranks waits, and only the one with ``marks`` writes its side's files."""

    BLOCK = 5

    def __init__(
        self, folder: str, me: int, block: int = BLOCK, timeout_s: float = 3600.0, marks: bool = True
    ):
        self.folder, self.me, self.block, self.timeout_s, self.marks = folder, me, block, timeout_s, marks

    @staticmethod
    def owner(turn: int) -> int:
        return turn % 2 if (turn // 2) % 2 == 0 else 1 - turn % 2

    @staticmethod
    def block_pairs(ref: list[float], fl: list[float], block: int = BLOCK) -> list[float]:
        """Ratios of two sides' block medians, block by block: the i-th blocks of the two sides ran one
        right after the other."""
        n = min(len(ref), len(fl)) // block
        return [
            statistics.median(fl[i * block : (i + 1) * block])
            / statistics.median(ref[i * block : (i + 1) * block])
            for i in range(n)
        ]

    def _mark(self, name: str) -> None:
        if self.marks:
            open(os.path.join(self.folder, name), "w").close()

    def _wait(self, name: str) -> None:
        path, abort = os.path.join(self.folder, name), os.path.join(self.folder, "abort")
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(path):
            if os.path.exists(abort) or time.monotonic() > deadline:
                raise RuntimeError(f"taking turns: the other side never got to {name!r}")
            time.sleep(0.002)

    def take(self, timed_step, repeats: int) -> list:
        """``timed_step()``'s results for at least ``repeats`` steps (whole blocks), in this side's turns."""
        self._mark(f"ready-{self.me}")
        self._wait(f"ready-{1 - self.me}")
        results = []
        blocks = -(-repeats // self.block)
        for turn in range(2 * blocks):
            if self.owner(turn) != self.me:
                continue
            if turn > 0 and self.owner(turn - 1) != self.me:
                self._wait(f"done-{turn - 1}")
            results += [timed_step() for _ in range(self.block)]
            self._mark(f"done-{turn}")
        return results


def time_first_calls(
    master,
    device: str,
    parts: list[str],
    prompt: torch.Tensor,
    decode_prompt: torch.Tensor,
    new_tokens: int,
    decode_mode,
) -> dict[str, float]:
    """Seconds of the first compiled call of each of ``parts``, in this order, on ``device``, compilation
    included: ``prefill`` (``torch.compile(model)``) and ``decode`` (static-cache ``generate`` with its
    decoding step compiled in ``decode_mode``); a compiled training step's first call is time_train_steps'
    first time. For a process of its own with empty compiler caches (benchmarks/qwen3.py): a tiny compile
    first takes the process's one-time costs."""
    from transformers import CompileConfig

    torch.compile(lambda t: (t * 2).sum())(torch.ones(8, device=device))
    synchronize(device)
    model = copy_to(master, device)
    compiled = torch.compile(model)
    config = CompileConfig(mode=decode_mode)
    config._compile_all_devices = True
    calls = {
        "prefill": lambda: compiled(prompt.to(device), logits_to_keep=1),
        "decode": lambda: greedy_generate(
            model, decode_prompt.to(device), new_tokens, cache_implementation="static", compile_config=config
        ),
    }
    times = {}
    for part in parts:
        synchronize(device)
        start = time.perf_counter()
        with torch.no_grad():
            calls[part]()
        synchronize(device)
        times[part] = time.perf_counter() - start
    return times


def backward_runs_here(device: str) -> bool:
    """Whether a backward pass on ``device`` can run in this process.

    Not on ``cuda`` once torch_fl is imported: registering flagos as PyTorch's PrivateUse1 backend makes it
    torch's one accelerator (``torch.accelerator.current_accelerator()``), and torch's autograd engine
    then finds no stream for autograd nodes on CUDA tensors and fails every CUDA backward with an internal
    assert (``opt_ready_stream && opt_parent_stream``, engine.cpp; pytorch/pytorch#161129, a fix declined
    upstream). Backward on flagos tensors is unaffected. So the CUDA reference trains in a process of its
    own (run_in_clean_process)."""
    if torch.device(device).type != "cuda":
        return True
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is None or accelerator.type == "cuda"


_CLEAN_PROCESS_MAIN = """
import importlib.util, sys
if sys.argv[4] == "1":
    import torch_fl
spec = importlib.util.spec_from_file_location("_qwen3_clean_process", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
module._serve_clean_process(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
"""


def hf_static_decode_seconds(
    model, device: str, prompt: int, tokens: tuple[int, int], repeats: int, compile_all_devices: bool = False
) -> list[float]:
    """Seconds per decoded token of Hugging Face's ``generate(cache_implementation="static")`` (which
    compiles the forward and replays CUDA graphs on cuda): the difference between generating
    ``tokens[1]`` and ``tokens[0]`` new tokens, so prefill and set-up cancel. Run it in a clean process.
    ``compile_all_devices``: generate's default compile config, told to compile on any device (transformers
    compiles on cuda-like devices only), as docs/compile.md shows for flagos."""
    generation = {}
    if compile_all_devices:
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True
        generation["compile_config"] = config
    model = copy_to(model, device)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)

    def run(n: int) -> float:
        synchronize(device)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                cache_implementation="static",
                **generation,
            )
        synchronize(device)
        return time.perf_counter() - start

    for n in tokens:  # compilation and warm-up for both lengths
        run(n)
    return [(run(tokens[1]) - run(tokens[0])) / (tokens[1] - tokens[0]) for _ in range(repeats)]


def run_in_clean_process(
    function: str,
    master: dict,
    env: dict | None = None,
    with_torch_fl: bool = False,
    timeout: float | None = None,
    **kwargs,
):
    """``function(build_model(**master), **kwargs)`` (a function of this module) run in a fresh Python
    process that never imports torch_fl, so that CUDA backward works there (see backward_runs_here); with
    ``with_torch_fl``, a fresh process that does (for flagos runs that must start cold).

    Arguments and the result cross as ``torch.save`` files (plain data and tensors only), in /dev/shm
    where there is one. ``env`` adds environment variables for the child. The child's output goes to this
    process's stderr; a failure raises RuntimeError with the child's exit code, and so does a child still
    running after ``timeout`` seconds (it is killed)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_", dir=shm) as tmp:
        request, result = os.path.join(tmp, "request.pt"), os.path.join(tmp, "result.pt")
        torch.save({"function": function, "master": master, "kwargs": kwargs}, request)
        command = [sys.executable, "-c", _CLEAN_PROCESS_MAIN, os.path.abspath(__file__), request, result]
        with subprocess.Popen(
            [*command, "1" if with_torch_fl else "0"], stdout=sys.stderr, env={**os.environ, **(env or {})}
        ) as proc:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"{function} in a clean process did not finish within {timeout} s"
                ) from None
            except BaseException:
                proc.kill()
                raise
        if proc.returncode != 0:
            raise RuntimeError(f"{function} in a clean process failed with exit code {proc.returncode}")
        return torch.load(result, weights_only=False)


def _serve_clean_process(request_path: str, result_path: str, with_torch_fl: bool = False) -> None:
    request = torch.load(request_path, weights_only=False)
    master = build_model(**request["master"])
    result = globals()[request["function"]](master, **request["kwargs"])
    assert with_torch_fl or "torch_fl" not in sys.modules, "the clean process imported torch_fl"
    torch.save(result, result_path)
    let_autograd_threads_finish()
