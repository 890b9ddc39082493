"""FlagGems at model shapes: the ops a routing config sends to ``flaggems``, on the calls a Qwen3 model
really makes, against the native kernels.

The OpInfo sweep (flaggems_sweep.py) checks small samples. A model calls the same ops at other sizes,
strides and dtypes (vocabulary-sized logits, KV-cache concatenations, bfloat16 reductions over the hidden
size, autocast's mixed dtypes), where a kernel that passed there can still fail or fault: a config made
from the OpInfo sweep alone crashed the Qwen3-0.6B forward with an illegal memory access. This sweep finds
such ops one by one and takes them out of the config.

1. Record (this process): the model runs on flagos, native route, under a TorchDispatchMode that keeps the
   arguments of the first call of every distinct signature (op; argument sizes, strides, dtypes, alignment
   and non-tensor values) of each op FlagGems implements, up to ``--max-signatures`` per op: a prefill,
   a cached greedy decode, a training step (AdamW) in the model's dtype and one under bfloat16 autocast.
2. Replay (``--workers`` processes): per op and recorded call, once on the native route (the reference)
   and once with only that op routed to ``flaggems``, each from its own copy of the arguments; the outputs
   and the arguments are compared (in-place and out= ops mutate them) at the OpInfo sweep's tolerances.
   A CUDA error (an illegal memory access poisons the whole process) or a dying worker marks the op
   ``crash``; a new worker goes on with the other ops.
3. An ``out`` overload that FlagGems serves through an adapter around a failing functional op fails with
   it (the same function runs). Outputs in ``--out-dir``: ``model_sweep.json``; ``model_sweep.md`` (the
   table for docs/flaggems.md); ``flaggems_cuda.conf``: the ``--config`` file with every op that failed
   here taken out of the routes and listed, with the reason, in an excluded section.

    python -m tools.flaggems_model_sweep --config flaggems_cuda.conf --out-dir /tmp/model-sweep

Needs flagos on the cuda accelerator with FlagGems usable (``--stand-in``: the simulated accelerator and
harness/fake_flaggems, for the CPU tests of this script).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch_fl
from harness import opinfo as opinfo_harness
from harness.flaggems import CallCounter, mismatch_message, tolerance
from tools import flaggems_common as common
from tools import flaggems_sweep as sweep

CUDA_ERROR_EXIT = 86  # a worker's exit status after a CUDA error (the process cannot go on)
STATUSES = ("pass", "fail", "crash", "not-exercised", "not-called", "not-run")

# ---- argument snapshots ----------------------------------------------------------------------------------

_SNAPSHOT = "__flaggems_model_sweep_tensor__"
_MEMORY_FORMAT = "__flaggems_model_sweep_memory_format__"  # torch.memory_format does not pickle


def _map(tree, fn):
    """`tree` (tuples, lists, dicts of leaves) with `fn` applied to every tensor and every snapshot."""
    if isinstance(tree, torch.Tensor) or (isinstance(tree, dict) and _SNAPSHOT in tree):
        return fn(tree)
    if isinstance(tree, torch.memory_format):
        return {_MEMORY_FORMAT: str(tree).removeprefix("torch.")}
    if isinstance(tree, dict) and _MEMORY_FORMAT in tree:
        return getattr(torch, tree[_MEMORY_FORMAT])
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map(v, fn) for v in tree)
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return tree


def _leaves(tree) -> list:
    found = []
    _map(tree, lambda x: found.append(x) or x)
    return found


def snapshot(t: torch.Tensor) -> dict:
    """A tensor's values and layout on the CPU: its storage from the start to its last element, and its
    sizes, strides and offset into it (a kernel's behaviour can depend on all of them)."""
    t = t.detach()
    extent = t.storage_offset() + (
        sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1 if t.numel() else 0
    )
    flat = t.as_strided((extent,), (1,), 0).cpu().clone()
    return {
        _SNAPSHOT: flat,
        "size": tuple(t.shape),
        "stride": tuple(t.stride()),
        "offset": t.storage_offset(),
        "device": str(t.device),
    }


def restore(snap: dict) -> torch.Tensor:
    """A fresh tensor with the snapshot's values and layout, on its device."""
    flat = snap[_SNAPSHOT].to(snap["device"], copy=True)
    return flat.as_strided(snap["size"], snap["stride"], snap["offset"])


def signature(op: str, args, kwargs) -> str:
    """What distinguishes two calls of `op` for a kernel: tensor dtypes, sizes, strides, 16-byte alignment
    and device types; every other argument's value."""

    def describe(x):
        if isinstance(x, torch.Tensor):
            aligned = (x.storage_offset() * x.element_size()) % 16 == 0
            return (
                f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}/{list(x.stride())}"
                f"{'' if aligned else '+unaligned'}{'' if x.device.type == 'flagos' else '@' + x.device.type}"
            )
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(describe(v) for v in x) + ")"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}={describe(v)}" for k, v in x.items()) + "}"
        return repr(x)

    return f"{op}{describe(tuple(args))}{describe(kwargs) if kwargs else ''}"


