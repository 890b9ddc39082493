"""Qwen3 on flagos against the reference device, in the same process: prefill latency, greedy decode
tokens/s and one training step, for each routing config.

The reference is the device flagos runs on underneath (the CPU on the simulated accelerator, CUDA on
NVIDIA). Each measurement runs ``--repeats`` pairs after one warm-up run each: a reference run and a
flagos run back to back, the order swapped from pair to pair. It reports the medians on each device and
their flagos/reference ratio (times: lower is better for flagos; speeds: higher is better), and beside it
the median and range of the pairs' own ratios. Host-bound runs (batch 1 on a GPU) wander by 10% and more
from minute to minute on a shared machine; a pair's two runs are seconds apart, so the paired figure and
its range say how far one run's ratio can be trusted.

- prefill: one forward pass over a ``1 x --prompt-length`` prompt (last position's logits, as generate does);
- decode: greedy ``generate`` of ``--new-tokens`` tokens after a 16-token prompt; tokens/s counts the
  tokens after the first, timed from the first new token to the last (prefill excluded);
- train: forward, backward and an AdamW step (foreach) on ``--batch x --train-length`` tokens, in the
  model's dtype. A CUDA backward cannot run in a process that imported torch_fl (a torch limitation, see
  ``harness.processes.backward_runs_here``), so against CUDA the reference's steps run in a fresh process on
  the same GPU, before flagos's, not interleaved with them.

``--compile``: the same three measurements under ``torch.compile`` (Inductor, default mode) on both devices:
prefill through the compiled model, decode through ``generate`` with a static cache and its decoding step
compiled (a ``CompileConfig`` in ``--decode-mode``, reduce-overhead by default, on both devices), and the
whole training step compiled (``harness.qwen3.compiled_train_step``). Compiled runs warm up twice. Also
the first call of each, compilation included, with empty Inductor and Triton caches on each device: this process
starts with empty caches and flagos runs first; the reference's first prefill and decode run in a fresh
process of their own before (in this one it would find flagos's kernels compiled: the same Triton or C++
source), in the same order; compiled training runs in a fresh process per device (the reference's never
imports torch_fl), whose first step is its first call, and which times at least 20 steps (no pairs there
but with ``--side-by-side``). ``--compiler-cache DIR`` keeps those caches in DIR instead, shared by every
process and run, so first calls leave out what DIR holds (the benchmark's tests share one folder).
First calls are reported for the first config only.
Inductor has one GPU type per process, and with torch_fl it is flagos (docs/compile.md): the reference's
compiled prefill and decode here run without Inductor's moving of CPU constructors to the GPU, which
Qwen3's graphs do not have.

``--parts`` measures some of prefill, decode and train only (all by default): at the 0.6b shape a compiled
run of all three does not fit a 10-minute GPU call (compiling the training step takes minutes per device).
``--train-results DIR`` keeps each training run made in a fresh process (the reference's on CUDA; both
compiled) in DIR, keyed by its settings, and a later run with the same settings takes it from there: a
run cut short after the reference's training goes on with flagos's. The report says which were taken.
``--side-by-side`` runs the two training processes (eager: both devices' steps in processes of their own;
compiled) at the same time instead of one after the other, on the same GPU and CPUs, and once both have
warmed up (compiled), their timed steps take turns
in blocks of 5 (flagos, the reference, the reference, flagos, ...: ``harness.processes.Turns``), so that
only one runs at a time and each block of one device has a block of the other beside it: the pairs of block medians give
a paired ratio. An eager or compiled training step at the 0.6b shape waits on the host, and its time wanders (33-64
ms a step on an H200) within minutes on both devices; run one after the other, or at the same time on two
GPUs, the two devices meet different host states (the GPU and CPUs a process runs on matter more than the
device). With ``--train-results``, saved runs are taken only where both devices'
are there (a side-by-side pair is run again together).

``--configs`` lists routing configs, run in turn with routing reset in between: ``native`` (no config
rules: every op on the native route where the native device has a kernel) or paths of config files
(``torch_fl.routing.load_config``; see docs/routing.md).

``--top-ops N`` (0, off, by default): after each config's measurements, one prefill, one decode and one
training step on flagos run under ``torch.profiler``, and the N aten ops with the most self device time
are listed: calls, self device time (the kernels attributed to the op where flagos runs on CUDA, else
self CPU time: the simulated accelerator's kernels are host code) and its share of all aten ops', self
CPU (host) time, and the backend ``torch_fl.routing.explain`` names for the op under the config.

``--host-diff N`` (0, off, by default): one prefill and one decode profiled (host activity) on each device,
and the N aten ops whose self host time on flagos exceeds the reference's most, with their calls on both:
where the inference overhead goes. With ``train`` in ``--parts``, also an eager training step on each device
in a fresh process of its own (``benchmarks.common.profile_train_steps``): its phases (forward, backward,
optimizer) timed, then the N profiler events (aten ops, autograd nodes, the optimizer) whose self host time
on flagos exceeds the reference's most.

``--graphs``: static-cache greedy decode, eager and replayed as graphs, on both devices and against Hugging
Face's static-cache ``generate`` (benchmarks/qwen3_graphs.py says what runs and what is compared).

``--json [FILE]`` records each ratio printed (benchmarks/records.py): ``<part>_time_ratio`` or
``<part>_speed_ratio`` with the pairs' range, ``compiled_`` in front under ``--compile`` (first calls:
``compiled_first_<part>_time_ratio``), a non-default size in the id (``prefill_1x4096_time_ratio``), and the
config (``flaggems_`` for flaggems_cuda.conf), a shape not the device's default or ``--model`` (``model_``)
first; ``--graphs`` and ``--host-diff`` record theirs.

    python -m benchmarks.qwen3 [--shape tiny|0.6b | --model PATH] [--dtype auto] [--repeats 5]
                               [--configs native,my.conf] [--threads N] [--top-ops N] [--host-diff N]
                               [--compile [--decode-mode reduce-overhead|default|...]]
                               [--parts prefill,decode,train] [--train-results DIR] [--side-by-side]
                               [--json [FILE]]
    python -m benchmarks.qwen3 --graphs [--configs native,flaggems.conf] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time

import torch

import torch_fl
from benchmarks import common, records
from benchmarks.common import Ratio, median
from benchmarks.qwen3_records import config_tag, record, shape_tag
from harness import processes, qwen3

_PARTS = ("prefill", "decode", "train")
_DEFAULTS = {  # shape -> (prompt length, new tokens, batch, train length); 0.6b as in docs/design.md
    "tiny": (128, 32, 2, 128),
    "0.6b": (512, 32, 2, 512),
}


def _timed(fn, device: str) -> float:
    common.synchronize(device)
    start = time.perf_counter()
    fn()
    common.synchronize(device)
    return time.perf_counter() - start


class _DecodeClock:
    """A transformers streamer recording when each new token arrives (generate synchronises per token)."""

    def __init__(self):
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self):
                self.times: list[float] = []
                self.first = True

            def put(self, value):
                if self.first:  # the prompt
                    self.first = False
                    return
                self.times.append(time.perf_counter())

            def end(self):
                pass

        self.cls = Clock

    def new(self):
        return self.cls()


class Workload:
    """The measurements of ``parts`` (prefill, decode, train) for one device. Each call records its wall
    time, compilation included on a first compiled call, in ``last_seconds``."""

    def __init__(
        self,
        master,
        spec: dict,
        device: str,
        sizes: tuple[int, int, int, int],
        vocab: int,
        parts: list[str],
        decode_mode: str | None = None,
        train_elsewhere: bool = False,
    ):
        prompt_length, self.new_tokens, batch, train_length = sizes
        self.device = device
        self.spec = spec  # how to build `master` again (qwen3.build_model's arguments)
        # decode_mode None: eager; else torch.compile everywhere, generate's decoding step in this mode
        self.decode_mode = decode_mode
        if "prefill" in parts or "decode" in parts:
            self.model = qwen3.copy_to(master, device)
            self.prefill_model = torch.compile(self.model) if decode_mode else self.model
        # A compiled training step runs in a fresh process on both devices (train_elsewhere), so that its
        # first call compiles with empty caches on each; an eager one here, where a backward can run, but
        # side by side (``train_elsewhere``: both in processes of their own, their steps in turns).
        self.trains_here = (
            "train" in parts
            and not decode_mode
            and not train_elsewhere
            and processes.backward_runs_here(device)
        )
        if self.trains_here:
            self.train_model = qwen3.copy_to(master, device).train()
            self.opt = torch.optim.AdamW(self.train_model.parameters(), lr=1e-5, foreach=True)
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, vocab, (1, prompt_length), generator=g).to(device)
        self.decode_prompt = torch.randint(0, vocab, (1, 16), generator=g).to(device)
        self.train_ids = torch.randint(0, vocab, (batch, train_length), generator=g)
        self.clock = _DecodeClock()
        self.decode_busy: list[float] = []
        self.last_seconds = 0.0

    def prefill(self) -> float:
        def run():
            with torch.no_grad():
                self.prefill_model(self.prompt, logits_to_keep=1)

        self.last_seconds = _timed(run, self.device)
        return self.last_seconds

    def decode(self) -> float:
        """tokens/s of greedy decoding, the first new token (prefill) excluded. Also records in
        ``decode_busy`` the share of the run's wall time this thread spent on the CPU: near 1, decoding is
        host-bound (the GPU waits for the host, which pays every op's host cost in full)."""
        clock = self.clock.new()
        generation = {}
        if self.decode_mode:
            from transformers import CompileConfig

            compile_config = CompileConfig(mode=self.decode_mode)
            compile_config._compile_all_devices = True  # transformers compiles on cuda-like devices only
            generation = dict(cache_implementation="static", compile_config=compile_config)
        common.synchronize(self.device)
        wall, cpu = time.perf_counter(), time.thread_time()
        qwen3.greedy_generate(self.model, self.decode_prompt, self.new_tokens, streamer=clock, **generation)
        common.synchronize(self.device)
        self.last_seconds = time.perf_counter() - wall
        self.decode_busy.append((time.thread_time() - cpu) / self.last_seconds)
        return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0])

    def train(self) -> float:
        ids = self.train_ids.to(self.device)
        self.last_seconds = _timed(lambda: qwen3.train_step(self.train_model, self.opt, ids), self.device)
        return self.last_seconds

    def saved_key(self, repeats: int, config_file: str, side_by_side: bool) -> dict:
        """The settings a saved training run is kept under (``--train-results``)."""
        return dict(
            device=self.device,
            spec={k: str(v) for k, v in self.spec.items()},
            ids=list(self.train_ids.shape),
            repeats=max(repeats, _STEPS_ELSEWHERE),
            compile=self.decode_mode is not None,
            config=open(config_file).read(),
            torch=torch.__version__,
            side_by_side=side_by_side,
        )

    def saved_path(self, key: dict, saved: str) -> str:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return os.path.join(saved, f"train-{self.device}-{digest}.json")

    def in_fresh_process(self, function: str, config_file: str, env: dict | None = None, **kwargs):
        """``function`` (``"module:function"``) of this device's model and training ids in a fresh process:
        one that never imports torch_fl for the reference, one that does with the routing config
        ``config_file`` for flagos; ``env`` adds to its environment."""
        env = dict(env or {})
        if self.device == "flagos":
            env["FLAGOS_BACKEND_CONFIG"] = config_file
        return processes.run_in_clean_process(
            function,
            self.spec,
            env=env,
            with_torch_fl=self.device == "flagos",
            device=self.device,
            ids=self.train_ids,
            **kwargs,
        )

    def train_elsewhere(
        self,
        repeats: int,
        config_file: str,
        saved: str | None,
        turns: dict | None = None,
        reuse: bool = True,
    ) -> tuple[float, list[float]]:
        """Training steps in a fresh process, one that never imports torch_fl for the reference, one that
        does with the routing config ``config_file`` for flagos; compiled, with empty compiler caches of its
        own. One warm-up step (two compiled), then ``repeats`` (at least _STEPS_ELSEWHERE): returns the first
        step's seconds (compilation included) and the timed steps'. With ``saved`` (a folder), a result of
        the same settings saved there by an earlier run is taken instead (where ``reuse``), and a new one is
        saved. ``turns``: the arguments of ``processes.Turns`` for a side-by-side run."""
        compile = self.decode_mode is not None
        warmup = 2 if compile else 1  # as measure() warms up
        repeats = max(repeats, _STEPS_ELSEWHERE)
        key = self.saved_key(repeats, config_file, turns is not None)
        path = self.saved_path(key, saved) if saved else None
        if path and reuse and os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            print(f"  .. train on {self.device}: taken from {path} (run {record['when']})", flush=True)
            return record["first"], record["times"]
        with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_caches_") as caches:
            times = self.in_fresh_process(
                "benchmarks.common:time_train_steps",
                config_file,
                _fresh_compiler_caches(caches) if compile else {},
                repeats=repeats,
                compile=compile,
                warmup=warmup,
                turns=turns,
            )
        print(f"  .. train on {self.device}: first step {times[0]:.1f} s", flush=True)
        if path:
            os.makedirs(saved, exist_ok=True)
            with open(path, "w") as f:
                json.dump(dict(key, first=times[0], times=times[warmup:], when=time.strftime("%F %T")), f)
        return times[0], times[warmup:]


