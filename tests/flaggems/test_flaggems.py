"""The flaggems backend where FlagGems cannot run (this CPU machine, the simulated accelerator): it is
unavailable with a reason, routed ops fall through with one warning, FLAGOS_DISABLE_FLAGGEMS works, and
importing torch_fl imports neither flag_gems nor triton.

The route itself (FlagGems' table read through the registrar protocol, its functions called with aliased
tensors, ``out`` adapters, separation from the python backend) is tested here with a stand-in for FlagGems
(harness/fake_flaggems) whose functions are CPU torch ops, so they run on the simulated accelerator's
aliases. Availability is decided once per process, so every test runs in a subprocess. The real FlagGems
on a GPU: tests/flaggems/test_flaggems_kernels.py.
"""

from __future__ import annotations

import os
import re

import pytest

from harness.fake_flaggems import stand_in

FAKE = stand_in.FOLDER  # first on the PYTHONPATH of subprocesses: `import flag_gems` finds the stand-in
SIM = {"FLAGOS_ACCELERATOR": "sim"}


def with_fake(tmp_path, **env) -> dict:
    """Environment for a subprocess that finds the stand-in flag_gems and triton first and logs imports."""
    path = os.pathsep.join(p for p in (FAKE, os.environ.get("PYTHONPATH", "")) if p)
    return {**SIM, "PYTHONPATH": path, "FAKE_FLAGGEMS_IMPORT_LOG": str(tmp_path / "imports.log"), **env}


def imported(tmp_path) -> list[str]:
    log = tmp_path / "imports.log"
    return log.read_text().split() if log.exists() else []


# ---- unavailable here ------------------------------------------------------------------------------------


def test_unavailable_with_a_reason(run_python):
    result = run_python(
        """
        import json, sys, torch, torch_fl
        from torch_fl import _C, _flaggems
        before = _C._routing_flaggems_state()
        out = {
            "before": list(before),
            "available": torch_fl.is_flaggems_available(),
            "enabled": torch_fl.is_flaggems_enabled(),
            "ops": torch_fl.get_registered_ops(),
            "status": _flaggems.status().state,
            "reason": _flaggems.status().reason,
            "router": list(_C._routing_flaggems_state()),
            "flag_gems imported": "flag_gems" in sys.modules,
        }
        print("RESULT " + json.dumps(out))
        """,
        env=SIM,
    ).check()
    out = result.json()
    assert out["before"] == ["unknown", ""], "nothing may be decided before the first need"
    assert out["available"] is False and out["enabled"] is False and out["ops"] == []
    assert out["status"] == "unavailable" and out["reason"]
    assert out["router"] == ["unavailable", out["reason"]], "the router must keep the same reason"
    # On this CPU machine flag_gems is not installed; where it is (the GPU machine), flagos on the simulated
    # accelerator is the reason.
    assert "not installed" in out["reason"] or "runs on 'sim'" in out["reason"], out["reason"]
    assert out["flag_gems imported"] is False


def test_routed_ops_fall_through_with_one_warning(run_python, tmp_path):
    conf = tmp_path / "gems.conf"
    conf.write_text("mm.out = flaggems\nadd.out = flagos_python   # the existing plugin's name\n")
    result = run_python(
        """
        import json, warnings, torch, torch_fl
        from torch_fl import routing, _flaggems
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = torch.randn(8, 8, device="flagos")
            b = torch.randn(8, 8, device="flagos")
            for _ in range(3):
                c = torch.mm(a, b) + a
            torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu() + a.cpu())
            routes = [routing.get("mm.out"), routing.get("add.out")]
            routing.set("bmm.out", "flaggems")  # another op, another level: still the same one warning
            torch.bmm(a[None], b[None])
        print("RESULT " + json.dumps({
            "routes": routes,
            "warnings": [str(w.message) for w in caught if "routing" in str(w.message)],
            "explain": routing.explain("mm.out"),
            "reason": _flaggems.status().reason,
        }))
        """,
        env={**SIM, "FLAGOS_BACKEND_CONFIG": str(conf)},
    ).check()
    out = result.json()
    assert out["routes"] == ["native", "native"]
    assert len(out["warnings"]) == 1, out["warnings"]
    warning = out["warnings"][0]
    assert "is routed to flaggems" in warning and "using native instead" in warning
    assert out["reason"] in warning, "the warning must say why FlagGems is unavailable"
    assert "once for all operators routed to flaggems" in warning
    assert out["explain"].startswith(f"aten::mm.out -> native (config {conf}:1 asked for flaggems;")
    assert out["reason"] in out["explain"]