# ---- 1. recording ----------------------------------------------------------------------------------------


class Recorder(TorchDispatchMode):
    """Keeps a snapshot of the arguments of each new call signature of the ops in `ops`."""

    def __init__(self, ops: set[str], max_signatures: int):
        super().__init__()
        self.ops = ops
        self.max_signatures = max_signatures
        self.calls: dict[str, dict[str, dict]] = collections.defaultdict(dict)  # op -> signature -> call
        self.stage = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if name in self.ops and len(self.calls[name]) < self.max_signatures:
            key = signature(name, args, kwargs)
            if key not in self.calls[name]:  # before the call: in-place ops change their arguments
                self.calls[name][key] = {
                    "stage": self.stage,
                    "args": _map(args, snapshot),
                    "kwargs": _map(kwargs, snapshot),
                }
        return func(*args, **kwargs)


def record(ops: set[str], shape: str, max_signatures: int, log) -> dict[str, dict[str, dict]]:
    """Runs the model's workloads on flagos (native route) under a Recorder; its calls."""
    from harness import qwen3

    dtype = torch.bfloat16 if shape != "tiny" else torch.float32
    start = time.perf_counter()
    master = qwen3.build_model(shape, seed=0, dtype=torch.float32)
    log(f"built Qwen3 {shape} in {time.perf_counter() - start:.0f} s")
    recorder = Recorder(ops, max_signatures)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, master.config.vocab_size, (2, 32), generator=generator).to("flagos")

    def stage(name):
        recorder.stage = name
        log(f"recording: {name}")

    model = qwen3.copy_to(master, "flagos", dtype)
    with recorder:
        stage("prefill")
        with torch.no_grad():
            model(prompt)
        stage("decode")
        qwen3.greedy_generate(model, prompt, 4)
        stage(f"train ({str(dtype).removeprefix('torch.')}, AdamW)")
        model.train()
        qwen3.train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), prompt)
    del model
    fp32 = qwen3.copy_to(master, "flagos", torch.float32).train()
    with recorder:
        stage("train (float32 under bfloat16 autocast)")
        qwen3.train_step(fp32, torch.optim.AdamW(fp32.parameters(), lr=1e-3), prompt, autocast=True)
    del fp32
    torch.flagos.synchronize()
    return dict(recorder.calls)


# ---- 2. replay -------------------------------------------------------------------------------------------


def resolve(op: str):
    """The OpOverload named `op` ("aten::add.Tensor")."""
    namespace, _, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


def as_native(t: torch.Tensor) -> torch.Tensor:
    """A flagos tensor seen as a native-device tensor, to compare without routing anything."""
    if t.device.type != "flagos":
        return t
    return torch_fl.as_cuda(t) if torch_fl.accelerator() == "cuda" else t.cpu()


