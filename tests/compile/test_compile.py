"""torch.compile on flagos: compiled results equal eager flagos results.

On the simulated accelerator (CI) Inductor compiles flagos graphs to C++ kernels over flagos's host memory;
where flagos is backed by CUDA (the GPU machine) to Triton kernels. The same tests run on both: every
function and module below is compiled with the default ``torch.compile`` (the Inductor backend) and its
outputs compared with eager flagos's on the same inputs (copies of seeded CPU tensors), with tolerances for
the dtype (a fused kernel rounds in another order than eager's kernels). Also: outputs are flagos tensors on
the inputs' device, gradients through AOTAutograd, seeded RNG, dynamic shapes, graph breaks, bounded
recompilation, extern kernels going through flagos's router, compiled kernels ordered after work queued
on flagos streams, and what ``import torch_fl`` leaves alone. Shapes are small: compiling is the cost.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from compile_cases import CASES, DEVICE, GROUPS, assert_same, ints, rand  # tests/ is on sys.path
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import torch_fl
from torch_fl import routing
from torch_fl._compile import graph_replay


def _clone_args(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def counted(fn, **kwargs):
    """``torch.compile(fn)`` with the default (Inductor) backend, and a counter of the graphs it compiled:
    tests check it, so that a silent fall-back to eager (a graph break, a cache limit) cannot pass."""
    counter = CompileCounterWithBackend("inductor")
    return torch.compile(fn, backend=counter, **kwargs), counter


def _run_group(cases, all_args):
    return [case.fn(*args) for case, args in zip(cases, all_args, strict=True)]


@pytest.mark.parametrize("group", list(GROUPS))
def test_functions_compiled_match_eager(group):
    cases = GROUPS[group]
    all_args = [case.args() for case in cases]
    eager_args = [_clone_args(args) for args in all_args]
    compiled_args = [_clone_args(args) for args in all_args]
    expected = _run_group(cases, eager_args)
    torch._dynamo.reset()  # each group compiles _run_group afresh (one code object for every group)
    compiled, counter = counted(_run_group)
    actual = compiled(cases, compiled_args)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs: a graph break in group {group}"
    assert len(CASES) >= 40
    for case, a, e, ca, ea in zip(cases, actual, expected, compiled_args, eager_args, strict=True):
        assert_same(a, e, case.scale, case.name)
        if case.mutates:
            assert_same(ca, ea, case.scale, f"{case.name}: mutated inputs")


# ---- modules, forward and backward ------------------------------------------------------------------


class TinyBlock(nn.Module):
    """A pre-norm transformer block: attention (SDPA) and a gated MLP."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.gate, self.up, self.down = nn.Linear(dim, 64), nn.Linear(dim, 64), nn.Linear(64, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


MODULES = {  # a whole compiled training step: tests/models/test_qwen3_compile.py
    "conv2d_bn": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        ),
        lambda: rand(2, 3, 8, 8),
    ),
    "embedding_mlp": (
        lambda: nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(40, 3)),
        lambda: ints(20, 4, 5),
    ),
    "transformer_block": (TinyBlock, lambda: rand(2, 6, 32)),
}


def _module_pair(name):
    make, make_input = MODULES[name]
    torch.manual_seed(0)
    module = make().to(DEVICE)
    return module, copy.deepcopy(module), make_input()


@pytest.mark.parametrize("name", list(MODULES))
def test_module_forward_and_backward_compiled_match_eager(name):
    """The module's output and every parameter's gradient (AOTAutograd's forward and backward graphs)."""
    eager, compiled, x = _module_pair(name)
    out = eager(x)
    compiled_module, counter = counted(compiled)
    out_c = compiled_module(x)
    assert counter.frame_count == 1
    assert_same(out_c, out, 8.0)
    out.float().pow(2).mean().backward()
    out_c.float().pow(2).mean().backward()
    for (pname, p), pc in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        assert pc.grad is not None and pc.grad.device == p.device, pname
        assert_same(pc.grad, p.grad, 16.0, f"grad of {pname}")


# ---- training -------------------------------------------------------------------------------------------


def _train_steps(model, step, steps=3):
    g = torch.Generator().manual_seed(21)
    x, y = torch.randn(8, 16, generator=g).to(DEVICE), torch.randn(8, 4, generator=g).to(DEVICE)
    return [step(model, x, y).item() for _ in range(steps)]


