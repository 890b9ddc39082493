"""reduce-overhead's graph replay for flagos (torch_fl/_compile/graph_replay.py), on any accelerator.

``GraphRunner`` wraps a compiled callable in Inductor's boxed convention (one list of inputs, cleared by the
call). Here the callables are written by hand from flagos operators, so the simulated accelerator's graphs
(which record operators) replay them; with flagos backed by CUDA the same tests run on CUDA graphs. What
Inductor hands over end to end is in test_compile.py (test_compile_modes, test_reduce_overhead_*), on
either accelerator.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from torch_fl._compile import graph_replay

DEVICE = "flagos"


def boxed(fn):
    """fn(*inputs) in Inductor's boxed calling convention, with a count of the calls that ran it."""

    def call(inputs):
        args = list(inputs)
        inputs.clear()
        call.calls += 1
        return fn(*args)

    call.calls = 0
    return call


def runner(fn, static=(), mutated=(), limit=8):
    return graph_replay.GraphRunner(boxed(fn), static, mutated, torch.flagos.current_device(), limit)


def t(*values):
    return torch.tensor(values, dtype=torch.float32).to(DEVICE)


def delta(before):
    after = graph_replay.stats()
    return {key: after[key] - before[key] for key in after}


def test_warm_up_then_record_then_replay():
    run = runner(lambda x, w: [x * w + 1, (x - w).sum()], static=(1,))
    w = t(2, 3, 4)
    before = graph_replay.stats()
    for i in range(4):
        x = t(i, i + 1, i + 2)
        out, total = run([x, w])
        assert out.device.type == DEVICE
        assert torch.equal(out.cpu(), (x * w + 1).cpu()) and torch.equal(total.cpu(), (x - w).sum().cpu())
    assert delta(before) == {"eager": 1, "recorded": 1, "replayed": 3}
    assert run.model.calls == 2  # the warm-up, then the capture; replays do not call it


def test_inputs_list_is_cleared_and_outputs_are_copies():
    run = runner(lambda x: [x * 2])
    kept = []
    for i in range(4):
        inputs = [t(i, i)]
        kept.append(run(inputs)[0])
        assert inputs == []  # Inductor's convention: the callee frees its inputs
    # An output kept across calls is not overwritten by later replays.
    assert [k.cpu().tolist() for k in kept] == [[0, 0], [2, 2], [4, 4], [6, 6]]


def test_mutated_copied_input_is_written_back_once_per_call():
    def step(x, w):
        x.add_(w)
        return [x * 1]

    run = runner(step, static=(1,), mutated=(0,))
    x, w = t(0, 0), t(1, 2)
    for _ in range(4):
        run([x, w])
    assert x.cpu().tolist() == [4, 8]


def test_static_input_changed_in_place_is_seen_replaced_is_recorded_again():
    run = runner(lambda x, w: [x @ w], static=(1,))
    x = torch.ones(2, 3).to(DEVICE)
    w = torch.ones(3, 2).to(DEVICE)
    for _ in range(2):
        run([x, w])
    w.mul_(3)  # same tensor, new values: the replay reads them
    assert torch.equal(run([x, w])[0].cpu(), torch.full((2, 2), 9.0))
    before = graph_replay.stats()
    # Another tensor of the same shape: another recording, at once (the signature was warmed up; the trees
    # too warm up a compiled graph once, not once per static input's address).
    w2 = torch.full((3, 2), 2.0).to(DEVICE)
    assert torch.equal(run([x, w2])[0].cpu(), torch.full((2, 2), 6.0))
    assert torch.equal(run([x, w2])[0].cpu(), torch.full((2, 2), 6.0))
    assert torch.equal(run([x, w])[0].cpu(), torch.full((2, 2), 9.0))  # the first recording again
    assert delta(before) == {"eager": 0, "recorded": 1, "replayed": 3}
    assert len(run.recordings) == 2


def test_a_new_static_cache_per_call_sequence_records_without_another_warm_up():
    """Hugging Face's ``generate(cache_implementation="static")`` makes a new cache (static inputs,
    ``mark_static_address``) per call: each decoding sequence after the first records on its first step
    and replays from then on, and the steps read and write that sequence's cache."""

    def step(token, cache):
        cache.add_(token)
        return [cache * 1]

    run = runner(step, static=(1,))
    before = graph_replay.stats()
    caches = []  # kept: a cache freed could give the next one its address (CUDA's caching allocator does)
    for _ in range(3):
        cache = torch.zeros(2).to(DEVICE)
        caches.append(cache)
        for i in range(4):
            (out,) = run([t(1, i), cache])
            assert out.cpu().tolist() == [i + 1, i * (i + 1) / 2]
        assert cache.cpu().tolist() == [4, 6]
    # The first sequence warms up, records and replays; the later ones record at once.
    assert delta(before) == {"eager": 1, "recorded": 3, "replayed": 11}


