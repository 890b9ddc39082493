"""Graphs on flagos (torch.flagos.FlagosGraph and friends): capture, replay, pools, random ops, the failure
cases a capture must reject, torch.accelerator.Graph (torch 2.13), and the Qwen3 static-cache decoder
(make_graphed_callables: test_graphed_callables.py). The same tests run on the simulated accelerator (CI) and
backed by CUDA (GPU)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import torch_fl  # noqa: F401
from harness import qwen3
from harness.static_decode import StaticGreedyDecoder
from torch_fl import routing

DEV = "flagos"
BACKED = torch_fl._C._backing_type() is not None


def warm_capture():
    """One capture and replay first: what a device's first capture sets up for good (library handles and
    their workspaces) is not the graph's memory. Then garbage is collected (torch.flagos.graph, like
    torch.cuda.graph, no longer does), so that memory measured next counts live tensors only, not cycles
    that earlier tests left and a later collection frees."""
    x = torch.ones(1, device=DEV)
    g, _ = capture(lambda: x.add_(1))
    g.replay()
    g.reset()
    del g
    gc.collect()


def capture(fn, **kwargs):
    g = torch.flagos.FlagosGraph()
    with torch.flagos.graph(g, **kwargs):
        out = fn()
    return g, out


def test_replay_reruns_the_work_on_the_same_memory():
    x = torch.ones(4, device=DEV)
    y = torch.zeros(4, device=DEV)

    def body():
        y.add_(x)
        return x * 2 + y

    g, z = capture(body)
    if not BACKED:  # nothing runs while capturing, as on CUDA
        assert torch.equal(y.cpu(), torch.zeros(4))
    g.replay()
    assert torch.equal(y.cpu(), torch.ones(4)) and torch.equal(z.cpu(), torch.full((4,), 3.0))
    x.fill_(10)
    g.replay()
    assert torch.equal(y.cpu(), torch.full((4,), 11.0)) and torch.equal(z.cpu(), torch.full((4,), 31.0))


def test_mixed_ops_match_eager():
    torch.manual_seed(0)
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    sa, sb = a.to(DEV), b.to(DEV)

    def body():
        h = torch.relu(sa @ sb)
        return torch.softmax(h, -1).sum(0), h.mean(), torch.cat([h, h], 1)[:, ::3].contiguous()

    body()  # warm-up before capture (cuBLAS sets up its workspace on first use, which cannot be captured)
    g, outs = capture(body)
    g.replay()
    expected = (torch.softmax(torch.relu(a @ b), -1).sum(0), torch.relu(a @ b).mean())
    torch.testing.assert_close(outs[0].cpu(), expected[0])
    torch.testing.assert_close(outs[1].cpu(), expected[1])
    torch.testing.assert_close(outs[2].cpu(), torch.cat([torch.relu(a @ b)] * 2, 1)[:, ::3])


def test_non_blocking_pinned_copies_are_captured():
    host_in = torch.arange(6.0).pin_memory()
    host_out = torch.zeros(6).pin_memory()
    dev = torch.empty(6, device=DEV)

    def body():
        dev.copy_(host_in, non_blocking=True)
        dev.mul_(2)
        host_out.copy_(dev, non_blocking=True)

    g, _ = capture(body)
    host_in.fill_(3)
    g.replay()
    torch.flagos.synchronize()
    assert torch.equal(host_out, torch.full((6,), 6.0))


def test_random_ops_draw_fresh_numbers_per_replay_and_match_eager():
    torch.flagos.manual_seed(123)
    eager = [torch.rand(5, device=DEV).cpu() for _ in range(2)]
    torch.flagos.manual_seed(123)
    g, r = capture(lambda: torch.rand(5, device=DEV))
    replays = []
    for _ in range(2):
        g.replay()
        replays.append(r.cpu())
    assert not torch.equal(replays[0], replays[1])
    assert torch.equal(replays[0], eager[0]) and torch.equal(replays[1], eager[1])


def test_registered_generator_draws_fresh_numbers():
    gen = torch.Generator(DEV)
    gen.manual_seed(7)
    g = torch.flagos.FlagosGraph()
    g.register_generator_state(gen)
    with torch.flagos.graph(g):
        r = torch.randn(4, device=DEV, generator=gen)
    g.replay()
    first = r.cpu()
    g.replay()
    assert not torch.equal(first, r.cpu())


def test_register_generator_state_rejects_other_generators():
    with pytest.raises(RuntimeError, match="flagos generator"):
        torch.flagos.FlagosGraph().register_generator_state(torch.Generator("cpu"))


def test_dropout_in_a_graph_differs_per_replay():
    x = torch.ones(64, device=DEV)
    g, y = capture(lambda: torch.nn.functional.dropout(x, 0.5, training=True))
    g.replay()
    first = y.cpu()
    g.replay()
    assert not torch.equal(first, y.cpu())
    assert set(first.unique().tolist()) <= {0.0, 2.0}


def test_is_current_stream_capturing():
    seen = []
    g, _ = capture(lambda: seen.append(torch.flagos.is_current_stream_capturing()))
    assert seen == [True]
    assert not torch.flagos.is_current_stream_capturing()


def test_capture_on_the_default_stream_is_an_error():
    g = torch.flagos.FlagosGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()


def test_replay_without_capture_and_after_reset_are_errors():
    g = torch.flagos.FlagosGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    x = torch.zeros(2, device=DEV)
    g, _ = capture(lambda: x.add_(1))
    g.replay()
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    # A reset graph captures again.
    with torch.flagos.graph(g):
        x.add_(2)
    g.replay()
    assert torch.equal(x.cpu(), torch.full((2,), 3.0))


@pytest.mark.parametrize(
    "forbidden",
    [
        pytest.param(lambda x: torch.flagos.synchronize(), id="synchronize"),
        pytest.param(lambda x: (x + 1).sum().item(), id="item"),
        pytest.param(lambda x: x.cpu(), id="blocking-copy"),
        pytest.param(lambda x: torch.flagos.current_stream().synchronize(), id="stream-synchronize"),
    ],
)
def test_synchronising_calls_fail_the_capture(forbidden):
    # torch.AcceleratorError where CUDA's runtime refuses the call; torch's own copy check raises
    # RuntimeError first for .item() and blocking copies on CUDA: both are RuntimeErrors.
    x = torch.ones(8, device=DEV)
    warm_capture()
    before = torch.flagos.memory_allocated()
    g = torch.flagos.FlagosGraph()
    with pytest.raises(RuntimeError):
        with torch.flagos.graph(g):
            y = x * 2  # noqa: F841
            forbidden(x)
    assert not torch.flagos.is_current_stream_capturing()
    g.reset()  # where torch's own check refused the call first, the capture ended: a graph to drop
    y = None  # noqa: F841
    gc.collect()
    assert torch.flagos.memory_allocated() == before
    # The allocator is as before the capture: an allocation that does not fit retries after releasing the
    # cache, and empty_cache releases (torch's CUDA graph alone leaves its caching allocator taking the
    # failed capture as still underway, which stops both for the rest of the process).
    retries = torch.flagos.memory_stats()["num_alloc_retries"]
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(2**40, dtype=torch.uint8, device=DEV)
    assert torch.flagos.memory_stats()["num_alloc_retries"] == retries + 1
    # The graph captures again, and the device is usable.
    with torch.flagos.graph(g):
        z = x * 3
    g.replay()
    assert torch.equal(z.cpu(), torch.full((8,), 3.0))
    g.reset()
    del g, z
    gc.collect()
    assert torch.flagos.memory_allocated() == before
    assert torch.equal((x + 1).cpu(), torch.full((8,), 2.0))


@pytest.mark.skipif(BACKED, reason="backed by CUDA the capture is CUDA's, which sees cuSPARSE's own kernels")
def test_sparse_op_fails_a_capture_clearly():
    # Sparse and quantized calls have no meta kernels to size a recorded call: refused, never run eagerly
    # inside a capture (replay would then not repeat them).
    s = torch.eye(4).to_sparse().to(DEV)
    warm_capture()
    g = torch.flagos.FlagosGraph()
    with pytest.raises(torch.AcceleratorError, match="sparse and quantized"):
        with torch.flagos.graph(g):
            (s + s).coalesce()
    assert not torch.flagos.is_current_stream_capturing()
    g.reset()
    assert torch.equal((s + s).to_dense().cpu(), 2 * torch.eye(4))


def test_empty_cache_during_capture_keeps_the_graph_memory():
    x = torch.ones(8, device=DEV)

    def body():
        y = x * 2
        torch.flagos.empty_cache()
        return y + 1

    g, out = capture(body)
    g.replay()
    assert torch.equal(out.cpu(), torch.full((8,), 3.0))


def test_thread_local_and_relaxed_modes_allow_other_threads():
    x = torch.ones(4, device=DEV)
    other_stream = torch.flagos.Stream()
    for mode in ("thread_local", "relaxed"):
        errors = []

        def other_thread(errors=errors):
            try:
                other_stream.synchronize()
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                errors.append(e)

        g = torch.flagos.FlagosGraph()
        with torch.flagos.graph(g, capture_error_mode=mode):
            x.add_(1)
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
        assert errors == [], mode
        g.replay()


def test_bad_capture_error_mode():
    with pytest.raises(ValueError, match="capture_error_mode"):
        torch.flagos.graph(torch.flagos.FlagosGraph(), capture_error_mode="sometimes")


def test_tensor_freed_during_capture():
    x = torch.arange(8.0, device=DEV)
    warm_capture()
    before = torch.flagos.memory_allocated()

    def body():
        t = x * 3
        u = t + 1
        del t  # its block goes back to the graph's pool, still the graph's
        return u * 2

    g, out = capture(body)
    g.replay()
    assert torch.equal(out.cpu(), (torch.arange(8.0) * 3 + 1) * 2)
    del out
    g.reset()
    del g
    gc.collect()
    assert torch.flagos.memory_allocated() == before


@pytest.mark.skipif(BACKED, reason="backed by CUDA the capture is CUDA's: this checks the HAL's recording")
def test_captured_compiled_function_holds_no_pool_memory():
    """A compiled function captured (on the simulated accelerator its C++ kernels' calls are recorded):
    freeing a result returns its block to the graph's pool, as for captured operators and on CUDA; a kept
    result is rewritten by each replay."""
    torch._dynamo.reset()
    x = torch.arange(1024.0, device=DEV)
    f = torch.compile(lambda x: [(x * 2).sin() + 1, x.cos() * 3])
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):
        for _ in range(2):
            f(x)
    torch.flagos.synchronize()
    warm_capture()
    before = torch.flagos.memory_allocated()
    g, (kept, freed) = capture(lambda: f(x))
    captured = torch.flagos.memory_allocated()
    assert captured - before >= 2 * 1024 * 4
    freed_bytes = freed.untyped_storage().nbytes()
    del freed
    assert torch.flagos.memory_allocated() == captured - freed_bytes
    x.copy_(torch.ones(1024))
    g.replay()
    torch.testing.assert_close(kept.cpu(), torch.full((1024,), 2.0).sin() + 1)
    del kept
    g.reset()
    del g
    gc.collect()
    assert torch.flagos.memory_allocated() == before


def test_graph_memory_comes_from_its_pool_and_is_released():
    x = torch.ones(1024, device=DEV)
    warm_capture()
    before = torch.flagos.memory_allocated()
    g, y = capture(lambda: x * 2)
    assert torch.flagos.memory_allocated() > before
    y_ptr = y.data_ptr()
    del y
    # A block of the graph's pool is not handed to eager allocations while the graph holds the pool.
    others = [torch.empty(1024, device=DEV) for _ in range(4)]
    assert all(o.data_ptr() != y_ptr for o in others)
    del others
    g.reset()
    gc.collect()
    assert torch.flagos.memory_allocated() == before


def test_ops_routed_by_a_rule_are_captured():
    # A rule makes a composite op (linear, rand) reach the router as a whole, through a kernel of its own
    # rather than the fallback: the capture records it too, so replay recomputes it (it used to run once,
    # eagerly, leaving an empty graph and a result replay never updated).
    x = torch.randn(4, 8, device=DEV)
    w = torch.randn(8, 8, device=DEV)
    with routing.override({"linear": "native", "rand": "native"}):
        g, (y, r) = capture(lambda: (torch.nn.functional.linear(x, w), torch.rand(3, device=DEV)))
        x.copy_(torch.ones(4, 8))
        g.replay()
        first = r.cpu()
        g.replay()
        second = r.cpu()
    torch.testing.assert_close(y.cpu(), torch.ones(4, 8) @ w.cpu().t())
    assert not torch.equal(first, second)


def test_shared_pool_between_graphs():
    pool = torch.flagos.graph_pool_handle()
    x = torch.ones(16, device=DEV)
    g1, a = capture(lambda: x + 1, pool=pool)
    g2, b = capture(lambda: a * 3, pool=g1.pool())
    assert g1.pool() == g2.pool() == pool
    g1.replay()
    g2.replay()
    assert torch.equal(b.cpu(), torch.full((16,), 6.0))


def test_thousand_capture_replay_reset_cycles_do_not_leak():
    x = torch.ones(256, device=DEV)
    warm_capture()
    torch.flagos.synchronize()
    before = torch.flagos.memory_allocated()
    g = torch.flagos.FlagosGraph()
    # capture_begin/end on a side stream, the form a loop of captures takes (torch.flagos.graph synchronises
    # and empties the cache per capture).
    side = torch.flagos.Stream()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):
        for _ in range(1000):
            g.capture_begin()
            y = (x * 2).sum()
            g.capture_end()
            g.replay()
            g.reset()
            del y
    torch.flagos.current_stream().wait_stream(side)
    torch.flagos.synchronize()
    gc.collect()
    assert torch.flagos.memory_allocated() == before


@pytest.mark.parametrize("forced", [False, True])
def test_graph_collects_garbage_only_where_asked(monkeypatch, forced):
    # As torch.cuda.graph: a collection per capture costs most of a second in a process holding a model and
    # Inductor's state, and compiled code records a graph whenever a static input moves.
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    x = torch.ones(8, device=DEV)
    with torch.compiler.config.patch(force_cudagraph_gc=forced):
        g, _ = capture(lambda: x * 2)
    g.reset()
    assert len(collections) == (1 if forced else 0)


def test_empty_graph_warns():
    g = torch.flagos.FlagosGraph()
    with pytest.warns(UserWarning, match="empty"):
        with torch.flagos.graph(g):
            pass


def test_debug_dump(tmp_path):
    if BACKED:
        pytest.skip(
            "CUDA's debug_dump writes a .dot file of the CUDA graph; tested on the simulated accelerator"
        )
    x = torch.ones(3, device=DEV)
    g = torch.flagos.FlagosGraph()
    g.enable_debug_mode()
    with torch.flagos.graph(g):
        x.mul_(2)
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    assert "aten::mul" in path.read_text()


@pytest.mark.skipif(
    not hasattr(torch, "accelerator") or not hasattr(torch.accelerator, "Graph"), reason="torch 2.13+"
)
def test_torch_accelerator_graph_runs_on_flagos():
    x = torch.ones(3, device=DEV)
    s = torch.flagos.Stream()
    g = torch.accelerator.Graph()
    with torch.flagos.stream(s):
        with g:
            x.mul_(3)
            assert s.is_capturing()
    assert not s.is_capturing()
    g.replay()
    g.replay()
    assert torch.equal(x.cpu(), torch.full((3,), 9.0))


def _decode_ids(dtype, shape, new_tokens, compile_step=False):
    model = qwen3.build_model(shape, dtype=dtype)
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    flagos_model = qwen3.copy_to(model, DEV)
    eager = StaticGreedyDecoder(flagos_model, graphs=False, compile_step=compile_step)
    graphed = StaticGreedyDecoder(flagos_model, graphs=True, compile_step=compile_step)
    return eager.generate(ids.to(DEV), new_tokens).cpu(), graphed.generate(ids.to(DEV), new_tokens).cpu()


def test_qwen3_tiny_static_decode_graph_equals_eager():
    eager, graphed = _decode_ids(torch.float32, "tiny", 10)
    assert torch.equal(eager, graphed)


@pytest.mark.gpu
def test_qwen3_06b_static_decode_graph_equals_eager_gpu():
    eager, graphed = _decode_ids(torch.bfloat16, "0.6b", 16)
    assert torch.equal(eager, graphed)


def test_qwen3_tiny_compiled_step_graph_equals_compiled_eager():
    """The decode step compiled (on the simulated accelerator: C++ kernels, which the capture records),
    captured and replayed, against the same compiled step run eagerly; both near the uncompiled tokens."""
    torch._dynamo.reset()
    eager, graphed = _decode_ids(torch.float32, "tiny", 10, compile_step=True)
    assert torch.equal(eager, graphed)
    uncompiled, _ = _decode_ids(torch.float32, "tiny", 10)
    assert torch.equal(eager, uncompiled)  # float32, random weights: no near ties in 10 tokens


def _forward_eager_and_replayed(model, ids, device: str):
    """The forward's logits eager and replayed from a graph, both on the capture's side stream (the same
    library handles and workspaces), on ``device`` ("flagos": FlagosGraph; "cuda": torch.cuda.CUDAGraph)."""
    module = torch.flagos if device == "flagos" else torch.cuda
    stream = module.Stream()
    stream.wait_stream(module.current_stream())
    with torch.no_grad():
        with module.stream(stream):
            for _ in range(2):
                eager = model(ids).logits
        g = torch.flagos.FlagosGraph() if device == "flagos" else torch.cuda.CUDAGraph()
        with module.graph(g, stream=stream):
            out = model(ids).logits
        g.replay()
    module.synchronize()
    return eager.cpu(), out.cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("seq", [1, 64])
def test_qwen3_06b_forward_graph_bitwise_gpu(seq):
    # A one-token forward replays eager's logits bitwise. At 64 tokens CUDA's own graph differs from its
    # eager forward in the last bits (H100, torch 2.11; docs/graphs.md), so there flagos must equal cuda
    # bitwise, eager and replayed alike.
    master = qwen3.build_model("0.6b", dtype=torch.bfloat16)
    ids = torch.randint(0, master.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))
    results = {}
    for device in ("flagos", "cuda"):
        model = qwen3.copy_to(master, device)
        results[device] = _forward_eager_and_replayed(model, ids.to(device), device)
        del model
    (fl_eager, fl_graph), (cuda_eager, cuda_graph) = results["flagos"], results["cuda"]
    assert torch.equal(fl_eager, cuda_eager)
    assert torch.equal(fl_graph, cuda_graph)
    if seq == 1:
        assert torch.equal(fl_graph, fl_eager)
