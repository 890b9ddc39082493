"""PyTorch's OpInfo database as the judge of the flagos device.

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` and every requested dtype the op
supports on the reference device, the first ``--max-samples`` sample inputs are generated on the reference
device, the op runs on them (the reference) and on a copy of each sample moved to ``flagos``, and the results
are compared after moving the flagos outputs back (``torch.testing.assert_close`` with its dtype defaults,
``equal_nan=True``; exact for integer and bool). When the reference raises, flagos must raise the same
exception type.

Each (op, dtype) gets one status:

- ``pass``: every sample gave an equal result (or the same exception type as the reference);
- ``mismatch``: a sample ran on flagos but its result differs (values, dtype, shape, an output left off
  flagos, or flagos did not raise where the reference did);
- ``error``: a sample raised on flagos where the reference ran;
- ``skip-random``: the op is random or returns uninitialized memory, so values cannot be compared;
- ``skip-samples``: the OpInfo produced no sample (or its sample generator raised) on the reference device.

Usage (from the repository root)::

    python -m harness.opinfo --dtypes float32,float64,bfloat16,int64,bool --out results.json
    python -m harness.opinfo --ops add,mm --dtypes float32 -v

``--write-passing FILE`` writes the passing ``op dtype`` pairs, the list that ``tests/ops/test_opinfo.py``
checks (``tests/ops/passing_ops_sim.txt``). torch_fl, the device under test, is imported where a tensor
first moves to it (``to_device``), not with this module.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_map

DEFAULT_MAX_SAMPLES = 3
# --exact: bitwise comparison (rtol = atol = 0), for a device under test that runs the reference's own
# kernels on the same memory layout (flagos backed by CUDA against cuda).
COMPARE = {"exact": False}
DEFAULT_SAMPLE_TIMEOUT_S = 60
DEFAULT_DTYPES = ("float32", "float64", "bfloat16", "int64", "bool")

# Ops whose values cannot be compared between two devices: random ops (different generators) and ops that
# return uninitialized memory.
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "cauchy",
        "empty",
        "empty_like",
        "empty_permuted",
        "empty_strided",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "new_empty",
        "new_empty_strided",
        "nn.functional.alpha_dropout",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout",
        "nn.functional.rrelu",
        "normal",
        "pca_lowrank",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "svd_lowrank",
        "uniform",
    }
)

STATUSES = ("pass", "mismatch", "error", "skip-random", "skip-samples")


def op_key(op) -> str:
    """The harness's name of an OpInfo: ``name`` or ``name.variant``."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def is_random(op) -> bool:
    return op.name in RANDOM_OPS


def load_op_db():
    """``op_db`` keyed by :func:`op_key` (the first OpInfo wins on a duplicate key)."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops: dict[str, object] = {}
    for op in op_db:
        ops.setdefault(op_key(op), op)
    return ops


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.strip(), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_device(tree, device: str):
    """A copy of `tree` with every tensor moved to `device`; non-tensors kept as they are. A strided tensor
    is moved with its whole storage and comes back as the same view of it (sizes, strides and storage
    offset kept), so that ops that address the storage (as_strided over a partial view) see what they see
    on the reference device."""
    import torch_fl  # noqa: F401  (registers the flagos device)

    def move(x):
        if isinstance(x, torch.Tensor):
            with torch.no_grad():
                return _move_tensor(x.detach(), device)
        return x

    return tree_map(move, tree)


def _move_tensor(x: torch.Tensor, device: str) -> torch.Tensor:
    if x.layout != torch.strided or x.is_nested or x.numel() == 0:
        return x.to(device, copy=True)
    storage_numel = x.untyped_storage().nbytes() // x.element_size()
    extent = x.storage_offset() + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True)) + 1
    if any(st < 0 for st in x.stride()) or extent > storage_numel:
        return x.to(device, copy=True)
    whole = x.as_strided((storage_numel,), (1,), 0).to(device, copy=True)
    return whole.as_strided(x.shape, x.stride(), x.storage_offset())


def to_cpu(tree):
    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise SampleTimeout after `seconds` (main thread on POSIX only; otherwise no limit)."""
    usable = seconds and hasattr(signal, "SIGALRM")
    if usable:
        try:
            old = signal.signal(signal.SIGALRM, _raise_timeout)
        except ValueError:  # not the main thread
            usable = False
    if not usable:
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _raise_timeout(signum, frame):
    raise SampleTimeout("sample timed out")


