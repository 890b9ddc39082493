"""The ops of the FlagGems capture audit (tools/flaggems_capture_audit.py) and how their calls are judged,
shared by its parent and its workers: which ops and in what order (op families, the OpInfo cases a
config's comments list), bitwise comparison of a replay with eager, and the diagnosis of a failed capture
from its exception chain and frames."""

from __future__ import annotations

import linecache
import os
import re

import torch

from harness import opinfo as opinfo_harness
from harness.flaggems import PRIORITY_OPS, bitwise_equal, tolerance
from harness.opinfo_variants import split_case
from harness.processes import REPO_ROOT
from tools import flaggems_model_sweep as model_sweep

# Audited first: the ops a Qwen3 forward reaches on flagos backed by CUDA (projections: mm, or addmm with a
# bias; attention: SDPA's kernels or, in its math form, bmm and softmax; RMSNorm: pow, mean, add, rsqrt,
# mul; rotary embedding: cos, sin, neg, cat; greedy decoding: argmax), then the ops the sweep takes first (harness.flaggems.PRIORITY_OPS).
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
    for op in (*TRANSFORMER_OPS, *PRIORITY_OPS):
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


# ---- comparisons and diagnoses ----------------------------------------------------------------------


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
            rtol, atol = tolerance(e.dtype, op)
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
    except (AssertionError, ValueError):
        return False
    return len(expected) == len(actual)


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
        frames.append(f"{short_path(code.co_filename)}:{tb.tb_lineno} {code.co_name}: {line}"[:240])
        tb = tb.tb_next

    def innermost(pattern: str) -> str:
        return next((f for f in reversed(frames) if re.search(pattern, f.split(" ", 1)[0])), "")

    return {
        "error": opinfo_harness.short_message(root),
        "errors": [opinfo_harness.short_message(x) for x in chain],
        "frames": frames[-12:],
        "flaggems_frame": innermost(r"flag_gems"),
        "triton_frame": innermost(r"(^|/)triton/"),
    }


def short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.relpath(path, REPO_ROOT) if path.startswith(REPO_ROOT) else path


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
