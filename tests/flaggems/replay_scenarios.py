"""Scenarios of FlagGems launch replay on the simulated accelerator, with the FlagGems-shaped stand-in of
harness/launch_stand_in served as the flaggems backend. Run as a script in a fresh process (the backend
is chosen once per process) by tests/flaggems/test_launch_replay.py, which asserts on each scenario's
result: ``python tests/flaggems/replay_scenarios.py`` prints one ``RESULT`` line of JSON, scenario name ->
"ok" or the failure's traceback.
"""

from __future__ import annotations

import json
import threading
import traceback
import warnings

import torch

import torch_fl
from harness.launch_stand_in import flag_gems_like, triton_like
from torch_fl import _C, routing

DEV = "flagos"


def rand(*shape, offset=0):
    t = torch.randn(*shape).to(DEV)
    if offset:
        t = torch.randn(t.numel() + offset).to(DEV)[offset:].view(*shape)
    return t


def close(actual, expected):
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-6, atol=1e-6)


def expect_raises(kind, call, words=""):
    """Runs `call`, which must raise `kind` with `words` in its message."""
    try:
        call()
    except kind as exc:
        assert words in str(exc), exc
    else:
        raise AssertionError(f"{kind.__name__} was expected")


def op_counts(op):
    return routing.replay_counts()["ops"].get(op, {})


def fresh():
    _C._replay_clear_plans()
    routing.reset_counts()
    triton_like.LAUNCHES.clear()


def replays_after_two_agreeing_recordings():
    fresh()
    with routing.override({"aten::add.Tensor": "flaggems"}):
        for _ in range(5):
            x, y = rand(1000), rand(1000)
            close(torch.add(x, y, alpha=2.5), x.cpu() + 2.5 * y.cpu())
    c = op_counts("aten::add.Tensor")
    assert (c["recorded"], c["replayed"], c["armed"]) == (2, 3, 1), c
    assert len(triton_like.LAUNCHES) == 2, triton_like.LAUNCHES  # only the recordings ran Python


def every_argument_kind():
    fresh()
    ops = {
        n: "flaggems"
        for n in (
            "aten::mul.Tensor",
            "aten::_softmax",
            "aten::fill_.Scalar",
            "aten::add_.Tensor",
            "aten::clamp",
        )
    }
    with routing.override(ops):
        for _ in range(4):
            x, y = rand(333), rand(333)
            close(torch.mul(x, y), x.cpu() * y.cpu())  # an i64 argument
            m = rand(7, 19)
            close(torch._softmax(m, -1, False), torch.softmax(m.cpu(), -1))  # two launches, a scratch buffer
            z = rand(100)
            assert torch.Tensor.fill_(z, 0.25) is z  # an fp32 argument; the result is the argument
            close(z, torch.full((100,), 0.25))
            close(torch.clamp(x, -0.5, 0.75), x.cpu().clamp(-0.5, 0.75))  # fp64, u32 and u64 arguments
            a, b = rand(64), rand(64)
            expected = a.cpu() + b.cpu()
            assert a.add_(b) is a
            close(a, expected)
    for op in ops:
        c = op_counts(op)
        assert (c["recorded"], c["replayed"]) == (2, 2), (op, c)


def narrow_and_half_arguments():
    """fp16, bf16 and one-byte boolean arguments (and an i16) replay with the bits Triton's launcher packs:
    the replayed results equal the recorded ones bit for bit."""
    fresh()
    x, end = rand(90), rand(90)
    ops = {"aten::lerp.Scalar": "flaggems", "aten::leaky_relu": "flaggems"}
    cases = [
        (torch.lerp, (x, end, 0.3)),  # a weight fp16 rounds; from_end False
        (torch.lerp, (x, end, 0.7)),  # from_end True
        (torch.nn.functional.leaky_relu, (x, 0.1)),  # a slope bf16 truncates; negate False
        (torch.nn.functional.leaky_relu, (x, -0.3)),  # negate True
    ]
    with routing.override(ops):
        for fn, args in cases:
            results = [fn(*args).cpu() for _ in range(4)]  # two recordings, then two replays
            for r in results[1:]:
                assert torch.equal(r, results[0]), (fn, args)
        lerp = torch.lerp(x, end, 0.3).cpu()
    w = torch.tensor(0.3).half().float()  # the weight as the kernel sees it
    close(lerp, x.cpu() + w * (end.cpu() - x.cpu()))
    for op, replayed in (("aten::lerp.Scalar", 5), ("aten::leaky_relu", 4)):
        c = op_counts(op)
        assert (c["signatures"], c["recorded"], c["replayed"]) == (2, 4, replayed), (op, c)


