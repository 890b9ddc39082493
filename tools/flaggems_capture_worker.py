"""What runs inside a worker process of the FlagGems capture audit (tools/flaggems_capture_audit.py, whose
docstring describes the audit): one op at a time from the parent, its call recorded, captured cold and
after warm-up, replayed and compared with eager (``audit_op``), and the result sent back (``run_worker``).
The parent starts a worker as ``python -m tools.flaggems_capture_audit --worker -``, whose ``main`` calls
``run_worker``.

A worker takes no further op after a capture that failed once ``capture_begin`` had succeeded (cold or
warm): on torch 2.11 such a capture leaves the CUDA generator in capture mode, and every later random op in
the process (samples are drawn with random ops) raises "Offset increment outside graph capture encountered
unexpectedly". The op's result then carries ``replace_worker`` (``must_end``), the worker exits after
sending it, and the parent starts a fresh worker for the next op. A random op whose cold capture failed
so has its warm-up and warm capture in the fresh worker too (``retry_warm``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import warnings

import torch

from harness import opinfo as opinfo_harness
from harness.flaggems import RouteCallCounter, bitwise_equal
from harness.opinfo_variants import move_for_variant, run_variant, split_case
from tools import flaggems_common as common
from tools import flaggems_model_sweep as model_sweep
from tools.flaggems_capture_ops import (
    diagnose,
    difference,
    error_record,
    family,
    is_random,
    short_path,
    within_tolerance,
)

BACKEND = "flaggems"  # the backend audited (``--backend native``: a dry run of the capture checks themselves)
CONTEXT_BROKEN_EXIT = model_sweep.CUDA_ERROR_EXIT  # a worker's exit status once its device context is gone
SEED = 1234
PROTOCOL = "@@audit "  # prefix of the worker's lines to the parent (on a stdout of its own)
REPLACED_EXIT = 0  # a worker's exit status when it ends after a failed capture (replace_worker)

# The ops of this process's captures that failed after capture_begin had succeeded (spoils_process): the
# worker takes no further op once there is one.
FAILED_CAPTURES: list[str] = []

# ---- one op in a worker ---------------------------------------------------------------------------------


def native_type() -> str:
    return "cuda" if common.REFERENCE[0] == "cuda" else "cpu"


def to_flagos(tree):
    """A recorded argument tree (snapshots of native aliases) as fresh flagos tensors; native devices named
    in it (a ``device=`` argument) name flagos."""

    def restore(snap):
        on_native = torch.device(snap["device"]).type == native_type()
        return model_sweep.restore({**snap, "device": "flagos"} if on_native else snap)

    def devices(x):
        if isinstance(x, torch.device) and x.type == native_type():
            return torch.device("flagos", torch.flagos.current_device())
        if isinstance(x, (list, tuple)):
            return type(x)(devices(v) for v in x)
        if isinstance(x, dict):
            return {k: devices(v) for k, v in x.items()}
        return x

    return devices(model_sweep._map(tree, restore))


def record_call(op: str, item: dict, db: dict, sample_timeout_s: float) -> dict:
    """Runs the op's OpInfo cases (first sample) with the op on the python backend, recording its arguments
    and running the native kernel; the first recorded call: {"case", "dtype", "signature", "args",
    "kwargs"} (snapshots), or {"error": why not}."""
    from torch_fl import routing

    native = model_sweep.resolve(op)
    calls: list[dict] = []
    context = {}

    def recorder(*args, **kwargs):
        snap = None
        if not calls:  # before the call: in-place and out= calls change their arguments
            snap = (
                model_sweep._map(args, model_sweep.snapshot),
                model_sweep._map(kwargs, model_sweep.snapshot),
            )
        result = native(*args, **kwargs)
        if snap is not None:  # only a call that runs natively
            calls.append({**context, "signature": model_sweep.signature(op, args, kwargs), "args": snap[0]})
            calls[-1]["kwargs"] = snap[1]
        return result

    tried = []
    routing.register_python_impl(op, recorder)
    try:
        for case in item["cases"][:4]:
            opinfo_key, variant = split_case(case)
            opinfo = db.get(opinfo_key)
            if opinfo is None:
                tried.append(f"{case}: no such OpInfo")
                continue
            supported = opinfo_harness.supported_dtypes(opinfo, common.REFERENCE[0])
            dtype = next(
                (
                    opinfo_harness.parse_dtype(d)
                    for d in item["dtypes"]
                    if opinfo_harness.parse_dtype(d) in supported
                ),
                None,
            )
            if dtype is None:
                tried.append(f"{case}: none of {'/'.join(item['dtypes'])}")
                continue
            context.update(case=case, dtype=opinfo_harness.dtype_name(dtype))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    with opinfo_harness.time_limit(sample_timeout_s):
                        torch.manual_seed(0)
                        samples = opinfo.sample_inputs(
                            common.REFERENCE[0], dtype, requires_grad=variant == "grad"
                        )
                        sample = next(iter(samples), None)
                        if sample is not None:
                            run_variant(opinfo, variant, move_for_variant(sample, variant, "flagos"))
                except Exception as exc:  # noqa: BLE001  (a failing sample may still have reached the op)
                    tried.append(f"{case}: {opinfo_harness.short_message(exc, 120)}")
            if calls:
                return calls[0]
            tried.append(f"{case} ({context['dtype']}): did not reach the op")
    finally:
        routing.unregister_python_impl(op)
    return {"error": "; ".join(tried) or "no OpInfo case"}


class Static:
    """One set of the call's arguments on flagos, which captures and replays keep using; ``reset()`` puts
    the recorded values back (whole storages, outside any capture)."""

    def __init__(self, op: str, call: dict):
        self.args, self.kwargs = to_flagos(call["args"]), to_flagos(call["kwargs"])
        self.inputs = model_sweep._leaves((self.args, self.kwargs))
        self.pristine = [self._flat(t).clone() for t in self.inputs]
        # out= arguments: written, never read, so resetting them proves nothing (an empty one stays as the
        # last call left it); a replay's check overwrites them instead.
        names = {a.name for a in model_sweep.resolve(op)._schema.arguments if a.is_out}
        self.outs = {id(t) for t in model_sweep._leaves({k: v for k, v in self.kwargs.items() if k in names})}

    @staticmethod
    def _flat(t: torch.Tensor) -> torch.Tensor:
        extent = t.storage_offset() + (
            sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1 if t.numel() else 0
        )
        return t.detach().as_strided((extent,), (1,), 0)

    def reset(self) -> None:
        with torch.no_grad():
            for t, flat in zip(self.inputs, self.pristine, strict=True):
                if flat.numel() and self._flat(t).numel() >= flat.numel():
                    self._flat(t)[: flat.numel()].copy_(flat)

    def storages(self) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in self.inputs if t.numel()}

    def leaves(self, result) -> list[torch.Tensor]:
        """What a call gives: its result's tensors and the arguments (in-place and out= calls change them)."""
        return model_sweep._leaves((result, self.args, self.kwargs))


