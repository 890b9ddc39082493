"""FlagGems under graph capture: which ops of a routing config can be captured with ``torch.flagos.graph``,
cold and after warm-up, and what stops the others.

For every op the config (default: the shipped ``torch_fl/configs/flaggems_cuda.conf``) routes to
``flaggems``, one call of it is audited on flagos with only that op routed to ``flaggems``:

1. The call: the OpInfo cases that passed the correctness sweep for the op (the config's comment on its
   route lists them; ``--map-in`` takes a sweep's ``flaggems_sweep.json`` instead), tried in order (the
   function, out=, in-place, backward), the first sample in one dtype (``--dtypes``: the first the
   sweep passed and the OpInfo supports). The sample runs with the op on the ``python`` backend, which
   records the op's arguments and runs the native kernel (FlagGems stays cold), as the sweep's discovery
   does; the first call of the op is the one audited, replayed as ``torch.ops.aten.<op>``.
2. Cold capture: the call captured with ``torch.flagos.graph`` without any earlier call of the op's
   FlagGems function in the process. Recorded: success or the error (the exception chain, where it was
   raised in FlagGems or Triton), whether the device is still usable afterwards (a worker whose context
   a failed capture broke ends, and the op's warm capture runs in a fresh worker), and later whether
   the cold graph's replay equals eager.
3. Warm capture: three eager calls on a side stream (as torch.cuda's graph docs advise; the FlagGems call
   counter confirms FlagGems ran; torch's CUDA sync debug mode counts host syncs per call), then a capture
   on that stream and two replays. Before each replay the inputs are reset and the outputs the graph
   allocated are overwritten (NaN, or values that differ from eager's), so a graph that does not
   compute them cannot pass; the replays' outputs (and the arguments in-place and out= calls change)
   are compared with the last eager call's bitwise (torch.equal; NaNs by their bits). Random ops are
   seeded before the eager call and the replay, and a third replay must draw other numbers. Where the
   warm capture fails after a failed cold capture, it is tried again in a fresh worker, so that a cold
   failure that breaks the process is told apart from an op that cannot be captured.

Per op: ``capturable-cold``, ``capturable-after-warmup``, ``not-capturable`` (with the error and a
diagnosis: autotuning, Triton compile or kernel load, host sync, device query, allocation, data-dependent
output size, host return value, random state frozen at capture, work not captured), ``fails-eager``,
``not-exercised`` (FlagGems' function never ran), ``crash`` (the worker died), ``timeout``
(``--op-timeout-s``), ``no-sample``, ``not-run`` (``--budget-s`` ran out). Transformer ops (those of a
Qwen3 forward, then the sweep's PRIORITY) run first, so a budget cut leaves the least important ops.

Workers (``--workers`` processes) take ops one at a time from the parent. "Cold" is per op family: a
worker is given only ops whose family (the op's base name: ``add.Tensor``, ``add.out`` and ``add_.Tensor``
are one family, which shares FlagGems functions and Triton kernels) it has not run, and a worker with
none left is replaced by a fresh one. Each worker first runs process-wide set-up that no op owns (a native
op, a native graph capture, a Triton kernel of its own: ``--no-process-warmup`` skips it), and gets its
own FlagGems cache directory (no autotuning results from earlier runs); Triton's on-disk cache is shared,
so "cold" may find a kernel compiled already (by another worker or run), but never loaded in the process.

Outputs in ``--out-dir``: ``capture_audit.json`` (everything) and ``capture_audit.md`` (a table op |
status | cold | warm | replay==eager | reason), and ``logs/worker-N.log`` (each worker's stderr). Both
are rewritten every 15 s while it runs ("partial": true in the JSON), and SIGTERM (``timeout``) stops it
with its outputs written; ``--resume FILE`` audits only the ops an earlier run did not reach.

    python -m tools.flaggems_capture_audit --out-dir /tmp/capture
    python -m tools.flaggems_capture_audit --out-dir /tmp/c --ops aten::_softmax,aten::bmm --workers 2 -v

Needs an NVIDIA GPU, flagos on the cuda accelerator, FlagGems usable, and ``expecttest``. ``--stand-in``
runs it on the simulated accelerator with tests/fake_flaggems, a dry run of the pipeline on a machine
without a GPU; there no flaggems call can be captured (the python route reads its aliases as host memory,
a blocking copy the capture refuses), and ``--backend native`` checks the capture checks themselves.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import importlib.util
import json
import linecache
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings

import torch

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (os.path.join(_REPO, "tests"), _REPO):  # `opinfo` (tests/opinfo) and `tools`, also as a script
    if _path not in sys.path:
        sys.path.insert(0, _path)

from opinfo import harness  # noqa: E402
from opinfo.variants import move_for_variant, run_variant, split_case  # noqa: E402

from tools import flaggems_common as common  # noqa: E402
from tools import flaggems_model_sweep as model_sweep  # noqa: E402
from tools import flaggems_sweep as sweep  # noqa: E402

STATUSES = (
    "capturable-cold",
    "capturable-after-warmup",
    "not-capturable",
    "fails-eager",
    "not-exercised",
    "crash",
    "timeout",
    "no-sample",
    "not-run",
)
CAPTURABLE = ("capturable-cold", "capturable-after-warmup")
BACKEND = "flaggems"  # the backend audited (``--backend native``: a dry run of the capture checks themselves)
DEFAULT_DTYPES = ("bfloat16", "float32")
CONTEXT_BROKEN_EXIT = model_sweep.CUDA_ERROR_EXIT  # a worker's exit status once its device context is gone
SEED = 1234
SPAWN_MARGIN_S = 25  # no new worker this close to the budget's end (start-up alone takes 5-20 s)
PROTOCOL = "@@audit "  # prefix of the worker's lines to the parent (on a stdout of its own)

# Audited first: the ops a Qwen3 forward reaches on flagos backed by CUDA (projections: mm, or addmm with a
# bias; attention: SDPA's kernels or, in its math form, bmm and softmax; RMSNorm: pow, mean, add, rsqrt,
# mul; rotary embedding: cos, sin, neg, cat; greedy decoding: argmax), then the sweep's PRIORITY.
TRANSFORMER_OPS = (
    "aten::mm",
    "aten::mm.out",
    "aten::addmm",
    "aten::addmm.out",
    "aten::bmm",
    "aten::bmm.out",
    "aten::embedding",
    "aten::index_select",
    "aten::_to_copy",
    "aten::copy_",
    "aten::pow.Tensor_Scalar",
    "aten::mean.dim",
    "aten::add.Tensor",
    "aten::add_.Tensor",
    "aten::add.out",
    "aten::rsqrt",
    "aten::mul.Tensor",
    "aten::mul.out",
    "aten::neg",
    "aten::cat",
    "aten::cat.out",
    "aten::cos",
    "aten::sin",
    "aten::silu",
    "aten::silu.out",
    "aten::_softmax",
    "aten::_softmax.out",
    "aten::_safe_softmax",
    "aten::_flash_attention_forward",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::argmax",
    "aten::argmax.out",
    "aten::rms_norm",
    "aten::arange.start_step",
    "aten::arange",
    "aten::full",
    "aten::ones",
    "aten::zeros",
    "aten::fill_.Scalar",
    "aten::zero_",
    "aten::where.self",
    "aten::masked_fill_.Scalar",
    "aten::triu",
    "aten::eq.Scalar",
)

# Ops whose output size depends on the values (a host sync by design) and random ops, by base name.
DATA_DEPENDENT = frozenset(
    {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "argwhere", "_unique"}
)
RANDOM = frozenset(
    {
        "rand",
        "randn",
        "rand_like",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "normal",
        "uniform",
        "bernoulli",
        "exponential",
        "geometric",
        "log_normal",
        "cauchy",
        "multinomial",
        "native_dropout",
        "dropout",
        "random",
    }
)


def audit_order(ops: list[str]) -> list[str]:
    rank: dict[str, int] = {}
    for op in (*TRANSFORMER_OPS, *sweep.PRIORITY):
        rank.setdefault(op, len(rank))
    return sorted(ops, key=lambda op: (rank.get(op, len(rank)), op))


def base_name(op: str) -> str:
    return op.removeprefix("aten::").partition(".")[0]


def family(op: str) -> str:
    """The op's family: its base name without an in-place underscore (add.Tensor, add.out, add_.Tensor)."""
    name = base_name(op)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def is_random(op: str) -> bool:
    return family(op) in RANDOM