def copies_and_fills_inside_the_wrapper():
    """Copies and fills a wrapper makes through ATen (a dtype conversion, a contiguous copy, a reshape of a
    strided input; zeros, full, zero_) are part of the plan: replayed with the native copy_ and fill_, the
    results still right (the stand-in's sum accumulates into the memory it filled)."""
    fresh()
    with routing.override({"aten::cat": "flaggems", "aten::sum": "flaggems"}):
        for _ in range(4):
            a = rand(6, 10)
            b = rand(10, 6).t()  # strided: cat copies it contiguous
            h = torch.randn(6, 3).half().to(DEV)  # converted to float32
            close(torch.cat([a, b, h], dim=1), torch.cat([a.cpu(), b.cpu(), h.cpu().float()], dim=1))
            # Sums of 40-60 float32 terms in another order than the CPU's: a few units in the last place.
            s = rand(8, 5).t()
            torch.testing.assert_close(torch.sum(s).cpu(), s.cpu().sum(), rtol=1e-5, atol=1e-5)
            # contiguous: the reshape is a view, no copy
            torch.testing.assert_close(torch.sum(a).cpu(), a.cpu().sum(), rtol=1e-5, atol=1e-5)
    for op, signatures in (("aten::cat", 1), ("aten::sum", 2)):
        c = op_counts(op)
        assert (c["signatures"], c["recorded"], c["replayed"]) == (
            signatures,
            2 * signatures,
            4 * signatures - 2 * signatures,
        ), (op, c)


def broadcasting_inside_the_wrapper():
    """A wrapper that broadcasts its inputs with torch.broadcast_tensors (FlagGems' fmin does) makes views,
    no device work: its calls are replayed."""
    fresh()
    op = "aten::add.Tensor"
    impl = torch_fl._flaggems.implementation(op)

    def broadcasting_add(x, y, *, alpha=1):
        a, b = torch.broadcast_tensors(x, y)
        return impl(a, b, alpha=alpha)

    with routing.override({op: "flaggems"}):
        _C._routing_set_flaggems_impl(op, broadcasting_add)
        try:
            for _ in range(4):
                x, y = rand(6, 8), rand(6, 8)
                close(torch.add(x, y, alpha=2.0), x.cpu() + 2.0 * y.cpu())
        finally:
            _C._routing_set_flaggems_impl(op, impl)
    c = op_counts(op)
    assert (c["signatures"], c["recorded"], c["replayed"]) == (1, 2, 2), c


def host_scalars_are_keyed_by_value():
    fresh()
    with routing.override({"aten::mul.Tensor": "flaggems"}):
        for value in (3.0, 3.0, 3.0, 3.0, -0.5, -0.5, -0.5):
            x = rand(70)
            close(torch.mul(x, torch.tensor(value)), x.cpu() * value)
        c = op_counts("aten::mul.Tensor")
        assert (c["signatures"], c["recorded"], c["replayed"]) == (2, 4, 3), c
        for _ in range(3):  # a 0-dim flagos tensor: its value is device data, read on the host
            x = rand(70)
            close(torch.mul(x, torch.tensor(2.0, device=DEV)), x.cpu() * 2.0)
    refused = routing.replay_counts()["refused"]
    assert refused.get("reads device data on the host (aten::item)", 0) > 0, refused