def _make_training(compile_optimizer: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    opt_step = torch.compile(opt.step) if compile_optimizer else opt.step

    def step(model, x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt_step()
        return loss

    return model, opt, step


def test_compiled_optimizer_step_matches_eager():
    """Eager forward and backward, ``torch.compile(optimizer.step)`` (AdamW, foreach): losses, weights and
    optimizer state as eager's. (A whole training step compiled in one function, optimizer included:
    tests/models/test_qwen3_compile.py.)"""
    eager_model, eager_opt, eager_step = _make_training(compile_optimizer=False)
    model, opt, step = _make_training(compile_optimizer=True)
    expected = _train_steps(eager_model, eager_step)
    actual = _train_steps(model, step)
    # Inductor fuses AdamW's update into Triton kernels (backed by CUDA) whose fp32 rounding differs from the
    # eager foreach kernels', as on cuda: measured 1.2e-5 relative on the H100 by the third step.
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert expected[-1] < expected[0]
    for (name, p_e), p in zip(eager_model.named_parameters(), model.parameters(), strict=True):
        assert p.device.type == DEVICE
        assert_same(p.detach(), p_e.detach(), 16.0, name)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_same(opt.state[p][key], eager_opt.state[p_e][key], 16.0, f"{name} {key}")


def test_an_optimizer_compiled_first_keeps_its_state_on_flagos(run_python):
    """The process's first compile an optimizer step (torch's compiled-optimizer recipe): Dynamo traces it
    before Inductor's hook would register flagos, so torch_fl registers with Dynamo when Dynamo is imported
    (a finder that leaves sys.meta_path once it has run)."""
    code = """
    import sys
    import torch, torch_fl
    from torch_fl._compile import _AfterImport
    import importlib.util
    assert "torch._dynamo" not in sys.modules
    assert importlib.util.find_spec("torch._dynamo") is not None  # a lookup, as libraries make: no import
    assert "torch._dynamo" not in sys.modules
    assert any(isinstance(f, _AfterImport) for f in sys.meta_path)
    model = torch.nn.Linear(4, 4).to("flagos")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4, device="flagos")).sum().backward()
    torch.compile(opt.step)()
    assert not any(isinstance(f, _AfterImport) for f in sys.meta_path)
    assert torch_fl._compile.status()["device_interface"]
    assert opt.param_groups[0]["capturable"], opt.param_groups[0]
    assert {v.device.type for s in opt.state.values() for v in s.values()} == {"flagos"}
    """
    run_python(code).check()


def test_compiled_optimizer_keeps_its_state_on_flagos(run_python):
    """As Dynamo does for cuda parameters: a compiled optimizer's first step makes the param groups of
    flagos parameters capturable, so its state (the step counters too) lives on flagos and the compiled
    step has no CPU kernels (adapters.capturable_optimizer_state); the update is eager's."""
    code = """
    import torch, torch_fl
    from torch import nn
    torch.compile(lambda x: x + 1)(torch.ones(2, device="flagos"))  # torch_fl registers with the compiler
    torch.manual_seed(0)
    models = [nn.Linear(4, 4).to("flagos") for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in models]
    steps = [opts[0].step, torch.compile(opts[1].step)]
    x = torch.randn(2, 4).to("flagos")
    for _ in range(3):
        for model, opt, step in zip(models, opts, steps):
            opt.zero_grad()
            model(x).sum().backward()
            step()
    devices = {k: v.device.type for s in opts[1].state.values() for k, v in s.items()}
    assert devices == {"step": "flagos", "exp_avg": "flagos", "exp_avg_sq": "flagos"}, devices
    assert all(group["capturable"] for group in opts[1].param_groups)
    assert all(not group["capturable"] for group in opts[0].param_groups)  # eager: as the user made it
    for eager, compiled in zip(models[0].parameters(), models[1].parameters()):
        # The capturable update computes the bias corrections on device tensors, fused: float32 rounding.
        torch.testing.assert_close(compiled.cpu(), eager.cpu(), rtol=1e-4, atol=1e-5)
    assert "dynamo.variables.optimizer.OptimizerVariable._set_capturable" in torch_fl._compile.status()["adapters"]
    """
    run_python(code).check()


# ---- RNG ------------------------------------------------------------------------------------------------


def _random_ops(x):
    return F.dropout(x, p=0.5, training=True), torch.rand_like(x), torch.randn(x.shape, device=x.device)


def test_rng_fallback_random_equals_eager():
    """With ``fallback_random``, compiled random ops call flagos's random operators: under one seed they
    draw the numbers eager draws. ``torch.manual_seed`` seeds every generator: ``aten::native_dropout``
    takes no generator argument and draws from the native device's default one (docs/design.md)."""
    x = rand(16, 32)
    torch.manual_seed(123)
    expected = _random_ops(x)
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(_random_ops)
        torch.manual_seed(123)
        actual = compiled(x)
    assert_same(actual, expected)


def test_rng_seeded_compiled_random_is_reproducible():
    """Inductor's own random numbers (the default) follow ``torch.flagos.manual_seed``: the same seed gives
    the same numbers, another seed others; dropout keeps about half and scales by 2."""
    x = torch.ones(64, 64, device=DEVICE)
    compiled = torch.compile(_random_ops)
    torch.flagos.manual_seed(7)
    first = compiled(x)
    torch.flagos.manual_seed(7)
    again = compiled(x)
    torch.flagos.manual_seed(8)
    other = compiled(x)
    for a, b, c in zip(first, again, other, strict=True):
        assert torch.equal(a.cpu(), b.cpu())
        assert not torch.equal(a.cpu(), c.cpu())
    dropped, uniform, normal = (t.cpu() for t in first)
    assert set(dropped.unique().tolist()) <= {0.0, 2.0} and 0.4 < (dropped == 0).float().mean() < 0.6
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.05
    assert abs(normal.mean()) < 0.1 and abs(normal.std() - 1) < 0.1


# ---- dynamic shapes, graph breaks, recompilation ----------------------------------------------------------


def _rowwise(x):
    return (x - x.mean(-1, keepdim=True)).softmax(-1) * x.shape[0]


def _dynamic_attention(q):
    return F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True).sum(-1) + _rowwise(q.sum(-1))


def test_dynamic_shapes_compile_once():
    """One graph for every size, attention included (its choice made on symbolic sizes)."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_dynamic_attention, backend=counter, dynamic=True)
    for batch, length in ((3, 8), (4, 8), (3, 12), (5, 6)):  # no 0 or 1 (specialized), no 2 (heads)
        q = rand(batch, 2, length, 16)
        assert_same(compiled(q), _dynamic_attention(q), 8.0, f"{batch}x{length}")
    assert counter.frame_count == 1


def test_automatic_dynamic_bounds_recompilation():
    """Without ``dynamic``: one static graph, then one dynamic graph for every later size; the same size
    again never recompiles."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda x: (x * 3).cumsum(0) - x.flip(0), backend=counter)
    for n in (4, 5, 6, 9, 17, 4, 5):
        x = rand(n, 3)
        assert_same(compiled(x), (x * 3).cumsum(0) - x.flip(0), 4.0, f"size {n}")
    assert counter.frame_count == 2
    for _ in range(3):
        compiled(rand(9, 3))
    assert counter.frame_count == 2


def _with_graph_breaks(x):
    y = x.sin() * 2
    torch._dynamo.graph_break()
    if y.sum() > 0:  # data-dependent branch: another break
        y = y + 1
    return y.cos() @ x.t()


def test_graph_breaks_give_eager_results():
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_with_graph_breaks, backend=counter)
    for seed in (0, 1):
        x = rand(6, 6, seed=seed)
        assert_same(compiled(x), _with_graph_breaks(x), 8.0)
    assert 2 <= counter.frame_count <= 4