# ---- the config: which ops, which OpInfo cases ----------------------------------------------------------

# A route line of a config the sweep generated:
#   aten::abs = flaggems   # bfloat16/float32, 6 samples: abs, abs@grad
_ROUTE_COMMENT = re.compile(
    r"^\s*(?P<op>\S+)\s*=\s*flaggems\s*#\s*(?P<dtypes>[\w/]+),\s*\d+\s+samples?:\s*(?P<cases>.*)$"
)


def config_cases(path: str) -> dict[str, dict]:
    """op -> {"dtypes": [...], "cases": [...]} from the comments of `path`'s flaggems routes: the dtypes and
    OpInfo cases (``opinfo@variant``) that passed the correctness sweep."""
    found = {}
    with open(path) as f:
        for line in f:
            match = _ROUTE_COMMENT.match(line)
            if match:
                cases = [c.strip() for c in match.group("cases").split(",") if c.strip()]
                found[match.group("op")] = {"dtypes": match.group("dtypes").split("/"), "cases": cases}
    return found


_VARIANT_RANK = {"": 0, "out": 1, "inplace": 2, "grad": 3}


def ordered_cases(cases: list[str]) -> list[str]:
    """The function first, then out=, in-place, backward: the shortest way to the op."""
    return sorted(cases, key=lambda c: _VARIANT_RANK.get(split_case(c)[1], 4))


