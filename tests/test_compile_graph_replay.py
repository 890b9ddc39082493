"""reduce-overhead's graph replay for flagos (torch_fl/_compile/graph_replay.py), on any accelerator.

``GraphRunner`` wraps a compiled callable in Inductor's boxed convention (one list of inputs, cleared by the
call). Here the callables are written by hand from flagos operators, so the simulated accelerator's graphs
(which record operators) replay them; with flagos backed by CUDA the same tests run on CUDA graphs. What
Inductor hands over end to end is in test_compile.py (test_compile_modes, test_reduce_overhead_*), on
either accelerator.
"""

from __future__ import annotations

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
    w2 = torch.full((3, 2), 2.0).to(DEVICE)  # another tensor: another recording, after its warm-up
    assert torch.equal(run([x, w2])[0].cpu(), torch.full((2, 2), 6.0))
    assert torch.equal(run([x, w2])[0].cpu(), torch.full((2, 2), 6.0))
    assert torch.equal(run([x, w])[0].cpu(), torch.full((2, 2), 9.0))  # the first recording again
    assert delta(before) == {"eager": 1, "recorded": 1, "replayed": 2}


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
    # forward: warm-up, record, 2 replays; backward: warm-up on the eager forward's output (static), warm-up
    # on a copy (copied in), record, replay.
    assert delta(before) == {"eager": 3, "recorded": 2, "replayed": 5}
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


@pytest.mark.parametrize("constants", [(), (torch.zeros(1),)])
def test_is_flagos_graph(constants):
    assert graph_replay.is_flagos_graph([t(1)], constants)
    assert not graph_replay.is_flagos_graph([torch.zeros(1), 3], constants)
    assert graph_replay.is_flagos_graph([3], (t(1),))