def test_mixed_devices_and_scalars():
    """CPU scalar tensors, a CPU input and a CPU constructor moved to flagos inside the graph, and a result
    copied to the CPU. Inductor moves CPU constructors to the process's GPU type: backed by CUDA that must
    be flagos, or the graph would mix cuda and flagos tensors, which Inductor refuses to compile."""

    def fn(x, cpu_scale, cpu_bias):
        positions = torch.arange(x.shape[-1], dtype=x.dtype).to(x.device)
        y = x * cpu_scale + cpu_bias.to(x.device) + positions
        return y, y.sum().cpu()

    args = (rand(4, 8), torch.tensor(3.0), torch.randn(8))
    assert_same(torch.compile(fn)(*args), fn(*args), 2.0)


def _attention_ops(fn, *args) -> list[str]:
    """The aten attention ops an eager call of ``fn`` runs (recorded by a dispatch mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Record():
        fn(*args)
    return [name for name in seen if name.startswith("_scaled_dot_product")]


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_traced_attention_runs_eagers_fused_kernel(requires_grad):
    """Tracing SDPA on flagos records the fused attention op eager runs (flagos's choice, made from the
    fake tensors' metadata by the native device) and no ``_fused_sdp_choice`` node."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (rand(2, 4, 8, 16, seed=i).requires_grad_(requires_grad) for i in range(3))
    eager = _attention_ops(attention, q, k, v)
    graph = make_fx(attention, tracing_mode="fake")(q, k, v).graph
    traced = [
        n.target.overloadpacket.__name__
        for n in graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    ]
    assert "_fused_sdp_choice" not in traced
    assert eager and eager[0] != "_scaled_dot_product_attention_math", eager
    assert [name for name in traced if name.startswith("_scaled_dot_product")] == eager, (traced, eager)


# ---- where the work runs ----------------------------------------------------------------------------------


def _on_device(x, w):
    return (x @ w).softmax(-1) + x.sum()


def test_second_device(two_devices_only):
    """A graph on flagos:1 while device 0 is current: eager's results, on flagos:1."""
    compiled = torch.compile(_on_device)
    x, w = rand(4, 8).to("flagos:1"), rand(8, 8, seed=1).to("flagos:1")
    assert torch.flagos.current_device() == 0
    out = compiled(x, w)
    assert out.device == torch.device("flagos:1")
    assert_same(out, _on_device(x, w), 8.0)


def _buffers(x, w):
    h = (x @ w).softmax(-1)  # the matmul's output and the softmax's are buffers of the graph
    return (h @ w).relu() + h.sum(0)


@pytest.mark.parametrize("index", [0, 1])
def test_buffers_are_allocated_through_torch_fl(index, device_count):
    """The wrapper allocates flagos buffers with ``empty_strided_flagos`` (torch_fl._C._empty_strided, as
    cuda's with torch's C++ empty_strided_cuda), on the graph's device by index, not with
    ``torch.empty_strided(..., device='flagos')``; the results are eager's."""
    from torch._inductor.utils import run_and_get_code

    if index >= device_count:
        pytest.skip("needs a second flagos device")
    torch._dynamo.reset()  # a graph compiled for the other index would be reused from Dynamo's cache
    x, w = rand(8, 16, seed=4).to(f"flagos:{index}"), rand(16, 16, seed=5).to(f"flagos:{index}")
    out, codes = run_and_get_code(torch.compile(_buffers), x, w)
    code = "\n".join(codes)
    assert f"empty_strided_flagos((8, 16), (16, 1), torch.float32, {index})" in code, code
    assert " = empty_strided(" not in code, code  # the generic allocation (the benchmark harness aside)
    assert out.device == torch.device(f"flagos:{index}")
    assert_same(out, _buffers(x, w), 8.0)


def test_fast_allocation_helper():
    """torch_fl._C._empty_strided: a flagos tensor of the size, strides and dtype asked, on the device by
    index (-1: the current one); clear errors for a wrong dtype, sizes that do not match the strides, a
    wrong device or number of arguments."""
    t = torch_fl._C._empty_strided((2, 3), (1, 2), torch.bfloat16, 0)
    assert (t.device, t.shape, t.stride(), t.dtype) == (
        torch.device("flagos:0"),
        torch.Size([2, 3]),
        (1, 2),
        torch.bfloat16,
    )
    assert torch_fl._C._empty_strided((), (), torch.int64).device == torch.device("flagos", 0)
    with pytest.raises(TypeError, match="torch.dtype"):
        torch_fl._C._empty_strided((2,), (1,), "float32", 0)
    with pytest.raises(TypeError, match="size must be ints"):
        torch_fl._C._empty_strided((2.0,), (1,), torch.float32, 0)
    with pytest.raises(OverflowError):
        torch_fl._C._empty_strided((2**70,), (1,), torch.float32, 0)
    with pytest.raises(RuntimeError, match="2 sizes but 1 strides"):
        torch_fl._C._empty_strided((2, 3), (1,), torch.float32, 0)
    with pytest.raises(TypeError, match="takes 3 or 4 positional arguments, got 2"):
        torch_fl._C._empty_strided((2,), (1,))
    with pytest.raises(TypeError, match="device must be an int"):
        torch_fl._C._empty_strided((2,), (1,), torch.float32, "flagos:0")
    with pytest.raises(ValueError, match="device 300 is not a device index"):
        torch_fl._C._empty_strided((2,), (1,), torch.float32, 300)
    last = torch.flagos.device_count() - 1
    with pytest.raises(IndexError, match=f"invalid flagos device index {last + 1}"):
        torch_fl._C._empty_strided((2,), (1,), torch.float32, last + 1)
    # Another device than the current one: allocated there, the current device left as it was.
    assert torch_fl._C._empty_strided((2,), (1,), torch.float32, last).device == torch.device("flagos", last)
    assert torch.flagos.current_device() == 0


def test_side_stream():
    compiled = torch.compile(_on_device)
    x, w = rand(4, 8, seed=2), rand(8, 8, seed=3)
    side = torch.flagos.Stream()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):
        y = compiled(x, w)
    torch.flagos.current_stream().wait_stream(side)
    assert_same(y, _on_device(x, w), 8.0)


