"""FlagGems launch replay with the real FlagGems on an NVIDIA GPU: a replayed call gives bitwise the
result of FlagGems' Python wrapper for the same inputs, random ops advance the generator as the wrapper
does, a Qwen3 forward on the shipped FlagGems config replays nearly all its calls with the eager result,
and a graph capture of it replays. The engine's refusals and bookkeeping are tested on the simulated
accelerator (tests/flaggems/test_launch_replay.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from torch_fl import _flaggems, routing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("backed_by_cuda")]


@pytest.fixture(scope="module")
def gems():
    status = _flaggems.load()
    if not status.available:
        pytest.skip(f"FlagGems is unavailable: {status.reason}")
    # What is compared is FlagGems' work: a call it fails raises rather than running natively.
    was = routing.flaggems_fallback_enabled()
    routing.set_flaggems_fallback(False)
    yield status
    routing.set_flaggems_fallback(was)


@contextlib.contextmanager
def replay(on: bool):
    was = routing.replay_enabled()
    routing.set_replay(on)
    try:
        yield
    finally:
        routing.set_replay(was)


def t(*shape, dtype=torch.float32, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to("flagos")


# name -> (ops reached on flagos, call on a namespace of inputs). Not mm: the shipped config keeps it native,
# and its first calls (FlagGems compiling and autotuning its configs) did not finish within 120 s on the H200.
CASES = {
    "add": (["aten::add.Tensor", "aten::add.out"], lambda T: torch.add(T.a, T.b, alpha=0.5)),
    "mul": (["aten::mul.Tensor", "aten::mul.out"], lambda T: T.a * T.b),
    "silu": (["aten::silu", "aten::silu.out"], lambda T: F.silu(T.a)),
    "rms_norm": (["aten::rms_norm"], lambda T: F.rms_norm(T.x, (T.x.shape[-1],), T.w, 1e-6)),
    "softmax": (["aten::_softmax", "aten::_softmax.out"], lambda T: torch.softmax(T.x, -1)),
    "embedding": (["aten::embedding", "aten::index_select"], lambda T: F.embedding(T.ids, T.table)),
    "cat": (["aten::cat", "aten::cat.out"], lambda T: torch.cat([T.a, T.b], 0)),
    "sum": (["aten::sum.dim_IntList", "aten::sum.IntList_out"], lambda T: T.x.sum(-1)),
    "rsqrt": (["aten::rsqrt", "aten::rsqrt.out"], lambda T: torch.rsqrt(T.a.abs() + 1)),
    "mean": (["aten::mean.dim", "aten::mean.out"], lambda T: T.x.mean(-1, keepdim=True)),
    "pow": (["aten::pow.Tensor_Scalar", "aten::pow.Tensor_Scalar_out"], lambda T: T.a.pow(2)),
    "add_": (["aten::add_.Tensor"], lambda T: T.a.clone().add_(T.b)),
    "neg": (["aten::neg", "aten::neg.out"], lambda T: -T.a),
    "where": (["aten::where.self", "aten::where.self_out"], lambda T: torch.where(T.a > 0, T.a, T.b)),
    # out= overloads served by an adapter of the functional op (as Inductor's extern calls pass buffers):
    # the wrapper's launches and the route's copy into out are one plan.
    "add_out": (["aten::add.out"], lambda T: torch.add(T.a, T.b, alpha=0.5, out=torch.empty_like(T.a))),
    "silu_out": (["aten::silu.out"], lambda T: torch.ops.aten.silu.out(T.a, out=torch.empty_like(T.a))),
    "cat_out": (
        ["aten::cat.out"],
        lambda T: torch.cat([T.a, T.b], 0, out=torch.empty(514, device="flagos", dtype=T.a.dtype)),
    ),
}


class Inputs:
    def __init__(self, dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.a, self.b = t(257, dtype=dtype, gen=gen), t(257, dtype=dtype, gen=gen)
        self.x, self.w = t(6, 96, dtype=dtype, gen=gen), t(96, dtype=dtype, gen=gen)
        self.table = t(50, 64, dtype=dtype, gen=gen)
        self.ids = torch.tensor([[1, 7, 3, 49]], device="flagos")


# Ops whose FlagGems wrappers only allocate and launch: their calls must be replayed. The others must give
# the same results whichever path they take; the reasons they stay in Python are printed.
MUST_REPLAY = {"add", "mul", "silu", "rms_norm", "softmax", "embedding", "add_out", "silu_out"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_replayed_call_is_bitwise_the_python_path(gems, name, dtype):
    ops, call = CASES[name]
    routable = set(_flaggems.routable_ops())
    ops = [op for op in ops if op in routable]
    if not ops:
        pytest.skip(f"FlagGems routes none of {CASES[name][0]}")
    with torch.no_grad(), routing.override({op: "flaggems" for op in ops}):
        for seed in range(4):  # two recordings, then replays, each on new inputs
            inputs = Inputs(dtype, seed)
            with replay(False):
                expected = call(inputs)
            routing.reset_counts()
            actual = call(inputs)
            counts = routing.replay_counts()
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            assert actual.stride() == expected.stride()
            assert torch.equal(actual.cpu(), expected.cpu()), f"{name} {dtype}: {counts}"
    print(f"replay {name} {dtype}: replayed {counts['replayed']}, in Python: {counts['refused']}")
    if name in MUST_REPLAY:
        assert counts["replayed"] >= 1, counts


def test_random_op_advances_the_generator_as_the_python_path(gems):
    if "aten::uniform_" not in set(_flaggems.routable_ops()):
        pytest.skip("FlagGems does not route uniform_")
    x = torch.empty(4096, device="flagos")
    with torch.no_grad(), routing.override({"aten::uniform_": "flaggems"}):
        for _ in range(3):
            x.uniform_()  # two recordings, then replays
        draws = {}
        for on in (False, True):
            torch.flagos.manual_seed(1234)
            with replay(on):
                draws[on] = [x.uniform_().clone() for _ in range(3)]
        for a, b in zip(draws[False], draws[True], strict=True):
            assert torch.equal(a.cpu(), b.cpu())
        assert not torch.equal(draws[True][0].cpu(), draws[True][1].cpu())


@pytest.fixture(scope="module")
def qwen3_on_flaggems(gems):
    """A 2-layer Qwen3-0.6B-shaped model (bfloat16) on flagos with the shipped FlagGems config loaded, its
    input, the replay-off logits, and the replay counts of a third forward (after two that record)."""
    from harness import qwen3

    routing.load_config(routing.package_config("flaggems_cuda"))
    try:
        model = qwen3.copy_to(qwen3.build_model("0.6b", layers=2, dtype=torch.bfloat16), "flagos")
        ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0)).to("flagos")
        with torch.no_grad():
            with replay(False):
                expected = model(ids, use_cache=False).logits
            for _ in range(2):
                model(ids, use_cache=False)
            routing.reset_counts()
            actual = model(ids, use_cache=False).logits
        yield model, ids, expected, actual, routing.replay_counts()
    finally:
        routing.load_config(None)


def test_qwen3_forward_replays_with_the_eager_result(qwen3_on_flaggems):
    """A 1-token-batch forward without KV cache: replayed calls give bitwise the replay-off logits, and a
    plain graph capture of the forward (warmed up on a side stream) replays them too."""
    model, ids, expected, actual, counts = qwen3_on_flaggems
    assert counts["replayed"] > 0, counts
    assert torch.equal(actual.cpu(), expected.cpu())
    routing.load_config(routing.package_config("flaggems_cuda"))
    try:
        with torch.no_grad():
            s = torch.flagos.Stream()
            s.wait_stream(torch.flagos.current_stream())
            with torch.flagos.stream(s):
                for _ in range(3):
                    model(ids, use_cache=False)
            torch.flagos.current_stream().wait_stream(s)
            g = torch.flagos.FlagosGraph()
            with torch.flagos.graph(g):
                captured = model(ids, use_cache=False).logits
            g.replay()
            torch.flagos.synchronize()
    finally:
        routing.load_config(None)
    assert torch.equal(captured.cpu(), expected.cpu())


def test_qwen3_forward_replays_95_percent_of_its_flaggems_calls(qwen3_on_flaggems):
    counts = qwen3_on_flaggems[4]
    calls = counts["replayed"] + counts["recorded"] + counts["python"]
    assert calls > 0 and counts["replayed"] >= 0.95 * calls, counts


def test_compiled_extern_out_calls_replay_with_the_python_path_result(gems):
    """Inductor calls matmuls as extern kernels with out= buffers (`extern_kernels.addmm(..., out=buf)`),
    which the shipped config routes to FlagGems' out adapters: those calls replay, with the bits of the
    Python path."""
    routed = {"aten::addmm.out", "aten::bmm.out"}
    if not routed <= set(_flaggems.routable_ops()):
        pytest.skip(f"FlagGems does not route all of {sorted(routed)}")
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64))
    mlp = mlp.to("flagos", torch.bfloat16)
    x = t(8, 64, dtype=torch.bfloat16, gen=gen)
    a, b = t(4, 16, 32, dtype=torch.bfloat16, gen=gen), t(4, 32, 8, dtype=torch.bfloat16, gen=gen)

    def f(x, a, b):
        return mlp(x).softmax(-1), torch.bmm(a, b).relu()

    compiled = torch.compile(f)
    routing.load_config(routing.package_config("flaggems_cuda"))
    try:
        with torch.no_grad():
            for _ in range(3):  # compiles, then two recordings
                compiled(x, a, b)
            routing.reset_counts()
            actual = compiled(x, a, b)
            counts = routing.replay_counts()
            with replay(False):
                expected = compiled(x, a, b)
    finally:
        routing.load_config(None)
        torch._dynamo.reset()
    for op in routed:
        assert counts["ops"].get(op, {}).get("replayed", 0) >= 1, counts
    assert counts["python"] == 0 and counts["recorded"] == 0, counts
    for got, want in zip(actual, expected, strict=True):
        assert torch.equal(got.cpu(), want.cpu())