def another_implementation_forgets_the_plans():
    fresh()
    from torch_fl import _flaggems

    original = _flaggems.implementation("aten::add.Tensor")
    with routing.override({"aten::add.Tensor": "flaggems"}):
        for _ in range(3):
            x, y = rand(90), rand(90)
            close(torch.add(x, y), x.cpu() + y.cpu())
        _C._routing_set_flaggems_impl("aten::add.Tensor", lambda a, b, *, alpha=1: flag_gems_like.mul(a, b))
        try:
            for _ in range(3):
                x, y = rand(90), rand(90)
                close(
                    torch.add(x, y), x.cpu() * y.cpu()
                )  # the new implementation's result, never the old plan's
        finally:
            _C._routing_set_flaggems_impl("aten::add.Tensor", original)
        x, y = rand(90), rand(90)
        close(torch.add(x, y), x.cpu() + y.cpu())


def signatures_apart():
    fresh()
    with routing.override({"aten::add.Tensor": "flaggems"}):
        for shape in ((10,), (10,), (10,), (20,), (20,), (20,)):
            x, y = rand(*shape), rand(*shape)
            close(torch.add(x, y), x.cpu() + y.cpu())
        for _ in range(3):  # a data pointer 4 bytes past 16-byte alignment: another kernel specialisation
            x, y = rand(20, offset=1), rand(20)
            close(torch.add(x, y), x.cpu() + y.cpu())
        for _ in range(3):  # one tensor twice: its own signature
            x = rand(20)
            close(torch.add(x, x), 2 * x.cpu())
    c = op_counts("aten::add.Tensor")
    assert c["signatures"] == 4 and c["armed"] == 4 and c["replayed"] == 4, c


def matmul_precision_is_in_the_signature():
    """A wrapper may choose TF32 by torch.get_float32_matmul_precision(): a plan recorded at one precision
    is not replayed at another."""
    fresh()
    was = torch.get_float32_matmul_precision()
    try:
        with routing.override({"aten::add.Tensor": "flaggems"}):
            for precision in ("highest", "highest", "highest", "high", "high", "high"):
                torch.set_float32_matmul_precision(precision)
                x, y = rand(10), rand(10)
                close(torch.add(x, y), x.cpu() + y.cpu())
    finally:
        torch.set_float32_matmul_precision(was)
    c = op_counts("aten::add.Tensor")
    assert c["signatures"] == 2 and c["armed"] == 2 and c["replayed"] == 2 and c["recorded"] == 4, c


def autotuned_first_call_is_not_replayed():
    fresh()
    with routing.override({"aten::sub.Tensor": "flaggems"}):
        for _ in range(5):
            x, y = rand(50), rand(50)
            close(torch.sub(x, y), x.cpu() - y.cpu())
    c = op_counts("aten::sub.Tensor")
    assert (c["recorded"], c["replayed"]) == (3, 2), c  # 3 launches, then 1, then 1: armed on the third


REFUSED = {
    "aten::neg": "reads device data on the host (aten::item)",
    "aten::abs": "runs aten::lt inside the wrapper",
    "aten::sin": "kernel fill_kernel's pointer parameter 0 points into memory the call neither received nor allocated",
    "aten::cos": "its recordings differ from call to call (launch 0's arguments at parameter byte 10)",
    "aten::uniform_": "its generator keeps no Philox offset",
    "aten::mm.out": "runs aten::mm inside the wrapper",  # an out= adapter refuses as its functional op does
}


def refusals_by_reason():
    fresh()
    with routing.override({op: "flaggems" for op in REFUSED}):
        for _ in range(6):
            x = rand(40)
            close(torch.neg(x), -x.cpu())
            close(torch.abs(x), x.cpu().abs())
            torch.sin(x)
            torch.cos(x)
            x.uniform_(0.5, 1.0)
            a, b = rand(4, 5), rand(5, 3)
            out = torch.empty(4, 3, device=DEV)
            close(torch.mm(a, b, out=out), a.cpu() @ b.cpu())
    refused = routing.replay_counts()["refused"]
    for op, reason in REFUSED.items():
        assert refused.get(reason, 0) > 0, (op, reason, refused)
        c = op_counts(op)
        assert c["replayed"] == 0 and c["python"] > 0, (op, c)