@pytest.mark.slow
def test_disable_env(run_python, tmp_path):
    code = """
        import json, sys, torch, torch_fl
        from torch_fl import _flaggems
        status = _flaggems._load()  # what the first need runs
        print("RESULT " + json.dumps({"reason": status.reason, "imported": "flag_gems" in sys.modules}))
        """
    for value in ("1", "yes"):
        out = run_python(code, env=with_fake(tmp_path, FLAGOS_DISABLE_FLAGGEMS=value)).check().json()
        assert out == {"reason": f"disabled by FLAGOS_DISABLE_FLAGGEMS={value}", "imported": False}
    assert imported(tmp_path) == []
    for value in ("0", ""):  # not disabled: the next check (flagos runs on the simulated accelerator) decides
        out = run_python(code, env=with_fake(tmp_path, FLAGOS_DISABLE_FLAGGEMS=value)).check().json()
        assert "runs on 'sim'" in out["reason"], out


def test_report_shows_the_reason(run_python, tmp_path):
    result = run_python("", args=["-m", "torch_fl"], env={**SIM, "FLAGOS_DISABLE_FLAGGEMS": "1"})
    assert result.returncode == 0, repr(result)
    # "FlagGems   unavailable: [flag-gems 5.0.2 installed; ]disabled by FLAGOS_DISABLE_FLAGGEMS=1"
    assert re.search(
        r"^FlagGems +unavailable: (flag-gems \S+ installed; )?disabled by FLAGOS_DISABLE_FLAGGEMS=1$",
        result.stdout,
        re.M,
    ), result.stdout
    result = run_python("", args=["-m", "torch_fl"], env=with_fake(tmp_path))
    assert result.returncode == 0, repr(result)
    line = next(line for line in result.stdout.splitlines() if line.startswith("FlagGems"))
    assert (
        "unavailable" in line
        and "FlagGems needs flagos on the cuda accelerator; flagos runs on 'sim'" in line
    )


def test_import_imports_neither_flag_gems_nor_triton(run_python, tmp_path):
    # Installed (the stand-ins are importable) and asked for by a config and an env variable: importing
    # torch_fl must still import neither; on the simulated accelerator the first routed op finds FlagGems
    # unusable before importing it.
    conf = tmp_path / "gems.conf"
    conf.write_text("mm = flaggems\n")
    result = run_python(
        """
        import json, sys, torch, torch_fl
        from torch_fl import _C, _flaggems
        after_import = [m for m in ("flag_gems", "triton") if m in sys.modules]
        state = _C._routing_flaggems_state()[0]
        a = torch.randn(4, 4, device="flagos")
        torch.mm(a, a)  # first need: the router calls the loader
        print("RESULT " + json.dumps({
            "after_import": after_import, "state": state,
            "after_op": [m for m in ("flag_gems", "triton") if m in sys.modules],
            "status": _flaggems.status().state, "reason": _flaggems.status().reason,
        }))
        """,
        env=with_fake(tmp_path, FLAGOS_BACKEND_CONFIG=str(conf), FLAGOS_OP_add__out="flaggems"),
    ).check()
    out = result.json()
    assert out["after_import"] == [] and out["state"] == "unknown"
    assert out["after_op"] == [] and imported(tmp_path) == []
    assert out["status"] == "unavailable" and "runs on 'sim'" in out["reason"]


def test_import_error_is_the_reason(run_python, tmp_path):
    result = run_python(
        """
        import json, torch, torch_fl
        from torch_fl import _flaggems
        status = _flaggems._load(require_cuda=False)
        print("RESULT " + json.dumps({"state": status.state, "reason": status.reason}))
        """,
        env=with_fake(tmp_path, FAKE_FLAGGEMS_IMPORT_ERROR="1"),
    ).check()
    out = result.json()
    assert out["state"] == "unavailable"
    assert out["reason"] == "import flag_gems failed: RuntimeError: No device were detected on your machine !"
    assert imported(tmp_path) == ["triton", "flag_gems"]


