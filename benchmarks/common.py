"""What the benchmarks share: device synchronisation, paired rounds, medians and ratios, and the timing of
Qwen3's steps and first calls.

Paired rounds: a benchmark comparing flagos with a baseline measures each side once per round, the sides'
order rotating from round to round (two sides: AB, BA, AB, ...), so that a drift of the machine over the
run (other load, clocks, caches) falls on every side alike and each round gives a ratio of its own;
``paired_rounds`` runs them, ``median`` and ``Ratio`` summarise them. Every benchmark takes its medians
from here.

The Qwen3 timing functions run where the benchmark needs them: in its own process, or in a clean one
(``harness.processes.run_in_clean_process("benchmarks.common:time_train_steps", ...)``). Importing this
module does not import torch_fl, so that a reference process never does.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch

from harness.processes import Turns
from harness.qwen3 import compiled_train_step, copy_to, greedy_generate, train_step

T = TypeVar("T")


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def geomean(values: Iterable[float]) -> float:
    return statistics.geometric_mean(values)


def round_order(sides: Sequence[T], r: int) -> list[T]:
    """The order of round ``r`` (any integer, warm-up rounds may count from below 0): ``sides`` rotated by
    ``r``; for two sides, as given in even rounds and swapped in odd ones (none: none)."""
    k = r % len(sides) if sides else 0
    return [*sides[k:], *sides[:k]]


def paired_rounds(measures: dict[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """``repeats`` rounds of one call of each of ``measures`` (side -> its measurement), in
    ``round_order``: side -> its measurements, round by round."""
    results: dict[str, list[T]] = {name: [] for name in measures}
    for r in range(repeats):
        for name in round_order(list(measures), r):
            results[name].append(measures[name]())
    return results


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Round by round: each numerator over the denominator of its round."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


@dataclasses.dataclass(frozen=True)
class Ratio:
    """The median of ratios and their range: ``Ratio.of(ratios)``, the pairs' or rounds' (or the cases')."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Ratio:
        values = list(values)
        if not values:
            raise ValueError("no ratios to summarise")
        return cls(median(values), min(values), max(values), len(values))

    @property
    def range(self) -> tuple[float, float]:
        return self.low, self.high

    def text(self, digits: int = 2) -> str:
        """``1.06  (1.02-1.09 over 9)``: the median, then the range and how many ratios it spans."""
        return f"{self.median:.{digits}f}  ({self.low:.2f}-{self.high:.2f} over {self.count})"


def compiler_caches(empty_folder: str, shared: str | None = None) -> dict[str, str]:
    """Environment variables naming Inductor's and Triton's caches for a fresh process: empty ones under
    ``empty_folder`` (a first call then compiles everything, what the compile benchmarks measure), or the
    caches kept in ``shared`` (``--compiler-cache``: runs after the first reuse what it compiled, so first
    calls leave out what the folder holds; the tests of the benchmarks share one to save compile time)."""
    folder = shared if shared else empty_folder
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
    }


def add_compiler_cache_argument(parser) -> None:
    parser.add_argument(
        "--compiler-cache",
        metavar="DIR",
        help="keep Inductor's and Triton's caches in DIR, shared by every process and run, instead of empty "
        "ones (first calls then leave out what DIR holds)",
    )


def synchronize(device: str | torch.device) -> None:
    """Waits for the work queued on ``device``, or on the current device of its type where it names no index
    (``torch.flagos``, ``torch.cuda``, ``torch.cpu``: each device module's ``synchronize``)."""
    device = torch.device(device)
    getattr(torch, device.type).synchronize(None if device.index is None else device)


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


def profile_train_steps(master, device: str, ids: torch.Tensor, steps: int = 2, warmup: int = 2) -> dict:
    """Where an eager training step's time goes on ``device``, for a process of its own (on CUDA the reference's
    never imports torch_fl): ``warmup`` steps of a copy of ``master``, then ``steps`` steps timed phase by
    phase (forward with the loss, backward, the AdamW step; the device synchronised after each), then
    ``steps`` more under the profiler (host activity). Returns ``phases`` (phase -> seconds per step),
    ``events`` (profiler event -> [calls, self host us], over the profiled steps: aten ops, the autograd
    engine's nodes, the optimizer's step) and ``steps``."""
    from torch.profiler import ProfilerActivity, profile

    model = copy_to(master, device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = ids.to(device)
    for _ in range(warmup):
        train_step(model, optimizer, ids)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def timed(phase: str, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        value = fn()
        synchronize(device)
        phases[phase] += (time.perf_counter() - start) / steps
        return value

    synchronize(device)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        out = timed("forward", lambda: model(ids, labels=ids))
        timed("backward", out.loss.backward)
        timed("optimizer", optimizer.step)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            train_step(model, optimizer, ids)
        synchronize(device)
    events: dict[str, list[float]] = {}
    for event in prof.events():
        row = events.setdefault(event.name, [0, 0.0])
        row[0] += event.cpu_parent is None or event.cpu_parent.name != event.name
        row[1] += event.self_cpu_time_total
    return {"phases": phases, "events": events, "steps": steps}


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