def test_new_static_tensors_do_not_use_up_the_rerecord_limit():
    """A model fed a new static cache per call (generate) keeps replaying past the re-record limit: other
    static tensors of one signature are not new signatures; the least recently used of them go."""
    run = runner(lambda x, cache: [x + cache], static=(1,), limit=1)
    caches = [t(float(n), 0.0) for n in range(3 * graph_replay._STATIC_VARIANTS)]
    before = graph_replay.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about the limit
        for n, cache in enumerate(caches):
            for i in range(2):
                assert run([t(i, 1), cache])[0].cpu().tolist() == [n + i, 1]
    assert delta(before) == {"eager": 1, "recorded": len(caches), "replayed": 2 * len(caches) - 1}
    assert len(run.recordings) == graph_replay._STATIC_VARIANTS
    # The kept ones are the most recent: the newest cache replays without recording again.
    before = graph_replay.stats()
    assert run([t(5, 1), caches[-1]])[0].cpu().tolist() == [5 + len(caches) - 1, 1]
    assert delta(before) == {"eager": 0, "recorded": 0, "replayed": 1}


def test_new_shapes_and_sizes_get_recordings_of_their_own():
    run = runner(lambda x, n: [x[:n] * 2])
    for n, size in [(2, 4), (2, 4), (3, 6), (3, 6), (2, 4)]:
        x = torch.arange(size, dtype=torch.float32).to(DEVICE)
        assert torch.equal(run([x, n])[0].cpu(), torch.arange(size, dtype=torch.float32)[:n] * 2)
    assert len(run.recordings) == 2


def test_expanded_input():
    run = runner(lambda x, y: [x + y])
    y = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(DEVICE)
    for i in range(3):
        x = t(i).expand(3, 4)
        assert torch.equal(run([x, y])[0].cpu(), (y + i).cpu())


def test_rerecord_limit_runs_eagerly_with_one_warning():
    run = runner(lambda x: [x + 1], limit=1)
    warned_at = []
    for call, size in enumerate((2, 2, 3, 3, 3)):
        x = torch.zeros(size).to(DEVICE)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.equal(run([x])[0].cpu(), torch.ones(size))
        warned_at += [call for w in caught if "input signatures" in str(w.message)]
    # size 2: warm-up, recording; size 3: warm-up, then over the limit (warned once), then eager again.
    assert warned_at == [3] and len(run.recordings) == 1


def test_inside_an_outer_capture_it_is_captured_with_it():
    run = runner(lambda x: [x * 3])
    x = t(1, 2)
    run([x])
    run([x])  # recorded: inside a capture it is not replayed but captured afresh
    g = torch.flagos.FlagosGraph()
    static_x = t(0, 0)
    with torch.flagos.graph(g):
        out = run([static_x])[0]
    static_x.copy_(t(5, 6))
    g.replay()
    assert out.cpu().tolist() == [15, 18]


def test_a_callable_records_after_another_one_was_dropped():
    """Each callable's graphs have a pool of their own: one that outlived the graphs of a dropped callable
    would be refused by CUDA's caching allocator for later captures."""
    import gc

    for factor in (2, 3):
        run = runner(lambda x, factor=factor: [x * factor])
        for _ in range(3):
            assert run([t(1, 2)])[0].cpu().tolist() == [factor, 2 * factor]
        assert len(run.recordings) == 1
        del run
        gc.collect()


def test_outputs_of_a_replay_are_copied_where_another_graph_declares_them_static():
    """A backward graph's saved tensors come declared static; the forward's outputs are fresh copies each
    call, so they are copied into the backward's buffers rather than recorded again every call."""
    forward = runner(lambda x: [x * 2])
    backward = runner(lambda saved, grad: [saved * grad], static=(0,))
    before = graph_replay.stats()
    for i in range(4):
        (saved,) = forward([t(i, i)])
        (grad,) = backward([saved, t(1, 3)])
        assert grad.cpu().tolist() == [2 * i, 6 * i]
    # forward: warm-up, record, 2 replays; backward: warm-up on the eager forward's output (static), then
    # on a copy (copied in: same signature, warmed up) record, 2 replays.
    assert delta(before) == {"eager": 2, "recorded": 2, "replayed": 6}
    assert len(backward.recordings) == 1