# Timed steps of a training run in a process of its own, at the least. Its first step costs far more (at the
# 0.6b shape, compiling takes minutes; the process starts in 10-30 s), and runs in separate processes give no
# pairs: only many steps of each make the medians steady (on the H200, 3 steps of each spread 37-48 ms for
# cuda, 54-64 ms for flagos).
_STEPS_ELSEWHERE = 20


# --compiler-cache: the folder every fresh process keeps its compiler caches in, or None for empty caches.
_COMPILER_CACHE: str | None = None


def _fresh_compiler_caches(folder: str) -> dict[str, str]:
    """Environment variables giving Inductor and Triton empty caches under ``folder`` (or --compiler-cache's)."""
    return common.compiler_caches(folder, _COMPILER_CACHE)


@dataclasses.dataclass
class Result:
    ref: float  # median on the reference
    fl: float  # median on flagos
    pairs: list[float]  # flagos/reference of each pair (side by side: of block medians); empty: no pairs
    first: dict[str, float]  # device -> seconds of its first call (compiled runs; compilation included)


def train_side_by_side(elsewhere, repeats: int, config_file: str, saved: str | None):
    """The training runs of ``elsewhere`` ((key, workload) pairs, both devices) in two processes at the same
    time, their timed steps in turns (``processes.Turns``): each device's first step and timed steps by key.
    A run that fails stops the other's waiting."""
    keys = [key for key, _ in elsewhere]
    # Both saved or both run: a run kept from before would leave the other running alone.
    reuse = bool(saved) and all(
        os.path.exists(w.saved_path(w.saved_key(repeats, config_file, True), saved)) for _, w in elsewhere
    )
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_turns_", dir=shm) as folder:

        def run(me: int, workload):
            try:
                return workload.train_elsewhere(
                    repeats, config_file, saved, dict(folder=folder, me=me), reuse
                )
            except BaseException:
                open(os.path.join(folder, "abort"), "w").close()
                raise

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(run, me, w) for me, (_, w) in enumerate(elsewhere)]
            results = [r.result() for r in runs]
    first = {w.device: result[0] for (_, w), result in zip(elsewhere, results, strict=True)}
    return first, dict(zip(keys, (result[1] for result in results), strict=True))