def guessed_cases(op: str) -> list[str]:
    """For an op without sweep cases: the OpInfo named as the op, in the variant its overload suggests."""
    name, _, overload = op.removeprefix("aten::").partition(".")
    if name.endswith("_") and not name.endswith("__"):
        return [f"{name[:-1]}@inplace"]
    return [f"{name}@out" if "out" in overload else name]


# ---- one op in a worker ---------------------------------------------------------------------------------


class RouteCallCounter(common.CallCounter):
    """The sweep's CallCounter, keeping an ``out`` adapter an adapter: the route then calls FlagGems'
    functional function and copies into ``out`` itself (in C++), as it does without a counter, so that the
    counted call is the call users get."""

    def __enter__(self):
        spec = getattr(self.impl, "_torch_fl_out_adapter", None)
        if spec is None:
            return super().__enter__()
        fn, names = spec

        def counted(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)

        def adapter(*args, **kwargs):
            from torch_fl import _flaggems

            outs = [kwargs.pop(name) for name in names]
            return _flaggems._copy_results(outs, counted(*args, **kwargs))

        adapter._torch_fl_out_adapter = (counted, names)
        common.torch_fl._C._routing_set_flaggems_impl(self.op, adapter)
        return self


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
            supported = harness.supported_dtypes(opinfo, common.REFERENCE[0])
            dtype = next(
                (harness.parse_dtype(d) for d in item["dtypes"] if harness.parse_dtype(d) in supported), None
            )
            if dtype is None:
                tried.append(f"{case}: none of {'/'.join(item['dtypes'])}")
                continue
            context.update(case=case, dtype=harness.dtype_name(dtype))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    with harness.time_limit(sample_timeout_s):
                        torch.manual_seed(0)
                        samples = opinfo.sample_inputs(
                            common.REFERENCE[0], dtype, requires_grad=variant == "grad"
                        )
                        sample = next(iter(samples), None)
                        if sample is not None:
                            run_variant(opinfo, variant, move_for_variant(sample, variant, "flagos"))
                except Exception as exc:  # noqa: BLE001  (a failing sample may still have reached the op)
                    tried.append(f"{case}: {harness.short_message(exc, 120)}")
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


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return False


def difference(expected: list[torch.Tensor], actual: list[torch.Tensor]) -> tuple[bool, str]:
    """(bitwise equal, '' or what differs: the first tensor that does and its greatest difference)."""
    if len(expected) != len(actual):
        return False, f"{len(actual)} tensors, eager gave {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if bitwise_equal(e, a):
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            return False, f"tensor {i}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        if e.dtype == torch.bool:
            return False, f"tensor {i}: {int((e != a).sum())} of {e.numel()} elements differ"
        ed, ad = e.double() if not e.is_complex() else e, a.double() if not a.is_complex() else a
        diff = (ed - ad).abs()
        diff = torch.where(torch.isnan(ed) | torch.isnan(ad), torch.full_like(diff, float("inf")), diff)
        bad = int((diff != 0).sum())
        return (
            False,
            f"tensor {i}: {bad} of {e.numel()} elements differ, max abs diff {float(diff.max()):.3g}",
        )
    return True, ""


def within_tolerance(op: str, expected: list[torch.Tensor], actual: list[torch.Tensor]) -> bool:
    try:
        for e, a in zip(expected, actual, strict=True):
            rtol, atol = common.tolerance(e.dtype, op)
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
    except (AssertionError, ValueError):
        return False
    return len(expected) == len(actual)


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


def error_record(exc: BaseException) -> dict:
    """The exception chain (innermost, the cause, first), the frames where the innermost was raised, and
    the innermost FlagGems and Triton frames."""
    chain = []
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    chain.reverse()
    root = chain[0]
    frames = []
    tb = root.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
        frames.append(f"{_short_path(code.co_filename)}:{tb.tb_lineno} {code.co_name}: {line}"[:240])
        tb = tb.tb_next

    def innermost(pattern: str) -> str:
        return next((f for f in reversed(frames) if re.search(pattern, f.split(" ", 1)[0])), "")

    return {
        "error": harness.short_message(root),
        "errors": [harness.short_message(x) for x in chain],
        "frames": frames[-12:],
        "flaggems_frame": innermost(r"flag_gems"),
        "triton_frame": innermost(r"(^|/)triton/"),
    }


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.relpath(path, _REPO) if path.startswith(_REPO) else path