def test_a_graph_that_cannot_be_captured_runs_eagerly_with_one_warning():
    """A host read (``.item()``) fails the capture; the call and later ones of that signature still give
    the right result, without replay."""
    run = runner(lambda x: [x * x.sum().item()])
    before = graph_replay.stats()
    caught_all = []
    for i in range(4):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert run([t(i, 1)])[0].cpu().tolist() == [i * (i + 1), i + 1]
        caught_all += [str(w.message) for w in caught if "could not be captured" in str(w.message)]
    assert delta(before) == {"eager": 4, "recorded": 0, "replayed": 0}
    assert len(caught_all) == 1 and not run.recordings


def test_copied_inputs_of_every_kind():
    """Copied inputs go in one ``_foreach_copy_`` per device; an expanded one is copied through its index
    (one element along its zero strides). (Not a CPU scalar: a CUDA graph keeps the value it had at capture
    in its kernels' arguments, and Inductor does not hand such a graph to graph replay.)"""
    run = runner(lambda a, b, e, s, w: [a + b.sum() + e * s + w], static=(4,))
    w = t(10, 20)
    for i in range(4):
        a, b, e, s = t(i, 2 * i), t(1, 2, 3), t(i).expand(2), t(float(i + 1))
        assert run([a, b, e, s, w])[0].cpu().tolist() == [
            i + 6 + i * (i + 1) + 10,
            2 * i + 6 + i * (i + 1) + 20,
        ]
    (recording,) = run.recordings
    assert len(recording.foreach_copies) == 1  # a, b and s
    assert [i for i, _ in recording.expanded_copies] == [2]


@pytest.mark.parametrize("native", [True, False])
def test_static_address_check_in_cpp_or_python(monkeypatch, native):
    """torch's CUDA builds compare the static inputs' addresses in C++; elsewhere one Python pass does.
    Either way a different tensor in a static input's place, or something else than a tensor, misses."""
    calls = []

    def cpp_check(inputs, ptrs, idxs):  # torch's _tensors_data_ptrs_at_indices_equal, as documented
        calls.append(len(idxs))
        return all(inputs[i].data_ptr() == ptrs[i] for i in idxs)

    monkeypatch.setattr(graph_replay, "_native_ptrs_equal", cpp_check if native else None)
    run = runner(lambda x, w, v: [x * w + v], static=(1, 2))
    x, w, v = t(1, 2), t(3, 4), t(5, 6)
    for _ in range(3):
        assert run([x, w, v])[0].cpu().tolist() == [8, 14]
    (recording,) = run.recordings
    assert recording.matches([x, w, v])
    assert not recording.matches([x, w, t(5, 6)])
    assert not recording.matches([x, w, 3])
    assert not recording.matches([x, w])
    assert bool(calls) == native


def test_recordings_capture_on_one_stream_per_thread_and_clear_blas_workspaces(monkeypatch):
    """Every recording of a thread captures on one side stream per device (not a new one each: cuBLAS keeps
    a workspace per stream), and clears the BLAS workspaces before and after (as the trees do; a no-op but
    where flagos is backed by CUDA)."""
    cleared, streams = [], []
    monkeypatch.setattr(graph_replay, "_clear_blas_workspaces", lambda: cleared.append(True))
    real_graph = torch.flagos.graph

    def graph_spy(graph, **kwargs):
        streams.append(kwargs["stream"])
        return real_graph(graph, **kwargs)

    monkeypatch.setattr(torch.flagos, "graph", graph_spy)

    def record_two_signatures():
        for fn in (lambda x: [x + 1], lambda x: [x * 2]):
            run = runner(fn)
            for size in (2, 3):
                for _ in range(2):
                    run([torch.zeros(size).to(DEVICE)])

    record_two_signatures()
    assert len(streams) == 4 and all(s == streams[0] for s in streams)
    assert len(cleared) == 8
    thread = threading.Thread(target=record_two_signatures)
    thread.start()
    thread.join()
    assert len(streams) == 8 and streams[4] != streams[0] and all(s == streams[4] for s in streams[4:])


@pytest.mark.parametrize("constants", [(), (torch.zeros(1),)])
def test_is_flagos_graph(constants):
    assert graph_replay.is_flagos_graph([t(1)], constants)
    assert not graph_replay.is_flagos_graph([torch.zeros(1), 3], constants)
    assert graph_replay.is_flagos_graph([3], (t(1),))