# ---- the route, with the stand-in FlagGems ---------------------------------------------------------------

INSTALL_FAKE = """
import json, warnings, torch, torch_fl
import flag_gems
from torch_fl import routing, _flaggems
status = _flaggems._install(flag_gems)
"""


def test_registrar_protocol_reads_the_table_without_registering(run_python, tmp_path):
    result = run_python(
        """
import torch, torch_fl
WATCHED = ("aten::mm", "aten::mm.out", "aten::add.Tensor", "aten::_softmax", "aten::index_select")
before = {op: torch._C._dispatch_dump_table(op) for op in WATCHED}
"""
        + INSTALL_FAKE
        + """
from torch_fl import _C
print("RESULT " + json.dumps({
    "state": status.state, "version": status.version, "ops": list(status.ops), "adapted": status.adapted,
    "skipped": status.skipped, "api_ops": torch_fl.get_registered_ops(),
    "available": torch_fl.is_flaggems_available(), "router": list(_C._routing_flaggems_ops()),
    "current_work_registrar": flag_gems.current_work_registrar.get_all_keys(),
    "routable": _flaggems.routable_ops(),
    "changed_in_torch": [op for op in WATCHED if torch._C._dispatch_dump_table(op) != before[op]],
}))
""",
        env=with_fake(tmp_path),
    ).check()
    out = result.json()
    assert out["state"] == "available" and out["version"] == "5.0.2+fake"
    direct = [
        "aten::_softmax",
        "aten::_to_copy",
        "aten::add.Tensor",
        "aten::add_.Tensor",
        "aten::index_select",
    ]
    direct += ["aten::max.dim", "aten::mm", "aten::mm.out"]
    adapted = {
        "aten::_softmax.out": "aten::_softmax",
        "aten::add.out": "aten::add.Tensor",
        "aten::index_select.out": "aten::index_select",
        "aten::max.dim_max": "aten::max.dim",
    }
    assert out["adapted"] == adapted
    assert out["ops"] == sorted(direct + list(adapted)) == out["api_ops"] == out["router"]
    assert out["skipped"] == {
        "abs": "FlagGems disables it for this torch",
        "neg": "implemented by FlagGems' C++ extension, which registers itself",
        "sin": "excluded by FlagGems' configuration for this vendor",
        "op_of_a_future_torch": f"not an operator of torch {__import__('torch').__version__}",
    }
    assert out["available"] is True
    # flag_gems.current_work_registrar is our collector: FlagGems' own queries keep working.
    assert out["current_work_registrar"] == [
        "add.Tensor",
        "add_.Tensor",
        "mm",
        "mm.out",
        "_softmax",
        "max.dim",
        "index_select",
        "_to_copy",
        "op_of_a_future_torch",
    ]
    # What a rule can send to flaggems: every op but flagos's own kernels (none of these); composite ops
    # too, since a rule naming one makes its calls reach the router.
    assert out["routable"] == out["ops"]
    assert out["changed_in_torch"] == [], "loading FlagGems must not register anything into torch"