def measure(
    ref: Workload,
    fl: Workload,
    repeats: int,
    parts: list[str],
    config_file: str,
    saved: str | None,
    side_by_side: bool = False,
) -> dict[str, Result]:
    """One warm-up each (two compiled), then ``repeats`` pairs of runs, one on each device back to back, the
    order swapped from pair to pair, so that the machine's drift (host load, clocks) hits both devices alike
    and each pair gives a ratio of its own. Flagos runs first, so its first compiled call is a cold one.
    Training that cannot run here (the reference on CUDA; compiled, both devices) runs in fresh processes,
    the reference's first: no pairs then; with ``side_by_side`` both devices' training runs in fresh
    processes at the same time and their timed steps take turns (:func:`train_side_by_side`), which pairs their blocks."""
    results = {}
    for workload in (ref, fl):
        workload.decode_busy.clear()  # this config's runs only
    warmups = 2 if fl.decode_mode else 1  # a second generate recompiles its decoding step (new cache tensors)
    for name in parts:
        samples: dict[str, list[float]] = {"ref": [], "fl": []}
        first: dict[str, float] = {}
        workloads = [("ref", ref), ("fl", fl)]
        if name == "train":
            elsewhere = [(key, w) for key, w in workloads if not w.trains_here]
            if side_by_side:
                firsts, timed = train_side_by_side(elsewhere, repeats, config_file, saved)
                first.update(firsts)
                samples.update(timed)
            else:
                for key, workload in elsewhere:
                    first[workload.device], samples[key] = workload.train_elsewhere(
                        repeats, config_file, saved
                    )
            workloads = [(key, w) for key, w in workloads if w.trains_here]
        for repeat in range(-warmups, repeats):  # paired rounds, flagos first in the first
            for key, workload in common.round_order(workloads[::-1], repeat):
                value = getattr(workload, name)()
                if repeat >= 0:
                    samples[key].append(value)
                elif repeat == -warmups and fl.decode_mode:
                    first[workload.device] = workload.last_seconds
        if len(workloads) == 2:
            pairs = [f / r for r, f in zip(samples["ref"], samples["fl"], strict=True)]
        elif side_by_side and name == "train":
            pairs = processes.Turns.block_pairs(samples["ref"], samples["fl"])
        else:
            pairs = []
        results[name] = Result(median(samples["ref"]), median(samples["fl"]), pairs, first)
        print(f"  .. {name}: done", flush=True)
    processes.let_autograd_threads_finish()
    return results