# Diagnoses of a failed capture, from the frames active when it failed (autotuning and Triton's compiler
# anywhere on the stack; the others in the innermost frames or the messages).
_AUTOTUNE = re.compile(r"autotuner|libtuner|LibTuner|do_bench|bench(mark)?", re.I)
_COMPILE = re.compile(  # not triton/backends/*/driver.py as such: every launch passes through it
    r"(^|/)triton/(compiler/|runtime/build)|triton/backends/\w+/compiler|_init_handles|load_binary"
    r"|make_launcher|\b_do_compile\b"
)
_HOST_SYNC = re.compile(
    r"\.item\(|_local_scalar_dense|\.tolist\(|\.cpu\(|\.numpy\(|blocking copy"
    r"|Cannot copy between CPU and CUDA"
    r"|synchroniz|is_nonzero|\bbool\(",
    re.I,
)
_DEVICE_QUERY = re.compile(
    r"get_device_properties|get_device_capability|device_count|get_device_name|mem_get_info"
    r"|cudaGetDevice|cudaDeviceGetAttribute|get_current_device",
    re.I,
)
_ALLOCATION = re.compile(r"cudaMalloc|CachingAllocator|out of memory|torch\.empty|new_empty|empty_like", re.I)


def host_return(op: str) -> str:
    """The type of a non-tensor return value (``bool`` for aten::equal), or ''."""
    try:
        returns = model_sweep.resolve(op)._schema.returns
    except Exception:  # noqa: BLE001
        return ""
    kinds = [str(r.type) for r in returns]
    return next((k for k in kinds if "Tensor" not in k), "")


def diagnose(op: str, record: dict) -> str:
    frames = record.get("frames", [])
    inner = "\n".join(frames[-3:] + record.get("errors", []))
    host = host_return(op)
    if host:
        return f"returns a host value ({host}): reading it synchronises, by design"
    if any(_AUTOTUNE.search(f.split(": ", 1)[0]) for f in frames):
        return "autotuning: candidate configs benchmarked (timed, synchronising) during the capture"
    if any(_COMPILE.search(f.split(": ", 1)[0]) for f in frames):
        return "Triton compile or kernel load on the first call, during the capture"
    if family(op) in DATA_DEPENDENT:
        return "output size depends on the values: read on the host (sync), by design"
    if _HOST_SYNC.search(inner):
        return "host sync (.item()/.tolist()/.cpu()/blocking copy/synchronize)"
    if _DEVICE_QUERY.search(inner):
        return "device query during the capture"
    if _ALLOCATION.search(inner):
        return "allocation outside the graph's pool"
    return "unknown (see the error and frames)"


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
        return False, harness.short_message(exc)


def capture(op: str, func, static: Static, stream) -> tuple[object, object, dict]:
    """Captures one call on `stream` with the op routed to the backend: (graph, outputs, record)."""
    from torch_fl import routing

    graph = torch.flagos.FlagosGraph()
    record: dict = {}
    start = time.perf_counter()
    out = None
    with RouteCallCounter(op) as counter, routing.override(routed(op)), torch.no_grad():
        try:
            with torch.flagos.graph(graph, stream=stream):
                out = func(*static.args, **static.kwargs)
            record["captured"] = True
        except Exception as exc:  # noqa: BLE001
            record.update(captured=False, **error_record(exc))
            try:
                graph.reset()
            except Exception:  # noqa: BLE001
                pass
            graph, out = None, None
    record["flaggems_calls"] = counter.calls  # FlagGems' function ran while capturing (backed: it launched)
    record["seconds"] = round(time.perf_counter() - start, 3)
    if not record["captured"]:
        record["diagnosis"] = diagnose(op, record)
        record["context_ok"], why = context_usable()
        if why:
            record["context_error"] = why
    return graph, out, record


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
                where = f"{_short_path(found[0].filename)}:{found[0].lineno}"
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