def a_pointer_past_an_allocation_is_not_guessed():
    """A pointer just past the end of memory the call allocated, not an empty tensor's, is memory the call
    did not see (a copy made where the recorder could not watch, say): refused, not taken for the end of
    that allocation."""
    fresh()
    op = "aten::add.Tensor"
    impl = torch_fl._flaggems.implementation(op)

    add = flag_gems_like._ADD
    add_from_address = triton_like.jit(
        add.name, add.source, add.arg_names, constexprs=add.constexprs, types={"y": "*fp32"}
    )

    def add_with_a_pointer_past_out(x, y, *, alpha=1):
        out = flag_gems_like._empty_like(x)
        past = out.data_ptr() + out.untyped_storage().nbytes()  # an address, as a wrapper may compute one
        add_from_address[(1,)](x, past, out, 1.0, 0, flag_gems_like.BLOCK)  # n = 0: nothing is read
        return impl(x, y, alpha=alpha)

    with routing.override({op: "flaggems"}):
        _C._routing_set_flaggems_impl(op, add_with_a_pointer_past_out)
        try:
            for _ in range(3):
                x, y = rand(20), rand(20)
                close(torch.add(x, y), x.cpu() + y.cpu())
        finally:
            _C._routing_set_flaggems_impl(op, impl)
    c = op_counts(op)
    assert c["replayed"] == 0, c
    refused = routing.replay_counts()["refused"]
    why = "kernel add_kernel's pointer parameter 1 points into memory the call neither received nor allocated"
    assert refused.get(why, 0) > 0, refused


def a_recorder_that_cannot_classify_refuses():
    """An ATen call the recorder fails to classify (here: the view check raises) refuses the signature; the
    wrapper's call itself still returns its result."""
    import torch_fl._launch_recorder as recorder

    fresh()

    def broken(out, args):
        raise RuntimeError("no storage to compare")

    saved, recorder._shares_memory = recorder._shares_memory, broken
    try:
        with routing.override({"aten::cat": "flaggems"}):
            m = rand(4, 6)
            for _ in range(3):
                close(torch.cat([m, m[:, :3]], dim=1), torch.cat([m.cpu(), m.cpu()[:, :3]], dim=1))
    finally:
        recorder._shares_memory = saved
    refused = routing.replay_counts()["refused"]
    assert any("which the recorder cannot classify (no storage to compare)" in r for r in refused), refused


def views_of_one_storage_are_keyed_by_their_distance():
    """Arguments that are views of one storage: a recording resolves each pointer to the first argument
    whose memory holds it (here the second view starts inside the first), so how far apart the views lie
    is part of the signature; views lying elsewhere in the storage make another signature, never a replay
    of the first one's pointers."""
    fresh()
    m = rand(64)
    mc = m.cpu()
    with routing.override({"aten::add.Tensor": "flaggems"}):
        for j in (4, 4, 4, 8, 12, 8, 8):
            close(torch.add(m[0:8], m[j : j + 8]), mc[0:8] + mc[j : j + 8])
    c = op_counts("aten::add.Tensor")
    assert (c["signatures"], c["replayed"]) == (3, 2), c


def a_view_of_an_argument_follows_it():
    """A result that is a view of an argument is planned where it lies relative to the argument, not in its
    storage: the same signature with the argument elsewhere in its storage returns the view there."""
    fresh()
    op = "aten::add.Tensor"
    impl = torch_fl._flaggems.implementation(op)

    def add_then_a_view_of_x(x, y, *, alpha=1):
        impl(x, y, alpha=alpha)  # launches, its result dropped
        return x[1:]

    m, y = rand(64), rand(10)
    mc = m.cpu()
    with routing.override({op: "flaggems"}):
        _C._routing_set_flaggems_impl(op, add_then_a_view_of_x)
        try:
            for j in (0, 0, 0, 4, 8):  # 4 and 8 floats on: the same 16-byte residue, the same signature
                r = torch.add(m[j : j + 10], y)
                assert r.storage_offset() == j + 1, (j, r.storage_offset())
                close(r, mc[j + 1 : j + 10])
        finally:
            _C._routing_set_flaggems_impl(op, impl)
    c = op_counts(op)
    assert (c["signatures"], c["replayed"]) == (1, 3), c