def short_message(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:limit]


@dataclass
class MovedSample:
    input: object
    args: tuple
    kwargs: dict


# Ops whose positional tensor arguments torch requires on the CPU whatever the input's device
# (tensor_split's tensor_indices_or_sections): moving them would test the sample, not the device.
CPU_ARGS_OPS = frozenset({"tensor_split"})


def move_sample(sample, device: str, ref_device: str = "cpu", op_name: str = "") -> MovedSample:
    """A copy of an OpInfo SampleInput's input, args and kwargs with every tensor moved to `device`.

    A positional argument naming the reference device (``x.to("cpu", ...)`` samples) names `device`
    instead, as a ``device=`` keyword does: the sample means "to the device the op runs on"."""
    kwargs = to_device(dict(sample.kwargs), device)
    if "device" in kwargs and kwargs["device"] is not None:  # factory ops: create on the device under test
        kwargs["device"] = device
    args = tuple(sample.args) if op_name in CPU_ARGS_OPS else to_device(tuple(sample.args), device)
    args = tuple(device if _names_device(arg, ref_device) else arg for arg in args)
    return MovedSample(to_device(sample.input, device), args, kwargs)


def _names_device(value, ref_device: str) -> bool:
    if isinstance(value, torch.device):
        return value == torch.device(ref_device)
    return isinstance(value, str) and value == ref_device


