"""The router's config files (format, includes, errors with file and line, the packaged configs) and the
environment: FLAGOS_OP_* variables, FLAGOS_BACKEND_CONFIG, and the precedence of the four levels (API,
override, environment, config). Variables read at import are tested in subprocesses. The rest of the
router: tests/ops/routing/test_router.py.
"""

from __future__ import annotations

import os

import pytest
from routing_cases import (  # beside this file: pytest puts its folder on sys.path
    ADD,
    ADDMM,
    BMM,
    MM,
    clean_routing,  # noqa: F401  (a fixture: pytestmark uses it)
    write,
)

import torch_fl
from torch_fl import routing

pytestmark = pytest.mark.usefixtures("clean_routing")


# ---- config files ---------------------------------------------------------------------------------------


def test_config_format_include_and_later_lines_win(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "base.conf", "bmm.out = cpu\naddmm.out = cpu   # trailing comment\n")
    conf = write(
        tmp_path / "main.conf",
        "# routing for a test\n"
        "\n"
        "mm.out = cpu\n"
        "include sub/base.conf\n"
        "   aten::bmm.out=native   \n"  # later than the include: wins
        "mm.out = cpu\n"
        "mm.out = cuda  # legacy name of native\n",
    )
    routing.load_config(conf)
    base = str(tmp_path / "sub" / "base.conf")
    assert routing.table() == {
        ADDMM: {"backend": "cpu", "requested": "cpu", "source": f"config {base}:2"},
        BMM: {"backend": "native", "requested": "native", "source": f"config {conf}:5"},
        MM: {"backend": "native", "requested": "native", "source": f"config {conf}:7, written 'cuda'"},
    }
    assert routing.explain(MM) == f"aten::mm.out -> native (config {conf}:7, written 'cuda')"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("mm.out = cpu\nmmm = cpu\n", 2, "unknown operator 'aten::mmm'"),
        (
            "\n\nmm.out = gpu\n",
            3,
            "unknown backend 'gpu' for aten::mm.out (valid: native, cpu, flaggems, python;",
        ),
        ("mm.out cpu\n", 1, "syntax error: expected 'op = backend' or 'include FILE', got 'mm.out cpu'"),
        ("mm.out = cpu = native\n", 1, "syntax error: more than one '='"),
        ("= cpu\n", 1, "syntax error: no operator name before '='"),
        ("mm.out =\n", 1, "syntax error: no backend after '='"),
        ("mm.out = cpu native\n", 1, "syntax error: expected one backend name after '='"),
        ("# ok\ninclude\n", 2, "syntax error: 'include' needs a file name"),
        ("include missing.conf\n", 1, "cannot open included file"),
    ],
)
def test_config_errors_name_file_and_line(tmp_path, text, line, message):
    conf = write(tmp_path / "bad.conf", text)
    routing.set(MM, "cpu")
    with pytest.raises(routing.RoutingError) as info:
        routing.load_config(conf)
    assert str(info.value).startswith(f"{conf}:{line}: "), str(info.value)
    assert message in str(info.value)
    assert routing.table() == {MM: {"backend": "cpu", "requested": "cpu", "source": "api"}}, (
        "a failed load must change nothing"
    )


def test_config_error_inside_an_include_names_the_included_file(tmp_path):
    inner = write(tmp_path / "inner.conf", "mm.out = cpu\nbogus_op = cpu\n")
    conf = write(tmp_path / "outer.conf", f"include {inner}\n")
    with pytest.raises(ValueError, match=f"^{inner}:2: unknown operator 'aten::bogus_op'"):
        routing.load_config(conf)
    missing = write(tmp_path / "m.conf", "\ninclude nothing/here.conf\n")
    with pytest.raises(ValueError) as info:
        routing.load_config(missing)
    assert str(info.value).startswith(
        f"{missing}:2: cannot open included file '{tmp_path}/nothing/here.conf'"
    )


def test_config_include_cycle(tmp_path):
    a = tmp_path / "a.conf"
    b = tmp_path / "b.conf"
    write(a, "mm.out = cpu\ninclude b.conf\n")
    write(b, "\n\ninclude ./a.conf\n")
    with pytest.raises(ValueError) as info:
        routing.load_config(str(a))
    assert str(info.value) == f"{b}:3: include cycle: {a} -> {b} -> {a}"
    write(tmp_path / "self.conf", "include self.conf\n")
    with pytest.raises(ValueError, match="self.conf:1: include cycle"):
        routing.load_config(str(tmp_path / "self.conf"))


def test_config_diamond_include_is_not_a_cycle(tmp_path):
    write(tmp_path / "common.conf", "mm.out = cpu\n")
    write(tmp_path / "x.conf", "include common.conf\n")
    write(tmp_path / "y.conf", "include common.conf\n")
    routing.load_config(write(tmp_path / "top.conf", "include x.conf\ninclude y.conf\n"))
    assert routing.get(MM) == "cpu"


def test_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="cannot open config file '.*nope.conf'"):
        routing.load_config(str(tmp_path / "nope.conf"))
    with pytest.raises(ValueError, match="is a directory"):
        routing.load_config(str(tmp_path))


def test_load_config_replaces_the_config_level(tmp_path):
    routing.load_config(write(tmp_path / "1.conf", "mm.out = cpu\nbmm.out = cpu\n"))
    routing.load_config(write(tmp_path / "2.conf", "bmm.out = cpu\n"))
    assert list(routing.table()) == [BMM]
    routing.load_config(None)
    assert routing.table() == {}


def test_package_configs_parse():
    config_dir = os.path.join(os.path.dirname(torch_fl.__file__), "configs")
    names = sorted(os.listdir(config_dir))
    assert {"sim.conf", "cuda.conf"} <= set(names)
    for name in names:
        routing.load_config(os.path.join(config_dir, name))