def a_call_flaggems_fails_runs_natively():
    """FlagGems raising where torch does not (a defect of its wrapper): the call of a functional op, or of
    an out adapter, runs again on the native route, with one warning per op naming the error. Bad input gets
    the native route's own error; FlagGems' own in-place op, KeyboardInterrupt and the switch turned off
    raise FlagGems' exception."""
    fresh()
    impls = {op: torch_fl._flaggems.implementation(op) for op in ("aten::sum", "aten::add_.Tensor")}
    interrupt = []

    def sum_failing_on_0_dim(x, *, dtype=None):
        if interrupt:
            raise KeyboardInterrupt
        if x.dim() == 0:
            return 1 // 0  # as a wrapper dividing by a 0-dim tensor's block count would
        return impls["aten::sum"](x, dtype=dtype)

    def failing_add_(x, y, *, alpha=1):
        raise ZeroDivisionError("integer division or modulo by zero")

    with routing.override({"aten::sum": "flaggems", "aten::add_.Tensor": "flaggems"}):
        _C._routing_set_flaggems_impl("aten::sum", sum_failing_on_0_dim)
        _C._routing_set_flaggems_impl("aten::add_.Tensor", failing_add_)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(3):
                    s = rand(())
                    close(torch.sum(s), s.cpu())
                    v = rand(40)
                    # FlagGems' sum where it works; a float32 sum in another order, so a reduction's tolerance
                    torch.testing.assert_close(torch.sum(v).cpu(), v.cpu().sum(), rtol=1e-5, atol=1e-5)
            said = [str(w.message) for w in caught if "FlagGems' implementation" in str(w.message)]
            assert len(said) == 1 and "aten::sum raised ZeroDivisionError" in said[0], said
            s = rand(())
            routing.reset_counts()
            torch.sum(s)
            counts = routing.counts()  # counted under the backend that ran it
            assert (counts["flaggems"], counts["native"]) == (0, 1), counts

            x = rand(5)
            before = x.cpu()
            expect_raises(ZeroDivisionError, lambda: x.add_(rand(5)))
            close(x, before)  # an in-place op runs no second time: its error, x as it was

            interrupt.append(True)
            expect_raises(KeyboardInterrupt, lambda: torch.sum(rand(())))
            interrupt.clear()

            routing.set_flaggems_fallback(False)
            try:
                expect_raises(ZeroDivisionError, lambda: torch.sum(rand(())))
            finally:
                routing.set_flaggems_fallback(True)
        finally:
            for op, impl in impls.items():
                _C._routing_set_flaggems_impl(op, impl)

    def adding_nothing_well(x, y, *, alpha=1):
        raise RuntimeError("FlagGems' own words")

    # An out adapter fails in FlagGems' functional op, before its copy into out: run again natively too.
    with routing.override({"aten::add.out": "flaggems"}):
        adapter = torch_fl._flaggems.implementation("aten::add.out")
        failing = torch_fl._flaggems._out_adapter(adding_nothing_well, "aten::add.Tensor", ["out"])
        _C._routing_set_flaggems_impl("aten::add.out", failing)
        try:
            x, y, out = rand(6), rand(6), rand(6)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert torch.add(x, y, out=out) is out
            close(out, x.cpu() + y.cpu())
            assert any(
                "aten::add.out raised RuntimeError: FlagGems' own words" in str(w.message) for w in caught
            )
        finally:
            _C._routing_set_flaggems_impl("aten::add.out", adapter)

    with routing.override({"aten::add.Tensor": "flaggems"}):
        impl = torch_fl._flaggems.implementation("aten::add.Tensor")
        _C._routing_set_flaggems_impl("aten::add.Tensor", adding_nothing_well)
        try:  # bad input: the native route's own error
            expect_raises(
                RuntimeError, lambda: torch.add(rand(3), rand(4)), "must match the size of tensor b"
            )
        finally:
            _C._routing_set_flaggems_impl("aten::add.Tensor", impl)