def _run(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _tensors(tree) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@dataclass
class SampleResult:
    status: str  # pass / mismatch / error
    message: str = ""


def check_sample(op, sample, device: str = "flagos", ref_device: str = "cpu") -> SampleResult:
    """Run one sample on the reference device and on `device`; compare."""
    # Before the reference run: in-place variants mutate the input.
    dev_sample = move_sample(sample, device, ref_device, op.name)
    ref_exc = None
    try:
        expected = _run(op, sample)
    except Exception as exc:  # noqa: BLE001  (any reference error is part of what flagos must match)
        ref_exc = exc
    try:
        actual = _run(op, dev_sample)
    except SampleTimeout:
        raise
    except Exception as exc:  # noqa: BLE001
        if ref_exc is None:
            return SampleResult("error", short_message(exc))
        if type(exc) is type(ref_exc) or isinstance(exc, type(ref_exc)):
            return SampleResult("pass")
        return SampleResult(
            "mismatch",
            f"exception type: {ref_device} raised {type(ref_exc).__name__}, "
            f"{device} raised {short_message(exc)}",
        )
    if ref_exc is not None:
        if "Could not run" in str(ref_exc) and "backend" in str(ref_exc):
            # The reference device has no kernel for the op; flagos ran it through another route.
            return SampleResult("pass")
        return SampleResult(
            "mismatch", f"{ref_device} raised {short_message(ref_exc)}, {device} did not raise"
        )
    device_type = torch.device(device).type
    ref_types = [t.device.type for t in _tensors(expected)]
    act_types = [t.device.type for t in _tensors(actual)]
    for ref_type, act_type in zip(ref_types, act_types, strict=False):
        if ref_type == torch.device(ref_device).type and act_type != device_type:
            return SampleResult("mismatch", f"output on {act_type}, expected on {device_type}")
    tolerance = {"rtol": 0.0, "atol": 0.0} if COMPARE["exact"] else {}
    try:
        torch.testing.assert_close(to_cpu(actual), to_cpu(expected), equal_nan=True, **tolerance)
        # In-place variants: the mutated input must match too.
        if op.name.endswith("_") and isinstance(sample.input, torch.Tensor):
            torch.testing.assert_close(
                to_cpu(dev_sample.input), to_cpu(sample.input), equal_nan=True, **tolerance
            )
    except Exception as exc:  # noqa: BLE001
        return SampleResult("mismatch", short_message(exc))
    return SampleResult("pass")


@dataclass
class OpDtypeResult:
    op: str
    dtype: str
    status: str
    samples: int = 0
    sample_counts: dict = field(default_factory=dict)
    message: str = ""
    seconds: float = 0.0


def sample_inputs(op, device: str, dtype: torch.dtype):
    """``op.sample_inputs(device, dtype)``, asked for on a thread of its own. Asking, torch's OpInfo looks
    for the unittest test that asks by walking the caller's stack with ``inspect.stack()``, which reads the
    source of every frame and finds each frame's module among all those loaded; under pytest, in a process
    that has imported the ecosystem tests' libraries, that walk cost more than the samples themselves (about
    0.2 s an op and dtype). A fresh thread's stack is one frame deep. The samples are then drawn here."""
    found: dict[str, object] = {}

    def ask() -> None:
        try:
            found["samples"] = op.sample_inputs(device, dtype, requires_grad=False)
        except BaseException as exc:  # noqa: BLE001  (raised again on the caller's thread)
            found["error"] = exc

    thread = threading.Thread(target=ask, name="opinfo-samples", daemon=True)
    thread.start()
    thread.join()
    if "error" in found:
        raise found["error"]
    return found["samples"]


def check_op(
    op,
    dtype: torch.dtype,
    device: str = "flagos",
    ref_device: str = "cpu",
    max_samples: int = DEFAULT_MAX_SAMPLES,
    sample_timeout_s: float = DEFAULT_SAMPLE_TIMEOUT_S,
) -> OpDtypeResult:
    """Compare `op` for `dtype` on `device` against `ref_device`, over the first `max_samples` samples."""
    key, dname = op_key(op), dtype_name(dtype)
    if is_random(op):
        return OpDtypeResult(key, dname, "skip-random")
    start = time.perf_counter()
    counts: collections.Counter = collections.Counter()
    first_failure: dict[str, str] = {}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with time_limit(sample_timeout_s):
                samples = list(
                    itertools.islice(
                        sample_inputs(op, ref_device, dtype), max_samples if max_samples > 0 else None
                    )
                )
        except Exception as exc:  # noqa: BLE001
            return OpDtypeResult(key, dname, "skip-samples", message=short_message(exc))
        for sample in samples:
            try:
                with time_limit(sample_timeout_s):
                    result = check_sample(op, sample, device, ref_device)
            except Exception as exc:  # noqa: BLE001  (the harness itself must never stop on one sample)
                result = SampleResult("error", short_message(exc))
            counts[result.status] += 1
            if result.status != "pass":
                first_failure.setdefault(result.status, result.message)
    if not samples:
        status = "skip-samples"
    elif counts["error"]:
        status = "error"
    elif counts["mismatch"]:
        status = "mismatch"
    else:
        status = "pass"
    message = first_failure.get(status, "")
    return OpDtypeResult(
        key, dname, status, len(samples), dict(counts), message, round(time.perf_counter() - start, 4)
    )


def supported_dtypes(op, ref_device: str = "cpu") -> set:
    try:
        return set(op.supported_dtypes(ref_device))
    except Exception:  # noqa: BLE001
        return set()


def run(
    ops: Iterable,
    dtypes: Iterable[torch.dtype],
    device: str = "flagos",
    ref_device: str = "cpu",
    max_samples: int = DEFAULT_MAX_SAMPLES,
    sample_timeout_s: float = DEFAULT_SAMPLE_TIMEOUT_S,
    verbose: bool = False,
) -> list[OpDtypeResult]:
    dtypes = list(dtypes)
    results = []
    for op in ops:
        supported = supported_dtypes(op, ref_device)
        for dtype in dtypes:
            if dtype not in supported:
                continue
            if verbose:
                print(f"{op_key(op)} {dtype_name(dtype)} ...", end=" ", file=sys.stderr, flush=True)
            result = check_op(op, dtype, device, ref_device, max_samples, sample_timeout_s)
            if verbose:
                print(result.status, result.message, file=sys.stderr, flush=True)
            results.append(result)
    return results


_NUMBERS = re.compile(r"\b\d+(\.\d+)?(e-?\d+)?\b")


def category(message: str) -> str:
    """A failure message with its specifics (numbers, shapes, quoted names) folded, to group failures."""
    text = re.sub(r"\[[^\]]*\]", "[..]", message)
    text = re.sub(r"'[^']*'", "'..'", text)
    text = _NUMBERS.sub("N", text)
    return text[:160]


def summarize(results: list[OpDtypeResult]) -> dict:
    per_dtype: dict[str, dict] = {}
    for result in results:
        entry = per_dtype.setdefault(
            result.dtype, {"ops": collections.Counter(), "samples": collections.Counter()}
        )
        entry["ops"][result.status] += 1
        for status, count in result.sample_counts.items():
            entry["samples"][status] += count
    total_ops = collections.Counter(r.status for r in results)
    total_samples: collections.Counter = collections.Counter()
    for result in results:
        total_samples.update(result.sample_counts)
    categories = collections.Counter(
        (r.status, category(r.message)) for r in results if r.status in ("error", "mismatch")
    )
    return {
        "per_dtype": {d: {k: dict(v) for k, v in e.items()} for d, e in per_dtype.items()},
        "total": {"ops": dict(total_ops), "samples": dict(total_samples)},
        "categories": [
            {"status": status, "category": cat, "count": count}
            for (status, cat), count in categories.most_common()
        ],
    }


def print_summary(summary: dict, top: int = 25, file=sys.stdout) -> None:
    print("dtype      (op,dtype) pass/mismatch/error/skip   samples pass/mismatch/error", file=file)
    for dname, entry in sorted(summary["per_dtype"].items()):
        ops, samples = entry["ops"], entry["samples"]
        skips = ops.get("skip-random", 0) + ops.get("skip-samples", 0)
        print(
            f"{dname:10} {ops.get('pass', 0):5} / {ops.get('mismatch', 0):4} / {ops.get('error', 0):4} / "
            f"{skips:4}       {samples.get('pass', 0):6} / {samples.get('mismatch', 0):5} / "
            f"{samples.get('error', 0):5}",
            file=file,
        )
    print(f"total: {summary['total']}", file=file)
    print("top failure categories:", file=file)
    for entry in summary["categories"][:top]:
        print(f"  {entry['count']:4}  {entry['status']:8} {entry['category']}", file=file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="flagos", help="device under test (default flagos)")
    parser.add_argument("--device-ref", default="cpu", help="reference device (default cpu)")
    parser.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES), help="comma-separated torch dtypes")
    parser.add_argument(
        "--ops", default="", help="comma-separated op keys (name or name.variant); default all"
    )
    parser.add_argument("--skip-ops", default="", help="comma-separated op keys to leave out")
    parser.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES, help="0 = all samples")
    parser.add_argument("--sample-timeout", type=float, default=DEFAULT_SAMPLE_TIMEOUT_S)
    parser.add_argument(
        "--exact", action="store_true", help="compare bitwise (rtol=atol=0) instead of dtype tolerances"
    )
    parser.add_argument("--out", help="write per-(op,dtype) results and the summary as JSON")
    parser.add_argument("--write-passing", help="write the passing 'op dtype' lines to this file")
    parser.add_argument("--top", type=int, default=25, help="failure categories to print")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each (op, dtype) as it runs")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run in this process (default: a worker process, restarted "
        "after a crash, which is recorded as an error of the (op, dtype) that was running)",
    )
    parser.add_argument(
        "--shard", default="0/1", help="K/N: run every N-th (op, dtype) pair from the K-th (parallel runs)"
    )
    parser.add_argument(
        "--merge", nargs="+", metavar="JSON", help="combine the --out files of shards (then --out, summary)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # JSON-lines output of a worker process
    parser.add_argument("--pair-start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch_fl  # noqa: F401  (registers the flagos device before the OpInfo database is loaded)

    COMPARE["exact"] = args.exact
    if args.merge:
        return merge(args)
    try:
        shard, shards = (int(part) for part in args.shard.split("/"))
        assert 0 <= shard < shards
    except (ValueError, AssertionError):
        parser.error(f"--shard {args.shard!r}: expected K/N with 0 <= K < N")

    dtypes = [parse_dtype(name) for name in args.dtypes.split(",") if name.strip()]
    db = load_op_db()
    wanted = [name.strip() for name in args.ops.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in db]
    if unknown:
        parser.error(f"unknown op(s): {', '.join(unknown)}")
    skip = {name.strip() for name in args.skip_ops.split(",") if name.strip()}
    ops = [db[name] for name in wanted] if wanted else list(db.values())
    ops = [op for op in ops if op_key(op) not in skip]

    pairs = [(op, dtype) for op in ops for dtype in dtypes if dtype in supported_dtypes(op, args.device_ref)]
    pairs = pairs[shard::shards]
    start = time.perf_counter()
    if args.worker:
        run_worker(pairs[args.pair_start :], args)
        return 0
    if args.in_process:
        results = [_check_verbose(op, dtype, args) for op, dtype in pairs]
    else:
        results = supervise(pairs, argv if argv is not None else sys.argv[1:], args)
    elapsed = time.perf_counter() - start
    run = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "device": args.device,
        "device_ref": args.device_ref,
        "max_samples": args.max_samples,
        "exact": args.exact,
        "seconds": round(elapsed, 1),
    }
    report(results, run, f"{len(results)} (op, dtype) pairs in {elapsed:.1f} s", args)
    return 0


def report(results: list[OpDtypeResult], run: dict, done: str, args) -> None:
    """Prints the summary and `done`; writes --out (JSON: `run`, the summary, the results) and
    --write-passing."""
    summary = summarize(results)
    print_summary(summary, args.top)
    print(done)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**run, "summary": summary, "results": [asdict(r) for r in results]}, f, indent=1)
    if args.write_passing:
        write_passing(args.write_passing, results, args)


