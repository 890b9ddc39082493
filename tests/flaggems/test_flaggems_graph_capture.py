"""Graph capture of FlagGems' kernels on an NVIDIA GPU (docs/graphs.md, docs/flaggems.md).

A Qwen3 decoder layer with every op the shipped FlagGems config (torch_fl/configs/flaggems_cuda.conf)
routes to ``flaggems``: warmed up eagerly on a side stream, captured with ``torch.flagos.graph``, replayed on
two inputs; each replay must equal the eager layer bitwise, and FlagGems must have run (its functions are
called while capturing, so their kernels are what the graph holds). Then the per-op audit
(tools/flaggems_capture_audit.py) on a handful of transformer ops, in a subprocess: each must be capturable
after warm-up, its replay equal to eager. Skipped without a GPU (``gpu`` marker) or without a usable
FlagGems.

    python -m pytest tests/flaggems/test_flaggems_graph_capture.py -q
"""

from __future__ import annotations

import contextlib
import json
import pathlib

import pytest
import test_flaggems_kernels
import torch
from test_flaggems_kernels import HIDDEN, qwen3_layer, qwen3_params, rope, shipped_flaggems_ops

from harness.flaggems import RouteCallCounter, bitwise_equal
from torch_fl import _flaggems, routing

pytestmark = pytest.mark.gpu

REPO = pathlib.Path(__file__).resolve().parents[2]
SEQ = 8  # a short prefill; the layer's ops are those of a decode step too
# Ops of a Qwen3 layer that certainly run on FlagGems with the shipped config (mm and mul stay native there);
# one of each group must have run, eagerly and while capturing.
CERTAIN = (
    "aten::silu|aten::silu.out",
    "aten::rms_norm",  # the config routes the op itself (its fused native kernel would run otherwise)
    "aten::add.Tensor|aten::add.out|aten::add_.Tensor",
    "aten::cat|aten::cat.out",
)
# The audit subprocess: transformer ops, an autotuned matmul among them (bmm).
AUDIT_OPS = ("aten::bmm", "aten::_softmax", "aten::silu", "aten::add.Tensor", "aten::rsqrt", "aten::cat")


@pytest.fixture(scope="module")
def gems():
    status = _flaggems.load()
    if not status.available:
        pytest.skip(f"FlagGems is unavailable: {status.reason}")
    return status


@pytest.fixture(scope="module")
def shipped(gems):
    routable = set(_flaggems.routable_ops())
    return [
        op for op in shipped_flaggems_ops() if op in routable and _flaggems.implementation(op) is not None
    ]


def layer_graph_against_eager(ops: list[str]) -> dict:
    """The layer with `ops` routed to flaggems: eager (three warm-up calls on a side stream, then a second
    input) against a graph captured on that stream and replayed on both inputs (its output overwritten with
    NaN before each replay). Copies and comparisons run outside the routes (copy_ and _to_copy are routed).
    Returns {"eager": [..], "replayed": [..], "calls": {op: (eager Python calls, calls while capturing)}}."""
    dtype = torch.bfloat16
    native = test_flaggems_kernels.NATIVE  # "cuda" (a variable there so that the logic can be dry-run on CPU)
    generator = torch.Generator(device=native).manual_seed(1)
    inputs = [
        torch.randn(1, SEQ, HIDDEN, device=native, generator=generator).to(dtype).to("flagos")
        for _ in range(2)
    ]
    params = {name: t.to("flagos") for name, t in qwen3_params(dtype).items()}
    cos, sin = (t.to("flagos") for t in rope(SEQ, dtype))
    counters = [RouteCallCounter(op) for op in ops]

    @contextlib.contextmanager
    def routed():
        with contextlib.ExitStack() as stack:
            for counter in counters:
                stack.enter_context(counter)
            stack.enter_context(routing.override({op: "flaggems" for op in ops}))
            yield

    stream = torch.flagos.Stream()
    stream.wait_stream(torch.flagos.current_stream())
    eager = []
    with torch.no_grad(), torch.flagos.stream(stream):
        for x in (inputs[0], inputs[0], inputs[0], inputs[1]):  # three warm-up calls, then the other input
            with routed():
                out = qwen3_layer(x, params, cos, sin)
            eager.append(out.cpu())
    torch.flagos.current_stream().wait_stream(stream)
    eager = eager[2:]  # the last warm-up call (input 0) and input 1
    eager_calls = {c.op: c.calls for c in counters}
    static_x = inputs[0].clone()
    graph = torch.flagos.FlagosGraph()
    replayed_before = replayed_calls()
    with torch.no_grad():
        with routed(), torch.flagos.graph(graph, stream=stream):
            static_out = qwen3_layer(static_x, params, cos, sin)
    # While capturing, a call runs FlagGems' wrapper or replays its recorded launches (docs/flaggems.md).
    replayed_now = replayed_calls()
    calls = {
        c.op: (
            eager_calls[c.op],
            c.calls - eager_calls[c.op] + replayed_now.get(c.op, 0) - replayed_before.get(c.op, 0),
        )
        for c in counters
    }
    replayed = []
    for x in inputs:
        static_x.copy_(x)
        static_out.fill_(float("nan"))
        graph.replay()
        torch.flagos.synchronize()
        replayed.append(static_out.cpu())
    graph.reset()
    return {"eager": eager, "replayed": replayed, "calls": calls}