def poison(outputs: list[torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """Overwrites each output (a graph's own memory, not an input) with values that differ from eager's,
    outside the capture; returns what was written (CPU), to tell a graph that never writes its outputs."""
    written: list[torch.Tensor | None] = []
    with torch.no_grad():
        for t, e in zip(outputs, like, strict=False):
            if t.numel() == 0 or t.shape != e.shape or t.dtype != e.dtype:
                written.append(None)
                continue
            if t.is_floating_point() or t.is_complex():
                t.fill_(float("nan"))
            elif t.dtype == torch.bool:
                t.copy_(~e.to(t.device))
            else:
                t.copy_((e + 1).to(t.device))
            written.append(t.cpu())
    return written


def context_usable() -> tuple[bool, str]:
    """Whether the device still works (a failed capture can leave the CUDA context unusable)."""
    try:
        t = torch.arange(8, device="flagos", dtype=torch.float32)
        value = float((t * 2).sum().cpu())
        torch.flagos.synchronize()
        if torch.flagos.is_current_stream_capturing():
            return False, "the current stream is still capturing"
        return value == 56.0, "" if value == 56.0 else f"wrong result {value} of a native op"
    except Exception as exc:  # noqa: BLE001
        return False, opinfo_harness.short_message(exc)


def capture(op: str, func, static: Static, stream) -> tuple[object, object, dict]:
    """Captures one call on `stream` with the op routed to the backend: (graph, outputs, record)."""
    from torch_fl import routing

    graph = torch.flagos.FlagosGraph()
    record: dict = {}
    start = time.perf_counter()
    out = None
    began = False  # capture_begin succeeded (the context manager's body ran)
    with RouteCallCounter(op) as counter, routing.override(routed(op)), torch.no_grad():
        try:
            with torch.flagos.graph(graph, stream=stream):
                began = True
                out = func(*static.args, **static.kwargs)
            record["captured"] = True
        except Exception as exc:  # noqa: BLE001
            record.update(captured=False, began=began, **error_record(exc))
            if spoils_process(record):
                FAILED_CAPTURES.append(op)
            try:
                graph.reset()
            except Exception:  # noqa: BLE001
                pass
            graph, out = None, None
    # FlagGems ran while capturing (backed: it launched), in Python or replayed from recorded launches.
    record["flaggems_calls"] = counter.calls + counter.replayed
    record["seconds"] = round(time.perf_counter() - start, 3)
    if not record["captured"]:
        record["diagnosis"] = diagnose(op, record)
        record["context_ok"], why = context_usable()
        if why:
            record["context_error"] = why
    return graph, out, record


def spoils_process(record: dict) -> bool:
    """Whether `record` (capture's) is of a capture that failed after capture_begin had succeeded, in its
    body or at capture_end. On torch 2.11 such a capture leaves the CUDA generator in capture mode: every
    later random op in the process raises "Offset increment outside graph capture encountered unexpectedly"
    (torch 2.13 keeps one generator state per capture), so the process must take no further op."""
    return record.get("captured") is False and bool(record.get("began"))


def must_end(result: dict) -> bool:
    """Whether the worker that sent `result` (an op's) takes no further op: its device context is unusable
    (``exit``), or a capture failed in it after capture_begin (``replace_worker``). The worker exits after
    sending it; the parent gives it no more work, and a fresh worker takes the next op."""
    return bool(result.get("exit") or result.get("replace_worker"))


def replay_check(op: str, graph, out, static: Static, eager: list[torch.Tensor], record: dict) -> None:
    """Replays `graph` (inputs reset, what it writes overwritten first) twice, comparing with `eager`;
    random ops: seeded as eager was, then a third replay must draw other numbers."""
    inputs = static.storages()
    results_count = len(model_sweep._leaves(out))
    # What the graph writes: its own outputs (not an input returned again) and the out= arguments, each
    # with the index of its eager counterpart.
    own, seen = [], set()
    for i, t in enumerate(static.leaves(out)):
        mine = i < results_count and t.untyped_storage().data_ptr() not in inputs
        if (mine or id(t) in static.outs) and id(t) not in seen:
            seen.add(id(t))
            own.append((i, t))
    results, stale = [], []
    for _ in range(2):
        static.reset()
        poison([t for _, t in own], [eager[i] for i, _ in own])
        before = [t.cpu() for t in static.leaves(out)]
        if is_random(op):
            torch.manual_seed(SEED)
        graph.replay()
        torch.flagos.synchronize()
        results.append([t.cpu() for t in static.leaves(out)])
        # A tensor the call changes (eager's differs from it) that the replay left as it was: the graph does
        # not contain the work (it ran eagerly while capturing, or on a stream outside the capture).
        stale += [
            i
            for i, (b, e, a) in enumerate(zip(before, eager, results[-1], strict=False))
            if not bitwise_equal(b, e) and bitwise_equal(b, a)
        ]
    equal, message = difference(eager, results[0])
    again, again_message = difference(eager, results[1])
    record["replay_equal"] = equal and again
    record["replay_message"] = message or again_message
    if stale:
        record["replay_message"] = (
            f"the replay leaves tensor {stale[0]} as it was: the graph does not contain the work "
            "(it ran outside the capture)"
        )
    record["replay_ok"] = record["replay_equal"]
    if is_random(op):
        static.reset()
        graph.replay()  # not seeded again: fresh numbers expected
        torch.flagos.synchronize()
        fresh = [t.cpu() for t in static.leaves(out)]
        record["fresh_per_replay"] = not difference(results[1], fresh)[0]
        if not record["fresh_per_replay"]:
            record["replay_ok"] = False
            record["replay_message"] = "replays repeat the numbers drawn at capture (random state frozen)"


def checked_replay(op: str, graph, out, static: Static, eager: list[torch.Tensor], record: dict) -> bool:
    """replay_check, an error in it recorded; then the graph reset. False when the device is unusable."""
    try:
        replay_check(op, graph, out, static, eager, record)
    except Exception as exc:  # noqa: BLE001
        failed = error_record(exc)
        record.update(replay_ok=False, replay_equal=False, replay_message=f"replay raised {failed['error']}")
        record["replay_frames"] = failed["frames"]
        ok, why = context_usable()
        if not ok:
            record["context_error"] = why
            return False
    try:
        graph.reset()
    except Exception:  # noqa: BLE001
        pass
    return True


def eager_calls(op: str, func, static: Static, stream, n: int, record: dict) -> list[torch.Tensor] | None:
    """`n` eager calls on `stream`, inputs reset before each; the last call's outputs (CPU), or None when
    one raised. Counts FlagGems calls and (backed by CUDA) host syncs per call. Only the call itself runs
    with the op routed to the backend (resetting and reading back use copies, which may be the op)."""
    from torch_fl import routing

    sync_debug = torch_fl_backed() and hasattr(torch.cuda, "set_sync_debug_mode")
    outputs: list[list[torch.Tensor]] = []
    seconds, syncs, where = [], [], ""
    counter = RouteCallCounter(op)
    stream.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(stream), torch.no_grad():
        for _ in range(n):
            static.reset()
            if is_random(op):
                torch.manual_seed(SEED)
            stream.synchronize()
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with counter, routing.override(routed(op)):
                        if sync_debug:
                            torch.cuda.set_sync_debug_mode("warn")
                        try:
                            result = func(*static.args, **static.kwargs)
                        finally:
                            if sync_debug:
                                torch.cuda.set_sync_debug_mode(0)
                except Exception as exc:  # noqa: BLE001
                    record.update(eager_ok=False, flaggems_calls=counter.calls, **error_record(exc))
                    record["eager_error"] = record.pop("error")
                    torch.flagos.current_stream().wait_stream(stream)
                    return None
            stream.synchronize()
            seconds.append(round(time.perf_counter() - start, 3))
            found = [w for w in caught if "synchronizing" in str(w.message)]
            syncs.append(len(found))
            if found and not where:
                where = f"{short_path(found[0].filename)}:{found[0].lineno}"
            outputs.append([t.cpu() for t in static.leaves(result)])
    torch.flagos.current_stream().wait_stream(stream)
    record.update(eager_ok=True, flaggems_calls=counter.calls, eager_seconds=seconds)
    if sync_debug:
        record["host_syncs_per_call"] = syncs
        if where:
            record["host_sync_at"] = where
    if len(outputs) >= 2:
        record["eager_deterministic"] = difference(outputs[-2], outputs[-1])[0]
    return outputs[-1]


def routed(op: str) -> dict[str, str]:
    """The override for the audited call: the op on the backend (``--backend native``: no rule at all, the
    default route; on the simulated accelerator a rule naming an op makes its calls bypass graph capture)."""
    return {op: BACKEND} if BACKEND != "native" else {}


def torch_fl_backed() -> bool:
    return common.torch_fl.accelerator() == "cuda"


def audit_op(item: dict, db: dict, stream, args, emit) -> dict:
    """One op: record its call, cold capture (unless item["skip_cold"]), eager warm-up, warm capture."""
    op = item["op"]
    start = time.perf_counter()
    result: dict = {"op": op, "family": family(op)}
    emit({"phase": "record", "op": op})
    call = record_call(op, item, db, args.sample_timeout)
    if "error" in call:
        result.update(status="no-sample", reason=call["error"][:300])
        return result
    result.update(case=call["case"], dtype=call["dtype"], signature=call["signature"][:300])
    func = model_sweep.resolve(op)
    cold_graph = cold_out = cold_static = None
    if not item.get("skip_cold"):
        emit({"phase": "cold", "op": op})
        cold_static = Static(op, call)
        cold_graph, cold_out, cold = capture(op, func, cold_static, stream)
        result["cold"] = cold
        emit({"partial": op, "cold": cold})
        if not cold.get("captured") and not cold.get("context_ok"):
            result["retry_warm"] = "the device context was unusable after the cold capture failed"
            result["exit"] = True
            return result
        if is_random(op) and spoils_process(cold):  # its eager calls here would raise (torch 2.11)
            result["retry_warm"] = "the failed cold capture left the random generator in capture mode"
            return result
    emit({"phase": "warm", "op": op})
    warm: dict = {}
    result["warm"] = warm
    static = Static(op, call)
    eager = eager_calls(op, func, static, stream, args.warmup, warm)
    if eager is None:
        warm["context_ok"], why = context_usable()
        if why:
            warm["context_error"] = why
        result["exit"] = not warm["context_ok"]
    else:  # also where FlagGems did not run (then it is not-exercised, whatever the capture)
        graph, out, captured = capture(op, func, static, stream)
        warm.update(
            {f"capture_{k}" if k in ("seconds", "flaggems_calls") else k: v for k, v in captured.items()}
        )
        if graph is not None:
            emit({"phase": "warm replay", "op": op})
            result["exit"] = not checked_replay(op, graph, out, static, eager, warm)
            if warm.get("replay_equal") is False and not warm.get("eager_deterministic", True):
                # Eager itself differs between calls (atomics): the replay is judged at the sweep's tolerance.
                warm["replay_ok"] = within_tolerance(op, eager, [t.cpu() for t in static.leaves(out)])
        elif not captured.get("context_ok"):
            result["exit"] = True
        if cold_graph is not None and not result.get("exit"):
            emit({"phase": "cold replay", "op": op})
            result["exit"] = not checked_replay(op, cold_graph, cold_out, cold_static, eager, result["cold"])
    cold = result.get("cold")
    if cold is not None and not cold.get("captured") and warm.get("captured") is False:
        result["retry_warm"] = "the warm capture failed after a failed cold capture in the same process"
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


# ---- workers ---------------------------------------------------------------------------------------------


def process_warmup(stream) -> dict:
    """Set-up no op owns, before any op: a native op, a native graph capture and replay (CUDA's first
    capture allocates generator state), and (backed by CUDA) a Triton kernel of this tool's own, which
    initialises Triton's driver and launcher in the process."""
    done = {}
    x = torch.ones(64, device="flagos")
    torch.flagos.synchronize()
    done["native_op"] = float((x * 2).sum().cpu()) == 128.0
    graph = torch.flagos.FlagosGraph()
    with torch.flagos.graph(graph, stream=stream):
        y = x * 3
    graph.replay()
    torch.flagos.synchronize()
    done["native_capture"] = bool(torch.equal(y.cpu(), torch.full((64,), 3.0)))
    graph.reset()
    if not torch_fl_backed():
        return done
    try:
        from tools.flaggems_capture_kernel import fill_kernel  # imports triton: only where it is real

        out = torch.zeros(256, device="cuda")
        fill_kernel[(2,)](out, 256, 1.5, BLOCK=128)
        torch.cuda.synchronize()
        done["triton_kernel"] = float(out.sum()) == 384.0
    except Exception as exc:  # noqa: BLE001
        done["triton_kernel"] = opinfo_harness.short_message(exc)
    return done


def run_worker(args) -> int:
    """A worker: ops from stdin (JSON lines) until {"stop"}, or until an op's result must end it
    (``must_end``); records to the parent on a stdout of its own, everything else printed goes to stderr
    (the worker's log)."""
    global BACKEND
    BACKEND = args.backend
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def emit(record: dict) -> None:
        channel.write(PROTOCOL + json.dumps(record, default=str) + "\n")
        channel.flush()

    reason = common.check_environment(stand_in=args.stand_in)
    if reason:
        emit({"fatal": reason})
        return 2
    start = time.perf_counter()
    db = opinfo_harness.load_op_db()
    stream = torch.flagos.Stream()
    warmup = process_warmup(stream) if not args.no_process_warmup else {}
    gc.collect()
    gc.freeze()  # op_db is large: every capture collects garbage, which would walk it each time
    emit({"ready": True, "startup_s": round(time.perf_counter() - start, 1), "process_warmup": warmup})
    for line in sys.stdin:
        item = json.loads(line)
        if item.get("stop"):
            break
        emit({"begin": item["op"]})
        try:
            result = audit_op(item, db, stream, args, emit)
        except Exception as exc:  # noqa: BLE001  (the audit's own failure: reported, and the process ends)
            result = {
                "op": item["op"],
                "status": "crash",
                "reason": f"the audit failed: {opinfo_harness.short_message(exc)}",
            }
            result.update(**error_record(exc))
            result["exit"] = not context_usable()[0]  # a bug of the audit's own need not end the worker
            if model_sweep.is_cuda_error(exc):
                result["reason"] = f"a CUDA error: {opinfo_harness.short_message(exc)}"
        if FAILED_CAPTURES and not result.get("exit"):  # (an unusable context ends the worker anyway)
            failed = ", ".join(dict.fromkeys(FAILED_CAPTURES))
            result["replace_worker"] = (
                f"a capture failed after capture_begin in this worker ({failed}): torch 2.11 leaves the CUDA "
                "generator in capture mode, later random ops in it would fail"
            )
        emit({"result": result})
        if must_end(result):
            sys.stderr.flush()
            os._exit(CONTEXT_BROKEN_EXIT if result.get("exit") else REPLACED_EXIT)
    return 0