def test_flaggems_route_runs_flaggems_functions(run_python, tmp_path):
    result = run_python(
        INSTALL_FAKE
        + """
def cpu(t):
    return t.cpu()

a = torch.randn(6, 5, device="flagos")
b = torch.randn(6, 5, device="flagos")
idx = torch.tensor([4, 0, 2], device="flagos")
ops = ["mm", "mm.out", "add.Tensor", "add_.Tensor", "add.out", "_softmax", "max.dim", "index_select"]
enabled_before = torch_fl.is_flaggems_enabled()
with routing.override({op: "flaggems" for op in ops}):
    enabled = torch_fl.is_flaggems_enabled()
    routes = [routing.get(op) for op in ops]
    flag_gems.CALLS.clear()
    checks = {}
    checks["mm"] = torch.equal(cpu(torch.mm(a, b.t())), cpu(a) @ cpu(b).t())
    mm_out = torch.empty(6, 6, device="flagos")
    checks["mm_out"] = torch.mm(a, b.t(), out=mm_out) is mm_out and torch.equal(cpu(mm_out), cpu(a) @ cpu(b).t())
    checks["add"] = torch.equal(cpu(a + b), cpu(a) + cpu(b))
    c = a.clone()
    same = c.add_(b, alpha=2)
    checks["add_"] = same is c and torch.equal(cpu(c), cpu(a) + 2 * cpu(b))
    checks["softmax"] = torch.equal(cpu(torch.softmax(a, -1)), torch.softmax(cpu(a), -1))
    values, indices = a.max(-1)
    ref = cpu(a).max(-1)
    checks["max"] = torch.equal(cpu(values), ref.values) and torch.equal(cpu(indices), ref.indices)
    checks["index_select"] = torch.equal(cpu(torch.index_select(a, 1, idx)), torch.index_select(cpu(a), 1, cpu(idx)))
    out = torch.empty(2, device="flagos")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = torch.add(a, b, out=out)
    checks["out_resized"] = result is out and out.shape == (6, 5) and torch.equal(cpu(out), cpu(a) + cpu(b))
    resize_warnings = [str(w.message) for w in caught if "resized" in str(w.message)]
    try:
        torch.add(a, b, out=torch.empty(6, 5, dtype=torch.int64, device="flagos"))
        cast_error = None
    except RuntimeError as exc:
        cast_error = str(exc)
    calls = list(flag_gems.CALLS)
flag_gems.CALLS.clear()
a + b  # routes back to native outside the override
print("RESULT " + json.dumps({
    "enabled_before": enabled_before, "enabled": enabled, "routes": routes, "checks": checks,
    "calls": calls, "after": list(flag_gems.CALLS), "resize_warnings": len(resize_warnings),
    "cast_error": cast_error, "device": str(result.device),
}))
""",
        env=with_fake(tmp_path),
    ).check()
    out = result.json()
    assert out["enabled_before"] is False and out["enabled"] is True
    assert out["routes"] == ["flaggems"] * 8
    assert all(out["checks"].values()), out["checks"]
    # Each call reaches the router as the op it is (functional, in-place, out=). mm.out is FlagGems' own;
    # add.out runs its functional add through an adapter (the last two calls).
    assert out["calls"] == ["mm", "mm_out", "add", "add_", "softmax", "max_dim", "index_select", "add", "add"]
    assert out["after"] == []
    assert out["resize_warnings"] == 1
    assert "can't be cast to the desired output type" in out["cast_error"]
    assert out["device"] == "flagos:0"


def test_flaggems_and_python_backends_keep_separate_implementations(run_python, tmp_path):
    result = run_python(
        INSTALL_FAKE
        + """
python_calls = []
def mm_out(self, mat2, *, out):
    python_calls.append("python")
    return torch.mm(self, mat2, out=out)
routing.register_python_impl("mm.out", mm_out, route=False)
a = torch.randn(3, 3, device="flagos")
out = torch.empty(3, 3, device="flagos")
seen = []
for backend in ("flaggems", "python", "flaggems", "native"):
    flag_gems.CALLS.clear(); python_calls.clear()
    with routing.override({"mm.out": backend}):
        torch.mm(a, a, out=out)
    seen.append([backend, list(flag_gems.CALLS), list(python_calls)])
routing.unregister_python_impl("mm.out")
with routing.override({"mm.out": "flaggems"}):
    flag_gems.CALLS.clear()
    torch.mm(a, a, out=out)
    seen.append(["flaggems after unregister", list(flag_gems.CALLS), []])
print("RESULT " + json.dumps(seen))
""",
        env=with_fake(tmp_path),
    ).check()
    assert result.json() == [
        ["flaggems", ["mm_out"], []],
        ["python", [], ["python"]],
        ["flaggems", ["mm_out"], []],
        ["native", [], []],
        ["flaggems after unregister", ["mm_out"], []],
    ]


