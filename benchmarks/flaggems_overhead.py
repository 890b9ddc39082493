"""Host overhead of the flaggems route against FlagGems called directly on CUDA tensors, in one process.

For about 20 transformer ops on tiny tensors (so that host time dominates), each op is launched N times
(then one synchronize; median of R repeats, the ways taking turns in each repeat, their order rotating from
repeat to repeat: benchmarks.common.paired_rounds) in these ways:

- ``direct``: FlagGems' own function for the op (the one it would register for CUDA) on CUDA tensors;
- ``route``: the torch call on flagos tensors with the overloads it may reach routed to ``flaggems``: after
  the warm-up, each signature's recorded launches replayed from C++ (csrc/ops/routes/launch_replay.h);
- ``python``: the same with replay off (``torch_fl.routing.set_replay(False)``): the router, aliasing to
  CUDA, the python route's argument conversion and FlagGems' Python wrapper on every call;
- ``torch``: the same torch call on CUDA tensors with FlagGems' function registered for the op's CUDA
  kernel (as ``flag_gems.enable()`` registers it, in a ``torch.library`` scope that lives only while this
  way is timed): FlagGems as its own users run it, torch's Python binding and dispatcher included;
- ``native``: the torch call on CUDA tensors (torch's CUDA kernels), for scale.

Printed per op: microseconds per launch, ``route / native``, ``route / direct`` and ``route - direct``, and
``route / torch``; then the medians, which ``--json`` records (``vs_native_...`` over the launch set
add, mul, silu, rms_norm, softmax, embedding, cat; ``vs_direct_...``, ``vs_torch_...``), and how many
flaggems calls were replayed. Last, the floor: one launch of a one-kernel Triton add through the HAL
(``torch_fl._C._kernel_launch`` repeated in C++, what a replay's launch costs with nothing around it), and
what a replayed ``add`` costs beyond it (``--json``: ``add_vs_launch_floor_added_us``).

``direct`` has no torch in front of FlagGems, so ``route - direct`` includes what any torch
call costs before it reaches a kernel (the Python binding, the dispatcher, autograd's no-grad check);
``route / torch`` compares like with like: what the route costs beyond FlagGems reached through torch.
Needs an NVIDIA GPU, flagos on the cuda accelerator and FlagGems; elsewhere it says why and exits 2.

    python -m benchmarks.flaggems_overhead [--n 300] [--repeats 5] [--ops add,mm] [--json [FILE]]

``--stand-in`` measures the same comparison without a GPU: flagos on the simulated accelerator, and the
stand-in FlagGems of harness/fake_flaggems (CPU torch functions) as the flaggems backend. ``direct`` is then
the stand-in's function on CPU tensors, ``native`` the torch call on CPU tensors, and the ops are the
stand-in's. ``route - direct`` is the plugin's own cost (router, aliasing, the python route, adapters),
the same code as on the GPU, where only the native device of the aliases differs:

    FLAGOS_ACCELERATOR=sim python -m benchmarks.flaggems_overhead --stand-in --n 2000 --repeats 7
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import torch_fl
from benchmarks import records
from benchmarks.common import Ratio, median, paired_rounds
from harness.fake_flaggems import stand_in
from torch_fl import _flaggems, routing


def unavailable_reason() -> str:
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False): this benchmark needs an NVIDIA GPU"
    if torch_fl.accelerator() != "cuda":
        return f"flagos runs on {torch_fl.accelerator()!r}, not on the cuda accelerator"
    status = _flaggems.load()
    if not status.available:
        return f"FlagGems is unavailable: {status.reason}"
    return ""


def tensors(device: str) -> SimpleNamespace:
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)

    return SimpleNamespace(
        a=t(16),
        b=t(16),
        pos=t(16).abs() + 0.5,
        m1=t(8, 8),
        m2=t(8, 8),
        bias=t(8),
        b1=t(2, 8, 8),
        b2=t(2, 8, 8),
        x=t(4, 16),
        w=t(16),
        idx=torch.tensor([0, 2, 4, 6], device=device),
        table=t(32, 16),
        ids=torch.tensor([[1, 5, 7]], device=device),
        mask=(t(16) > 0),
        out=torch.empty(16, device=device),
        mout=torch.empty(8, 8, device=device),
    )


# name -> (overloads the torch call reaches on flagos, the torch call, FlagGems' op, its direct call)
CASES = {
    "add": (["aten::add.out"], lambda T: torch.add(T.a, T.b), "aten::add.Tensor", lambda f, T: f(T.a, T.b)),
    "mul": (["aten::mul.out"], lambda T: torch.mul(T.a, T.b), "aten::mul.Tensor", lambda f, T: f(T.a, T.b)),
    "sub": (["aten::sub.out"], lambda T: torch.sub(T.a, T.b), "aten::sub.Tensor", lambda f, T: f(T.a, T.b)),
    "div": (["aten::div.out"], lambda T: torch.div(T.a, T.b), "aten::div.Tensor", lambda f, T: f(T.a, T.b)),
    "neg": (["aten::neg.out"], lambda T: torch.neg(T.a), "aten::neg", lambda f, T: f(T.a)),
    "exp": (["aten::exp.out"], lambda T: torch.exp(T.a), "aten::exp", lambda f, T: f(T.a)),
    "rsqrt": (["aten::rsqrt.out"], lambda T: torch.rsqrt(T.pos), "aten::rsqrt", lambda f, T: f(T.pos)),
    "pow": (
        ["aten::pow.Tensor_Scalar_out"],
        lambda T: torch.pow(T.a, 2),
        "aten::pow.Tensor_Scalar",
        lambda f, T: f(T.a, 2),
    ),
    "silu": (["aten::silu.out"], lambda T: F.silu(T.a), "aten::silu", lambda f, T: f(T.a)),
    "rms_norm": (
        ["aten::rms_norm"],
        lambda T: F.rms_norm(T.x, (16,), T.w, 1e-6),
        "aten::rms_norm",
        lambda f, T: f(T.x, [16], T.w, 1e-6),
    ),
    "softmax": (
        ["aten::_softmax.out"],
        lambda T: torch.softmax(T.x, -1),
        "aten::_softmax",
        lambda f, T: f(T.x, -1, False),
    ),
    "mm": (["aten::mm.out"], lambda T: torch.mm(T.m1, T.m2), "aten::mm", lambda f, T: f(T.m1, T.m2)),
    "bmm": (["aten::bmm.out"], lambda T: torch.bmm(T.b1, T.b2), "aten::bmm", lambda f, T: f(T.b1, T.b2)),
    "addmm": (
        ["aten::addmm.out"],
        lambda T: torch.addmm(T.bias, T.m1, T.m2),
        "aten::addmm",
        lambda f, T: f(T.bias, T.m1, T.m2),
    ),
    "sum": (
        ["aten::sum.IntList_out"],
        lambda T: T.x.sum(-1),
        "aten::sum.dim_IntList",
        lambda f, T: f(T.x, [-1]),
    ),
    "mean": (["aten::mean.out"], lambda T: T.x.mean(-1), "aten::mean.dim", lambda f, T: f(T.x, [-1])),
    "amax": (["aten::amax.out"], lambda T: T.x.amax(-1), "aten::amax", lambda f, T: f(T.x, [-1])),
    "argmax": (["aten::argmax.out"], lambda T: T.x.argmax(-1), "aten::argmax", lambda f, T: f(T.x, -1)),
    "cat": (["aten::cat.out"], lambda T: torch.cat([T.a, T.b]), "aten::cat", lambda f, T: f([T.a, T.b])),
    "index_select": (
        ["aten::index_select"],
        lambda T: torch.index_select(T.a, 0, T.idx),
        "aten::index_select",
        lambda f, T: f(T.a, 0, T.idx),
    ),
    "embedding": (
        ["aten::index_select"],
        lambda T: F.embedding(T.ids, T.table),
        "aten::embedding",
        lambda f, T: f(T.table, T.ids),
    ),
    "where": (
        ["aten::where.self_out"],
        lambda T: torch.where(T.mask, T.a, T.b),
        "aten::where.self",
        lambda f, T: f(T.mask, T.a, T.b),
    ),
}


# The same for the stand-in FlagGems (harness/fake_flaggems), whose table is much smaller. Its functions are
# Python wrappers over CPU torch ops, as FlagGems' are over Triton launches. `add_out` and `softmax` take
# the out adapter of torch_fl/_flaggems.py, `mm_out` a function with an out argument, `max_dim` returns a
# tuple, `add_` is in-place.
STAND_IN_CASES = {
    "add": CASES["add"],
    "add_": (
        ["aten::add_.Tensor"],
        lambda T: T.out.add_(T.a),
        "aten::add_.Tensor",
        lambda f, T: f(T.out, T.a),
    ),
    "add_out": (
        ["aten::add.out"],
        lambda T: torch.add(T.a, T.b, out=T.out),
        "aten::add.Tensor",
        lambda f, T: f(T.a, T.b),
    ),
    "mm": CASES["mm"],
    "mm_out": (
        ["aten::mm.out"],
        lambda T: torch.mm(T.m1, T.m2, out=T.mout),
        "aten::mm.out",
        lambda f, T: f(T.m1, T.m2, out=T.mout),
    ),
    "softmax": CASES["softmax"],
    "max_dim": (["aten::max.dim"], lambda T: T.x.max(-1), "aten::max.dim", lambda f, T: f(T.x, -1)),
    "index_select": CASES["index_select"],
}


# The ops whose median route / native time the replay of FlagGems launches is measured by.
LAUNCH_SET = ("add", "mul", "silu", "rms_norm", "softmax", "embedding", "cat")


@contextlib.contextmanager
def routed(ops, replay: bool = True):
    """`ops` routed to flaggems while the block runs, with launch replay on or off."""
    was = routing.replay_enabled()
    routing.set_replay(replay)
    try:
        with routing.override({op: "flaggems" for op in ops}):
            yield
    finally:
        routing.set_replay(was)


@contextlib.contextmanager
def flaggems_as_cuda_kernel(op: str, fn):
    """FlagGems' `fn` as the CUDA kernel of `op` ("aten::add.Tensor") while the block runs, registered the
    way flag_gems.enable() registers it, and removed afterwards."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": that is the point (flag_gems.enable() warns too).
            warnings.simplefilter("ignore", UserWarning)
            lib.impl(op.removeprefix("aten::"), fn, "CUDA")
        yield
    finally:
        lib._destroy()