_TRITON_WARMUP_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def fill_kernel(out_ptr, n, value, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, value, mask=offsets < n)
"""


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
        path = os.path.join(tempfile.mkdtemp(prefix="flaggems_capture_audit_"), "capture_audit_warmup.py")
        with open(path, "w") as f:
            f.write(_TRITON_WARMUP_SOURCE)
        spec = importlib.util.spec_from_file_location("capture_audit_warmup", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = torch.zeros(256, device="cuda")
        module.fill_kernel[(2,)](out, 256, 1.5, BLOCK=128)
        torch.cuda.synchronize()
        done["triton_kernel"] = float(out.sum()) == 384.0
    except Exception as exc:  # noqa: BLE001
        done["triton_kernel"] = harness.short_message(exc)
    return done


def run_worker(args) -> int:
    """A worker: ops from stdin (JSON lines) until {"stop"}; records to the parent on a stdout of its own,
    everything else printed goes to stderr (the worker's log)."""
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
    db = harness.load_op_db()
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
                "reason": f"the audit failed: {harness.short_message(exc)}",
            }
            result.update(**error_record(exc))
            result["exit"] = not context_usable()[0]  # a bug of the audit's own need not end the worker
            if model_sweep.is_cuda_error(exc):
                result["reason"] = f"a CUDA error: {harness.short_message(exc)}"
        emit({"result": result})
        if result.get("exit"):
            sys.stderr.flush()
            os._exit(CONTEXT_BROKEN_EXIT)
    return 0


# ---- the parent ------------------------------------------------------------------------------------------


