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
  ``_qwen3.backward_runs_here``), so against CUDA the reference's steps run in a fresh process on the same
  GPU, before flagos's, not interleaved with them.

``--compile``: the same three measurements under ``torch.compile`` (Inductor, default mode) on both devices:
prefill through the compiled model, decode through ``generate`` with a static cache and its decoding step
compiled (a ``CompileConfig`` in ``--decode-mode``, reduce-overhead by default, on both devices), and the
whole training step compiled (``_qwen3.compiled_train_step``); the reference's compiled training runs in
a process of its own as above. Compiled runs warm up twice. Also the first call of each, compilation
included, on each device in a fresh process with empty Inductor and Triton caches (in one process the
second device would find the first's kernels compiled: they are the same Triton or C++ source). Inductor
has one GPU type per process, and with torch_fl it is flagos (docs/compile.md): the reference's compiled
prefill and decode here run without Inductor's moving of CPU constructors to the GPU, which Qwen3's graphs
do not have.

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
where the inference overhead goes.

``--graphs``: greedy decode with a static KV cache (``torch_fl._static_decode``), batch 1, 16-token prompt,
``--new-tokens`` tokens, in tokens/s of the decode loop: the reference device eager and with its graph
(``torch.cuda.CUDAGraph`` on cuda), flagos eager and with ``torch.flagos.FlagosGraph`` for each config, and
Hugging Face's ``generate(cache_implementation="static")`` on the reference (compiled, CUDA graphs on cuda)
in a process that never imports torch_fl. The token ids of every graph run are checked against its eager
run. Ratios: flagos graph / reference graph, flagos graph / Hugging Face, flagos graph / reference eager.

    python benchmarks/qwen3.py [--shape tiny|0.6b | --model PATH] [--dtype auto] [--repeats 5]
                               [--configs native,my.conf] [--threads N] [--top-ops N] [--host-diff N]
                               [--compile [--decode-mode reduce-overhead|default|...]]
    python benchmarks/qwen3.py --graphs [--configs native,flaggems.conf] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

import torch

import torch_fl
from torch_fl import _qwen3

_DEFAULTS = {  # shape -> (prompt length, new tokens, batch, train length); 0.6b as in docs/design.md
    "tiny": (128, 32, 2, 128),
    "0.6b": (512, 32, 2, 512),
}


def _timed(fn, device: str) -> float:
    _qwen3.synchronize(device)
    start = time.perf_counter()
    fn()
    _qwen3.synchronize(device)
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
    """The three measurements for one device."""

    def __init__(
        self,
        master,
        spec: dict,
        device: str,
        sizes: tuple[int, int, int, int],
        vocab: int,
        decode_mode: str | None = None,
    ):
        prompt_length, self.new_tokens, batch, train_length = sizes
        self.device = device
        self.spec = spec  # how to build `master` again (_qwen3.build_model's arguments)
        # decode_mode None: eager; else torch.compile everywhere, generate's decoding step in this mode
        self.decode_mode = decode_mode
        self.model = _qwen3.copy_to(master, device)
        self.prefill_model = torch.compile(self.model) if decode_mode else self.model
        self.trains_here = _qwen3.backward_runs_here(device)
        if self.trains_here:
            self.train_model = _qwen3.copy_to(master, device).train()
            self.opt = torch.optim.AdamW(self.train_model.parameters(), lr=1e-5, foreach=True)
            self.train_step = (
                _qwen3.compiled_train_step(self.train_model, self.opt)
                if decode_mode
                else (lambda ids: _qwen3.train_step(self.train_model, self.opt, ids))
            )
        g = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, vocab, (1, prompt_length), generator=g).to(device)
        self.decode_prompt = torch.randint(0, vocab, (1, 16), generator=g).to(device)
        self.train_ids = torch.randint(0, vocab, (batch, train_length), generator=g)
        self.clock = _DecodeClock()
        self.decode_busy: list[float] = []

    def prefill(self) -> float:
        def run():
            with torch.no_grad():
                self.prefill_model(self.prompt, logits_to_keep=1)

        return _timed(run, self.device)

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
        _qwen3.synchronize(self.device)
        wall, cpu = time.perf_counter(), time.thread_time()
        _qwen3.greedy_generate(self.model, self.decode_prompt, self.new_tokens, streamer=clock, **generation)
        _qwen3.synchronize(self.device)
        self.decode_busy.append((time.thread_time() - cpu) / (time.perf_counter() - wall))
        return (len(clock.times) - 1) / (clock.times[-1] - clock.times[0])

    def train(self) -> float:
        ids = self.train_ids.to(self.device)
        return _timed(lambda: self.train_step(ids), self.device)

    def train_elsewhere(self, repeats: int) -> list[float]:
        """Step times from a fresh process without torch_fl (one warm-up step, two compiled, then
        ``repeats``), with empty compiler caches of its own when compiling."""
        compile = self.decode_mode is not None
        warmup = 2 if compile else 1  # as measure() warms up
        with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_caches_") as caches:
            env = _fresh_compiler_caches(caches) if compile else None
            times = _qwen3.run_in_clean_process(
                "time_train_steps",
                self.spec,
                env=env,
                device=self.device,
                ids=self.train_ids,
                repeats=repeats,
                compile=compile,
                warmup=warmup,
            )
        return times[warmup:]