def test_op_without_flaggems_implementation_falls_through(run_python, tmp_path):
    result = run_python(
        INSTALL_FAKE
        + """
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with routing.override({"bmm.out": "flaggems", "mul.out": "flaggems"}):
        a = torch.randn(2, 3, 3, device="flagos")
        out = torch.empty(2, 3, 3, device="flagos")
        for _ in range(2):
            torch.bmm(a, a, out=out); torch.mul(a, a, out=out)
        text = routing.explain("bmm.out")
print("RESULT " + json.dumps({"warnings": [str(w.message) for w in caught], "explain": text}))
""",
        env=with_fake(tmp_path),
    ).check()
    out = result.json()
    # Per op: FlagGems is there, it just lacks these two.
    assert len(out["warnings"]) == 2 and all(
        "FlagGems has no implementation of it" in w for w in out["warnings"]
    )
    assert out["explain"] == (
        "aten::bmm.out -> native (override asked for flaggems; flaggems is unavailable: FlagGems has no "
        "implementation of it; fell through to native)"
    )


@pytest.mark.parametrize(
    ("protocol", "reason"),
    [
        ("ignores_registrar", "flag_gems.enable() did not use the registrar it was given"),
        ("no_registrar", "flag_gems.enable() takes no registrar= argument"),
    ],
)
def test_flaggems_without_the_registrar_protocol_is_unavailable(run_python, tmp_path, protocol, reason):
    result = run_python(
        INSTALL_FAKE
        + """
print("RESULT " + json.dumps({
    "state": status.state, "reason": status.reason,
    "torch_kernels": [op for op in ("aten::mm", "aten::add.Tensor", "aten::_softmax")
                      if "flag_gems" in torch._C._dispatch_dump_table(op)],
    # None where enable() was never called (no registrar argument: torch_fl does not call it).
    "registered_by_flaggems": getattr(flag_gems.current_work_registrar, "registered", []),
}))
""",
        env=with_fake(tmp_path, FAKE_FLAGGEMS_PROTOCOL=protocol),
    ).check()
    out = result.json()
    assert out["state"] == "unavailable" and out["reason"] == f"FlagGems 5.0.2+fake: {reason}"
    assert out["torch_kernels"] == [] and out["registered_by_flaggems"] == []


def test_rule_routed_ops_are_recorded_by_a_simulated_capture(run_python, tmp_path):
    """On the simulated accelerator a capture records the calls that reach the router and replay routes
    them again: ops a rule sends to FlagGems run FlagGems' functions at each replay (fresh random numbers,
    the fill applied to the replay's data), not once at capture. (Backed by CUDA the capture is CUDA's
    stream capture, and the ops whose FlagGems implementations cannot be captured, rand and masked_fill_
    among them, run natively inside it: tests/flaggems/test_flaggems_graph_capture.py.)"""
    result = run_python(
        INSTALL_FAKE
        + """
x = torch.zeros(8, device="flagos")
mask = torch.arange(8, device="flagos") % 2 == 0
with routing.override({"rand": "flaggems", "masked_fill_.Scalar": "flaggems"}):
    flag_gems.CALLS.clear()
    torch.rand(4, device="flagos")
    x.clone().masked_fill_(mask, 1.0)
    eager_calls = list(flag_gems.CALLS)
    flag_gems.CALLS.clear()
    g = torch.flagos.FlagosGraph()
    with torch.flagos.graph(g):
        r = torch.rand(4, device="flagos")
        y = x.clone()
        y.masked_fill_(mask, 2.0)
    capture_calls = list(flag_gems.CALLS)
    x.fill_(5.0)
    g.replay()
    first = r.cpu()
    g.replay()
    second = r.cpu()
    replay_calls = list(flag_gems.CALLS)
print("RESULT " + json.dumps({
    "eager_calls": eager_calls, "capture_calls": capture_calls, "replay_calls": replay_calls,
    "fresh": not torch.equal(first, second), "in_range": bool(((first >= 0) & (first < 1)).all()),
    "filled": y.cpu().tolist(),
}))
""",
        env=with_fake(tmp_path, FAKE_FLAGGEMS_CAPTURE_OPS="1"),
    ).check()
    out = result.json()
    assert out["eager_calls"] == ["rand", "masked_fill_"]
    assert out["capture_calls"] == []
    assert out["replay_calls"] == ["rand", "masked_fill_"] * 2
    assert out["fresh"] and out["in_range"]
    assert out["filled"] == [2.0, 5.0] * 4
