"""The repository's harness (``harness/``): importing any of its modules leaves torch_fl unimported, so that
a reference process, which must never import torch_fl, can use them; and a function run in a clean process
reports the child's failure with its traceback."""

from __future__ import annotations

import pkgutil

import pytest

import harness
import harness.processes

# Packages that play other libraries in subprocesses (imported there as `flag_gems` and `triton`, with
# harness/fake_flaggems first on PYTHONPATH), not modules of the harness.
STAND_INS = ("harness.fake_flaggems.flag_gems", "harness.fake_flaggems.triton")


def harness_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(harness.__path__, "harness.")]
    return sorted(n for n in names if not n.startswith(STAND_INS))


def test_the_harness_has_its_modules():
    modules = harness_modules()
    for name in ("harness.qwen3", "harness.processes", "harness.opinfo", "harness.fake_flaggems.stand_in"):
        assert name in modules, modules


def test_importing_the_harness_does_not_import_torch_fl(run_python):
    modules = harness_modules()
    result = run_python(
        f"""
import importlib, json, sys
for name in {modules!r}:
    importlib.import_module(name)
print("RESULT " + json.dumps(sorted(m for m in sys.modules if m == "torch_fl" or m.startswith("torch_fl."))))
"""
    )
    assert result.check().json() == [], "importing the harness imported torch_fl"


def test_a_failure_in_a_clean_process_carries_the_child_traceback():
    with pytest.raises(RuntimeError) as failure:
        harness.processes.run_in_clean_process("harness.cpus:cpu_list", text="0-x", timeout=120)
    message = str(failure.value)
    assert "harness.cpus:cpu_list in a clean process failed with exit code 1" in message, message
    assert "Traceback" in message and "ValueError: '0-x' is not a CPU number or range" in message, message


def test_a_clean_process_returns_the_function_result_without_torch_fl():
    result = harness.processes.run_in_clean_process("harness.cpus:cpu_list", text="0-2,5", timeout=120)
    assert result == {0, 1, 2, 5}
