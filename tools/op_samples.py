"""Where one op's host time goes, flagos against its native device, function by function: perf samples of a
loop of the op.

For each op named (benchmarks.op_overhead's cases: ``--set tiny``, ``qwen3``, ``foreach`` or ``generate``), one
worker process calls it in a loop on the native device (cuda when backed, the CPU on the simulated accelerator) and
on flagos, in alternating phases (``--rounds`` of each, which device goes first alternating too), with autograd
off as op_overhead runs them. perf samples the worker's CPU time (``cpu-clock``, all its threads, timestamps on
CLOCK_MONOTONIC) while it loops, and each sample counts for the phase it fell in. A function's share of a
device's samples times that device's time per call is its nanoseconds per call. Printed per op: the time per
call on each device under perf, the nanoseconds per call of each shared library, and the functions that
differ most between the devices (torch_fl's own functions all appear on flagos's side).

``--set model`` times whole Qwen3 steps instead (``--ops "decode step,prefill"``, make_model_steps): a model's
gap per op call has been larger than its ops' in op_overhead, and these say in which functions it goes.

Both devices run in one process, interleaved, because separate processes are not comparable here: on the
lent GPU machine the same loop's time per call differs by up to 1.7x between fresh processes, on cuda as
much as on flagos. perf's own interrupts slow both devices alike; op_overhead's figure, without perf, is
the one to quote for the time an op adds.

    python -m tools.op_samples --ops add,gelu [--rounds 4] [--phase 1.0] [--frequency 4999] [--top 30]
    python -m tools.op_samples --set model --ops "decode step,prefill" --phase 2

``--annotate N`` also writes perf's instruction-level listing of the N busiest torch_fl functions per op
into ``--out``, beside perf's samples and the printed tables (``summary.txt``). Needs `perf` (or ``--perf``
naming one: on the lent GPU machine the carried ``.perf/perf``, which this tool finds by itself) and an
unstripped build of torch_fl for its function names (``pip install --no-build-isolation -C
install.strip=false -e .``; a stripped one names only its exported functions). A function's figure is a sampling estimate: functions below about 2 ns a call are
noise.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# One sample of `perf script -F time,ip,sym,dso`: "  1234.567890:  7f6eb1608367 symbol (/path/libfoo.so)".
_SAMPLE = re.compile(r"^\s*(\d+\.\d+):\s+[0-9a-f]+\s+(.*)\s+\((.*)\)\s*$")


@dataclasses.dataclass
class Profile:
    """One device's phases of the loop: its time per call and where their samples fell."""

    ns_per_call: float
    samples: dict[tuple[str, str], int]  # (library, function) -> samples

    @functools.cached_property
    def total(self) -> int:
        return sum(self.samples.values())

    def ns(self, key: tuple[str, str]) -> float:
        """Nanoseconds per call spent in one function."""
        return self.samples.get(key, 0) / max(self.total, 1) * self.ns_per_call

    def by_library(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for key in self.samples:
            out[key[0]] += self.ns(key)
        return dict(out)


@dataclasses.dataclass
class Phase:
    """One stretch of the worker's loop on one device (CLOCK_MONOTONIC seconds)."""

    device: str
    start: float
    end: float
    calls: int


def parse_samples(text: str) -> list[tuple[float, str, str]]:
    """(time, library, function) of each sample in `perf script -F time,ip,sym,dso` output; the library is
    the file name of the sample's object, an unresolved function its address."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            time_s, function, dso = match.groups()
            samples.append((float(time_s), os.path.basename(dso), function.strip()))
    return samples


def profiles(samples: list[tuple[float, str, str]], phases: list[Phase]) -> dict[str, Profile]:
    """Each device's profile: the samples that fell in its phases, and its time per call over them."""
    phases = sorted(phases, key=lambda p: p.start)
    starts = [p.start for p in phases]
    counts: dict[str, dict[tuple[str, str], int]] = {p.device: defaultdict(int) for p in phases}
    for time_s, library, function in samples:
        i = bisect.bisect_right(starts, time_s) - 1
        if i >= 0 and time_s <= phases[i].end:
            counts[phases[i].device][(library, function)] += 1
    out = {}
    for device, rows in counts.items():
        mine = [p for p in phases if p.device == device]
        seconds, calls = sum(p.end - p.start for p in mine), sum(p.calls for p in mine)
        out[device] = Profile(ns_per_call=seconds / max(calls, 1) * 1e9, samples=dict(rows))
    return out


def shorten(function: str, width: int = 96) -> str:
    return function if len(function) <= width else function[: width - 3] + "..."


def comparison(native: str, ref: Profile, fl: Profile, top: int) -> str:
    """The table printed for one op: libraries, then the functions that differ most."""
    lines = [
        f"  per call: {native} {ref.ns_per_call:.0f} ns, flagos {fl.ns_per_call:.0f} ns, "
        f"difference {fl.ns_per_call - ref.ns_per_call:+.0f} ns, under perf "
        f"(samples: {ref.total} and {fl.total})",
        f"  {'library':40} {native + ' ns':>9} {'flagos ns':>10} {'diff':>7}",
    ]
    ref_libs, fl_libs = ref.by_library(), fl.by_library()
    libraries = sorted(
        set(ref_libs) | set(fl_libs),
        key=lambda lib: -abs(fl_libs.get(lib, 0.0) - ref_libs.get(lib, 0.0)),
    )
    for lib in libraries:
        r, f = ref_libs.get(lib, 0.0), fl_libs.get(lib, 0.0)
        if max(r, f) >= 1.0:
            lines.append(f"  {lib[:40]:40} {r:9.1f} {f:10.1f} {f - r:+7.1f}")
    keys = sorted(set(ref.samples) | set(fl.samples), key=lambda k: -abs(fl.ns(k) - ref.ns(k)))
    lines.append(f"  {'function (library)':96} {native + ' ns':>9} {'flagos ns':>10} {'diff':>7}")
    for key in keys[:top]:
        r, f = ref.ns(key), fl.ns(key)
        lines.append(f"  {shorten(f'{key[1]} ({key[0]})'):96} {r:9.1f} {f:10.1f} {f - r:+7.1f}")
    return "\n".join(lines)


def perf_command(explicit: str | None) -> list[str]:
    """The perf to run: --perf, else the carried .perf/perf with its libraries, else perf on the PATH."""
    if explicit:
        return shlex.split(explicit)
    carried = ROOT / ".perf" / "perf"
    if carried.exists():
        return ["env", f"LD_LIBRARY_PATH={ROOT / '.perf' / 'lib'}", str(carried)]
    found = shutil.which("perf")
    if found is None:
        raise SystemExit("error: no perf (install it: apt-get install linux-perf; or pass --perf)")
    return [found]


def run_op(
    perf: list[str],
    native: str,
    op: str,
    case_set: str,
    rounds: int,
    phase_s: float,
    frequency: int,
    out: Path,
    annotate: int = 0,
) -> dict[str, Profile]:
    """Runs one op's worker under perf; returns each device's profile."""
    # The worker imports the torch_fl this process imports (an A/B's build first on PYTHONPATH): the checkout
    # only after it, and not the working directory in front (PYTHONSAFEPATH).
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    env = dict(os.environ, PYTHONPATH=path, PYTHONSAFEPATH="1")
    command = [
        sys.executable,
        "-m",
        "tools.op_samples",
        "--worker",
        native,
        op,
        case_set,
        str(rounds),
        str(phase_s),
    ]
    worker = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    data = out / f"{op}.data"
    recorder = None
    try:
        if worker.stdout.readline().strip() != "ready":
            worker.wait(timeout=60)
            raise RuntimeError(f"the worker for {op} did not start (exit {worker.returncode})")
        recorder = subprocess.Popen(
            [*perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock", "-F", str(frequency)]
            + ["-p", str(worker.pid), "-o", str(data)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(100):  # perf writes its file's header once it is attached
            if data.exists() or recorder.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        if recorder.poll() is not None:
            raise RuntimeError(f"perf record failed: {recorder.stderr.read().strip()[-500:]}")
        # A worker that hangs (a wedged device) is stopped below once its phases are long overdue.
        printed, _ = worker.communicate("go\n", timeout=2 * rounds * phase_s * 3 + 120)
        if worker.returncode != 0:
            raise RuntimeError(f"the worker for {op} failed (exit {worker.returncode})")
        phases = [Phase(**p) for p in json.loads(printed.strip().splitlines()[-1])]
        recorder.wait(timeout=120)  # perf stops when the process it follows exits
    finally:
        for process in (worker, recorder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    script = subprocess.run(
        [*perf, "script", "-i", str(data), "-F", "time,ip,sym,dso"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    samples = parse_samples(script.stdout)
    if not samples:
        raise RuntimeError(f"perf recorded no samples of the worker for {op}: {script.stderr[-500:]}")
    result = profiles(samples, phases)
    flagos = result["flagos"].samples
    own = sorted((k for k in flagos if k[0].startswith("libtorch_fl")), key=lambda k: -flagos[k])
    for library, function in own[:annotate]:
        listing = subprocess.run(
            [*perf, "annotate", "-i", str(data), "--stdio", "--dsos", library, function],
            capture_output=True,
            text=True,
            timeout=300,
        )
        with open(out / f"{op}.annotate.txt", "a") as annotated:
            annotated.write(listing.stdout)
    data.unlink()
    return result


MODEL_STEPS = ("decode step", "prefill")
DECODE_CACHE = 40  # tokens in the decode step's cache
PREFILL_LENGTH = 128


def make_model_steps(devices: tuple[str, ...]) -> dict[str, dict]:
    """Per device, name -> a Qwen3 step, at the shape and dtype benchmarks.qwen3 runs against the first device
    (0.6B in bfloat16 against cuda, the tiny shape in float32 against the CPU), from one set of random
    weights: ``decode step``, one token's forward over a DECODE_CACHE-token cache, which is cropped back after
    each call so that every call does the same work, and ``prefill``, a 1 x PREFILL_LENGTH prompt's forward to
    the last position's logits (as generate runs them). Where a model's gap exceeds its ops' (op_overhead's
    cases), these say in which functions."""
    import torch
    from transformers import DynamicCache

    from harness import qwen3

    reference = devices[0]
    model = qwen3.build_model(qwen3.default_shape(reference), dtype=qwen3.default_dtype(reference))
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(vocab, (1, DECODE_CACHE), generator=g)
    token = torch.randint(vocab, (1, 1), generator=g)
    long_prompt = torch.randint(vocab, (1, PREFILL_LENGTH), generator=g)
    steps = {}
    for device in devices:
        on_device = qwen3.copy_to(model, device)
        cache = DynamicCache()
        with torch.no_grad():
            on_device(prompt.to(device), past_key_values=cache, use_cache=True)
        ids, long_ids = token.to(device), long_prompt.to(device)

        def decode(m=on_device, cache=cache, ids=ids):
            m(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(-1)  # back to DECODE_CACHE tokens

        def prefill(m=on_device, ids=long_ids):
            m(ids, logits_to_keep=1)

        steps[device] = {"decode step": decode, "prefill": prefill}
    return steps


def case_names(case_set: str) -> list[str]:
    """The names --ops takes with --set ``case_set`` (op_overhead's cases, made on the CPU to list them)."""
    if case_set == "model":
        return list(MODEL_STEPS)
    from benchmarks import op_overhead

    return list(op_overhead.MAKERS.get(case_set, op_overhead.make_cases)("cpu"))


def worker(native: str, op: str, case_set: str, rounds: int, phase_s: float) -> int:
    """Calls one op in a loop on both devices: warm-up, 'ready', then (after a line on stdin) `rounds` phases
    of `phase_s` seconds on each device, in batches of 500 calls (20 of a tensor-list op, 2 of a model step) with a synchronize
    after each, alternating which device goes first; prints the phases as JSON."""
    import torch

    from benchmarks import op_overhead
    from benchmarks.common import synchronize

    torch.set_num_threads(1)
    devices = (native, "flagos")
    if case_set == "model":
        fns = {d: steps[op] for d, steps in make_model_steps(devices).items()}
    elif case_set in op_overhead.MAKERS:  # cases of several operator calls: (callable, calls)
        fns = {d: op_overhead.MAKERS[case_set](d)[op][0] for d in devices}
    else:
        fns = {d: op_overhead.make_cases(d)[op] for d in devices}
    # Calls between synchronizes: a list op is hundreds of tensors' work, a model step an op's thousands.
    batch = {"foreach": 20, "model": 2}.get(case_set, 500)
    phases = []
    with torch.no_grad():
        for device, fn in fns.items():
            for _ in range(4 * batch):
                fn()
            synchronize(device)
        print("ready", flush=True)
        sys.stdin.readline()
        for r in range(rounds):
            for device in devices if r % 2 == 0 else devices[::-1]:
                fn, calls = fns[device], 0
                start = time.clock_gettime(time.CLOCK_MONOTONIC)
                while time.clock_gettime(time.CLOCK_MONOTONIC) - start < phase_s:
                    for _ in range(batch):
                        fn()
                    synchronize(device)
                    calls += batch
                end = time.clock_gettime(time.CLOCK_MONOTONIC)
                phases.append({"device": device, "start": start, "end": end, "calls": calls})
    print(json.dumps(phases), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        native, op, case_set, rounds, phase_s = argv[1:6]
        return worker(native, op, case_set, int(rounds), float(phase_s))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", default="add", help="comma-separated op_overhead cases (default: add)")
    parser.add_argument(
        "--set",
        choices=("tiny", "qwen3", "foreach", "generate", "model"),
        default="tiny",
        help="op_overhead's case set, or model: Qwen3 steps (--ops 'decode step,prefill')",
    )
    parser.add_argument("--rounds", type=int, default=4, help="phases on each device (default 4)")
    parser.add_argument("--phase", type=float, default=1.0, help="seconds a phase (default 1)")
    parser.add_argument("--frequency", type=int, default=4999, help="samples a second (default 4999)")
    parser.add_argument("--top", type=int, default=30, help="functions listed per op (default 30)")
    parser.add_argument(
        "--annotate", type=int, default=0, help="perf annotate the N busiest torch_fl functions into --out"
    )
    parser.add_argument("--perf", help="the perf command (default: .perf/perf if carried, else perf)")
    parser.add_argument("--out", type=Path, help="where perf's output goes (default: a temporary folder)")
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    known = case_names(args.set)
    unknown = [op for op in ops if op not in known]
    if unknown or not ops:
        named = ", ".join(map(repr, unknown)) or "op"
        parser.error(f"--ops: no {named} in --set {args.set} (its cases: {', '.join(known)})")

    perf = perf_command(args.perf)
    out = args.out or Path(tempfile.mkdtemp(prefix="op-samples."))
    out.mkdir(parents=True, exist_ok=True)
    import torch_fl

    native = torch_fl._C._backing_type() or "cpu"
    with open(out / "summary.txt", "w") as summary:

        def say(text: str) -> None:
            print(text, flush=True)
            summary.write(text + "\n")

        say(
            f"native device {native}; {args.rounds} phases of {args.phase:g} s a device at "
            f"{args.frequency} samples/s; output in {out}"
        )
        for op in ops:
            result = run_op(
                perf, native, op, args.set, args.rounds, args.phase, args.frequency, out, args.annotate
            )
            say(f"{op}:\n{comparison(native, result[native], result['flagos'], args.top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