def is_cuda_error(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "AcceleratorError" or "CUDA error" in text or "illegal memory" in text


@dataclass
class CallResult:
    signature: str
    stage: str
    status: str  # pass / mismatch / error / not-exercised
    message: str = ""


@dataclass
class OpResult:
    op: str
    status: str  # one of STATUSES
    message: str = ""
    calls: list = field(default_factory=list)
    seconds: float = 0.0


def compare(op: str, expected, actual) -> str:
    """'' when `actual` (flaggems) matches `expected` (native) at the tolerance of each tensor's dtype."""
    exp, act = _leaves(expected), _leaves(actual)
    if len(exp) != len(act):
        return f"{len(act)} tensors, expected {len(exp)}"
    for i, (e, a) in enumerate(zip(exp, act, strict=True)):
        if not isinstance(e, torch.Tensor):
            continue
        if a.device.type != e.device.type:
            return f"tensor {i} on {a.device.type}, expected on {e.device.type}"
        rtol, atol = tolerance(e.dtype, op)
        try:
            torch.testing.assert_close(as_native(a), as_native(e), rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as exc:
            return f"tensor {i}: {mismatch_message(exc)}"
    return ""


def replay(op: str, call: dict) -> CallResult:
    """Runs one recorded call natively and with `op` routed to flaggems; compares outputs and arguments."""
    from torch_fl import routing

    func = resolve(op)
    key = call["signature"]

    def fresh():
        return _map(call["args"], restore), _map(call["kwargs"], restore)

    ref_args, ref_kwargs = fresh()
    dut_args, dut_kwargs = fresh()
    ref_exc = None
    try:
        # Native whatever a config or FLAGOS_OP_* variable in the environment says.
        with routing.override({op: "native"}):
            expected = func(*ref_args, **ref_kwargs)
            torch.flagos.synchronize()
    except Exception as exc:  # noqa: BLE001  (the reference's error is what flaggems must match)
        ref_exc = exc
    with CallCounter(op) as counter, routing.override({op: "flaggems"}):
        try:
            actual = func(*dut_args, **dut_kwargs)
            torch.flagos.synchronize()
        except Exception as exc:  # noqa: BLE001
            if is_cuda_error(exc):
                raise
            if ref_exc is not None and isinstance(exc, type(ref_exc)):
                return CallResult(key, call["stage"], "pass")
            return CallResult(key, call["stage"], "error", opinfo_harness.short_message(exc))
    if ref_exc is not None:
        return CallResult(
            key, call["stage"], "mismatch", f"native raised {opinfo_harness.short_message(ref_exc)}"
        )
    if counter.calls == 0:
        return CallResult(key, call["stage"], "not-exercised", "FlagGems' function was not called")
    message = compare(op, expected, actual) or compare(op, (ref_args, ref_kwargs), (dut_args, dut_kwargs))
    return CallResult(key, call["stage"], "mismatch" if message else "pass", message)


def op_status(calls: list[CallResult]) -> tuple[str, str]:
    for status in ("error", "mismatch"):
        failed = next((c for c in calls if c.status == status), None)
        if failed is not None:
            return "fail", f"{status} at {failed.signature} ({failed.stage}): {failed.message}"
    if any(c.status == "pass" for c in calls):
        return "pass", ""
    return "not-exercised", "FlagGems' function was not called by any recorded call"


def run_worker(args) -> int:
    with open(args.worker) as f:
        task = json.load(f)
    reason = common.check_environment(stand_in=args.stand_in)
    if reason:
        print(f"flaggems_model_sweep worker: {reason}", file=sys.stderr)
        return 2
    recording = torch.load(task["recording"], weights_only=False, mmap=True)
    with open(args.results, "a") as out:

        def emit(record: dict) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        for item in task["items"]:
            op = item["op"]
            if time.time() > task["deadline"]:
                return 0
            emit({"begin": op})
            start = time.perf_counter()
            results = []
            for key, call in recording[op].items():
                try:
                    results.append(replay(op, {**call, "signature": key}))
                except Exception as exc:  # noqa: BLE001
                    if not is_cuda_error(exc):
                        raise
                    # The context is gone: the parent marks the op begun last as crashed.
                    print(
                        f"flaggems_model_sweep: {op} at {key}: {opinfo_harness.short_message(exc)}",
                        file=sys.stderr,
                    )
                    sys.stderr.flush()
                    os._exit(CUDA_ERROR_EXIT)
            status, message = op_status(results)
            result = OpResult(
                op, status, message, [asdict(r) for r in results], round(time.perf_counter() - start, 2)
            )
            emit(asdict(result))
    return 0


# ---- 3. outputs ------------------------------------------------------------------------------------------


def extend_to_adapters(results: dict[str, OpResult], adapted: dict[str, str]) -> None:
    """An ``out`` overload served by an adapter (torch_fl._flaggems: FlagGems' functional function, then a
    copy into ``out``) runs the very function of its functional op: where the model never called the
    overload itself, it fails with that op."""
    for op, result in results.items():
        source = results.get(adapted.get(op, ""))
        if result.status == "not-called" and source is not None and source.status in ("fail", "crash"):
            results[op] = OpResult(
                op, source.status, f"its adapter runs FlagGems' function for {source.op}: {source.message}"
            )


_ROUTE = re.compile(r"^\s*(\S+)\s*=\s*flaggems\b")


def candidate_ops(config: str) -> list[str]:
    """The ops `config` routes to flaggems (the router's reading of it, includes and all)."""
    from torch_fl import routing

    routing.load_config(config)
    try:
        return sorted(op for op, route in routing.table().items() if route["requested"] == "flaggems")
    finally:
        routing.load_config(None)


def write_config(path: str, config: str, results: dict[str, OpResult], header: dict) -> None:
    """`config` without the routes of the ops that failed or crashed here, which it lists with the reason."""
    excluded = {op: r for op, r in results.items() if r.status in ("fail", "crash")}
    with open(config) as f:
        lines = f.read().splitlines()
    kept = []
    for line in lines:
        match = _ROUTE.match(line)
        if not (match and match.group(1) in excluded):
            kept.append(line)
    first_route = next((i for i, line in enumerate(kept) if not line.startswith("#")), len(kept))
    note = [
        f"# Model shapes (tools/flaggems_model_sweep.py, Qwen3 {header['shape']}: {header['environment']}, "
        f"{header['date']}):",
        f"# the calls of {header['recorded_ops']} routed ops replayed; {len(excluded)} excluded below.",
    ]
    kept[first_route:first_route] = [*note, "#"] if first_route else note
    if excluded:
        kept += [
            "",
            "# Excluded: wrong or crashing at the calls a Qwen3 model makes (the OpInfo sweep passed them):",
        ]
        for op in sorted(excluded):
            kept.append(f"#   {op}: {excluded[op].status}: {excluded[op].message}"[:300])
    with open(path, "w") as f:
        f.write("\n".join(kept) + "\n")


def write_markdown(path: str, results: dict[str, OpResult], header: dict) -> None:
    intro = (
        f"Model-shape sweep: Qwen3 {header['shape']} ({', '.join(header['stages'])}); "
        f"{header['environment']}, {header['date']}; {header['seconds']:.0f} s."
    )
    common.write_status_markdown(
        path, intro, STATUSES, results, ["calls", "note"], lambda r: [len(r.calls), r.message[:200]]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", help="the routing config whose flaggems routes to check (default: all ops)"
    )
    parser.add_argument("--out-dir", default="flaggems_model_sweep_out")
    parser.add_argument(
        "--shape", default=None, help="Qwen3 shape (default: 0.6b on a GPU, tiny with --stand-in)"
    )
    parser.add_argument("--max-signatures", type=int, default=12, help="recorded calls per op")
    parser.add_argument("--workers", type=int, default=max(1, min(6, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--budget-s", type=float, default=300.0, help="wall time, recording included")
    parser.add_argument("--grace-s", type=float, default=20.0)
    common.add_worker_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args)

    start = time.time()
    reason = common.check_environment(stand_in=args.stand_in)
    if reason:
        print(f"flaggems_model_sweep: cannot run here: {reason}", file=sys.stderr)
        return 2
    from torch_fl import _flaggems

    shape = args.shape or ("tiny" if args.stand_in else "0.6b")
    os.makedirs(args.out_dir, exist_ok=True)

    def log(message: str) -> None:
        print(f"flaggems_model_sweep [{time.time() - start:.0f} s]: {message}", flush=True)

    routable = set(_flaggems.routable_ops())
    ops = candidate_ops(args.config) if args.config else sorted(routable)
    unknown = [op for op in ops if op not in routable]
    if unknown:
        log(f"not routable FlagGems ops here, left as they are: {', '.join(unknown)}")
    ops = [op for op in ops if op in routable]
    log(f"{common.environment_line()}; {len(ops)} ops")
    calls = record(set(ops), shape, args.max_signatures, log)
    stages = sorted({c["stage"] for per_op in calls.values() for c in per_op.values()})
    tmp = tempfile.mkdtemp(prefix="flaggems_model_sweep_")
    recording = os.path.join(tmp, "recording.pt")
    torch.save({op: per_op for op, per_op in calls.items() if per_op}, recording)
    log(
        f"recorded {sum(len(c) for c in calls.values())} calls of {len(calls)} ops ({os.path.getsize(recording) >> 20} MiB)"
    )

    called = sweep.priority_order([op for op in ops if calls.get(op)])
    command = [sys.executable, "-m", "tools.flaggems_model_sweep"] + (["--stand-in"] if args.stand_in else [])
    records = common.run_phase(
        "model",
        [{"op": op} for op in called],
        {"recording": recording},
        args,
        start + args.budget_s,
        lambda r: r["op"] if "op" in r else r.get("crash"),
        command=command,
    )
    results = {op: OpResult(op, "not-called", "the model's workloads do not call it") for op in ops}
    results.update({op: OpResult(op, "not-run", "the time budget ran out before it") for op in called})
    for r in records:
        if "crash" in r:
            why = (
                "a CUDA error (see the log)"
                if r["returncode"] == CUDA_ERROR_EXIT
                else f"exit status {r['returncode']}"
            )
            results[r["crash"]] = OpResult(r["crash"], "crash", f"the process died: {why}")
        else:
            results[r["op"]] = OpResult(**r)
    extend_to_adapters(results, _flaggems.load().adapted)
    os.remove(recording)
    os.rmdir(tmp)
    header = {
        "environment": common.environment_line(),
        "date": datetime.date.today().isoformat(),
        "shape": shape,
        "stages": stages,
        "recorded_ops": len(called),
        "seconds": time.time() - start,
    }
    with open(os.path.join(args.out_dir, "model_sweep.json"), "w") as f:
        json.dump({**header, "results": [asdict(r) for r in results.values()]}, f, indent=1)
    if args.config:
        write_config(os.path.join(args.out_dir, "flaggems_cuda.conf"), args.config, results, header)
    write_markdown(os.path.join(args.out_dir, "model_sweep.md"), results, header)
    log(f"{dict(collections.Counter(r.status for r in results.values()))}; outputs in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