def _fresh_compiler_caches(folder: str) -> dict[str, str]:
    """Environment variables giving Inductor and Triton empty caches under ``folder``."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(folder, "triton"),
    }


def measure(ref: Workload, fl: Workload, repeats: int) -> dict[str, tuple[float, float, list[float]]]:
    """name -> (median on the reference, median on flagos, flagos/reference ratio of each repeat's pair).

    One warm-up each (two compiled), then ``repeats`` pairs of runs, one on each device back to back, the
    order swapped from pair to pair, so that the machine's drift (host load, clocks) hits both devices alike
    and each pair gives a ratio of its own. A reference that cannot train in this process trains first, in a
    process of its own: no pairs then (an empty list)."""
    results = {}
    for workload in (ref, fl):
        workload.decode_busy.clear()  # this config's runs only
    for name in ("prefill", "decode", "train"):
        samples: dict[str, list[float]] = {"ref": [], "fl": []}
        workloads = [("ref", ref), ("fl", fl)]
        paired = True
        if name == "train" and not ref.trains_here:
            samples["ref"] = ref.train_elsewhere(repeats)
            workloads = [("fl", fl)]
            paired = False
        # Negative repeats warm up; compiled, twice: a second generate recompiles its decoding step once more
        # (the static cache's new tensors).
        warmups = 2 if fl.decode_mode else 1
        for repeat in range(-warmups, repeats):
            for key, workload in workloads if repeat % 2 else workloads[::-1]:
                value = getattr(workload, name)()
                if repeat >= 0:
                    samples[key].append(value)
        pairs = [f / r for r, f in zip(samples["ref"], samples["fl"], strict=True)] if paired else []
        results[name] = (statistics.median(samples["ref"]), statistics.median(samples["fl"]), pairs)
        print(f"  .. {name}: done", flush=True)
    _qwen3.let_autograd_threads_finish()
    return results


def _paired(pairs: list[float]) -> str:
    """The median of the pairs' ratios and their range, or why there are none."""
    if not pairs:
        return "-  (reference in another process: no pairs)"
    return f"{statistics.median(pairs):.2f}  ({min(pairs):.2f}-{max(pairs):.2f} over {len(pairs)})"


def _explain(name: str) -> str | None:
    try:
        return torch_fl.routing.explain(name)
    except (torch_fl.routing.RoutingError, RuntimeError):
        return None


def _backend_of(name: str) -> str | None:
    """The backend word of ``torch_fl.routing.explain(name)``; where ``name`` runs a composite kernel
    calling a routed op ('probably aten::mm.out'), that op's; ``flagos`` for ops with a kernel of their own."""
    text = _explain(name)
    piece = text and re.search(r"\(probably (\S+)\)", text)
    text = (piece and _explain(piece.group(1))) or text
    if not text:
        return None
    if "a kernel of its own" in text:
        return "flagos"
    return text.partition(" -> ")[2].split(" ", 1)[0] or None


def _backend(op: str) -> str:
    """Which flagos backend serves ``op`` (a profiler name, no overload) under the current config: for a
    name without a default overload (aten::add), its functional overloads' backends, '/'-joined where they
    differ; '?' where explain cannot say."""
    backend = _backend_of(op)
    if backend is None:
        try:
            overloads = getattr(torch.ops.aten, op.removeprefix("aten::")).overloads()
        except (AttributeError, RuntimeError):
            overloads = []
        backends = {_backend_of(f"{op}.{overload}") for overload in overloads if not overload.endswith("out")}
        backend = "/".join(sorted(backends - {None}))
    return backend or "?"


def _self_device_us(event) -> float:
    """The kernel time attributed to a profiler event (``self_cuda_time_total`` before torch 2.4)."""
    value = getattr(event, "self_device_time_total", None)
    return event.self_cuda_time_total if value is None else value


def top_ops(fl: Workload, n: int) -> None:
    """Profiles one prefill, decode and training step on flagos and prints the ``n`` aten ops with the
    most self device time. The profiler names events without their overload, so a call nested in one of
    the same name (flagos's composite aten::mm calling aten::mm.out) is counted once."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch_fl.accelerator() == "cuda" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        fl.prefill()
        fl.decode()
        fl.train()
    _qwen3.let_autograd_threads_finish()
    ops: dict[str, list[float]] = {}  # name -> [calls, self device us, self CPU us]
    for event in prof.events():
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        row = ops.setdefault(event.name, [0, 0.0, 0.0])
        row[0] += event.cpu_parent is None or event.cpu_parent.name != event.name
        row[1] += _self_device_us(event) if on_cuda else event.self_cpu_time_total
        row[2] += event.self_cpu_time_total
    total = sum(row[1] for row in ops.values()) or 1.0
    top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:n]
    device = "CUDA kernels" if on_cuda else f"self CPU, flagos on '{torch_fl.accelerator()}'"
    print(
        f"  top {len(top)} aten ops on flagos, one prefill, decode and train step profiled "
        f"(device time: {device}; {total / 1e3:.2f} ms in all aten ops)"
    )
    width = max(len(name) for name, _ in top) if top else 0
    print(f"    {'op':{width}}{'calls':>8}{'device ms':>12}{'share':>8}{'host ms':>12}   backend")
    for name, (calls, device_us, cpu_us) in top:
        print(
            f"    {name:{width}}{calls:8d}{device_us / 1e3:12.2f}{device_us / total:8.1%}"
            f"{cpu_us / 1e3:12.2f}   {_backend(name)}"
        )


def _host_us_by_op(work: Workload) -> tuple[dict[str, list[float]], float]:
    """One prefill and one decode under the profiler (host activity only): aten op name -> [calls, self
    host us], and the wall time of the two in us (the profiler's own cost included)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work.prefill()
        work.decode()
    wall = (time.perf_counter() - start) * 1e6
    ops: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        row = ops.setdefault(event.name, [0, 0.0])
        row[0] += event.cpu_parent is None or event.cpu_parent.name != event.name
        row[1] += event.self_cpu_time_total
    return ops, wall


def host_diff(ref: Workload, fl: Workload, n: int) -> None:
    """Where flagos's inference host time goes beyond the reference's: one prefill and one decode profiled
    on each device, aten ops by the difference of their self host time (calls, host ms on both)."""
    ref_ops, ref_wall = _host_us_by_op(ref)
    fl_ops, fl_wall = _host_us_by_op(fl)
    names = set(ref_ops) | set(fl_ops)
    rows = []
    for name in names:
        rc, rt = ref_ops.get(name, [0, 0.0])
        fc, ft = fl_ops.get(name, [0, 0.0])
        rows.append((ft - rt, name, int(rc), int(fc), rt, ft))
    rows.sort(reverse=True)
    ref_total = sum(r[4] for r in rows)
    fl_total = sum(r[5] for r in rows)
    print(
        f"  host time of one prefill and one decode, profiled: wall {ref_wall / 1e3:.1f} ms on {ref.device}, "
        f"{fl_wall / 1e3:.1f} ms on flagos; self host time in aten ops {ref_total / 1e3:.1f} ms and "
        f"{fl_total / 1e3:.1f} ms"
    )
    top = rows[:n]
    width = max((len(r[1]) for r in top), default=2)
    print(f"    {'op':{width}}{'calls':>8}{'calls fl':>10}{'host ms':>10}{'host ms fl':>12}{'diff ms':>10}")
    for diff, name, rc, fc, rt, ft in top:
        print(f"    {name:{width}}{rc:8d}{fc:10d}{rt / 1e3:10.2f}{ft / 1e3:12.2f}{diff / 1e3:10.2f}")


def first_calls(spec: dict, reference: str, sizes, vocab: int, decode_mode: str) -> dict[str, dict]:
    """device -> seconds of its first compiled prefill, decode and training step (compilation included),
    each device in a fresh process with empty Inductor and Triton caches: in one process the second device
    would find the first's kernels (the same Triton or C++ source) compiled already. The reference's process
    never imports torch_fl (its training step's backward needs that on CUDA)."""
    prompt_length, new_tokens, batch, train_length = sizes
    g = torch.Generator().manual_seed(1)
    inputs = dict(
        prompt=torch.randint(0, vocab, (1, prompt_length), generator=g),
        decode_prompt=torch.randint(0, vocab, (1, 16), generator=g),
        new_tokens=new_tokens,
        train_ids=torch.randint(0, vocab, (batch, train_length), generator=g),
        decode_mode=decode_mode,
    )
    results = {}
    for device in ("flagos", reference):
        with tempfile.TemporaryDirectory(prefix="torch_fl_qwen3_caches_") as caches:
            results[device] = _qwen3.run_in_clean_process(
                "time_first_calls",
                spec,
                env=_fresh_compiler_caches(caches),
                with_torch_fl=device == "flagos",
                device=device,
                **inputs,
            )
    return results


def _use_config(config: str, native_file: str) -> str:
    """Resets routing and loads ``config``; returns how to name it."""
    torch_fl.routing.reset(all=True)
    if config == "native":
        torch_fl.routing.load_config(native_file)
        return "native (no config rules)"
    torch_fl.routing.load_config(config)
    return os.path.abspath(config)


def _decode_tokens_per_s(model, ids, new_tokens: int, graphs: bool, repeats: int):
    from torch_fl._static_decode import StaticGreedyDecoder

    decoder = StaticGreedyDecoder(model, graphs=graphs)
    speeds, tokens = [], None
    for _ in range(repeats + 1):  # the first run warms up
        tokens = decoder.generate(ids, new_tokens).cpu()
        speeds.append((new_tokens - 1) / decoder.decode_seconds)
    return statistics.median(speeds[1:]), tokens


def graphs_main(master, spec, reference: str, configs: list[str], new_tokens: int, repeats: int) -> int:
    ids = torch.randint(0, master.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    rows, failures = {}, []
    ref_model = _qwen3.copy_to(master, reference)
    rows[f"{reference} eager"], ref_tokens = _decode_tokens_per_s(
        ref_model, ids.to(reference), new_tokens, False, repeats
    )
    if reference != "cpu":
        rows[f"{reference} graph"], tokens = _decode_tokens_per_s(
            ref_model, ids.to(reference), new_tokens, True, repeats
        )
        if not torch.equal(tokens, ref_tokens):
            failures.append(f"{reference} graph tokens differ from {reference} eager")
    del ref_model
    fl_model = _qwen3.copy_to(master, "flagos")
    with tempfile.TemporaryDirectory() as tmp:
        native_file = os.path.join(tmp, "native.conf")
        with open(native_file, "w") as f:
            f.write("# no rules\n")
        for config in configs:
            _use_config(config, native_file)
            name = "native" if config == "native" else os.path.basename(config)
            eager, eager_tokens = _decode_tokens_per_s(fl_model, ids.to("flagos"), new_tokens, False, repeats)
            rows[f"flagos eager ({name})"] = eager
            try:
                speed, tokens = _decode_tokens_per_s(fl_model, ids.to("flagos"), new_tokens, True, repeats)
            except Exception as e:  # reported, not hidden: a config whose ops cannot be captured
                failures.append(f"flagos graph ({name}): {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            rows[f"flagos graph ({name})"] = speed
            if not torch.equal(tokens, eager_tokens):
                failures.append(f"flagos graph ({name}) tokens differ from flagos eager ({name})")
    del fl_model
    try:
        per_token = _qwen3.run_in_clean_process(
            "hf_static_decode_seconds",
            spec,
            device=reference,
            prompt=16,
            tokens=(new_tokens // 2, new_tokens),
            repeats=repeats,
        )
        rows[f"Hugging Face static cache ({reference}, clean process)"] = 1.0 / statistics.median(per_token)
    except Exception as e:  # noqa: BLE001 - reported below
        failures.append(f"Hugging Face static-cache anchor: {e}")

    print(f"\ndecode tokens/s, batch 1, 16-token prompt, {new_tokens} new tokens (median of {repeats})")
    for name, value in rows.items():
        print(f"  {name:<58} {value:10.1f}")
    native = rows.get("flagos graph (native)")
    anchors = [
        (f"{reference} graph", "flagos graph (native) / reference graph"),
        (
            f"Hugging Face static cache ({reference}, clean process)",
            "flagos graph (native) / Hugging Face static",
        ),
        (f"{reference} eager", "flagos graph (native) / reference eager"),
    ]
    if native:
        for key, label in anchors:
            if key in rows:
                print(f"  {label:<58} {native / rows[key]:10.2f}")
    for name, value in rows.items():
        if name.startswith("flagos graph (") and name != "flagos graph (native)":
            print(f"  {name + ' / reference eager':<58} {value / rows[f'{reference} eager']:10.2f}")
    for failure in failures:
        print(f"  FAILED: {failure}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", metavar="PATH", help="a local Hugging Face causal-LM directory")
    parser.add_argument("--shape", choices=list(_qwen3.SHAPES), help="default: 0.6b on a GPU, tiny otherwise")
    parser.add_argument("--dtype", default="auto", choices=["auto", *_qwen3.DTYPES])
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
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.top_ops < 0 or args.host_diff < 0:
        parser.error("--top-ops and --host-diff must be 0 (off) or more")
    if args.new_tokens is not None and args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)

    reference = _qwen3.reference_device()
    dtype = _qwen3.parse_dtype(args.dtype, reference)
    shape = args.shape or _qwen3.default_shape(reference)
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
    master = _qwen3.build_model(**spec)
    c = master.config
    print(
        f"model: {args.model or f'Qwen3 {shape} shape, random weights'}, {str(dtype).replace('torch.', '')}, "
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}; prefill 1x{sizes[0]}, "
        f"decode {sizes[1]} tokens, train {sizes[2]}x{sizes[3]}"
    )
    if args.graphs:
        return graphs_main(master, spec, reference, configs, args.new_tokens or 64, args.repeats)
    decode_mode = args.decode_mode if args.compile else None
    if args.compile:
        print(f"torch.compile: Inductor, default mode; decoding step in mode {decode_mode!r}, static cache")
        compile_times = first_calls(spec, reference, sizes, c.vocab_size, decode_mode)
    ref = Workload(master, spec, reference, sizes, c.vocab_size, decode_mode)
    fl = Workload(master, spec, "flagos", sizes, c.vocab_size, decode_mode)
    del master

    with tempfile.TemporaryDirectory() as tmp:
        native_file = os.path.join(tmp, "native.conf")
        with open(native_file, "w") as f:
            f.write("# no rules: the default chain (native where the native device has a kernel, else cpu)\n")
        for config in configs:
            name = _use_config(config, native_file)
            print(f"\nconfig {name}")
            _qwen3.reset_routing_counts()
            results = measure(ref, fl, args.repeats)
            counts = _qwen3.routing_counts()
            (p_ref, p_fl, p_pairs), (d_ref, d_fl, d_pairs), (t_ref, t_fl, t_pairs) = (
                results[k] for k in ("prefill", "decode", "train")
            )
            rows = [
                (f"prefill 1x{sizes[0]} (ms)", p_ref * 1e3, p_fl * 1e3, f"time {p_fl / p_ref:.2f}", p_pairs),
                ("decode (tokens/s)", d_ref, d_fl, f"speed {d_fl / d_ref:.2f}", d_pairs),
                (
                    f"train step {sizes[2]}x{sizes[3]} (ms)",
                    t_ref * 1e3,
                    t_fl * 1e3,
                    f"time {t_fl / t_ref:.2f}",
                    t_pairs,
                ),
            ]
            print(f"  {'':26}{reference:>12}{'flagos':>12}   flagos/{reference}   paired: median (range)")
            for label, on_ref, on_fl, ratio, pairs in rows:
                print(f"  {label:26}{on_ref:12.2f}{on_fl:12.2f}   {ratio:<14}{_paired(pairs)}")
            busy = [statistics.median(w.decode_busy[1:] or w.decode_busy) for w in (ref, fl)]  # no warm-up
            print(f"  {'decode: thread on CPU':26}{busy[0]:12.0%}{busy[1]:12.0%}   (near 100%: host-bound)")
            if args.compile:  # measured once, before the configs, in processes of their own
                for name in ("prefill", "decode", "train"):
                    r, f = compile_times[reference][name], compile_times["flagos"][name]
                    print(f"  {'first ' + name + ' call (s)':26}{r:12.2f}{f:12.2f}   time {f / r:.2f}")
            print(f"  op calls on flagos by backend: {_qwen3.format_counts(counts)}")
            if args.top_ops:
                top_ops(fl, args.top_ops)
            if args.host_diff:
                host_diff(ref, fl, args.host_diff)
    torch_fl.routing.reset(all=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