def _paired(pairs: list[float]) -> str:
    """The median of the pairs' ratios and their range, or why there are none."""
    return Ratio.of(pairs).text() if pairs else "-  (run in processes of their own: no pairs)"


def reference_first_calls(spec: dict, reference: str, sizes, vocab: int, decode_mode: str, parts) -> dict:
    """part -> seconds of the reference's first compiled prefill and decode (compilation included), in a
    fresh process with empty Inductor and Triton caches that never imports torch_fl: in this process it
    would find flagos's kernels (the same Triton or C++ source) compiled already. The same inputs and order
    as this process's flagos runs, whose first calls compile with empty caches too (main)."""
    g = torch.Generator().manual_seed(0)  # as Workload draws them
    prompt = torch.randint(0, vocab, (1, sizes[0]), generator=g)
    decode_prompt = torch.randint(0, vocab, (1, 16), generator=g)
    with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_caches_") as caches:
        return processes.run_in_clean_process(
            "benchmarks.common:time_first_calls",
            spec,
            env=_fresh_compiler_caches(caches),
            device=reference,
            parts=parts,
            prompt=prompt,
            decode_prompt=decode_prompt,
            new_tokens=sizes[1],
            decode_mode=decode_mode,
        )


def _use_config(config: str, native_file: str) -> str:
    """Resets routing and loads ``config``; returns how to name it."""
    torch_fl.routing.reset(all=True)
    if config == "native":
        torch_fl.routing.load_config(native_file)
        return "native (no config rules)"
    torch_fl.routing.load_config(config)
    return os.path.abspath(config)