def time_per_launch(ways: dict, n: int, repeats: int) -> dict[str, float]:
    """Per way (name -> (launch one call, synchronize, context to run it in)): the median over `repeats`
    of (n launches + one synchronize) / n, in microseconds. The ways take turns in every repeat (paired
    rounds), so that a drift of the machine's speed (other load, clocks) shows in all of them alike rather
    than biasing whichever ran during it."""
    for fn, sync, context in ways.values():
        with context():
            for _ in range(20):  # warm-up: Triton compiles and autotunes on first calls
                fn()
            sync()

    def per_launch_us(fn, sync, context) -> float:
        with context():
            fn()  # entering a routing override re-resolves the op on its next call: not timed
            sync()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            return (time.perf_counter() - start) / n * 1e6

    samples = paired_rounds(
        {name: lambda way=way: per_launch_us(*way) for name, way in ways.items()}, repeats
    )
    return {name: median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="launches per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", default="", help="comma-separated subset of: " + ", ".join(CASES))
    records.add_json_argument(parser)
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="no GPU: the simulated accelerator and the stand-in FlagGems of harness/fake_flaggems",
    )
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    reason = stand_in.install() if args.stand_in else unavailable_reason()
    if reason:
        print(f"flaggems_overhead: cannot run here: {reason}", file=sys.stderr)
        return 2
    cases = STAND_IN_CASES if args.stand_in else CASES
    if args.stand_in:
        # Tiny CPU kernels on a shared machine: one intra-op thread keeps the figures from wandering.
        torch.set_num_threads(1)
    names = [n.strip() for n in args.ops.split(",") if n.strip()] or list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        parser.error(f"unknown op(s): {', '.join(unknown)}")
    native_device = "cpu" if args.stand_in else "cuda"
    sync_native = (lambda: None) if args.stand_in else torch.cuda.synchronize
    on_native, flagos = tensors(native_device), tensors("flagos")
    sync_native()
    torch.flagos.synchronize()
    where = "stand-in on sim" if args.stand_in else torch.cuda.get_device_name(0)
    print(
        f"torch {torch.__version__}, flag-gems {_flaggems.load().version}, {where}, N={args.n}, repeats={args.repeats}"
    )
    print(
        f"{'op':13} {'native us':>9} {'direct us':>9} {'torch us':>9} {'python us':>9} {'route us':>9} "
        f"{'route/native':>12} {'route/direct':>12} {'diff us':>8} {'route/torch':>11}"
    )
    rows, ratios, torch_ratios = [], [], []
    routable = set(_flaggems.routable_ops())
    routing.reset_counts()
    with torch.no_grad():
        for name in names:
            ops, call, gems_op, direct_call = cases[name]
            direct_fn = _flaggems.implementation(gems_op)
            # The functional overload too: with flagos backed by CUDA, calls reach it directly instead of
            # its composite's out= overload.
            if gems_op in routable and gems_op not in ops:
                ops = [gems_op, *ops]
            missing = [op for op in ops if op not in routable]
            if direct_fn is None or missing:
                print(f"{name:13} skipped: FlagGems lacks {gems_op if direct_fn is None else missing}")
                continue
            try:
                times = time_per_launch(
                    {
                        "native": (lambda c=call: c(on_native), sync_native, contextlib.nullcontext),
                        "direct": (
                            lambda f=direct_fn, d=direct_call: d(f, on_native),
                            sync_native,
                            contextlib.nullcontext,
                        ),
                        # The stand-in's functions are CPU torch code: registered as the CPU kernels they
                        # call, they would call themselves.
                        **(
                            {}
                            if args.stand_in
                            else {
                                "torch": (
                                    lambda c=call: c(on_native),
                                    sync_native,
                                    lambda o=gems_op, f=direct_fn: flaggems_as_cuda_kernel(o, f),
                                )
                            }
                        ),
                        "route": (
                            lambda c=call: c(flagos),
                            torch.flagos.synchronize,
                            lambda o=ops: routed(o),
                        ),
                        "python": (
                            lambda c=call: c(flagos),
                            torch.flagos.synchronize,
                            lambda o=ops: routed(o, replay=False),
                        ),
                    },
                    args.n,
                    args.repeats,
                )
                native, direct, route, python = (
                    times["native"],
                    times["direct"],
                    times["route"],
                    times["python"],
                )
                through_torch = times.get("torch")  # None with the stand-in
            except Exception as exc:  # noqa: BLE001  (one broken op must not hide the others' figures)
                print(f"{name:13} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
                continue
            ratios.append(route / direct)
            torch_ratio = None if through_torch is None else route / through_torch
            if torch_ratio is not None:
                torch_ratios.append(torch_ratio)
            rows.append(
                {
                    "op": name,
                    "native_us": native,
                    "direct_us": direct,
                    "torch_us": through_torch,
                    "route_us": route,
                    "python_us": python,
                }
            )
            torch_us = "-" if through_torch is None else f"{through_torch:.1f}"
            torch_ratio_text = "-" if torch_ratio is None else f"{torch_ratio:.2f}"
            print(
                f"{name:13} {native:9.1f} {direct:9.1f} {torch_us:>9} {python:9.1f} {route:9.1f} "
                f"{route / native:12.2f} {route / direct:12.2f} {route - direct:8.1f} {torch_ratio_text:>11}"
            )
    if ratios:
        diffs = [r["route_us"] - r["direct_us"] for r in rows]
        torch_diffs = [r["route_us"] - r["torch_us"] for r in rows if r["torch_us"] is not None]
        print(
            f"median route/direct {median(ratios):.2f}, median difference {median(diffs):.1f} us over "
            f"{len(ratios)} ops"
            + (
                f"; median route/torch {median(torch_ratios):.2f}, difference {median(torch_diffs):.1f} us"
                if torch_ratios
                else ""
            )
        )
        record_medians(rec, len(ratios), args.stand_in, (ratios, diffs), (torch_ratios, torch_diffs))
        record_launch_set(rec, rows, args.stand_in)
    add_row = next((r for r in rows if r["op"] == "add"), None)
    if add_row is not None and not args.stand_in:
        try:
            record_launch_floor(rec, add_row, args.n, args.repeats)
        except Exception as exc:  # noqa: BLE001  (the figures above stand without it)
            print(f"launch floor: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return 0 if ratios else 1


def triton_add_launch(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor):
    """A Triton kernel computing out = x + y, compiled and loaded through the HAL (torch_fl._C._kernel_load),
    with its parameters packed as the HAL's layout says: (launch(repeat) -> None), or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(
            out_ptr + offsets,
            tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
            mask=mask,
        )

    n, block = out.numel(), 1024
    # Compiled for CUDA tensors of the same dtype (what Triton specialises on); launched on flagos memory.
    like = [torch.empty(n, dtype=t.dtype, device="cuda") for t in (x, y, out)]
    compiled = add_kernel.warmup(*like, n, BLOCK=block, grid=(1,))
    function = torch_fl._C._kernel_load(out.device.index or 0, compiled.asm["cubin"], compiled.metadata.name)
    layout = torch_fl._C._kernel_param_layout(function)
    # The four arguments, then what Triton's launcher adds after them (scratch pointers), null here as in
    # a kernel that uses none.
    if layout is None or len(layout) < 4:
        raise RuntimeError(f"unexpected parameter layout of the Triton add kernel: {layout}")
    values = [x.data_ptr(), y.data_ptr(), out.data_ptr(), n] + [0] * (len(layout) - 4)
    params = bytearray(max(offset + size for offset, size in layout))
    for (offset, size), value in zip(layout, values, strict=True):
        params[offset : offset + size] = value.to_bytes(size, "little", signed=False)
    grid = ((n + block - 1) // block, 1, 1)
    threads = (compiled.metadata.num_warps * 32, 1, 1)
    shared = compiled.metadata.shared

    def launch(repeat: int) -> None:
        torch_fl._C._kernel_launch(function, grid, threads, shared, bytes(params), None, repeat=repeat)

    return launch


def record_launch_floor(rec, add_row: dict, n: int, repeats: int) -> None:
    """The floor of a replayed call, one kernel launch through the HAL with nothing around it, against the
    replayed add (one kernel too)."""
    x, y = torch.randn(16, device="flagos"), torch.randn(16, device="flagos")
    out = torch.empty_like(x)
    launch = triton_add_launch(x, y, out)
    if launch is None:
        print("launch floor: not measured (Triton is not importable)")
        return
    launch(1)
    torch.testing.assert_close(out.cpu(), (x + y).cpu())  # the packed launch computes what it should

    def per_launch_us() -> float:
        torch.flagos.synchronize()
        start = time.perf_counter()
        launch(n)
        torch.flagos.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    per_launch_us()  # warm-up
    floor = median([per_launch_us() for _ in range(max(repeats, 3))])
    route = add_row["route_us"]
    print(
        f"launch floor: one Triton kernel launched through the HAL from C++ {floor:.2f} us; replayed add "
        f"{route:.2f} us ({route - floor:.2f} us above it: Python binding, dispatcher, signature, allocation); "
        f"native add {add_row['native_us']:.2f} us"
    )
    rec.add(
        "add_vs_launch_floor_added_us",
        route - floor,
        "us added",
        detail=f"a replayed FlagGems add (tiny tensors) over one HAL kernel launch from C++ ({floor:.2f} us)",
        baseline="one HAL kernel launch",
    )


def record_launch_set(rec, rows: list[dict], on_stand_in: bool) -> None:
    """route / native over LAUNCH_SET (median and worst), and the share of flaggems calls replayed."""
    counts = routing.replay_counts()
    calls = counts["replayed"] + counts["recorded"] + counts["python"]
    share = counts["replayed"] / calls if calls else 0.0
    refused = ", ".join(f"{n} x {why}" for why, n in sorted(counts["refused"].items(), key=lambda kv: -kv[1]))
    print(
        f"flaggems calls replayed: {counts['replayed']} of {calls} ({share:.1%}); in Python: {refused or 'none'}"
    )
    chosen = [r for r in rows if r["op"] in LAUNCH_SET]
    if not chosen:
        return
    ratios = [r["route_us"] / r["native_us"] for r in chosen]
    ops = ", ".join(r["op"] for r in chosen)
    print(f"launch set ({ops}): route/native median {median(ratios):.2f}, worst {max(ratios):.2f}")
    where = ", stand-in" if on_stand_in else ""
    baseline = "native torch" if not on_stand_in else "native torch (CPU)"
    rec.add(
        "vs_native_median_ratio",
        median(ratios),
        "time ratio",
        range=Ratio.of(ratios).range,
        detail=f"launch set of {len(chosen)} ops, tiny tensors{where}: replayed flaggems route against native",
        baseline=baseline,
    )
    rec.add(
        "vs_native_worst_ratio",
        max(ratios),
        "time ratio",
        detail=f"the slowest of the launch set{where}: replayed flaggems route against native",
        baseline=baseline,
    )
    rec.add("replayed_share", share, "share", detail=f"flaggems calls replayed during the run{where}")


def record_medians(rec, ops: int, on_stand_in: bool, direct: tuple, through_torch: tuple) -> None:
    """The records of the medians: against FlagGems' bare function, and against FlagGems through torch
    where that was measured; each (ratios, differences in us) over the ops."""
    what = f"{ops} ops, tiny tensors" + (", stand-in" if on_stand_in else "")
    for name, baseline, against, (ratios, diffs) in (
        ("vs_direct", "FlagGems' function", "FlagGems' bare function", direct),
        ("vs_torch", "FlagGems via torch", "FlagGems registered for cuda", through_torch),
    ):
        if not ratios:
            continue
        rec.add(
            f"{name}_median_ratio",
            median(ratios),
            "time ratio",
            range=Ratio.of(ratios).range,
            detail=f"{what}: the route against {against}",
            baseline=baseline,
        )
        rec.add(
            f"{name}_median_added_us",
            median(diffs),
            "us added",
            detail=f"{what}: time the flaggems route adds per call to {against}",
            baseline=baseline,
        )


if __name__ == "__main__":
    sys.exit(main())