def test_package_default_config_is_loaded_for_the_accelerator(run_python, tmp_path):
    write(tmp_path / "sim.conf", "mm.out = cpu\n")
    result = run_python(
        f"""
        import json, torch, torch_fl
        from torch_fl import _C, routing
        _C._routing_init({str(tmp_path)!r}, "", [])
        print("RESULT " + json.dumps([torch_fl.accelerator(), routing.explain("mm.out")]))
        """,
        env={"FLAGOS_ACCELERATOR": "sim"},
    ).check()
    assert result.json() == ["sim", f"aten::mm.out -> cpu (config {tmp_path}/sim.conf:1)"]


# ---- environment and precedence (subprocesses: read at import) ------------------------------------------


def test_precedence_of_all_four_levels(run_python, tmp_path):
    conf = write(tmp_path / "p.conf", "mm.out = cpu\nbmm.out = cpu\naddmm.out = cpu\nadd.out = cpu\n")
    result = run_python(
        """
        import json, torch, torch_fl
        from torch_fl import routing
        routing.set("addmm.out", "native")
        routing.set("add.out", "native")
        with routing.override({"add.out": "cpu"}):
            table = routing.table()
            got = {op: routing.get(op) for op in table}
        got["aten::sub.out"] = routing.get("sub.out")
        print("RESULT " + json.dumps({"table": table, "got": got}))
        """,
        env={
            "FLAGOS_BACKEND_CONFIG": conf,
            "FLAGOS_OP_bmm__out": "native",
            "FLAGOS_OP_addmm__out": "cpu",
            "FLAGOS_OP_add__out": "cpu",
        },
    ).check()
    out = result.json()
    assert {op: row["source"] for op, row in out["table"].items()} == {
        MM: f"config {conf}:1",
        BMM: "env FLAGOS_OP_bmm__out",
        ADDMM: "api",
        ADD: "override",
    }
    assert out["got"] == {MM: "cpu", BMM: "native", ADDMM: "native", ADD: "cpu", "aten::sub.out": "native"}


def test_env_names_and_legacy_values(run_python):
    result = run_python(
        """
        import json, torch, torch_fl
        from torch_fl import routing
        print("RESULT " + json.dumps(routing.table()))
        """,
        env={
            "FLAGOS_OP_mm__out": "cpu",  # the existing plugin's `.` -> `__` spelling
            "FLAGOS_OP_mm": "cuda",  # legacy name of native, default overload
            "FLAGOS_OP_add__Tensor": "flagos_python",  # legacy name of flaggems
            "FLAGOS_OP___and____Tensor": "CPU",  # an op whose name contains '__'; case-insensitive
            "FLAGOS_OP_bmm__out": "",  # empty: not set
            "FLAGOS_DISABLE_FLAGGEMS": "1",  # flaggems unavailable also where FlagGems is installed
        },
    ).check()
    table = result.json()
    assert table == {
        "aten::mm.out": {"backend": "cpu", "requested": "cpu", "source": "env FLAGOS_OP_mm__out"},
        "aten::mm": {
            "backend": "native",
            "requested": "native",
            "source": "env FLAGOS_OP_mm, written 'cuda'",
        },
        "aten::add.Tensor": {
            "backend": "native",
            "requested": "flaggems",
            "source": "env FLAGOS_OP_add__Tensor, written 'flagos_python'",
        },
        "aten::__and__.Tensor": {
            "backend": "cpu",
            "requested": "cpu",
            "source": "env FLAGOS_OP___and____Tensor",
        },
    }


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"FLAGOS_OP_mm": "gpu"},
            "environment variable FLAGOS_OP_mm=gpu: unknown backend 'gpu' for aten::mm",
        ),
        ({"FLAGOS_OP_mmm": "cpu"}, "environment variable FLAGOS_OP_mmm: unknown operator 'aten::mmm'"),
        ({"FLAGOS_OP_add__Tenso": "cpu"}, "FLAGOS_OP_add__Tenso: unknown operator 'aten::add.Tenso'"),
        ({"FLAGOS_OP_": "cpu"}, "environment variable FLAGOS_OP_: no operator name"),
    ],
)
def test_bad_env_fails_at_import(run_python, env, message):
    result = run_python("import torch_fl", env=env)
    assert result.returncode != 0, repr(result)
    assert "RoutingError" in result.stderr and message in result.stderr, repr(result)


def test_bad_backend_config_fails_at_import(run_python, tmp_path):
    conf = write(tmp_path / "broken.conf", "mm = cpu\nmm = gpu\n")
    result = run_python("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": conf})
    assert result.returncode != 0
    assert f"{conf}:2: unknown backend 'gpu' for aten::mm" in result.stderr, repr(result)


def test_reset_all_rereads_the_environment(monkeypatch, tmp_path):
    conf = write(tmp_path / "r.conf", "bmm.out = cpu\n")
    monkeypatch.setenv("FLAGOS_OP_mm__out", "cpu")
    monkeypatch.setenv("FLAGOS_BACKEND_CONFIG", conf)
    routing.set(ADD, "cpu")
    routing.reset(all=True)
    assert routing.table() == {
        BMM: {"backend": "cpu", "requested": "cpu", "source": f"config {conf}:1"},
        MM: {"backend": "cpu", "requested": "cpu", "source": "env FLAGOS_OP_mm__out"},
    }
    monkeypatch.delenv("FLAGOS_OP_mm__out")
    monkeypatch.delenv("FLAGOS_BACKEND_CONFIG")
    routing.reset(all=True)
    assert routing.table() == {}