def print_replay_counts(rec, tag: str) -> None:
    """How the run's flaggems calls ran: replayed from recorded launches, recorded, or in Python (and why)."""
    import torch_fl

    counts = torch_fl.routing.replay_counts()
    calls = counts["replayed"] + counts["recorded"] + counts["python"]
    share = counts["replayed"] / calls if calls else 0.0
    print(
        f"  flaggems calls: {counts['replayed']} replayed ({share:.1%}), {counts['recorded']} recorded, "
        f"{counts['python']} in Python"
    )
    for why, n in sorted(counts["refused"].items(), key=lambda kv: -kv[1])[:12]:
        print(f"    in Python {n}x: {why}")
    in_python = sorted(((c["python"], op) for op, c in counts["ops"].items() if c["python"]), reverse=True)
    print("    ops in Python: " + ", ".join(f"{op} {n}" for n, op in in_python[:16]))
    rec.add(f"{tag}replayed_share", share, "share", detail="flaggems calls replayed over the run")


def report(results: dict[str, Result], sizes, reference: str, ref_first: dict | None) -> None:
    """The table of one config's results; with ``ref_first`` (compiled, the first config), first calls."""
    labels = {
        "prefill": (f"prefill 1x{sizes[0]} (ms)", 1e3, "time"),
        "decode": ("decode (tokens/s)", 1.0, "speed"),
        "train": (f"train step {sizes[2]}x{sizes[3]} (ms)", 1e3, "time"),
    }
    print(f"  {'':26}{reference:>12}{'flagos':>12}   flagos/{reference}   paired: median (range)")
    for part, result in results.items():
        label, scale, kind = labels[part]
        ratio = f"{kind} {result.fl / result.ref:.2f}"
        print(
            f"  {label:26}{result.ref * scale:12.2f}{result.fl * scale:12.2f}   {ratio:<14}"
            + _paired(result.pairs)
        )
    if ref_first is None:
        return
    for part, result in results.items():
        first = {**result.first, **({reference: ref_first[part]} if part in ref_first else {})}
        r, f = first[reference], first["flagos"]
        print(f"  {'first ' + part + ' call (s)':26}{r:12.2f}{f:12.2f}   time {f / r:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", metavar="PATH", help="a local Hugging Face causal-LM directory")
    parser.add_argument("--shape", choices=list(qwen3.SHAPES), help="default: 0.6b on a GPU, tiny otherwise")
    parser.add_argument("--dtype", default="auto", choices=["auto", *qwen3.DTYPES])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--configs", default="native", help="comma-separated: native and/or config files")
    parser.add_argument("--prompt-length", type=int, help="prefill prompt length (tiny 128, 0.6b 512)")
    parser.add_argument("--new-tokens", type=int, help="decoded tokens (32)")
    parser.add_argument("--batch", type=int, help="training batch (2)")
    parser.add_argument("--train-length", type=int, help="training sequence length (tiny 128, 0.6b 512)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--top-ops", type=int, default=0, metavar="N", help="profile flagos, list the N costliest aten ops"
    )
    parser.add_argument("--compile", action="store_true", help="measure under torch.compile on both devices")
    parser.add_argument(
        "--decode-mode",
        default="reduce-overhead",
        help="with --compile: the torch.compile mode of generate's decoding step (static cache)",
    )
    parser.add_argument(
        "--host-diff",
        type=int,
        default=0,
        metavar="N",
        help="profile inference on both devices, list the N ops whose host time flagos exceeds most",
    )
    parser.add_argument(
        "--graphs", action="store_true", help="static-cache decode: eager, graphs, Hugging Face"
    )
    parser.add_argument(
        "--parts",
        default=",".join(_PARTS),
        help="comma-separated, of prefill, decode, train: what to measure (all by default)",
    )
    parser.add_argument(
        "--train-results",
        metavar="DIR",
        help="keep each training run made in a fresh process in DIR, and take one of the same settings "
        "from there instead of running it again (a run cut short goes on where it stopped)",
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="the two training processes (eager or compiled) at the same time on the same GPU and CPUs, their "
        "timed steps in turns of 5 (paired blocks)",
    )
    common.add_compiler_cache_argument(parser)
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    global _COMPILER_CACHE
    _COMPILER_CACHE = args.compiler_cache
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(_PARTS))
    if unknown or not parts:
        parser.error(f"--parts: {', '.join(unknown) or 'nothing'} given; choose from {', '.join(_PARTS)}")
    parts = [p for p in _PARTS if p in parts]  # in their fixed order, once each
    if args.host_diff and not ({"prefill", "decode"} <= set(parts) or "train" in parts):
        parser.error("--host-diff profiles prefill and decode, and train: --parts must include both or train")
    if args.host_diff and args.compile:
        parser.error("--host-diff profiles eager runs: leave out --compile")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.side_by_side and "train" not in parts:
        parser.error("--side-by-side runs the training processes together: --parts must include train")
    if args.top_ops < 0 or args.host_diff < 0:
        parser.error("--top-ops and --host-diff must be 0 (off) or more")
    if args.new_tokens is not None and args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)

    reference = qwen3.reference_device()
    dtype = qwen3.parse_dtype(args.dtype, reference)
    shape = args.shape or qwen3.default_shape(reference)
    defaults = _DEFAULTS["tiny" if args.model is None and shape == "tiny" else "0.6b"]
    sizes = tuple(
        given if given is not None else default
        for given, default in zip(
            (args.prompt_length, args.new_tokens, args.batch, args.train_length), defaults, strict=True
        )
    )
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for config in configs:
        if config != "native" and not os.path.isfile(config):
            parser.error(f"--configs: {config!r} is neither 'native' nor a file")

    print(
        f"torch {torch.__version__}, torch_fl {torch_fl.__version__} on '{torch_fl.accelerator()}', "
        f"reference {reference}, {torch.get_num_threads()} CPU threads, repeats {args.repeats}"
    )
    spec = dict(shape=shape, seed=0, dtype=dtype, model_path=args.model)
    master = qwen3.build_model(**spec)
    c = master.config
    print(
        f"model: {args.model or f'Qwen3 {shape} shape, random weights'}, {str(dtype).replace('torch.', '')}, "
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}; prefill 1x{sizes[0]}, "
        f"decode {sizes[1]} tokens, train {sizes[2]}x{sizes[3]}"
    )
    model = os.path.basename(args.model.rstrip("/")) if args.model else f"Qwen3 {shape}"
    model += f" ({str(dtype).replace('torch.', '')})"
    shape_id = shape_tag(args.model, shape, reference)
    if args.graphs:
        from benchmarks.qwen3_graphs import graphs_main

        new_tokens = args.new_tokens or 64
        return graphs_main(
            master, spec, reference, configs, new_tokens, args.repeats, _use_config, rec, shape_id
        )
    decode_mode = args.decode_mode if args.compile else None
    with contextlib.ExitStack() as cleanup:
        tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_"))
        ref_first = {}
        if args.compile:
            print(
                f"torch.compile: Inductor, default mode; decoding step in mode {decode_mode!r}, static cache"
            )
            # This process compiles flagos's first calls with empty caches too, before anything else.
            os.environ.update(_fresh_compiler_caches(tmp))
            inference = [p for p in parts if p != "train"]
            if inference:
                ref_first = reference_first_calls(
                    spec, reference, sizes, c.vocab_size, decode_mode, inference
                )
            torch.compile(lambda t: (t * 2).sum())(torch.ones(8, device="flagos"))  # one-time costs, as there
        ref = Workload(master, spec, reference, sizes, c.vocab_size, parts, decode_mode, args.side_by_side)
        fl = Workload(master, spec, "flagos", sizes, c.vocab_size, parts, decode_mode, args.side_by_side)
        del master
        native_file = os.path.join(tmp, "native.conf")
        with open(native_file, "w") as f:
            f.write("# no rules: the default chain (native where the native device has a kernel, else cpu)\n")
        for index, config in enumerate(configs):
            name = _use_config(config, native_file)
            print(f"\nconfig {name}")
            qwen3.reset_routing_counts()
            config_file = native_file if config == "native" else config
            results = measure(
                ref, fl, args.repeats, parts, config_file, args.train_results, args.side_by_side
            )
            counts = qwen3.routing_counts()
            first_calls = ref_first if args.compile and index == 0 else None
            tag = config_tag(config) + shape_id
            report(results, sizes, reference, first_calls)
            record(rec, results, tag, model, sizes, defaults, first_calls, reference)
            if "decode" in parts:
                busy = [median(w.decode_busy[1:] or w.decode_busy) for w in (ref, fl)]  # no warm-up
                print(
                    f"  {'decode: thread on CPU':26}{busy[0]:12.0%}{busy[1]:12.0%}   (near 100%: host-bound)"
                )
            print(f"  op calls on flagos by backend: {qwen3.format_counts(counts)}")
            if counts and counts.get("flaggems"):
                print_replay_counts(rec, tag)
            if args.top_ops or args.host_diff:
                from benchmarks import qwen3_profile

                if args.top_ops:
                    qwen3_profile.top_ops(
                        fl, args.top_ops, [p for p in parts if p != "train" or fl.trains_here]
                    )
                if args.host_diff and {"prefill", "decode"} <= set(parts):
                    qwen3_profile.host_diff(ref, fl, args.host_diff, rec, tag, model)
                if args.host_diff and "train" in parts:
                    qwen3_profile.train_host_diff(ref, fl, args.host_diff, rec, tag, model, config_file)
    torch_fl.routing.reset(all=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
