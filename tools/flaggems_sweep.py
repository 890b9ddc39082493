"""FlagGems correctness sweep on a GPU: which ops may be routed to ``flaggems`` (writes the config).

For every op that FlagGems implements and whose calls on flagos tensors reach the router
(``torch_fl._flaggems.routable_ops()``), the OpInfo samples that exercise it run twice: natively on CUDA
(the reference) and on flagos with only that op routed to ``flaggems``; the results are compared with
dtype-fit tolerances (:data:`TOLERANCES`). An op passes when FlagGems was actually called by its samples and
every sample of every (OpInfo, dtype) matched.

1. Discovery: which OpInfos reach which of those ops. Each op is given a recording implementation on the
   ``python`` backend (it calls the native CUDA kernel, so no Triton compiles), the first sample of every
   OpInfo runs on flagos in each of its variants (function, in-place, out=, forward and backward:
   harness/opinfo_variants.py), and the recorders say which ops it reached.
2. Sweep: per op, up to ``--max-opinfos`` of its OpInfos, every dtype of ``--dtypes`` the OpInfo supports
   on CUDA, the first ``--max-samples`` samples. Transformer ops first (:data:`PRIORITY_OPS`), so that a
   ``--budget-s`` that runs out leaves the least important ops unrun (reported as ``not-run``).

Both phases run in ``--workers`` processes (Triton compiles on the CPU); a worker that dies marks the op it
was running as ``crash`` and a new worker continues with the rest. Outputs in ``--out-dir``:
``flaggems_sweep.json`` (everything, with the discovered map for ``--map-in``), ``flaggems_cuda.conf`` (passing ops routed to flaggems, the others
listed in comments with the reason; copy it to ``torch_fl/configs/``) and ``flaggems_sweep.md`` (the table
for docs/flaggems.md).

    python -m tools.flaggems_sweep --out-dir /tmp/sweep --budget-s 150
    python -m tools.flaggems_sweep --ops aten::add.out,aten::mm.out --workers 1 -v
    python -m tools.flaggems_sweep --replay-check --map-in /tmp/sweep/flaggems_sweep.json --budget-s 300

``--replay-check`` also runs every passing sample once more with replay off and three times more with it
on, and requires the replayed result (launches recorded by the flaggems route, replayed from C++) to be
bitwise equal to the Python path's; a sample that differs fails its op. A sample whose replay differs, or
whose Python path varies from run to run (a native kernel of the sample accumulates with atomics), is
checked again with torch's deterministic algorithms, which leave the replayed launches as they are, and
judged by that check; where they cannot run it and a second run of the Python path differs too, it counts
as nondeterministic, not failed. The summary counts samples replayed bitwise, differing,
nondeterministic and not replayed (with why).

Needs an NVIDIA GPU, flagos on the cuda accelerator, FlagGems usable, and ``expecttest``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch

from harness import opinfo as opinfo_harness
from harness.flaggems import PRIORITY_OPS, CallCounter, check_replay, mismatch_message, tolerance
from harness.opinfo_variants import (
    VARIANTS,
    case_key,
    has_variant,
    move_for_variant,
    run_variant,
    sample_applies,
    split_case,
)
from tools.flaggems_common import (
    REFERENCE,
    add_worker_arguments,
    check_environment,
    environment_line,
    run_phase,
    write_status_markdown,
)

DEFAULT_DTYPES = ("float32", "float16", "bfloat16")

STATUSES = ("pass", "fail", "crash", "not-exercised", "no-opinfo", "not-run")


def priority_order(ops: list[str]) -> list[str]:
    rank = {op: i for i, op in enumerate(PRIORITY_OPS)}
    return sorted(ops, key=lambda op: (rank.get(op, len(rank)), op))


# ---- comparing one sample ----------------------------------------------------------------------------


# compare_sample's message for a sample that raised the same error on flagos as natively: a pass with no
# result, so nothing whose replay could be checked.
RAISED_AS_THE_REFERENCE = "raised as the reference does"


def compare_sample(opinfo, sample, op: str, dtype: torch.dtype, variant: str = "") -> tuple[str, str]:
    """Runs `sample` (the `variant` way) natively and on flagos (the caller routes `op` to flaggems);
    ('pass'|'mismatch'|'error', message); a pass's message is RAISED_AS_THE_REFERENCE where both raised.
    The reference is CUDA, except for "grad": a CUDA backward cannot run in a process that imported
    torch_fl (pytorch#161129), so there it is flagos with `op` on the native route, which runs CUDA's
    kernels."""
    from torch_fl import routing

    dut = move_for_variant(sample, variant, "flagos")  # before the reference: in-place variants mutate it
    ref_sample = move_for_variant(sample, variant, "flagos") if variant == "grad" else sample
    ref_exc = None
    try:
        if variant == "grad":
            with routing.override({op: "native"}):
                expected = run_variant(opinfo, variant, ref_sample)
        else:
            expected = run_variant(opinfo, variant, ref_sample)
    except Exception as exc:  # noqa: BLE001
        ref_exc = exc
    try:
        actual = run_variant(opinfo, variant, dut)
    except opinfo_harness.SampleTimeout:
        raise
    except Exception as exc:  # noqa: BLE001
        if ref_exc is None:
            return "error", opinfo_harness.short_message(exc)
        if isinstance(exc, type(ref_exc)):
            return "pass", RAISED_AS_THE_REFERENCE
        return (
            "mismatch",
            f"cuda raised {type(ref_exc).__name__}, flagos raised {opinfo_harness.short_message(exc)}",
        )
    if ref_exc is not None:
        return "mismatch", f"cuda raised {opinfo_harness.short_message(ref_exc)}, flagos did not raise"
    for ref_t, act_t in zip(opinfo_harness._tensors(expected), opinfo_harness._tensors(actual), strict=False):
        if ref_t.device.type == REFERENCE[0] and act_t.device.type != "flagos":
            return "mismatch", f"output on {act_t.device.type}, expected on flagos"
    rtol, atol = tolerance(dtype, op)
    try:
        torch.testing.assert_close(
            opinfo_harness.to_cpu(actual),
            opinfo_harness.to_cpu(expected),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
        )
        if (opinfo.name.endswith("_") or variant == "inplace") and isinstance(sample.input, torch.Tensor):
            torch.testing.assert_close(
                opinfo_harness.to_cpu(dut.input), sample.input.cpu(), rtol=rtol, atol=atol, equal_nan=True
            )
    except Exception as exc:  # noqa: BLE001
        return "mismatch", mismatch_message(exc)
    return "pass", ""


@dataclass
class CaseResult:
    """One (op, OpInfo, dtype)."""

    op: str
    opinfo: str
    dtype: str
    status: str  # pass / mismatch / error / not-exercised / skip-samples
    samples: int = 0
    flaggems_calls: int = 0
    message: str = ""
    seconds: float = 0.0
    # with --replay-check: bitwise/differs/nondeterministic/not-replayed -> samples
    replay: dict = field(default_factory=dict)
    replay_message: str = ""


@dataclass
class OpResult:
    op: str
    status: str  # one of STATUSES
    message: str = ""
    cases: list = field(default_factory=list)
    seconds: float = 0.0


def sweep_case(
    op: str,
    opinfo,
    variant: str,
    dtype: torch.dtype,
    max_samples: int,
    sample_timeout_s: float,
    replay_check: bool = False,
) -> CaseResult:
    from torch_fl import routing

    start = time.perf_counter()
    key, dname = case_key(opinfo_harness.op_key(opinfo), variant), opinfo_harness.dtype_name(dtype)
    torch.manual_seed(0)
    try:
        with opinfo_harness.time_limit(sample_timeout_s):
            samples = list(
                _first(
                    (
                        s
                        for s in opinfo.sample_inputs(REFERENCE[0], dtype, requires_grad=variant == "grad")
                        if sample_applies(s, variant)
                    ),
                    max_samples if max_samples > 0 else None,
                )
            )
    except Exception as exc:  # noqa: BLE001
        return CaseResult(op, key, dname, "skip-samples", message=opinfo_harness.short_message(exc))
    if not samples:
        return CaseResult(op, key, dname, "skip-samples")
    counts: collections.Counter = collections.Counter()
    replays: collections.Counter = collections.Counter()
    first: dict[str, str] = {}
    with CallCounter(op) as counter, routing.override({op: "flaggems"}):
        for sample in samples:
            try:
                with opinfo_harness.time_limit(sample_timeout_s):
                    reached = counter.reached()
                    status, message = compare_sample(opinfo, sample, op, dtype, variant)
                    # A sample of an OpInfo that reaches `op` through another path (a matmul of 2-D
                    # tensors, where the 1-D one reached dot) says nothing about its replay, nor does one
                    # that raised on both devices (an out= form the OpInfo's op does not take).
                    if replay_check and status == "pass" and counter.reached() > reached and not message:
                        replay, why = check_replay(opinfo, sample, op, variant)
                        replays[replay] += 1
                        first.setdefault(f"replay:{replay}", why)
                        if replay == "differs":
                            status, message = "mismatch", why
            except Exception as exc:  # noqa: BLE001  (the sweep must never stop on one sample)
                status, message = "error", opinfo_harness.short_message(exc)
            counts[status] += 1
            if status != "pass":
                first.setdefault(status, message)
    torch.flagos.synchronize()
    replay_message = (
        first.get("replay:differs")
        or first.get("replay:nondeterministic")
        or first.get("replay:not-replayed", "")
    )
    if counts["error"]:
        status = "error"
    elif counts["mismatch"]:
        status = "mismatch"
    elif counter.calls + counter.replayed == 0:  # a call replayed from an earlier case's plan counts
        status = "not-exercised"
    else:
        status = "pass"
    return CaseResult(
        op,
        key,
        dname,
        status,
        len(samples),
        counter.calls,
        first.get(status, ""),
        round(time.perf_counter() - start, 3),
        dict(replays),
        replay_message,
    )


def _first(iterable, n):
    for i, item in enumerate(iterable):
        if n is not None and i >= n:
            return
        yield item


def op_status(op: str, cases: list[CaseResult]) -> tuple[str, str]:
    failed = [c for c in cases if c.status in ("mismatch", "error")]
    if failed:
        c = failed[0]
        return "fail", f"{c.status} in {c.dtype} ({c.opinfo}): {c.message}"
    if any(c.status == "pass" for c in cases):
        return "pass", ""
    if cases:
        return "not-exercised", "no sample of its OpInfos reached the FlagGems function"
    return "no-opinfo", "no OpInfo reaches it on flagos"


# ---- discovery -------------------------------------------------------------------------------------------


def discover(
    ops: list[str], opinfos: list, dtypes: list[torch.dtype], sample_timeout_s: float, deadline: float
):
    """For each OpInfo and each of its VARIANTS (first sample, first of `dtypes` it supports on CUDA), the
    ops of `ops` it reaches on flagos: yields (case key, [ops])."""
    from torch_fl import routing

    hits: set[str] = set()

    def recorder(name: str):
        base, _, overload = name.removeprefix("aten::").partition(".")
        native = getattr(getattr(torch.ops.aten, base), overload or "default")

        def record(*args, **kwargs):
            hits.add(name)
            return native(*args, **kwargs)

        return record

    for name in ops:
        routing.register_python_impl(name, recorder(name))
    try:
        for opinfo in opinfos:
            if time.time() > deadline:
                return
            if opinfo_harness.is_random(opinfo):
                continue
            supported = opinfo_harness.supported_dtypes(opinfo, REFERENCE[0])
            dtype = next((d for d in dtypes if d in supported), None)
            if dtype is None:
                continue
            # The function last: its record tells the worker pool the OpInfo is done (run_phase), so a
            # crash in any variant is the OpInfo's.
            for variant in (*VARIANTS[1:], VARIANTS[0]):
                if not has_variant(opinfo, variant):
                    continue
                hits.clear()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        with opinfo_harness.time_limit(sample_timeout_s):
                            torch.manual_seed(0)
                            grad = variant == "grad"
                            samples = opinfo.sample_inputs(REFERENCE[0], dtype, requires_grad=grad)
                            sample = next((s for s in samples if sample_applies(s, variant)), None)
                            if sample is not None:
                                run_variant(opinfo, variant, move_for_variant(sample, variant, "flagos"))
                    except Exception:  # noqa: BLE001  (a failing sample still says which ops it reached)
                        pass
                yield case_key(opinfo_harness.op_key(opinfo), variant), sorted(hits)
    finally:
        for name in ops:
            routing.unregister_python_impl(name)


# ---- workers ---------------------------------------------------------------------------------------------


def run_worker(args) -> int:
    """A worker: the items of its task file (JSON), results appended to --results as JSON lines."""
    with open(args.worker) as f:
        task = json.load(f)
    # Discovery uses the python route, not FlagGems.
    reason = check_environment(need_flaggems=task["phase"] == "sweep", stand_in=args.stand_in)
    if reason:
        print(f"flaggems_sweep worker: {reason}", file=sys.stderr)
        return 2
    db = opinfo_harness.load_op_db()
    dtypes = [opinfo_harness.parse_dtype(d) for d in task["dtypes"]]
    with open(args.results, "a") as out:

        def emit(record: dict) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        if task["phase"] == "discover":
            opinfos = [db[k] for k in task["items"] if k in db]
            for key, reached in discover(task["ops"], opinfos, dtypes, args.sample_timeout, task["deadline"]):
                emit({"opinfo": key, "ops": reached})
            return 0
        for item in task["items"]:
            op, keys = item["op"], item["opinfos"]
            if time.time() > task["deadline"]:
                return 0
            emit({"begin": op})
            start = time.perf_counter()
            cases = []
            for key in keys[: args.max_opinfos]:
                opinfo_key, variant = split_case(key)
                opinfo = db[opinfo_key]
                supported = opinfo_harness.supported_dtypes(opinfo, REFERENCE[0])
                for dtype in dtypes:
                    if dtype in supported:
                        case = sweep_case(
                            op,
                            opinfo,
                            variant,
                            dtype,
                            args.max_samples,
                            args.sample_timeout,
                            task.get("replay_check", False),
                        )
                        cases.append(case)
                        if args.verbose:
                            print(
                                f"{op} {case.opinfo} {case.dtype}: {case.status} {case.message}",
                                file=sys.stderr,
                            )
            status, message = op_status(op, cases)
            emit(
                asdict(
                    OpResult(
                        op, status, message, [asdict(c) for c in cases], round(time.perf_counter() - start, 2)
                    )
                )
            )
    return 0


# ---- outputs ---------------------------------------------------------------------------------------------


# FlagGems defects confirmed by calling FlagGems itself on CUDA tensors, without the route: their cause,
# added to the excluded op's line in the config (the sweep itself only sees a failure or a dead worker).
def _empty_inner_dimension_fault(function: str) -> str:
    return (
        f"FlagGems 5.0.2 {function} faults (illegal memory access) on an empty inner dimension, (5, 0) @ "
        "(0, 10), on CUDA tensors directly too (tests/flaggems/flaggems_mm_probe.py; "
        "tests/flaggems/test_flaggems_kernels.py)"
    )


KNOWN_DEFECTS = {
    "aten::mm": _empty_inner_dimension_fault("mm"),
    "aten::mm.out": _empty_inner_dimension_fault("mm_out"),
}


def write_config(path: str, results: dict[str, OpResult], header: dict) -> None:
    by_status: dict[str, list[OpResult]] = collections.defaultdict(list)
    for result in results.values():
        by_status[result.status].append(result)
    lines = [
        "# FlagGems routes for NVIDIA GPUs: the ops that passed tools/flaggems_sweep.py. Generated; do not",
        "# edit by hand (rerun the sweep on the GPU machine, scripts/gpu/flaggems.sh, and copy its output).",
        f"# Sweep: {header['environment']}, {header['date']}",
        f"# dtypes {', '.join(header['dtypes'])}; up to {header['max_samples']} samples of up to "
        f"{header['max_opinfos']} OpInfos per op and dtype, compared",
        "# with native CUDA at dtype-fit tolerances (float32 matmul-family ops at TF32 tolerance; see the sweep).",
        f"# {len(by_status['pass'])} of {len(results)} ops FlagGems implements (and that reach the router) pass.",
        "#",
        '# Select it: FLAGOS_BACKEND_CONFIG=$(python -c "import torch_fl.routing as r; '
        "print(r.package_config('flaggems_cuda'))\")",
        "# or torch_fl.routing.load_config(torch_fl.routing.package_config('flaggems_cuda')). See docs/flaggems.md.",
        "include cuda.conf",
        "",
    ]
    for result in sorted(by_status["pass"], key=lambda r: r.op):
        dtypes = sorted({c["dtype"] for c in result.cases if c["status"] == "pass"})
        samples = sum(c["samples"] for c in result.cases if c["status"] == "pass")
        opinfos = sorted({c["opinfo"] for c in result.cases if c["status"] == "pass"})
        lines.append(
            f"{result.op} = flaggems   # {'/'.join(dtypes)}, {samples} samples: {', '.join(opinfos)}"
        )
    why = {
        "fail": "Excluded: results differ from native CUDA or FlagGems raised (first failure shown)",
        "crash": "Excluded: the process died while sweeping it",
        "not-exercised": "Not routed: no OpInfo sample reached FlagGems' function (untested)",
        "no-opinfo": "Not routed: no OpInfo reaches this op on flagos (untested)",
        "not-run": "Not routed: the sweep's time budget ran out before it (untested)",
    }
    for status, title in why.items():
        if not by_status[status]:
            continue
        lines += ["", f"# {title}:"]
        for result in sorted(by_status[status], key=lambda r: r.op):
            note = f": {result.message}" if result.message and status in ("fail", "crash") else ""
            line = f"#   {result.op}{note}"[:300]
            if result.op in KNOWN_DEFECTS:
                line += f"\n#     cause: {KNOWN_DEFECTS[result.op]}"
            lines.append(line)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_markdown(path: str, results: dict[str, OpResult], header: dict) -> None:
    def row(result):
        dtypes = sorted({c["dtype"] for c in result.cases if c["status"] == "pass"})
        samples = sum(c["samples"] for c in result.cases)
        opinfos = sorted({c["opinfo"] for c in result.cases})
        return ["/".join(dtypes), samples, ", ".join(opinfos[:4]), result.message[:160]]

    intro = (
        f"Sweep: {header['environment']}, {header['date']}; dtypes {', '.join(header['dtypes'])}, up to "
        f"{header['max_samples']} samples x {header['max_opinfos']} OpInfos per op and dtype; "
        f"{header['seconds']:.0f} s."
    )
    columns = ["dtypes passed", "samples", "OpInfos", "note"]
    write_status_markdown(path, intro, STATUSES, results, columns, row)


def worker_command(args) -> list[str]:
    """This script as a worker process (run_phase adds the task), with the sweep's options."""
    return (
        [
            sys.executable,
            "-m",
            "tools.flaggems_sweep",
            "--max-samples",
            str(args.max_samples),
            "--max-opinfos",
            str(args.max_opinfos),
            "--sample-timeout",
            str(args.sample_timeout),
        ]
        + (["-v"] if args.verbose else [])
        + (["--stand-in"] if args.stand_in else [])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default="flaggems_sweep_out")
    parser.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    parser.add_argument(
        "--ops", default="", help="comma-separated canonical op names (default: all routable)"
    )
    parser.add_argument("--max-samples", type=int, default=3, help="samples per OpInfo and dtype (0 = all)")
    parser.add_argument("--max-opinfos", type=int, default=3, help="OpInfos per op")
    parser.add_argument("--sample-timeout", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall time for both phases")
    parser.add_argument(
        "--discovery-share", type=float, default=0.3, help="fraction of the budget for discovery"
    )
    parser.add_argument(
        "--grace-s", type=float, default=20.0, help="after the budget, before workers are killed"
    )
    parser.add_argument(
        "--map-in",
        help="reuse the op -> OpInfos map of an earlier run's flaggems_sweep.json (skips discovery)",
    )
    parser.add_argument(
        "--resume",
        help="an earlier run's flaggems_sweep.json: sweep only the ops it did not run (its budget ran out),"
        " keep its results for the others, reuse its op -> OpInfos map",
    )
    parser.add_argument(
        "--rerun",
        default="",
        help="with --resume: comma-separated ops to sweep again although it has their results (their route"
        " changed since)",
    )
    parser.add_argument(
        "--exclude",
        default="",
        help="comma-separated ops not to sweep: they keep an earlier run's result, else stay not-run",
    )
    parser.add_argument("--opinfos", default="", help="comma-separated OpInfo keys to discover (default all)")
    parser.add_argument(
        "--replay-check",
        action="store_true",
        help="also replay each passing sample from its recorded launches and require the result bitwise equal"
        " to the Python path's (a sample that differs fails its op)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)

    start = time.time()
    reason = check_environment(stand_in=args.stand_in)
    if reason:
        print(f"flaggems_sweep: cannot run here: {reason}", file=sys.stderr)
        return 2
    from torch_fl import _flaggems

    os.makedirs(args.out_dir, exist_ok=True)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    routable = _flaggems.routable_ops()
    wanted = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in wanted if o not in routable]
    if unknown:
        parser.error(f"not routable FlagGems ops here: {', '.join(unknown)}")
    ops = priority_order(wanted or routable)
    rerun = {o.strip() for o in args.rerun.split(",") if o.strip()}
    excluded = {o.strip() for o in args.exclude.split(",") if o.strip()}
    if rerun and not args.resume:
        parser.error("--rerun needs --resume")
    earlier: dict[str, OpResult] = {}
    earlier_seconds = 0.0
    if args.resume:
        with open(args.resume) as f:
            resumed = json.load(f)
        args.map_in = args.resume
        earlier_seconds = resumed.get("seconds", 0.0)
        earlier = {r["op"]: OpResult(**r) for r in resumed["results"] if r["op"] in ops}
        earlier = {
            op: r
            for op, r in earlier.items()
            if op in excluded or (r.status != "not-run" and op not in rerun)
        }
    for op in excluded & set(ops):
        earlier.setdefault(op, OpResult(op, "not-run"))
    ops = [op for op in ops if op not in earlier]
    common = {"dtypes": dtypes, "ops": ops, "replay_check": args.replay_check}
    print(
        f"flaggems_sweep: {environment_line()}; {len(ops)} ops, {args.workers} workers, budget {args.budget_s:.0f} s"
    )

    if args.map_in:
        with open(args.map_in) as f:
            op_map = json.load(f)
        op_map = op_map.get("opinfo_map", op_map)
    else:
        db = opinfo_harness.load_op_db()
        opinfos = [k.strip() for k in args.opinfos.split(",") if k.strip()] or list(db)
        missing = [k for k in opinfos if k not in db]
        if missing:
            parser.error(f"unknown OpInfo(s): {', '.join(missing)}")
        deadline = start + args.budget_s * args.discovery_share
        records = run_phase(
            "discover",
            opinfos,
            common,
            args,
            deadline,
            lambda r: r if isinstance(r, str) else r.get("opinfo", r.get("crash")),
            worker_command(args),
        )
        op_map = {op: [] for op in ops}
        for record in records:
            for op in record.get("ops", []):
                op_map.setdefault(op, []).append(record["opinfo"])
        discovered = len({split_case(r["opinfo"])[0] for r in records if "opinfo" in r})
        print(
            f"flaggems_sweep: discovery ran {discovered} of {len(opinfos)} OpInfos in {time.time() - start:.0f} s"
        )

    items = [{"op": op, "opinfos": sorted(op_map.get(op, []))} for op in ops]
    deadline = start + args.budget_s
    records = run_phase(
        "sweep",
        items,
        common,
        args,
        deadline,
        lambda r: r["op"] if "op" in r else r.get("crash"),
        worker_command(args),
    )
    results: dict[str, OpResult] = {**earlier, **{op: OpResult(op, "not-run") for op in ops}}
    for record in records:
        if "crash" in record:
            results[record["crash"]] = OpResult(
                record["crash"], "crash", f"exit status {record['returncode']}"
            )
        else:
            results[record["op"]] = OpResult(**record)
    elapsed = time.time() - start + earlier_seconds
    header = {
        "environment": environment_line(),
        "date": datetime.date.today().isoformat(),
        "dtypes": dtypes,
        "max_samples": args.max_samples,
        "max_opinfos": args.max_opinfos,
        "seconds": elapsed,
    }
    with open(os.path.join(args.out_dir, "flaggems_sweep.json"), "w") as f:
        json.dump(
            {**header, "results": [asdict(r) for r in results.values()], "opinfo_map": op_map}, f, indent=1
        )
    write_config(os.path.join(args.out_dir, "flaggems_cuda.conf"), results, header)
    write_markdown(os.path.join(args.out_dir, "flaggems_sweep.md"), results, header)
    counts = collections.Counter(r.status for r in results.values())
    print(f"flaggems_sweep: {dict(counts)} in {elapsed:.0f} s; outputs in {args.out_dir}")
    if args.replay_check:
        print("flaggems_sweep: replay check, samples: " + replay_summary(results))
    return 0


def replay_summary(results: dict[str, OpResult]) -> str:
    """Samples replayed bitwise, differing, nondeterministic (the Python path varies too) and not replayed
    over every op, with the ops of the last three."""
    totals: collections.Counter = collections.Counter()
    ops: dict[str, set] = collections.defaultdict(set)
    for result in results.values():
        for case in result.cases:
            case = case if isinstance(case, dict) else asdict(case)
            for kind, n in case.get("replay", {}).items():
                totals[kind] += n
                ops[kind].add(result.op)
    parts = [f"{totals[k]} {k}" for k in ("bitwise", "differs", "nondeterministic", "not-replayed")]
    for kind in ("differs", "nondeterministic", "not-replayed"):
        if ops[kind]:
            parts.append(f"{kind}: {', '.join(sorted(ops[kind]))}")
    return "; ".join(parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