def replayed_calls() -> dict[str, int]:
    return {op: c["replayed"] for op, c in routing.replay_counts()["ops"].items()}


def describe(eager: torch.Tensor, replayed: torch.Tensor) -> str:
    diff = (eager.double() - replayed.double()).abs().nan_to_num(1e9)
    return f"{int((diff != 0).sum())} of {diff.numel()} elements differ, max abs diff {float(diff.max()):.3g}"


def test_qwen3_layer_graph_replays_eager_bitwise_on_flaggems(shipped):
    # Every op the shipped config routes to flaggems is routed here (attention is native CUDA's SDPA kernel
    # on flagos; mm and mul stay native in the config).
    result = layer_graph_against_eager(shipped)
    ran = {op: calls for op, calls in result["calls"].items() if calls[0]}
    for entry in CERTAIN:
        family = [op for op in entry.split("|") if op in shipped]
        if not family:
            continue
        assert any(result["calls"][op][0] for op in family), (
            f"FlagGems never ran for {entry} eagerly; ran: {ran}"
        )
        assert any(result["calls"][op][1] for op in family), (
            f"FlagGems did not run for {entry} while capturing: its kernels are not in the graph; ran: {ran}"
        )
    problems = [
        f"input {i}: {describe(e, r)}"
        for i, (e, r) in enumerate(zip(result["eager"], result["replayed"], strict=True))
        if not bitwise_equal(e, r)
    ]
    if problems:
        # Tell FlagGems' part from the rest: the same layer with every op native (cuBLAS, CUDA's kernels).
        native = layer_graph_against_eager([])
        native_problems = [
            f"input {i}: {describe(e, r)}"
            for i, (e, r) in enumerate(zip(native["eager"], native["replayed"], strict=True))
            if not bitwise_equal(e, r)
        ]
        message = (
            f"the replay differs from eager with the FlagGems routes ({'; '.join(problems)}); FlagGems ran for "
            f"{sorted(ran)}; the same layer with every op native: "
        )
        if native_problems:
            # Not FlagGems' doing (docs/graphs.md, "Known gaps": the captured bf16 forward differs from eager).
            pytest.xfail(message + f"the replay differs too ({'; '.join(native_problems)})")
        pytest.fail(message + "the replay equals eager")


def test_audit_finds_transformer_ops_capturable_after_warmup(shipped, run_python, tmp_path):
    ops = [op for op in AUDIT_OPS if op in shipped]
    assert ops, "the shipped config routes none of the audited transformer ops"
    result = run_python(
        None,
        args=["-m", "tools.flaggems_capture_audit", "--out-dir", str(tmp_path), "--ops", ",".join(ops)]
        + ["--workers", "2", "--budget-s", "90", "--op-timeout-s", "75"],
        timeout=150,
        cwd=str(REPO),
    )
    assert result.returncode == 0, repr(result)
    report = json.loads((tmp_path / "capture_audit.json").read_text())
    by_op = {r["op"]: r for r in report["results"]}
    assert set(by_op) == set(ops), repr(result)
    not_capturable = {
        op: f"{r['status']}: {r.get('reason', '')}"
        for op, r in by_op.items()
        if r["status"] not in ("capturable-cold", "capturable-after-warmup")
    }
    assert not not_capturable, f"{not_capturable}\n{(tmp_path / 'capture_audit.md').read_text()}"
    for op, r in by_op.items():
        warm = r["warm"]
        assert warm["flaggems_calls"] > 0, f"{op}: FlagGems did not run eagerly: {warm}"
        assert warm["capture_flaggems_calls"] > 0, f"{op}: FlagGems did not run while capturing: {warm}"
        assert warm["replay_equal"] is True, f"{op}: replay differs from eager: {warm.get('replay_message')}"