class Worker:
    """A worker process, seen from the parent: what it was given, and what it said so far."""

    def __init__(self, index: int, command: list[str], log_dir: str, cache_root: str, events: queue.Queue):
        self.index = index
        self.log_path = os.path.join(log_dir, f"worker-{index}.log")
        # Only the audited op is ever routed to flaggems: no config or FLAGOS_OP_* routes of the caller's.
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "FLAGOS_BACKEND_CONFIG" and not k.startswith("FLAGOS_OP_")
        }
        # Its own FlagGems cache: no autotuning results of earlier runs or other workers ("cold"), and no
        # concurrent writers of one sqlite file.
        env["FLAGGEMS_CACHE_DIR"] = os.path.join(cache_root, f"flaggems_cache{index}")
        self.log = open(self.log_path, "w")  # noqa: SIM115  (closed when the worker ends)
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, text=True
        )
        self.ready = False
        self.stopping = False
        self.ended = False
        self.touched: set[str] = set()  # op families it has run
        self.item: dict | None = None
        self.began = 0.0
        self.phase = ""
        self.cold: dict | None = None
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                try:
                    events.put((self, json.loads(line[len(PROTOCOL) :])))
                except json.JSONDecodeError:
                    pass
        events.put((self, None))

    def send(self, record: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(record) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def assign(self, item: dict) -> None:
        item = {**item, "ops_before": len(self.touched)}  # earlier ops (other families) in this process
        self.item, self.began, self.phase, self.cold = item, time.time(), "start", None
        self.touched.add(family(item["op"]))
        self.send(item)

    def stop(self) -> None:
        self.stopping = True
        self.send({"stop": True})

    def kill(self) -> None:
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.kill()

    def log_tail(self, lines: int = 6) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = [line.rstrip() for line in f.readlines()[-lines:]]
        except OSError:
            return ""
        return " | ".join(line for line in tail if line)[-500:]


def classify(result: dict) -> dict:
    """Sets status and reason from the cold and warm records (the parent's: after a retry's merge)."""
    if result.get("status") in ("no-sample", "crash", "timeout", "not-run"):
        return result
    cold, warm = result.get("cold") or {}, result.get("warm") or {}
    if not warm:
        why = result.get("retry_warm", "")
        result.update(status="not-run", reason=f"no warm capture: {why}; no fresh worker in the budget")
    elif not warm.get("eager_ok"):
        result.update(status="fails-eager", reason=warm.get("eager_error", ""))
    elif not warm.get("flaggems_calls"):
        result.update(status="not-exercised", reason="FlagGems' function did not run in the eager calls")
    elif warm.get("captured") and warm.get("replay_ok"):
        if cold.get("captured") and cold.get("replay_ok"):
            result.update(status="capturable-cold", reason="")
        elif cold.get("captured"):
            why = cold.get("replay_message") or "not replayed"
            result.update(status="capturable-after-warmup", reason=f"cold capture's replay: {why}")
        elif cold:
            result.update(
                status="capturable-after-warmup", reason=f"cold: {cold['diagnosis']}: {cold['error']}"
            )
        else:
            result.update(status="capturable-after-warmup", reason="cold capture not run")
        if not warm.get("replay_equal"):
            result["reason"] += "; eager differs between calls, the replay is within the sweep's tolerance"
    elif warm.get("captured"):
        result.update(status="not-capturable", reason=f"replay: {warm.get('replay_message')}")
    else:
        result.update(status="not-capturable", reason=f"{warm.get('diagnosis')}: {warm.get('error')}")
    if result.get("retried"):
        result["reason"] += f" (warm capture retried in a fresh worker: {result['retried']})"
    elif result.get("retry_warm") and warm:
        result["reason"] += f" ({result['retry_warm']}; not retried in a fresh worker: no time left)"
    result["reason"] = result["reason"][:500]
    return result


def merge_retry(first: dict, retry: dict) -> dict:
    """The first attempt's cold capture with the warm capture of the fresh worker."""
    merged = {**first, **{k: v for k, v in retry.items() if k not in ("cold", "status", "reason")}}
    merged["first_warm"] = first.get("warm")
    merged["retried"] = first.get("retry_warm", "")
    if retry.get("status") in ("crash", "timeout", "no-sample", "not-run"):
        merged["status"], merged["reason"] = retry["status"], retry.get("reason", "")
    else:
        merged.pop("status", None)
    merged.pop("retry_warm", None)
    return merged


def cell_cold(r) -> str:
    cold = getattr(r, "cold", None) or {}
    if not cold:
        return ""
    if cold.get("captured"):
        if "replay_ok" not in cold:
            return "captured (not replayed)"
        return "ok" if cold["replay_ok"] else f"captured, replay: {cold.get('replay_message', '')}"[:80]
    return f"fails: {cold.get('diagnosis', '')}"[:80] + (
        "" if cold.get("context_ok", True) else " (context lost)"
    )


def cell_warm(r) -> str:
    warm = getattr(r, "warm", None) or {}
    if not warm or not warm.get("eager_ok"):
        return ""
    if warm.get("captured"):
        return "ok" if warm.get("replay_ok") else "captured"
    return f"fails: {warm.get('diagnosis', '')}"[:80]


def cell_replay(r) -> str:
    cells = []
    for name in ("warm", "cold"):
        record = getattr(r, name, None) or {}
        if "replay_equal" in record and record["replay_equal"] is not None:
            cells.append(
                f"{name}: {'equal' if record['replay_equal'] else record.get('replay_message', '')[:60]}"
            )
    return "; ".join(cells)


def write_markdown(path: str, results: dict[str, dict], header: dict) -> None:
    intro = (
        f"Capture audit of `{header['config']}`: {header['environment']}, {header['date']}; one call per op "
        f"({', '.join(header['dtypes'])}), {header['warmup']} eager calls before the warm capture; "
        f"{header['seconds']:.0f} s."
    )
    rows = {op: types.SimpleNamespace(**r) for op, r in results.items()}
    common.write_status_markdown(
        path,
        intro,
        STATUSES,
        rows,
        ["cold", "warm", "replay==eager", "reason"],
        lambda r: [cell_cold(r), cell_warm(r), cell_replay(r), (r.reason or "")[:200]],
    )


def run_parent(args, items: list[dict], log, start: float, checkpoint) -> dict[str, dict]:
    """Hands `items` to up to ``args.workers`` workers, one op at a time (each to a worker that has not run
    its family); returns op -> result. ``checkpoint(results)`` is called every 15 s with the results so far
    (outputs that survive a kill). SIGTERM (``timeout``) ends the run early, its outputs written."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "-",
        "--sample-timeout",
        str(args.sample_timeout),
    ]
    command += ["--warmup", str(args.warmup), "--backend", args.backend]
    command += ["--stand-in"] * args.stand_in + ["--no-process-warmup"] * args.no_process_warmup
    log_dir = os.path.join(args.out_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    cache_root = tempfile.mkdtemp(prefix="flaggems_capture_audit_")
    deadline = start + args.budget_s
    events: queue.Queue = queue.Queue()
    pending = list(items)
    results: dict[str, dict] = {}
    workers: list[Worker] = []
    first_attempts: dict[str, dict] = {}  # op -> its first result, while its warm capture is retried
    startup_failures = 0
    terminated = []
    last_checkpoint = time.time()
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))

    def finish(worker: Worker, item: dict, result: dict) -> None:
        op = item["op"]
        if op in first_attempts:
            result = merge_retry(first_attempts.pop(op), result)
        elif result.get("retry_warm") and time.time() < deadline - 10:
            first_attempts[op] = result
            pending.insert(0, {k: v for k, v in item.items() if k != "ops_before"} | {"skip_cold": True})
            return
        result = classify(result)
        result.pop("exit", None)
        result.update(worker=worker.index, ops_before_in_worker=item.get("ops_before"))
        results[op] = result
        if args.verbose:
            log(f"{op}: {result['status']} {result.get('reason', '')}"[:300])

    def give_work(worker: Worker) -> None:
        if time.time() < deadline:
            for i, item in enumerate(pending):
                if family(item["op"]) not in worker.touched:
                    worker.assign(pending.pop(i))
                    return
        worker.stop()  # nothing it can run cold (a fresh worker takes over) or no time left

    def lose(worker: Worker, status: str, why: str) -> None:
        item, worker.item = worker.item, None
        if item is not None:
            result = {"op": item["op"], "family": family(item["op"]), "status": status, "reason": why[:500]}
            if worker.cold is not None:
                result["cold"] = worker.cold
            finish(worker, result=result, item=item)

    while True:
        now = time.time()
        if terminated:
            log("terminated (SIGTERM): the running ops are stopped, the outputs written")
            for w in workers:
                if w.item is not None and not w.ended:
                    w.kill()
                    lose(w, "not-run", f"the run was terminated while it ran (phase {w.phase})")
            break
        if now - last_checkpoint > 15:
            checkpoint(results)
            last_checkpoint = now
        live = [w for w in workers if not w.ended]
        if not any(w.item is not None for w in live) and (not pending or now >= deadline):
            break
        active = [w for w in live if not w.stopping]
        waiting = [w for w in active if w.item is None]  # starting, or ready and about to be given work
        if now < deadline - SPAWN_MARGIN_S and startup_failures < 3:
            for _ in range(min(args.workers - len(active), len(pending) - len(waiting))):
                workers.append(Worker(len(workers), command, log_dir, cache_root, events))
        elif not live:
            break
        try:
            worker, record = events.get(timeout=0.5)
        except queue.Empty:
            worker, record = None, None
        if worker is not None and record is None:  # its stdout closed: the worker ended
            worker.ended = True
            code = worker.proc.wait()
            if not worker.ready and not terminated:
                startup_failures += 1
                log(f"worker {worker.index} ended before it was ready (exit {code}): {worker.log_tail()}")
            if worker.item is not None:
                why = "a CUDA error" if code == CONTEXT_BROKEN_EXIT else f"exit status {code}"
                lose(
                    worker, "crash", f"the worker died ({why}) in phase {worker.phase}: {worker.log_tail(3)}"
                )
            worker.log.close()
        elif worker is not None:
            if "fatal" in record:
                log(f"worker {worker.index}: {record['fatal']}")
            elif "ready" in record:
                worker.ready = True
                if worker.index == 0 or args.verbose:
                    log(
                        f"worker {worker.index} ready in {record['startup_s']} s; "
                        f"process set-up {record['process_warmup']}"
                    )
                give_work(worker)
            elif "phase" in record:
                worker.phase = record["phase"]
            elif "partial" in record:
                worker.cold = record["cold"]
            elif "result" in record and worker.item is not None:
                item, worker.item = worker.item, None
                ends = bool(record["result"].get("exit"))
                finish(worker, item, record["result"])
                if ends:
                    worker.stopping = True  # it ends by itself: its device context is unusable
                else:
                    give_work(worker)
        now = time.time()
        for w in workers:
            if w.item is None or w.ended:
                continue
            if now > deadline + args.grace_s:
                w.kill()
                lose(w, "not-run", f"the budget ran out while it ran (phase {w.phase})")
            elif now - w.began > args.op_timeout_s:
                w.kill()
                lose(w, "timeout", f"no result after {args.op_timeout_s:g} s (phase {w.phase})")
    for w in workers:
        if w.ended:
            continue
        if w.ready:
            w.stop()
        else:
            w.kill()  # still starting: nothing to wait for
    for w in workers:
        try:
            w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            w.kill()
            w.proc.wait()
    for op, first in first_attempts.items():  # retries the budget did not reach
        first.pop("exit", None)
        results.setdefault(op, classify(first))
    for item in pending:
        if item["op"] not in results:
            reason = "the time budget ran out before it"
            if terminated:
                reason = "the run was terminated (SIGTERM) before it"
            elif startup_failures >= 3:
                reason = f"no worker could start (see {log_dir})"
            results[item["op"]] = {
                "op": item["op"],
                "family": family(item["op"]),
                "status": "not-run",
                "reason": reason,
            }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", default="flaggems_capture_audit_out")
    parser.add_argument(
        "--config",
        help="routing config whose flaggems routes to audit (default: the shipped flaggems_cuda.conf)",
    )
    parser.add_argument(
        "--ops", default="", help="comma-separated ops (default: every op the config routes to flaggems)"
    )
    parser.add_argument(
        "--map-in",
        help="a sweep's flaggems_sweep.json: its op -> OpInfo cases map (default: the config's comments)",
    )
    parser.add_argument(
        "--dtypes", default=",".join(DEFAULT_DTYPES), help="preferred dtypes, first that the sweep passed"
    )
    parser.add_argument("--warmup", type=int, default=3, help="eager calls before the warm capture")
    parser.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 4)))
    parser.add_argument(
        "--budget-s", type=float, default=210.0, help="wall time for everything, start-up included"
    )
    parser.add_argument(
        "--grace-s", type=float, default=15.0, help="after the budget, before running ops are killed"
    )
    parser.add_argument("--op-timeout-s", type=float, default=90.0, help="one op's limit in a worker")
    parser.add_argument("--sample-timeout", type=float, default=30.0)
    parser.add_argument("--resume", help="an earlier capture_audit.json: audit only the ops it did not run")
    parser.add_argument("--no-process-warmup", action="store_true", help="no process-wide set-up in workers")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "--backend", default="flaggems", choices=("flaggems", "native"), help=argparse.SUPPRESS
    )
    common.add_worker_arguments(parser)
    args = parser.parse_args(argv)
    global BACKEND
    BACKEND = args.backend
    if args.worker:
        return run_worker(args)

    start = time.time()

    def log(message: str) -> None:
        print(f"flaggems_capture_audit [{time.time() - start:.0f} s]: {message}", flush=True)

    reason = common.check_environment(stand_in=args.stand_in)
    if reason:
        print(f"flaggems_capture_audit: cannot run here: {reason}", file=sys.stderr)
        return 2
    from torch_fl import _flaggems, routing

    config = args.config or routing.package_config("flaggems_cuda")
    configured = model_sweep.candidate_ops(config)
    routable = set(_flaggems.routable_ops())
    wanted = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in wanted if o not in routable]
    if unknown:
        parser.error(f"not routable FlagGems ops here: {', '.join(unknown)}")
    ops = wanted or [op for op in configured if op in routable]
    left_out = sorted(set(configured) - routable) if not wanted else []
    if args.map_in:
        with open(args.map_in) as f:
            opinfo_map = json.load(f)
        opinfo_map = opinfo_map.get("opinfo_map", opinfo_map)
        cases = {op: {"dtypes": [], "cases": keys} for op, keys in opinfo_map.items()}
    else:
        cases = config_cases(config)
    earlier: dict[str, dict] = {}
    if args.resume:
        with open(args.resume) as f:
            earlier = {r["op"]: r for r in json.load(f)["results"] if r["status"] != "not-run"}
    preferred = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    items = []
    for op in audit_order([op for op in ops if op not in earlier]):
        known = cases.get(op, {})
        passed = known.get("dtypes") or preferred
        dtypes = [d for d in preferred if d in passed] + [d for d in passed if d not in preferred]
        items.append(
            {"op": op, "cases": ordered_cases(known.get("cases") or guessed_cases(op)), "dtypes": dtypes}
        )
    os.makedirs(args.out_dir, exist_ok=True)
    log(
        f"{common.environment_line()}; {len(items)} ops of {config}, {args.workers} workers, "
        f"budget {args.budget_s:.0f} s"
        + (f"; {len(left_out)} configured ops not routable here" if left_out else "")
    )

    def write(results: dict[str, dict], final: bool) -> dict[str, dict]:
        header = {
            "environment": common.environment_line(),
            "date": datetime.date.today().isoformat(),
            "config": os.path.relpath(config, _REPO) if config.startswith(_REPO) else config,
            "dtypes": preferred,
            "warmup": args.warmup,
            "workers": args.workers,
            "budget_s": args.budget_s,
            "seconds": time.time() - start,
            "not_routable_here": left_out,
            "partial": not final,
        }
        ordered = {op: results[op] for op in audit_order(list(results))}
        with open(os.path.join(args.out_dir, "capture_audit.json"), "w") as f:
            json.dump({**header, "results": list(ordered.values())}, f, indent=1, default=str)
        write_markdown(os.path.join(args.out_dir, "capture_audit.md"), ordered, header)
        return ordered

    ordered = write(
        {**earlier, **run_parent(args, items, log, start, lambda r: write({**earlier, **r}, False))}, True
    )
    elapsed = time.time() - start
    counts = collections.Counter(r["status"] for r in ordered.values())
    log(f"{dict(counts)} in {elapsed:.0f} s; outputs in {args.out_dir}")
    diagnoses = collections.Counter(
        (r.get("warm") or {}).get("diagnosis") or r.get("reason", "")[:60]
        for r in ordered.values()
        if r["status"] == "not-capturable"
    )
    for why, n in diagnoses.most_common():
        log(f"  not capturable after warm-up, {n} ops: {why}")
    cold = collections.Counter(
        (r.get("cold") or {}).get("diagnosis")
        for r in ordered.values()
        if r["status"] == "capturable-after-warmup"
    )
    for why, n in cold.most_common():
        log(f"  capturable after warm-up only, {n} ops; cold: {why}")
    for r in ordered.values():
        if r["status"] not in CAPTURABLE and r["status"] != "not-run":
            log(f"  {r['op']}: {r['status']}: {r.get('reason', '')}"[:240])
    return 0


if __name__ == "__main__":
    sys.exit(main())