def out_adapters_are_replayed():
    """An out= overload served by an adapter of FlagGems' functional op: the wrapper's launches and the
    route's copy of the result into out make one plan. Replayed, the values land in the caller's out (also
    where out is an input, a strided view or of a wider dtype), which is what the call returns; an out the
    result must resize stays on the Python path, with torch's warning."""
    fresh()
    op = "aten::add.out"

    def replayed():
        return op_counts(op).get("replayed", 0)

    with routing.override({op: "flaggems"}):
        for _ in range(4):
            x, y = rand(100), rand(100)
            out = torch.full((100,), 7.0, device=DEV)
            assert torch.add(x, y, alpha=2.0, out=out) is out
            close(out, x.cpu() + 2.0 * y.cpu())
        assert op_counts(op)["recorded"] == 2 and replayed() == 2, op_counts(op)

        before = replayed()
        for _ in range(4):  # out is the first input: the functional result is whole before the copy
            x, y = rand(100), rand(100)
            expected = x.cpu() + y.cpu()
            assert torch.add(x, y, out=x) is x
            close(x, expected)
        assert replayed() >= before + 2, op_counts(op)

        before = replayed()
        for _ in range(4):  # a column of a matrix: the copy writes through out's strides, nothing else
            x, y = rand(6), rand(6)
            m = rand(6, 4)
            expected = m.cpu()
            expected[:, 1] = x.cpu() + y.cpu()
            torch.add(x, y, out=m[:, 1])
            close(m, expected)
        assert replayed() == before + 2, op_counts(op)

        before = replayed()
        for _ in range(4):  # float into double: the copy casts
            x, y = rand(50), rand(50)
            out = torch.empty(50, dtype=torch.float64, device=DEV)
            torch.add(x, y, out=out)
            torch.testing.assert_close(out.cpu(), (x.cpu() + y.cpu()).double())
        assert replayed() == before + 2, op_counts(op)

        before = replayed()
        for _ in range(3):  # an out with elements and another shape: resized, as torch does, in Python
            x, y = rand(30), rand(30)
            out = torch.empty(4, device=DEV)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.add(x, y, out=out)
            assert any("was resized" in str(w.message) for w in caught), [str(w.message) for w in caught]
            close(out, x.cpu() + y.cpu())
        assert replayed() == before, op_counts(op)

        for _ in range(3):  # torch's idiom, an out without elements: resized by the route, in Python
            x, y = rand(30), rand(30)
            out = torch.empty(0, device=DEV)
            assert torch.add(x, y, out=out) is out
            close(out, x.cpu() + y.cpu())
        assert replayed() == before, op_counts(op)
    refused = routing.replay_counts()["refused"]
    assert refused.get("runs aten::resize_ inside the wrapper", 0) > 0, refused
    assert refused.get("an out= argument without elements, which the call may resize", 0) == 3, refused


def an_error_inside_a_recording_keeps_its_message():
    """An exception raised while a call records, from an ATen call the route itself makes under the
    recorder's dispatch mode, reaches the caller with its message, and the caller's out is left as it was.
    Here: the route's copy into an out whose elements share memory (an expanded tensor), which torch
    refuses."""
    fresh()
    with routing.override({"aten::add.out": "flaggems"}):
        x, y = rand(10), rand(10)
        base = torch.full((1,), 3.0, device=DEV)
        expect_raises(RuntimeError, lambda: torch.add(x, y, out=base.expand(10)), "single memory location")
        assert base.item() == 3.0


