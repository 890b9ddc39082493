"""tools/count_op_path.py: the figures it derives from a gdb record (the counted run itself needs a Debug
build and gdb, minutes of building, so it is not run here)."""

from __future__ import annotations

import py_compile
from pathlib import Path

from tools import count_op_path


def function(name: str, file: str, entries: int, other_threads: int = 0) -> dict:
    return {"name": name, "file": file, "line": 1, "entries": entries, "other_threads": other_threads}


RECORD = {
    "functions": [
        function("flagos::runtime::active_mode()", "runtime/mode.cpp", 3),
        function("flagos::runtime::is_initialized()", "runtime/hal_runtime.cpp", 2),
        function("flagos::runtime::selection()", "runtime/hal_runtime.cpp", 4),
        function("flagos_get_device", "hal/sim/sim_device.cpp", 2),
        function("flagos::runtime::mode_or_null()", "runtime/mode.h", 1),
        function("sim::worker_loop()", "hal/sim/sim_stream.cpp", 1, other_threads=1),
        function("flagos::never_entered()", "ops/routes/dispatch.cpp", 0),
    ],
    # mode.cpp, mode.h, hal_runtime.cpp, sim_device.cpp, mode.cpp, sim_stream.cpp (another thread)
    "order": [[0, True], [4, True], [1, True], [3, True], [0, True], [5, False]],
}


def test_summary_counts_entries_functions_and_files_sources_and_headers_apart():
    s = count_op_path.summarize(RECORD)
    assert s["total"] == {"entries": 13, "functions": 6, "files": 5}
    assert s["sources"] == {"entries": 12, "functions": 5, "files": 4}
    assert s["headers"] == {"entries": 1, "functions": 1, "files": 1}
    assert s["other_threads"] == 1
    assert s["hal_runtime_entries"] == 6
    assert s["hal_get_device_calls"] == 2
    assert s["per_file"]["runtime/hal_runtime.cpp"] == 6
    assert "ops/routes/dispatch.cpp" not in s["per_file"]
    assert s["per_layer"] == {"runtime": 10, "hal": 3}
    # runtime -> runtime -> runtime -> hal -> runtime -> hal
    assert s["layer_changes"] == 3
    assert [f["name"] for f in s["per_function"]][:2] == [
        "flagos::runtime::selection()",
        "flagos::runtime::active_mode()",
    ]
    assert [e["caller"] for e in s["order"]] == [True] * 5 + [False]


def test_report_names_the_figures_the_targets_are_stated_in():
    s = count_op_path.summarize(RECORD)
    text = count_op_path.report("torch.add(a, b)", s, show_order=True)
    assert "project function entries: 13 into 6 distinct functions in 5 files" in text
    assert "entries into runtime/hal_runtime.cpp: 6" in text
    assert "calls of the HAL's flagos_get_device: 2" in text
    assert "     6 * sim::worker_loop  (hal/sim/sim_stream.cpp)" in text


def test_short_name_drops_parameters_and_cuts_long_names():
    assert count_op_path.short_name("a::b(int, float) const") == "a::b"
    assert count_op_path.short_name("a::(anonymous namespace)::f(int)") == "a::{anon}::f"
    assert count_op_path.short_name("x" * 100, width=10) == "xxxxxxx..."


def test_missing_build_is_a_clear_error(tmp_path):
    try:
        count_op_path.built_libraries(tmp_path)
    except SystemExit as e:
        assert "lacks ['_C', 'core', 'hal']" in str(e)
    else:
        raise AssertionError("an empty build folder was accepted")


def test_the_gdb_side_compiles():
    py_compile.compile(str(Path(count_op_path.__file__).with_name("count_op_path_gdb.py")), doraise=True)
