"""GPU kernel time of FlagGems against native CUDA for a transformer's ops at Qwen3-0.6B shapes, one process.

Shapes: bf16, one sequence of 512 tokens, hidden 1024, 16 query heads and 8 KV heads of 128, intermediate
3072, vocabulary 151936. Each op runs twice on the same CUDA tensors: FlagGems' function for the ATen op
(the one it would register for CUDA) and torch's CUDA kernel for that ATen op. The time is what the GPU
spent in kernels (torch.profiler's CUDA activity, summed per call; FlagGems' host overhead of tens of
microseconds would otherwise hide the kernels), median of R measurements of N calls, the two taking turns
(benchmarks.common.paired_rounds); where the profiler records no kernels, CUDA-graph replays timed with
events are used instead (marked ``graph``).

Printed per op: microseconds per call for both and ``native / flaggems`` (above 1: FlagGems is faster);
recorded (``--json``): the median over the cases (their range) and the geometric mean.
Needs an NVIDIA GPU and FlagGems; elsewhere it says why and exits 2.

    python -m benchmarks.flaggems_kernels [--n 20] [--repeats 3] [--ops mm_qkv,softmax] [--json [FILE]]
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import records
from benchmarks.common import Ratio, geomean, median, paired_rounds

SEQ, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 512, 1024, 16, 8, 128, 3072, 151936
DTYPE = torch.bfloat16


def unavailable_reason() -> str:
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False): this benchmark needs an NVIDIA GPU"
    import torch_fl  # noqa: F401  (FlagGems' table is read through torch_fl; nothing runs on flagos here)
    from torch_fl import _flaggems

    status = _flaggems.load()
    if not status.available:
        return f"FlagGems is unavailable: {status.reason}"
    return ""


def cases():
    """name -> (ATen op, argument builder). Arguments are built once per op, on CUDA."""

    def r(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.float32).mul_(scale).to(DTYPE)

    def ids():
        return torch.randint(0, VOCAB, (SEQ,), device="cuda")

    return {
        "mm_q_proj": ("aten::mm", lambda: (r(SEQ, HIDDEN), r(HIDDEN, HEADS * HEAD_DIM, scale=0.03))),
        "mm_kv_proj": ("aten::mm", lambda: (r(SEQ, HIDDEN), r(HIDDEN, KV_HEADS * HEAD_DIM, scale=0.03))),
        "mm_o_proj": (
            "aten::mm",
            lambda: (r(SEQ, HEADS * HEAD_DIM), r(HEADS * HEAD_DIM, HIDDEN, scale=0.03)),
        ),
        "mm_gate_up": ("aten::mm", lambda: (r(SEQ, HIDDEN), r(HIDDEN, INTER, scale=0.03))),
        "mm_down": ("aten::mm", lambda: (r(SEQ, INTER), r(INTER, HIDDEN, scale=0.02))),
        "mm_lm_head": ("aten::mm", lambda: (r(SEQ, HIDDEN), r(HIDDEN, VOCAB, scale=0.03))),
        "bmm_scores": ("aten::bmm", lambda: (r(HEADS, SEQ, HEAD_DIM), r(HEADS, HEAD_DIM, SEQ))),
        "bmm_values": ("aten::bmm", lambda: (r(HEADS, SEQ, SEQ), r(HEADS, SEQ, HEAD_DIM))),
        "softmax_scores": ("aten::_softmax", lambda: (r(1, HEADS, SEQ, SEQ, scale=3), -1, False)),
        "flash_attention": (
            "aten::_flash_attention_forward",
            lambda: (
                r(1, SEQ, HEADS, HEAD_DIM),
                r(1, SEQ, KV_HEADS, HEAD_DIM),
                r(1, SEQ, KV_HEADS, HEAD_DIM),
                None,
                None,
                SEQ,
                SEQ,
                0.0,
                True,
                False,
            ),
        ),
        "rms_norm": ("aten::rms_norm", lambda: (r(1, SEQ, HIDDEN), [HIDDEN], r(HIDDEN), 1e-6)),
        "silu": ("aten::silu", lambda: (r(SEQ, INTER),)),
        "mul_gate": ("aten::mul.Tensor", lambda: (r(SEQ, INTER), r(SEQ, INTER))),
        "add_residual": ("aten::add.Tensor", lambda: (r(1, SEQ, HIDDEN), r(1, SEQ, HIDDEN))),
        "rsqrt": ("aten::rsqrt", lambda: (r(SEQ, HIDDEN).abs_().add_(1e-3),)),
        "pow2": ("aten::pow.Tensor_Scalar", lambda: (r(SEQ, HIDDEN), 2)),
        "mean_last": ("aten::mean.dim", lambda: (r(SEQ, HIDDEN), [-1], True)),
        "sum_last": ("aten::sum.dim_IntList", lambda: (r(SEQ, HIDDEN), [-1])),
        "embedding": ("aten::embedding", lambda: (r(VOCAB, HIDDEN), ids())),
        "index_select": ("aten::index_select", lambda: (r(VOCAB, HIDDEN), 0, ids())),
        "cat_rotate_half": (
            "aten::cat",
            lambda: ([r(1, HEADS, SEQ, HEAD_DIM // 2), r(1, HEADS, SEQ, HEAD_DIM // 2)], -1),
        ),
        "neg": ("aten::neg", lambda: (r(1, HEADS, SEQ, HEAD_DIM // 2),)),
        "argmax_logits": ("aten::argmax", lambda: (r(SEQ, VOCAB), -1)),
        "amax_logits": ("aten::amax", lambda: (r(SEQ, VOCAB), [-1])),
    }


def native_op(name: str):
    base, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def device_us_profiler(fn, n: int) -> float:
    """GPU kernel time per call from torch.profiler (0.0 when it recorded no kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for event in prof.key_averages():
        total += getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
    return total / n


def device_us_graph(fn, n: int) -> float:
    """GPU time per call of `n` calls captured in a CUDA graph, replayed and timed with events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / n


def compare(native, gems, inputs, args) -> tuple[tuple[float, str], tuple[float, str]]:
    """(native, FlagGems) on the same inputs, each (microseconds per call, how it was timed): the median
    of ``args.repeats`` profiled rounds, the two in turns; CUDA-graph replays for a side whose kernels the
    profiler did not record."""
    calls = {"native": lambda: native(*inputs), "flaggems": lambda: gems(*inputs)}
    for fn in calls.values():
        for _ in range(3):  # warm-up: compiles and autotunes
            fn()
    torch.cuda.synchronize()
    profiled = paired_rounds(
        {name: lambda fn=fn: device_us_profiler(fn, args.n) for name, fn in calls.items()}, args.repeats
    )
    measured = {}
    for name, values in profiled.items():
        if all(v > 0 for v in values):
            measured[name] = (median(values), "profiler")
        else:
            graphed = [device_us_graph(calls[name], args.n) for _ in range(args.repeats)]
            measured[name] = (median(graphed), "graph")
    return measured["native"], measured["flaggems"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20, help="calls per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ops", default="", help="comma-separated subset of the cases")
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv, baseline="cuda kernels")
    reason = unavailable_reason()
    if reason:
        print(f"flaggems_kernels: cannot run here: {reason}", file=sys.stderr)
        return 2
    from torch_fl import _flaggems

    table = cases()
    names = [n.strip() for n in args.ops.split(",") if n.strip()] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    print(
        f"torch {torch.__version__}, flag-gems {_flaggems.status().version}, {torch.cuda.get_device_name(0)}; "
        f"Qwen3-0.6B shapes, bf16, seq {SEQ}; N={args.n}, repeats={args.repeats}"
    )
    print(f"{'case':16} {'aten op':30} {'native us':>10} {'flaggems us':>12} {'native/flaggems':>16}  timing")
    ratios = []
    with torch.no_grad():
        for name in names:
            op, build = table[name]
            gems = _flaggems.implementation(op)
            if gems is None:
                print(f"{name:16} {op:30} skipped: FlagGems has no implementation")
                continue
            try:
                (native_us, how_native), (gems_us, how_gems) = compare(native_op(op), gems, build(), args)
            except Exception as exc:  # noqa: BLE001  (one broken op must not hide the others' figures)
                print(f"{name:16} {op:30} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            ratio = native_us / gems_us
            ratios.append(ratio)
            how = how_native if how_native == how_gems else f"{how_native}/{how_gems}"
            print(f"{name:16} {op:30} {native_us:10.1f} {gems_us:12.1f} {ratio:16.2f}  {how}")
    if ratios:
        summary = Ratio.of(ratios)
        print(
            f"median native/flaggems {summary.median:.2f} over {len(ratios)} cases "
            f"(geometric mean {geomean(ratios):.2f}); above 1: FlagGems' kernels are faster"
        )
        what = f"FlagGems' kernels against torch's CUDA kernels, {len(ratios)} cases at Qwen3-0.6B shapes"
        rec.add(
            "median_speed_ratio",
            summary.median,
            "speed ratio",
            range=summary.range,
            detail=f"{what} (bf16, seq {SEQ})",
        )
        rec.add("geomean_speed_ratio", geomean(ratios), "speed ratio", detail=f"{what}, geometric mean")
    return 0 if ratios else 1


if __name__ == "__main__":
    sys.exit(main())