def merge(args) -> int:
    """The shards' results as one run (the run's settings are the first shard's; seconds the longest)."""
    results, run = [], {}
    for path in args.merge:
        with open(path) as f:
            data = json.load(f)
        results.extend(OpDtypeResult(**r) for r in data.pop("results"))
        data.pop("summary")
        run = run or data
        run["seconds"] = max(run["seconds"], data["seconds"])
    done = f"{len(results)} (op, dtype) pairs from {len(args.merge)} shards, the longest {run['seconds']} s"
    report(results, run, done, args)
    return 0


def _check_verbose(op, dtype, args) -> OpDtypeResult:
    if args.verbose:
        print(f"{op_key(op)} {dtype_name(dtype)} ...", end=" ", file=sys.stderr, flush=True)
    result = check_op(op, dtype, args.device, args.device_ref, args.max_samples, args.sample_timeout)
    if args.verbose:
        print(result.status, result.message, file=sys.stderr, flush=True)
    return result


def run_worker(pairs, args) -> None:
    with open(args.worker, "a") as out:
        for op, dtype in pairs:
            out.write(json.dumps(asdict(_check_verbose(op, dtype, args))) + "\n")
            out.flush()


def supervise(pairs, argv: list[str], args) -> list[OpDtypeResult]:
    """Run the pairs in worker processes; a worker that dies marks its current pair as an error and the next
    worker resumes after it."""
    import os
    import subprocess
    import tempfile

    from harness.processes import python_env

    results: list[OpDtypeResult] = []
    fd, path = tempfile.mkstemp(prefix="opinfo_worker_", suffix=".jsonl")
    os.close(fd)
    try:
        start = 0
        while start < len(pairs):
            open(path, "w").close()
            cmd = [
                sys.executable,
                "-m",
                "harness.opinfo",
                *argv,
                "--worker",
                path,
                "--pair-start",
                str(start),
            ]
            rc = subprocess.call(cmd, env=python_env())
            with open(path) as f:
                done = [OpDtypeResult(**json.loads(line)) for line in f if line.strip()]
            results.extend(done)
            start += len(done)
            if start < len(pairs):
                op, dtype = pairs[start]
                message = f"crash: the process died (exit status {rc})"
                print(f"{op_key(op)} {dtype_name(dtype)}: {message}", file=sys.stderr, flush=True)
                results.append(
                    OpDtypeResult(op_key(op), dtype_name(dtype), "error", 1, {"error": 1}, message)
                )
                start += 1
    finally:
        os.unlink(path)
    return results


def write_passing(path: str, results: list[OpDtypeResult], args) -> None:
    lines = sorted(f"{r.op} {r.dtype}" for r in results if r.status == "pass")
    with open(path, "w") as f:
        f.write(
            "# (op, dtype) pairs of PyTorch's OpInfo op_db that pass on flagos (simulated accelerator).\n"
            "# Checked by tests/ops/test_opinfo.py; regenerate with\n"
            f"#   python -m harness.opinfo --dtypes {args.dtypes} --max-samples {args.max_samples} "
            f"--write-passing {path}\n"
        )
        for line in lines:
            f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