def switched_off():
    fresh()
    routing.set_replay(False)
    try:
        with routing.override({"aten::add.Tensor": "flaggems"}):
            for _ in range(4):
                x, y = rand(30), rand(30)
                close(torch.add(x, y), x.cpu() + y.cpu())
        assert routing.replay_counts()["replayed"] == 0
        assert len(triton_like.LAUNCHES) == 4
    finally:
        routing.set_replay(True)


def bounded_cache():
    fresh()
    _C._replay_clear_plans()
    limit = _C._replay_signature_limit()
    _C._replay_set_signature_limit(2)
    try:
        with (
            routing.override({"aten::mul.Tensor": "flaggems"}),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            for n in (5, 6, 7, 7, 8):
                x, y = rand(n), rand(n)
                close(torch.mul(x, y), x.cpu() * y.cpu())
        full = [w for w in caught if "signature cache is full" in str(w.message)]
        assert len(full) == 1, [str(w.message) for w in caught]
        c = op_counts("aten::mul.Tensor")
        assert c["full"] and c["signatures"] == 2 and c["python"] == 3, c
    finally:
        _C._replay_set_signature_limit(limit)


def threads_share_plans():
    fresh()
    errors = []

    def work():
        try:
            for _ in range(40):
                x, y = rand(256), rand(256)
                close(torch.add(x, y, alpha=-1.0), x.cpu() - y.cpu())
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    with routing.override({"aten::add.Tensor": "flaggems"}):
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    c = op_counts("aten::add.Tensor")
    assert c["replayed"] + c["recorded"] == 160 and c["replayed"] >= 150, c


def side_stream_and_second_device():
    fresh()
    with routing.override({"aten::add.Tensor": "flaggems"}):
        for _ in range(3):
            x, y = rand(4000), rand(4000)
            close(torch.add(x, y), x.cpu() + y.cpu())
        s = torch.flagos.Stream()
        x, y = rand(4000), rand(4000)
        s.wait_stream(torch.flagos.current_stream())
        with torch.flagos.stream(s):
            z = torch.add(x, y)
            w = z * 2  # native, after the replayed launch on the same stream
        torch.flagos.current_stream().wait_stream(s)
        close(w, 2 * (x.cpu() + y.cpu()))
        if torch.flagos.device_count() > 1:
            for _ in range(3):
                x, y = torch.randn(300).to("flagos:1"), torch.randn(300).to("flagos:1")
                z = torch.add(x, y)
                assert z.device == torch.device("flagos:1")
                close(z, x.cpu() + y.cpu())
    assert op_counts("aten::add.Tensor")["replayed"] >= 2


def graph_replays_the_plan():
    fresh()
    with routing.override({"aten::add.Tensor": "flaggems", "aten::cat": "flaggems"}):
        x, y = rand(128), rand(128)
        m = rand(8, 4)
        for _ in range(3):
            torch.add(x, y)
            torch.cat([m, m.t().t(), m[:, :2]], dim=1)  # a strided piece: a copy in the plan
        g = torch.flagos.FlagosGraph()
        with torch.flagos.graph(g):
            z = torch.add(x, y)
            joined = torch.cat([m, m.t().t(), m[:, :2]], dim=1)
        for _ in range(2):
            x.copy_(torch.randn(128))
            y.copy_(torch.randn(128))
            m.copy_(torch.randn(8, 4))
            g.replay()
            close(z, x.cpu() + y.cpu())
            close(joined, torch.cat([m.cpu(), m.cpu(), m.cpu()[:, :2]], dim=1))
    assert op_counts("aten::cat")["replayed"] >= 2, op_counts("aten::cat")


def sweep_replay_check():
    """tools/flaggems_sweep.py's --replay-check on OpInfo samples: the replayed result against the Python
    path's, bitwise; a wrapper whose recordings launch differently from its Python path is caught; a sample
    whose Python path itself varies is told apart."""
    from harness import opinfo as opinfo_harness
    from harness.flaggems import check_replay

    fresh()
    db = opinfo_harness.load_op_db()
    samples = [
        s
        for s in db["add"].sample_inputs("cpu", torch.float32)
        if isinstance(s.args[0], torch.Tensor) and s.args[0].shape == s.input.shape and s.input.numel() > 1
    ][:2]
    assert samples
    op = "aten::add.Tensor"
    impl = torch_fl._flaggems.implementation(op)
    with routing.override({op: "flaggems"}):
        for sample in samples:
            assert check_replay(db["add"], sample, op, "") == ("bitwise", ""), sample
        neg = next(iter(db["neg"].sample_inputs("cpu", torch.float32)))
        with routing.override({"aten::neg": "flaggems"}):
            status, why = check_replay(db["neg"], neg, "aten::neg", "")
        assert (status, why) == ("not-replayed", "reads device data on the host (aten::item)"), (status, why)

        def drifting_add(x, y, *, alpha=1):  # hidden state: on the Python path it adds once more
            return impl(x, y, alpha=alpha + (0 if routing.replay_enabled() else 1))

        _C._routing_set_flaggems_impl(op, drifting_add)
        try:
            status, why = check_replay(db["add"], samples[0], op, "")
        finally:
            _C._routing_set_flaggems_impl(op, impl)
        assert status == "differs" and "differs from the Python path" in why, (status, why)

        class VaryingAfterAdd:  # the sample's other (native) kernel varies from run to run, even in
            calls = 0  # torch's deterministic mode

            def __call__(self, x, y, **kwargs):
                VaryingAfterAdd.calls += 1
                return torch.add(x, y, **kwargs).mul_(1.0 + VaryingAfterAdd.calls)

        status, why = check_replay(VaryingAfterAdd(), samples[0], op, "")
        assert status == "nondeterministic" and "two runs of the Python path differ too" in why, (status, why)

        class AtomicAfterAdd:  # the sample's other kernel varies once (the replayed run) unless torch's
            calls = 0  # deterministic algorithms are on: two Python runs agree, the replay seems to differ

            def __call__(self, x, y, **kwargs):
                AtomicAfterAdd.calls += 1
                varies = AtomicAfterAdd.calls == 4 and not torch.are_deterministic_algorithms_enabled()
                return torch.add(x, y, **kwargs).mul_(1.5 if varies else 1.0)

        assert check_replay(AtomicAfterAdd(), samples[0], op, "") == ("bitwise", "")
        assert AtomicAfterAdd.calls > 5  # judged by the run with deterministic algorithms

    # The sweep's counter: calls in the wrapper, and those replayed (which run no Python) as reached.
    from harness.flaggems import CallCounter

    with routing.override({op: "flaggems"}), CallCounter(op) as counter:
        for _ in range(4):
            x, y = rand(30), rand(30)
            close(torch.add(x, y), x.cpu() + y.cpu())
        assert (counter.calls, counter.reached()) == (2, 4), (counter.calls, counter.reached())


SCENARIOS = [
    replays_after_two_agreeing_recordings,
    every_argument_kind,
    narrow_and_half_arguments,
    copies_and_fills_inside_the_wrapper,
    broadcasting_inside_the_wrapper,
    host_scalars_are_keyed_by_value,
    another_implementation_forgets_the_plans,
    signatures_apart,
    matmul_precision_is_in_the_signature,
    autotuned_first_call_is_not_replayed,
    refusals_by_reason,
    a_pointer_past_an_allocation_is_not_guessed,
    a_recorder_that_cannot_classify_refuses,
    views_of_one_storage_are_keyed_by_their_distance,
    a_view_of_an_argument_follows_it,
    a_call_flaggems_fails_runs_natively,
    out_adapters_are_replayed,
    an_error_inside_a_recording_keeps_its_message,
    switched_off,
    bounded_cache,
    threads_share_plans,
    side_stream_and_second_device,
    graph_replays_the_plan,
    sweep_replay_check,
]


def main() -> None:
    assert torch_fl.accelerator() == "sim"
    flag_gems_like.install()
    results = {}
    for scenario in SCENARIOS:
        try:
            scenario()
            results[scenario.__name__] = "ok"
        except Exception:  # noqa: BLE001
            results[scenario.__name__] = traceback.format_exc()
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
