"""What the FlagGems checks of tests and tools share: dtype-fit tolerances against native CUDA, the call
counter that sees whether FlagGems was reached (and whether its calls were replayed), bitwise comparison,
the ops a transformer spends its time in, and the check that a replayed call equals the Python path's.

Importing this module does not import torch_fl (harness/__init__.py); what needs it imports it when called.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from harness import opinfo as opinfo_harness
from harness.opinfo_variants import move_for_variant, run_variant


def _torch_fl():
    import torch_fl

    return torch_fl


# Dtype-fit tolerances (rtol, atol) for FlagGems against native CUDA. Different kernels accumulate in a
# different order, so results agree to a few units in the last place of the dtype, not bitwise.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float64: (1e-7, 1e-7),
}
# Triton's tl.dot takes float32 inputs at TF32 precision by default (10-bit mantissa), while torch's CUDA
# matmuls run full float32 (torch.backends.cuda.matmul.allow_tf32 is False): float32 matmul-family ops are
# compared at TF32 tolerance.
TF32_OPS = frozenset(
    {
        "aten::mm",
        "aten::mm.out",
        "aten::bmm",
        "aten::bmm.out",
        "aten::addmm",
        "aten::addmm.out",
        "aten::baddbmm",
        "aten::baddbmm.out",
        "aten::addmv",
        "aten::addmv.out",
        "aten::mv",
        "aten::mv.out",
        "aten::dot",
        "aten::vdot",
        "aten::_flash_attention_forward",
        "aten::_grouped_mm",
    }
)
TF32_TOLERANCE = (1e-2, 1e-2)


def tolerance(dtype: torch.dtype, op: str = "") -> tuple[float, float]:
    """(rtol, atol) for comparing `op`'s FlagGems result in `dtype` with native CUDA's."""
    if dtype == torch.float32 and op in TF32_OPS:
        return TF32_TOLERANCE
    return TOLERANCES.get(dtype, (0.0, 0.0))


def mismatch_message(exc: BaseException) -> str:
    """assert_close's first line plus its mismatch counts and greatest differences, on one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = [line for line in lines[1:] if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join([opinfo_harness.short_message(exc), *detail])[:400]


class CallCounter:
    """Re-registers `op`'s FlagGems implementation behind a counter for the duration of a with block.

    ``calls`` counts calls of FlagGems' Python wrapper; ``replayed`` calls replayed from recorded launches
    (docs/flaggems.md), which run no Python. The wrapper registered is one per op and implementation,
    shared by every counter of the op (it counts for the one entered): launch plans are forgotten when an
    op's implementation changes, so they then survive from one counter to the next. Inside the block a call
    FlagGems fails raises FlagGems' error rather than running again natively
    (``torch_fl.routing.set_flaggems_fallback``): what is counted is FlagGems, failures included."""

    _wrappers: dict = {}  # (op, implementation) -> the counting wrapper registered for it
    _entered: dict = {}  # op -> the counter entered

    def __init__(self, op: str):
        from torch_fl import _flaggems

        self.op = op
        self.impl = _flaggems.implementation(op)
        self.calls = 0
        self._replayed_at_entry = 0
        self._replayed = 0

    def _count(self) -> None:
        self.calls += 1

    def wrapper(self):
        key = (self.op, id(self.impl))
        if key not in CallCounter._wrappers:
            CallCounter._wrappers[key] = self._make_wrapper(self.op, self.impl)
        return CallCounter._wrappers[key]

    @staticmethod
    def _make_wrapper(op, impl):
        def counting(*args, **kwargs):
            counter = CallCounter._entered.get(op)
            if counter is not None:
                counter._count()
            return impl(*args, **kwargs)

        return counting

    @property
    def replayed(self) -> int:
        return self._replayed

    def reached(self) -> int:
        """Calls of the op inside the block so far, in FlagGems' wrapper or replayed."""
        return self.calls + self._replay_count() - self._replayed_at_entry

    def _replay_count(self) -> int:
        return _torch_fl().routing.replay_counts()["ops"].get(self.op, {}).get("replayed", 0)

    def __enter__(self):
        CallCounter._entered[self.op] = self
        self._replayed_at_entry = self._replay_count()
        routing = _torch_fl().routing
        self._fallback_at_entry = routing.flaggems_fallback_enabled()
        routing.set_flaggems_fallback(False)
        _torch_fl()._C._routing_set_flaggems_impl(self.op, self.wrapper())
        return self

    def __exit__(self, *exc):
        _torch_fl()._C._routing_set_flaggems_impl(self.op, self.impl)
        _torch_fl().routing.set_flaggems_fallback(self._fallback_at_entry)
        self._replayed += self._replay_count() - self._replayed_at_entry
        CallCounter._entered.pop(self.op, None)


class RouteCallCounter(CallCounter):
    """The sweep's CallCounter, keeping an ``out`` adapter an adapter: the route then calls FlagGems'
    functional function and copies into ``out`` itself (in C++), as it does without a counter, so that the
    counted call is the call users get."""

    @staticmethod
    def _make_wrapper(op, impl):
        spec = getattr(impl, "_torch_fl_out_adapter", None)
        if spec is None:
            return CallCounter._make_wrapper(op, impl)
        fn, names = spec

        def counted(*args, **kwargs):
            counter = CallCounter._entered.get(op)
            if counter is not None:
                counter._count()
            return fn(*args, **kwargs)

        def adapter(*args, **kwargs):
            from torch_fl import _flaggems

            outs = [kwargs.pop(name) for name in names]
            return _flaggems._copy_results(outs, counted(*args, **kwargs))

        adapter._torch_fl_out_adapter = (counted, names)
        return adapter


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