@pytest.mark.gpu
@pytest.mark.skipif(torch_fl.accelerator() != "cuda", reason="flagos backed by CUDA")
def test_triton_kernels_run_on_flagos_current_stream():
    """A copy queued behind a long kernel on a side stream, then a compiled graph on that stream: its
    Triton kernels launch on flagos's current stream (CUDA's), so they see the copy's result."""
    compiled = torch.compile(lambda t: t * 2 + 1)
    n = 1 << 20
    x = torch.zeros(n, device=DEVICE)
    compiled(x)
    src = torch.arange(n, dtype=torch.float32, device=DEVICE)
    torch.flagos.synchronize()
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        torch.cuda._sleep(200_000_000)  # a spinning kernel on the current (side) stream
        x.copy_(src)
        y = compiled(x)
        pending = not side.query()
    torch.flagos.current_stream().wait_stream(side)
    assert pending, "the side stream was idle already: the test proves nothing"
    assert torch.equal(y.cpu(), src.cpu() * 2 + 1)


def test_extern_kernels_go_through_the_router():
    """mm is left to ATen by Inductor: the compiled graph calls flagos's mm, which the router serves and
    counts; a routing rule set afterwards decides the compiled graph's mm like an eager one's."""
    fn = torch.compile(lambda a, b: (a @ b).relu() + 1)
    a, b = rand(8, 16), rand(16, 8, seed=1)
    expected = (a @ b).relu() + 1
    fn(a, b)  # compiled
    routing.reset_counts()
    assert_same(fn(a, b), expected, 8.0)
    native = routing.counts().get("native", 0)
    assert native >= 1, routing.counts()
    routing.reset_counts()
    with routing.override({"aten::mm.out": "cpu", "aten::mm": "cpu"}):
        assert_same(fn(a, b), expected, 8.0)
    assert routing.counts().get("cpu", 0) >= 1, routing.counts()


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_compile_modes(mode):
    """Both modes ask for CUDA graphs (max-autotune autotunes too) and give eager's results. They replay
    flagos graphs (the first call warms up, the second records, later calls replay; Inductor counts no
    skip): CUDA graphs when backed, on the simulated accelerator graphs that record the C++ kernels'
    calls (docs/compile.md)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    skips, before = counters["inductor"]["cudagraph_skips"], graph_replay.stats()
    fn = torch.compile(lambda x, w: F.gelu(x @ w) * 2, mode=mode)
    w = rand(32, 16, seed=1)
    outputs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x = rand(16, 32, seed=10 + i)
            outputs.append((fn(x, w), F.gelu(x @ w) * 2))
    assert not [m for m in caught if "not replayed" in str(m.message)], [str(m.message) for m in caught]
    for actual, expected in outputs:  # kept across calls: replays must not overwrite earlier outputs
        assert_same(actual, expected, 8.0)
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert _replays_since(before) == {"eager": 1, "recorded": 1, "replayed": 3}


def _replays_since(before):
    after = graph_replay.stats()
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize("partition", [True, False], ids=["graph_partition", "whole_graph"])
def test_reduce_overhead_replays_with_mutation_and_new_values(partition):
    """reduce-overhead with an input the graph mutates (copied into the graph's buffer and back), a
    parameter-like static input changed in place between calls (read in place) and a copied input whose
    values change between calls (the same tensor refilled): every call gives eager's results and state,
    and after the warm-up and one recording every call is a replay. With and without graph partitions
    (torch's default partitions the graph; partitions take flagos nodes on either accelerator)."""
    torch._dynamo.reset()

    def step(x, w, acc):
        y = torch.tanh(x @ w) + 1
        acc.add_(y.sum(0))
        return y * acc, acc.mean()

    w = rand(8, 4, seed=1)
    torch._dynamo.mark_static_address(w)
    acc, acc_eager, x = torch.zeros(4, device=DEVICE), torch.zeros(4, device=DEVICE), rand(6, 8, seed=2)
    with torch._inductor.config.patch(graph_partition=partition):
        compiled = torch.compile(step, mode="reduce-overhead")
        before = graph_replay.stats()
        for i in range(5):
            x.copy_(rand(6, 8, seed=10 + i))  # new values in the same input tensor
            if i == 3:
                w.mul_(0.5)  # a static input changed in place: the replay reads it
            actual, expected = compiled(x, w, acc), step(x, w, acc_eager)
            for a, e in zip(actual, expected, strict=True):
                assert_same(a, e, 8.0, f"call {i}")
            assert_same(acc, acc_eager, 8.0, f"call {i}: the mutated input")
    assert _replays_since(before) == {"eager": 1, "recorded": 1, "replayed": 4}


def test_reduce_overhead_training_step():
    """A training step compiled with reduce-overhead: the forward and the backward graph (AOTAutograd's)
    each warm up, record and replay; losses and gradients stay eager's, also for gradients kept from an
    earlier step (replays must not overwrite them)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(DEVICE)
    reference = copy.deepcopy(model)

    def step(m, x, y):
        loss = F.mse_loss(m(x), y)
        loss.backward()
        return loss.detach()

    compiled = torch.compile(step, mode="reduce-overhead")
    before = graph_replay.stats()
    kept = []
    for i in range(4):
        x, y = rand(8, 16, seed=i), rand(8, 4, seed=100 + i)
        assert_same(compiled(model, x, y), step(reference, x, y), 8.0, f"loss of step {i}")
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert_same(p.grad, q.grad, 8.0, f"step {i}: grad of {name}")
        kept.append([p.grad for p in model.parameters()])
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            p.grad, q.grad = None, None
    for i, grads in enumerate(kept[:-1]):
        for g, later in zip(grads, kept[i + 1], strict=True):
            assert not torch.equal(g, later), f"step {i}'s gradient was overwritten by a later replay"
    # forward: warm-up, record, 2 replays; backward: warm-up (the eager forward's saved tensors), then on
    # copies out of replays (the same signature, warmed up) record, 2 replays (test_compile_graph_replay.py).
    assert _replays_since(before) == {"eager": 2, "recorded": 2, "replayed": 6}


def test_cpp_wrapper_is_a_clear_error():
    with torch._inductor.config.patch(cpp_wrapper=True):
        with pytest.raises(Exception, match="cpp_wrapper=True"):
            torch.compile(lambda x: x * 2 + 1)(rand(4))


def test_registration_status():
    # The first compile registers (so the test passes run alone too).
    torch.compile(lambda t: t + 1)(torch.ones(1, device=DEVICE))
    status = torch_fl._compile.status()
    assert status["inductor"] and status["device_interface"]
    assert status["flavour"] == ("triton" if torch_fl.accelerator() == "cuda" else "cpp")
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import get_scheduling_for_device
    from torch._inductor.utils import is_gpu

    assert get_interface_for_device(DEVICE).current_device() == torch.flagos.current_device()
    assert get_scheduling_for_device(DEVICE) is torch.flagos.Scheduling
    assert is_gpu(DEVICE) == (status["flavour"] == "triton")
    # reduce-overhead replays flagos graphs on both; graph partitions need telling only where not a GPU type.
    assert "inductor.compile_fx.cudagraphify" in status["adapters"]
    partitions = "inductor.scheduler.Scheduler.should_partition" in status["adapters"]
    assert partitions == (status["flavour"] == "cpp"), status["adapters"]


_STREAM_ORDER_SCRIPT = """
import json, torch
out = {}
# torch's compiler first: Inductor's PrivateUse1 hook runs before torch_fl exists, so import registers.
torch.compile(lambda t: t + 1)(torch.ones(2))
import torch_fl
out["registered_at_import"] = torch_fl._compile.status()["inductor"]
n = 1 << 16
compiled = torch.compile(lambda x: x * 2 + 1)
x = torch.zeros(n, device="flagos")
compiled(x)  # compiled and run once before the timed part
src = torch.arange(n, dtype=torch.float32).pin_memory()
x.copy_(src, non_blocking=True)  # queued on the current stream, run after the stream's delay
out["copy_pending"] = not torch.flagos.current_stream().query()
out["default_stream"] = torch.equal(compiled(x).cpu(), src * 2 + 1)
side = torch.flagos.Stream()
y = torch.zeros(n, device="flagos")
src3 = (src * 3).pin_memory()
with torch.flagos.stream(side):
    y.copy_(src3, non_blocking=True)
    out["side_pending"] = not side.query()
    z = compiled(y)
side.synchronize()
out["side_stream"] = torch.equal(z.cpu(), src * 6 + 1)
# reduce-overhead: a replay's recorded kernels wait for the copy queued before the call, as the calls do.
from torch_fl._compile import graph_replay
replayed = graph_replay.stats()["replayed"]
graphed = torch.compile(lambda x: x * 3 - 1, mode="reduce-overhead")
ok = []
for i in range(4):
    x.copy_((src + i).pin_memory(), non_blocking=True)
    ok.append(torch.equal(graphed(x).cpu(), (src + i) * 3 - 1))
out["replays_wait"] = all(ok) and graph_replay.stats()["replayed"] - replayed == 3
print("RESULT " + json.dumps(out))
"""


@pytest.mark.skipif(torch_fl.accelerator() != "sim", reason="the simulated accelerator's stream delay")
def test_compiled_host_kernels_wait_for_queued_stream_work(run_python):
    """With every stream task delayed, an async copy into a compiled graph's input is still queued when
    the graph runs: its C++ kernel must wait for the current stream (default, then a side stream), also
    when replayed from a flagos graph (reduce-overhead). The process compiles a CPU function before
    importing torch_fl: import then registers at once."""
    env = {"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "200000"}
    out = run_python(_STREAM_ORDER_SCRIPT, env=env, timeout=240).check().json()
    assert out["registered_at_import"], "not registered at import though Inductor was loaded"
    assert out["copy_pending"] and out["side_pending"], "the copies were not pending: the test proves nothing"
    assert out["default_stream"], "a compiled kernel read its input before the queued copy into it ran"
    assert out["side_stream"], "a compiled kernel on a side stream did not wait for that stream"
    assert out["replays_wait"], "a replayed compiled kernel read its input before the queued copy into it ran"


def test_compile_cache_key_carries_torch_fl(run_python):
    """Inductor's caches key graphs by torch's sources, not torch_fl's: the first compile adds a hash of
    torch_fl's compile code to ``cache_key_tag`` (a user's tag kept in front), so graphs cached under another
    torch_fl are not loaded with code generated for it."""
    from torch.compiler import config

    if not hasattr(config, "cache_key_tag"):
        pytest.skip("this torch has no torch.compiler.config.cache_key_tag")
    code = """
    import hashlib, pathlib, torch, torch_fl
    torch.compile(lambda t: t * 2)(torch.ones(2, device="flagos"))
    from torch.compiler import config
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(torch_fl._compile.__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    assert config.cache_key_tag == "mine+torch_fl-" + digest.hexdigest()[:16], config.cache_key_tag
    torch_fl._compile.tag_compile_cache()  # again: the tag is not added twice
    assert config.cache_key_tag.count("torch_fl-") == 1, config.cache_key_tag
    """
    run_python(code, env={"TORCH_COMPILE_CACHE_KEY_TAG": "mine"}).check()


def test_import_loads_no_compiler(run_python):
    """``import torch_fl`` imports neither Dynamo nor Inductor (a second of import time): the first compile
    registers flagos, through Inductor's PrivateUse1 hook (test_registration_status)."""
    code = """
    import sys, torch, torch_fl
    assert "torch._dynamo" not in sys.modules and "torch._inductor" not in sys.modules, sorted(
        m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor")))
    assert not torch_fl._compile.status()["inductor"]
    """
    run_python(code).check()


_BACKED_GLUE_SCRIPT = """
import torch, torch_fl
from torch._inductor.runtime import hints

seen = []
hints.DeviceProperties.create = classmethod(lambda cls, device: seen.append(device) or "cuda properties")
from torch._inductor import utils
from torch._inductor.codegen.common import get_device_op_overrides, get_scheduling_for_device
from torch_fl._compile import backed, device_interface

classes, adapters = backed.register("flagos")
assert hints.DeviceProperties.create(torch.device("flagos", 1)) == "cuda properties"
assert seen == [torch.device("cuda", 1)], seen
assert hints.DeviceProperties.create(torch.device("cpu")) == "cuda properties" and seen[-1] == torch.device("cpu")
assert utils.is_gpu("flagos") and "cuda" in utils.GPU_TYPES
assert utils.get_gpu_type() == "flagos", utils.get_gpu_type()
assert get_scheduling_for_device("flagos") is backed.BackedScheduling is classes["Scheduling"]
# A class, a TritonScheduling by type: Inductor's is_triton (argmax, max over a dim, scans) asserts that much
# of a device other than cuda; constructed, it is the scheduling cuda gets.
from torch._inductor import ir
from torch._inductor.codegen.common import BackendFeature, get_backend_features
from torch._inductor.codegen.cuda_combined_scheduling import CUDACombinedScheduling
assert ir.is_triton(torch.device("flagos")) and ir.is_triton("flagos")
assert type(backed.BackedScheduling(None)) is CUDACombinedScheduling
assert BackendFeature.TUPLE_REDUCTION in get_backend_features("flagos")
assert "_cuda_getCurrentRawStream" in get_device_op_overrides("flagos").import_get_raw_stream_as("s")
assert get_device_op_overrides("flagos") is get_device_op_overrides("cuda")
assert device_interface.interface_for("triton") is device_interface.BackedInterface
assert sorted(adapters) == sorted([
    "inductor.utils.GPU_TYPES", "inductor.utils.get_gpu_type", "inductor.runtime.hints.DeviceProperties.create",
    "inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes", "inductor.compile_fx.cudagraphify",
    "inductor.output_code.maybe_handle_backward_generation", "inductor.codecache.AotCodeCompiler.compile",
]), adapters
# AOTInductor: the model of a flagos graph is CUDA's (torch_fl/_compile/aot.py).
from torch._inductor.codegen.cpp_wrapper_gpu import CppWrapperGpu
assert issubclass(classes["CppWrapperCodegen"], CppWrapperGpu)
assert classes["CppWrapperCodegen"].get_c_shim_func_name("at::mm_out", "flagos") == "aoti_torch_cuda_mm_out"
assert classes["CppWrapperCodegen"].get_c_shim_func_name("at::mm_out", "cpu") == "aoti_torch_cpu_mm_out"
# reduce-overhead: one flagos device is no reason to skip graphs; CPU nodes and mixed devices still are.
from torch._inductor import compile_fx, cudagraph_utils, output_code
F0, C0 = torch.device("flagos", 0), torch.device("cuda", 0)
assert cudagraph_utils.check_multiple_devices_or_any_cpu_nodes({F0: None}) is None
assert cudagraph_utils.check_multiple_devices_or_any_cpu_nodes({C0: None}) is None
assert "multiple devices" in cudagraph_utils.check_multiple_devices_or_any_cpu_nodes({F0: None, C0: None})
assert "multiple devices" in cudagraph_utils.check_multiple_devices_or_any_cpu_nodes(
    {F0: None, torch.device("flagos", 1): None})
class Node:
    name, meta, users = "cpu_node", {}, {}
assert "cpu device" in cudagraph_utils.check_multiple_devices_or_any_cpu_nodes(
    {F0: None, torch.device("cpu"): Node()})
class Graph:
    device_types = {"flagos"}
assert output_code.maybe_handle_backward_generation(Graph(), None) is None
# The wrapper gives a callable of flagos tensors flagos graph replay (the simulated accelerator's graphs).
def model(inputs):
    x, w = inputs
    inputs.clear()
    return [x @ w + 1]
run = compile_fx.cudagraphify(model, (1,), device_index=0, stack_traces=[None], is_backward=False,
                              is_inference=True, mutated_input_idxs=())
w = torch.randn(8, 8).to("flagos")
from torch_fl._compile import graph_replay
before = graph_replay.stats()
for i in range(3):
    x = torch.full((4, 8), float(i)).to("flagos")
    (out,) = run([x, w])
    assert torch.equal(out.cpu(), (x @ w + 1).cpu())
after = graph_replay.stats()
assert (after["eager"] - before["eager"], after["recorded"] - before["recorded"],
        after["replayed"] - before["replayed"]) == (1, 1, 2), (before, after)
print("RESULT {}")
"""


def test_backed_registration_glue(run_python):
    """What flagos backed by CUDA registers, checked where no GPU exists (the GPU tests run it for real):
    CUDA's scheduling and op overrides under the flagos name, flagos a GPU type and the process's one,
    Triton's device properties those of the CUDA device of the same index, and reduce-overhead's graph
    replay for flagos graphs (the wrapping run here on the simulated accelerator's graphs)."""
    run_python(_BACKED_GLUE_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim"}, timeout=120).check()