def test_random_flaggems_op_takes_native_route_inside_capture(gems):
    """FlagGems' random kernels read the generator's state on the host, so inside a capture the router
    sends them native, with one warning: replays draw fresh numbers, the ones a cuda graph draws under the
    same seed, while eager calls stay on FlagGems."""
    if _flaggems.implementation("aten::rand") is None:
        pytest.skip("this FlagGems has no aten::rand")

    def replays(device: str, graph_cls) -> list[torch.Tensor]:
        torch.manual_seed(7)
        side = torch.cuda.Stream() if device == "cuda" else torch.flagos.Stream()
        graph = graph_cls()
        module = torch.cuda if device == "cuda" else torch.flagos
        with module.graph(graph, stream=side):
            out = torch.rand(4096, device=device)
        drawn = []
        for _ in range(2):
            graph.replay()
            drawn.append(out.cpu())
        graph.reset()
        return drawn

    with routing.override({"aten::rand": "flaggems"}), RouteCallCounter("aten::rand") as counter:
        torch.rand(8, device="flagos")
        assert counter.calls == 1, "FlagGems' rand did not run eagerly"
        with pytest.warns(UserWarning, match=r"aten::rand runs on the native route inside a graph capture"):
            on_flagos = replays("flagos", torch.flagos.FlagosGraph)
        assert counter.calls == 1, "FlagGems' rand ran inside the capture"
        torch.rand(8, device="flagos")
        assert counter.calls == 2, "FlagGems' rand did not run eagerly after the capture"
    assert not torch.equal(on_flagos[0], on_flagos[1]), "the replays drew the same numbers"
    on_cuda = replays("cuda", torch.cuda.CUDAGraph)
    for mine, theirs in zip(on_flagos, on_cuda, strict=True):
        assert torch.equal(mine, theirs)


def test_synchronising_flaggems_op_takes_native_route_inside_capture(gems):
    """FlagGems' in-place masked_fill_ synchronises with the device, which a capture forbids: inside a
    capture the router sends it native, with one warning, and the graph replays it on new inputs; eager
    calls stay on FlagGems."""
    op = "aten::masked_fill_.Scalar"
    if _flaggems.implementation(op) is None:
        pytest.skip(f"this FlagGems has no {op}")
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(4096, generator=generator).to("flagos")
    mask = (torch.rand(4096, generator=generator) < 0.5).to("flagos")
    with routing.override({op: "flaggems"}), RouteCallCounter(op) as counter:
        x.clone().masked_fill_(mask, -1.0)
        assert counter.calls == 1, "FlagGems' masked_fill_ did not run eagerly"
        graph = torch.flagos.FlagosGraph()
        with pytest.warns(
            UserWarning, match=r"aten::masked_fill_\S* runs on the native route inside a graph"
        ):
            with torch.flagos.graph(graph, stream=torch.flagos.Stream()):
                out = x.clone().masked_fill_(mask, -1.0)
        assert counter.calls == 1, "FlagGems' masked_fill_ ran inside the capture"
        for _ in range(2):
            x.copy_(torch.randn(4096, generator=generator))
            mask.copy_(torch.rand(4096, generator=generator) < 0.5)
            graph.replay()
            expected = x.cpu().masked_fill(mask.cpu(), -1.0)
            assert torch.equal(out.cpu(), expected)
        graph.reset()
        x.clone().masked_fill_(mask, -1.0)
        assert counter.calls == 2, "FlagGems' masked_fill_ did not run eagerly after the capture"