# Swept first: the ops a transformer (Qwen3) spends its time in, then everything else alphabetically.
# Both overloads of an op: with flagos backed by CUDA calls reach the functional one (aten::mm) directly,
# elsewhere its composite calls the out= one (aten::mm.out).
PRIORITY_OPS = (
    "aten::mm",
    "aten::mm.out",
    "aten::bmm",
    "aten::bmm.out",
    "aten::addmm",
    "aten::addmm.out",
    "aten::_softmax",
    "aten::_softmax.out",
    "aten::silu",
    "aten::silu.out",
    "aten::mul.Tensor",
    "aten::mul.out",
    "aten::add.Tensor",
    "aten::add.out",
    "aten::sub.Tensor",
    "aten::sub.out",
    "aten::div.Tensor",
    "aten::div.out",
    "aten::pow.Tensor_Scalar",
    "aten::pow.Tensor_Scalar_out",
    "aten::rsqrt",
    "aten::rsqrt.out",
    "aten::mean.dim",
    "aten::mean.out",
    "aten::sum.dim_IntList",
    "aten::sum.IntList_out",
    "aten::index_select",
    "aten::cat",
    "aten::cat.out",
    "aten::neg",
    "aten::neg.out",
    "aten::exp",
    "aten::exp.out",
    "aten::where.self",
    "aten::where.self_out",
    "aten::masked_fill_.Scalar",
    "aten::fill_.Scalar",
    "aten::zero_",
    "aten::amax",
    "aten::amax.out",
    "aten::max.dim",
    "aten::max.dim_max",
    "aten::argmax",
    "aten::argmax.out",
    "aten::_log_softmax",
    "aten::_log_softmax.out",
    "aten::gelu",
    "aten::gelu.out",
    "aten::tanh",
    "aten::tanh.out",
    "aten::sigmoid",
    "aten::sigmoid.out",
    "aten::cos",
    "aten::cos.out",
    "aten::sin",
    "aten::sin.out",
    "aten::cumsum",
    "aten::cumsum.out",
    "aten::topk",
    "aten::topk.values",
    "aten::_flash_attention_forward",
)


@contextlib.contextmanager
def _deterministic_algorithms():
    """Native kernels that accumulate with atomics (scatter_add and index_add in backward passes) give
    bits that vary from run to run: their deterministic versions, where torch has them, for the replay
    check (warn_only: an op without one runs as it is, and the check sees it vary)."""
    import torch.utils.deterministic

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills every new tensor with NaN; the wrappers' own allocations stay as they are.
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            warnings.filterwarnings("ignore", message=".*CUBLAS_WORKSPACE_CONFIG.*")
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def check_replay(opinfo, sample, op: str, variant: str) -> tuple[str, str]:
    """Whether `sample`'s call of `op` (routed to flaggems) replays bitwise: its result on the Python path
    (replay off) against the same call replayed from its recorded launches, inputs and random seed alike.
    ('bitwise'|'differs'|'nondeterministic'|'not-replayed', message): 'nondeterministic' when the replayed
    result differs but so do two runs of the Python path (another kernel of the sample varies from run to
    run); such a sample, and one whose replay differs, is checked again with torch's deterministic
    algorithms, where they can run it, and judged by that check."""
    from torch_fl import routing

    def run():
        torch.manual_seed(0)
        dut = move_for_variant(sample, variant, "flagos")
        out = run_variant(opinfo, variant, dut)
        return [*opinfo_harness._tensors(out), *([dut.input] if variant == "inplace" else [])]

    def run_in_python():
        routing.set_replay(False)
        try:
            return run()
        finally:
            routing.set_replay(True)

    def replayed() -> int:
        return routing.replay_counts()["ops"].get(op, {}).get("replayed", 0)

    def difference(expected, actual) -> str:
        try:
            for e, a in zip(expected, actual, strict=True):
                torch.testing.assert_close(
                    opinfo_harness.to_cpu(a), opinfo_harness.to_cpu(e), rtol=0, atol=0, equal_nan=True
                )
        except Exception as exc:  # noqa: BLE001
            return mismatch_message(exc)
        return ""

    def attempt() -> tuple[str, str]:
        python_path = run_in_python()
        for _ in range(2):  # record until two recordings agree (compare_sample made the first)
            run()
        before, refused = replayed(), dict(routing.replay_counts()["refused"])
        last = run()
        if replayed() == before:
            now = routing.replay_counts()["refused"]
            reasons = [why for why, n in now.items() if n > refused.get(why, 0)]
            return "not-replayed", "; ".join(reasons)[:200] or "recordings did not settle"
        differs = difference(python_path, last)
        if not differs:
            return "bitwise", ""
        varies = difference(python_path, run_in_python())
        if varies:
            return "nondeterministic", "two runs of the Python path differ too: " + varies
        return "differs", "replayed result differs from the Python path's: " + differs

    status, message = attempt()
    if status in ("nondeterministic", "differs"):
        # A native kernel of the sample that accumulates with atomics (a backward's scatter_add) can give
        # two runs of the Python path the same bits and the replay other ones: a sample that differs is
        # judged again with torch's deterministic algorithms, which leave the replayed launches as they are.
        try:
            with _deterministic_algorithms():
                return attempt()
        except Exception:  # noqa: BLE001  (torch's deterministic kernels refuse some samples: 0-dim index_add)
            pass
    return status, message
