"""The router (torch_fl.routing): names and defaults, the API level, override contexts, explain/table,
fall-through, Python implementations, the routes taken and the cost of route_for. Config files, the
environment and the precedence of the four levels: tests/ops/routing/test_router_config.py.

In-process tests change the API level and the config level and restore them; anything read once per
process (the environment, FLAGOS_LOG_DISPATCH, one-time warnings) is tested in subprocesses. Op names:
tests/ops/routing/routing_cases.py.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from routing_cases import (  # beside this file: pytest puts its folder on sys.path
    ADD,
    ADDMM,
    BMM,
    MM,
    NATIVE,
    clean_routing,  # noqa: F401  (a fixture: pytestmark uses it)
    write,
)

import torch_fl
from torch_fl import routing

pytestmark = pytest.mark.usefixtures("clean_routing")


def op_without_native_kernel() -> str:
    """An op that reaches the router but has no native kernel (so `native` is unavailable for it here)."""
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, NATIVE):
            continue
        table = torch._C._dispatch_dump_table(name)
        line = next((entry for entry in table.splitlines() if entry.startswith("PrivateUse1:")), "")
        if "[backend fallback]" in line:
            return name
    pytest.skip(f"every routed op has a {NATIVE} kernel in this torch build")


# ---- names, defaults, API level ------------------------------------------------------------------------


def test_backends():
    assert routing.backends() == ["native", "cpu", "flaggems", "python"]


def test_default_chain_is_native_when_the_native_device_has_a_kernel():
    assert routing.get(MM) == "native"
    assert routing.explain(MM) == f"aten::mm.out -> native (default: native has a {NATIVE} kernel)"
    assert routing.table() == {}


def test_default_chain_is_cpu_without_a_native_kernel():
    op = op_without_native_kernel()
    assert routing.get(op) == "cpu"
    assert f"(default: native has no {NATIVE} kernel)" in routing.explain(op)


@pytest.mark.parametrize("spelling", ["mm.out", "aten::mm.out", " aten::mm.out "])
def test_op_spellings(spelling):
    routing.set(spelling, "cpu")
    assert routing.get(MM) == "cpu"
    assert routing.table() == {MM: {"backend": "cpu", "requested": "cpu", "source": "api"}}


def test_overload_less_name_is_the_default_overload():
    routing.set("mm", "cpu")
    assert list(routing.table()) == ["aten::mm"]
    assert routing.get("aten::mm") == "cpu"
    assert routing.get(MM) == "native", "the default overload must not route the out overload"


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("mmm", "unknown operator 'aten::mmm'"),
        ("add", "aten::add has no default overload; its overloads: Scalar, Scalar_out, Tensor, out"),
        ("add.Tenso", "aten::add has no overload 'Tenso'"),
        ("not an op", "invalid operator name 'not an op'"),
        ("nosuchns::op", "unknown operator 'nosuchns::op'"),
    ],
)
def test_unknown_ops_are_errors(op, expected):
    with pytest.raises(routing.RoutingError) as info:
        routing.set(op, "cpu")
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ValueError):
        routing.get(op)
    with pytest.raises(ValueError):
        routing.explain(op)


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError) as info:
        routing.set("mm", "gpu")
    message = str(info.value)
    assert "unknown backend 'gpu' for aten::mm" in message
    assert "valid: native, cpu, flaggems, python" in message and "cuda -> native" in message
    assert routing.table() == {}


def test_set_none_and_reset():
    routing.set(MM, "cpu")
    routing.set(BMM, "cpu")
    routing.set(MM, None)
    assert list(routing.table()) == [BMM]
    routing.reset()
    assert routing.table() == {}
    assert routing.get(BMM) == "native"


def test_legacy_aliases_at_api_level():
    routing.set(MM, "cuda")
    assert routing.get(MM) == "native"
    assert routing.explain(MM) == "aten::mm.out -> native (api, written 'cuda')"
    routing.set(MM, "FLAGOS_PYTHON")
    assert routing.table()[MM]["requested"] == "flaggems"
    routing.set(MM, "flagos")
    assert routing.table()[MM]["requested"] == "flaggems"


# ---- override contexts -----------------------------------------------------------------------------------


def test_override_nests_and_restores():
    routing.set(MM, "cpu")
    with routing.override({MM: "native", BMM: "cpu"}):
        assert routing.get(MM) == "native" and routing.get(BMM) == "cpu"
        with routing.override({"mm.out": "cpu"}):
            assert routing.get(MM) == "cpu"
            assert routing.get(BMM) == "cpu", "an inner context keeps the outer one's other ops"
        assert routing.get(MM) == "native"
    assert routing.get(MM) == "cpu" and routing.get(BMM) == "native"
    assert routing.table() == {MM: {"backend": "cpu", "requested": "cpu", "source": "api"}}


def test_override_restores_on_exception():
    with pytest.raises(KeyError):
        with routing.override({MM: "cpu"}):
            assert routing.get(MM) == "cpu"
            raise KeyError("boom")
    assert routing.get(MM) == "native"
    assert routing.table() == {}


def test_override_validates_before_changing_anything():
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        with routing.override({MM: "cpu", BMM: "gpu"}):
            pytest.fail("the body must not run")
    assert routing.table() == {}


def test_overrides_of_threads_exit_in_any_order():
    entered_a, entered_b, a_exited = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with routing.override({MM: "cpu"}):
            entered_a.set()
            entered_b.wait(10)
            seen["a inside, both live"] = routing.get(MM)
        a_exited.set()

    def thread_b():
        entered_a.wait(10)
        with routing.override({MM: "native", BMM: "cpu"}):
            entered_b.set()
            a_exited.wait(10)
            seen["b inside, a exited"] = (routing.get(MM), routing.get(BMM))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"a inside, both live": "native", "b inside, a exited": ("native", "cpu")}
    assert routing.table() == {}


def test_override_concurrent_threads_stress():
    ops = [MM, BMM, ADDMM, ADD]
    errors = []
    barrier = threading.Barrier(8)

    def worker(index):
        own = ops[index % len(ops)]
        try:
            barrier.wait(10)
            for i in range(300):
                backend = "cpu" if (i + index) % 2 else "native"
                with routing.override({own: backend, MM: "cpu"}):
                    if routing.get(MM) != "cpu":
                        errors.append(f"thread {index}: {MM} is {routing.get(MM)} inside an override to cpu")
                    routing.explain(own)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:5]
    assert routing.table() == {}
    assert all(routing.get(op) == "native" for op in ops)


# ---- explain and table -----------------------------------------------------------------------------------


def test_explain_names_the_rule_and_what_it_shadows(tmp_path):
    conf = write(tmp_path / "x.conf", "# comment\nmm.out = native\n")
    routing.load_config(conf)
    assert routing.explain(MM) == f"aten::mm.out -> native (config {conf}:2)"
    routing.set(MM, "cpu")
    assert routing.explain(MM) == f"aten::mm.out -> cpu (api); shadowed: config {conf}:2 = native"
    with routing.override({MM: "native"}):
        assert routing.explain(MM) == (
            f"aten::mm.out -> native (override); shadowed: api = cpu, config {conf}:2 = native"
        )


def test_explain_notes_ops_that_do_not_reach_the_router():
    # mm has a native kernel, so its calls reach the router directly; mv has only a composite kernel, which
    # calls other ops (addmv_), and linear decomposes.
    assert routing.explain("aten::mm") == f"aten::mm -> native (default: native has a {NATIVE} kernel)"
    assert "on flagos it runs its CompositeExplicitAutograd kernel, which calls other ops" in (
        routing.explain("aten::mv")
    )
    assert "CompositeImplicitAutograd" in routing.explain("aten::linear")
    assert "flagos has a kernel of its own" in routing.explain("aten::empty.memory_format")
    assert "note" not in routing.explain(MM)


def test_table_lists_every_explicit_route(tmp_path, flaggems_unavailable):
    conf = write(tmp_path / "t.conf", "bmm.out = cpu\nmm.out = flaggems\n")
    routing.load_config(conf)
    routing.set(ADD, "cpu")
    with routing.override({ADDMM: "cpu"}):
        assert routing.table() == {
            ADD: {"backend": "cpu", "requested": "cpu", "source": "api"},
            ADDMM: {"backend": "cpu", "requested": "cpu", "source": "override"},
            BMM: {"backend": "cpu", "requested": "cpu", "source": f"config {conf}:1"},
            MM: {"backend": "native", "requested": "flaggems", "source": f"config {conf}:2"},
        }


# ---- fall-through --------------------------------------------------------------------------------------


def test_fall_through_is_explained(flaggems_unavailable):
    routing.set(MM, "flaggems")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert routing.get(MM) == "native"
    _, reason = torch_fl._C._routing_flaggems_state()  # e.g. "import flag_gems failed: ..."
    assert reason, "FlagGems is unavailable here, so a reason must have been kept"
    assert routing.explain(MM) == (
        "aten::mm.out -> native (api asked for flaggems; flaggems is unavailable: FlagGems is not available "
        f"in this process: {reason}; fell through to native)"
    )
    routing.set(MM, "python")
    assert "python is unavailable: no Python implementation is registered for it" in routing.explain(MM)
    op = op_without_native_kernel()
    routing.set(op, "flaggems")
    text = routing.explain(op)
    assert text.startswith(f"{op} -> cpu (api asked for flaggems; flaggems is unavailable")
    assert f"native is unavailable: the {NATIVE} device has no kernel for it; fell through to cpu" in text


def test_fall_through_warns_once_per_op_and_backend(run_python):
    result = run_python(
        """
        import json, warnings
        import torch, torch_fl
        from torch_fl import routing
        routing.set("aten::mm.out", "flaggems")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [routing.get("mm.out") for _ in range(3)]
            a = torch.randn(4, 4, device="flagos")
            for _ in range(3):
                torch.mm(a, a)
            routing.set("aten::mm.out", "python")  # another backend: one more warning
            got += [routing.get("mm.out") for _ in range(2)]
        print("RESULT " + json.dumps({"got": got, "warnings": [str(w.message) for w in caught]}))
        """,
        env={"FLAGOS_DISABLE_FLAGGEMS": "1"},  # unavailable also where FlagGems is installed
    ).check()
    out = result.json()
    assert out["got"] == ["native"] * 5
    assert len(out["warnings"]) == 2, out["warnings"]
    assert "aten::mm.out is routed to flaggems by api, but flaggems is unavailable" in out["warnings"][0]
    assert "using native instead" in out["warnings"][0]
    assert "routed to python" in out["warnings"][1]


def test_flaggems_when_available(run_python):
    # In a subprocess: availability is decided once per process. An op routes to flaggems only where the
    # backend is available and has an implementation of that op.
    result = run_python(
        """
        import json, warnings
        import torch, torch_fl
        from torch_fl import _C, routing
        routing.set("aten::mm.out", "flaggems")
        routing.set("aten::bmm.out", "flaggems")
        routing._set_flaggems_available(True)
        _C._routing_set_flaggems_impl("aten::mm.out", lambda self, mat2, *, out: torch.mm(self, mat2, out=out))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [routing.get("mm.out"), routing.get("bmm.out")]
        explained = [routing.explain("mm.out"), routing.explain("bmm.out")]
        routing._set_flaggems_available(False, "switched off")
        with warnings.catch_warnings(record=True) as caught_off:
            warnings.simplefilter("always")
            got += [routing.get("mm.out"), routing.get("bmm.out")]
        explained.append(routing.explain("mm.out"))
        print("RESULT " + json.dumps({"got": got, "explained": explained,
              "warnings": [str(w.message) for w in caught], "off": [str(w.message) for w in caught_off]}))
        """
    ).check()
    out = result.json()
    assert out["got"] == ["flaggems", "native", "native", "native"]
    assert out["explained"] == [
        "aten::mm.out -> flaggems (api)",
        "aten::bmm.out -> native (api asked for flaggems; flaggems is unavailable: FlagGems has no "
        "implementation of it; fell through to native)",
        "aten::mm.out -> native (api asked for flaggems; flaggems is unavailable: FlagGems is not available "
        "in this process: switched off; fell through to native)",
    ]
    # A missing implementation warns per op; FlagGems missing as a whole warns once for all ops.
    assert len(out["warnings"]) == 1 and "once per operator and backend" in out["warnings"][0]
    assert len(out["off"]) == 1 and "once for all operators routed to flaggems" in out["off"][0]


# ---- python implementations -------------------------------------------------------------------------------


def test_register_python_impl_routes_to_python():
    def impl(*args, **kwargs):
        raise AssertionError("not called by this test")

    try:
        assert routing.register_python_impl("bmm.out", impl) == BMM
        assert routing.get(BMM) == "python"
        assert routing.table()[BMM] == {"backend": "python", "requested": "python", "source": "api"}
        routing.reset()
        assert routing.get(BMM) == "native", "reset drops the route but not the implementation"
        with routing.override({BMM: "python"}):
            assert routing.get(BMM) == "python"
        routing.set(BMM, "python")
        routing.unregister_python_impl(BMM)
        assert routing.table() == {}
        assert routing.register_python_impl(BMM, impl, route=False) == BMM
        assert routing.get(BMM) == "native"
    finally:
        routing.unregister_python_impl(BMM)
    with pytest.raises(TypeError):
        routing.register_python_impl(BMM, 42)


def test_python_impl_runs_when_routed():
    calls = []

    def mm_out(self, mat2, *, out):
        calls.append((self.device.type, mat2.device.type, out.device.type))
        return torch.mm(self, mat2, out=out)

    a = torch.randn(5, 3, device="flagos")
    b = torch.randn(3, 4, device="flagos")
    out = torch.empty(5, 4, device="flagos")
    try:
        routing.register_python_impl(MM, mm_out)
        result = torch.mm(a, b, out=out)
    finally:
        routing.unregister_python_impl(MM)
    native = "cuda" if torch_fl.accelerator() == "cuda" else "cpu"
    assert calls == [(native, native, native)], calls
    assert result is out
    torch.testing.assert_close(result.cpu(), a.cpu() @ b.cpu())


# ---- routes actually taken --------------------------------------------------------------------------------


def test_cpu_and_native_routes_agree():
    a = torch.randn(64, 33, device="flagos")
    b = torch.randn(64, 33, device="flagos")
    with routing.override({ADD: "cpu"}):
        on_cpu = torch.add(a, b, alpha=2)
    with routing.override({ADD: "native"}):
        on_native = torch.add(a, b, alpha=2)
    assert on_cpu.device.type == on_native.device.type == "flagos"
    torch.testing.assert_close(on_cpu.cpu(), on_native.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(on_native.cpu(), torch.add(a.cpu(), b.cpu(), alpha=2), rtol=0, atol=0)


def test_log_dispatch_shows_each_decision(run_python):
    code = """
        import torch, torch_fl
        a = torch.randn(4, 4, device="flagos")
        torch.mm(a, a); torch.mm(a, a)
        b = a + a
        print("RESULT", torch_fl._C._routing_log_dispatch())
        """
    result = run_python(code, env={"FLAGOS_LOG_DISPATCH": "1", "FLAGOS_OP_add__Tensor": "cpu"}).check()
    lines = [line for line in result.stderr.splitlines() if line.startswith("[flagos dispatch]")]
    assert lines.count(f"[flagos dispatch] aten::mm -> native (default: native has a {NATIVE} kernel)") == 2
    assert "[flagos dispatch] aten::add.Tensor -> cpu (env FLAGOS_OP_add__Tensor)" in lines
    quiet = run_python(code).check()
    assert "[flagos dispatch]" not in quiet.stderr
    assert "RESULT False" in quiet.stdout and "RESULT True" in result.stdout


# ---- cost -----------------------------------------------------------------------------------------------


def test_route_for_steady_state_cost():
    best = min(torch_fl._C._routing_route_for_cost_ns(MM, 2_000_000) for _ in range(3))
    assert best < 50, f"route_for costs {best:.1f} ns per call"


def test_routing_changes_invalidate_the_cache():
    a = torch.randn(3, 3, device="flagos")
    for backend in ["cpu", "native", "cpu"]:
        routing.set(ADD, backend)
        assert routing.get(ADD) == backend
        torch.testing.assert_close((a + a).cpu(), a.cpu() * 2)


def test_routes_change_while_threads_run_ops():
    a = torch.randn(32, device="flagos")
    b = torch.randn(32, device="flagos")
    expected = (a.cpu() + b.cpu()).tolist()
    stop = threading.Event()
    errors = []

    def worker():
        try:
            while not stop.is_set():
                if (a + b).cpu().tolist() != expected:
                    errors.append("wrong result")
                    return
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            routing.set(ADD, "cpu" if i % 2 else "native")
            with routing.override({ADD: "native" if i % 2 else "cpu"}):
                pass
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
