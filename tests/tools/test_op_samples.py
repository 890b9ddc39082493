"""tools/op_samples.py: samples of perf's script output split into the devices' phases, and the table it prints
from them; where perf can sample this machine, one op end to end on the simulated accelerator."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tools import op_samples

SCRIPT = """\
  100.000100:      7f6eb1608367 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)
  100.000300:      7f6eb1608368 flagos::ops::UnboxedKernel<at::_ops::add_Tensor, at::Tensor (at::Tensor const&)>::call (/x/torch_fl/libtorch_fl_core.so)
  100.000500:  ffffffff815a29ec next_uptodate_folio ([kernel.kallsyms])
  101.500000:      7f6eb1608367 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)
  101.500100:      7f6eb1608367 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)
  101.500200:      5634d50b3cfc [unknown] (/usr/bin/python3.12)
  103.000000:      7f6eb1608367 malloc (/usr/lib/x86_64-linux-gnu/libc.so.6)
not a sample line
"""

ADD = "flagos::ops::UnboxedKernel<at::_ops::add_Tensor, at::Tensor (at::Tensor const&)>::call"


def test_parse_samples_keeps_function_names_with_spaces_and_parentheses():
    samples = op_samples.parse_samples(SCRIPT)
    assert len(samples) == 7
    assert samples[1] == (100.0003, "libtorch_fl_core.so", ADD)
    assert samples[2] == (100.0005, "[kernel.kallsyms]", "next_uptodate_folio")
    assert samples[5] == (101.5002, "python3.12", "[unknown]")


def test_samples_count_for_the_phase_they_fell_in():
    phases = [
        op_samples.Phase("flagos", 100.0, 101.0, calls=1000),
        op_samples.Phase("cuda", 101.4, 101.6, calls=100),
        op_samples.Phase("flagos", 102.0, 102.5, calls=500),
    ]
    result = op_samples.profiles(op_samples.parse_samples(SCRIPT), phases)
    fl, ref = result["flagos"], result["cuda"]
    # 100.0005's kernel sample is in flagos's first phase; 103.0 falls in none.
    assert fl.samples == {
        ("libc.so.6", "malloc"): 1,
        ("libtorch_fl_core.so", ADD): 1,
        ("[kernel.kallsyms]", "next_uptodate_folio"): 1,
    }
    assert ref.samples == {("libc.so.6", "malloc"): 2, ("python3.12", "[unknown]"): 1}
    assert fl.ns_per_call == pytest.approx(1.5 / 1500 * 1e9)
    assert ref.ns_per_call == pytest.approx(0.2 / 100 * 1e9)
    assert fl.ns(("libtorch_fl_core.so", ADD)) == pytest.approx(fl.ns_per_call / 3)
    assert ref.by_library() == pytest.approx(
        {"libc.so.6": ref.ns_per_call * 2 / 3, "python3.12": ref.ns_per_call / 3}
    )


def test_comparison_lists_libraries_and_the_functions_that_differ_most():
    ref = op_samples.Profile(
        ns_per_call=1000.0, samples={("libc.so.6", "malloc"): 50, ("libcuda.so", "0x12"): 50}
    )
    fl = op_samples.Profile(
        ns_per_call=1200.0,
        samples={
            ("libc.so.6", "malloc"): 50,
            ("libcuda.so", "0x12"): 40,
            ("libtorch_fl_core.so", "alias_of"): 10,
        },
    )
    table = op_samples.comparison("cuda", ref, fl, top=2).splitlines()
    assert "cuda 1000 ns, flagos 1200 ns, difference +200 ns" in table[0]
    libraries = [line.split()[0] for line in table[2:5]]
    assert libraries[0] == "libtorch_fl_core.so"  # +120 ns, the largest difference
    functions = table[table.index(next(line for line in table if "function (library)" in line)) + 1 :]
    assert len(functions) == 2
    assert functions[0].split()[0] == "alias_of"
    assert functions[0].split()[-1] == "+120.0"


def perf_can_sample() -> bool:
    perf = shutil.which("perf")
    if perf is None:
        return False
    probe = subprocess.run(
        [perf, "record", "-q", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


@pytest.mark.parametrize(
    ("case_set", "ops", "named"),
    [("model", "add", "'add'"), ("tiny", "add,no_such_op", "'no_such_op'"), ("foreach", ",", "op")],
)
def test_ops_not_in_the_set_are_refused_by_name(capsys, case_set, ops, named):
    with pytest.raises(SystemExit):
        op_samples.main(["--set", case_set, "--ops", ops])
    error = capsys.readouterr().err
    assert f"--ops: no {named} in --set {case_set} (its cases: " in error
    assert ", ".join(op_samples.case_names(case_set)) in error


@pytest.mark.skipif(not perf_can_sample(), reason="perf cannot sample on this machine")
@pytest.mark.parametrize(
    ("case_set", "op"),
    [("tiny", "add"), ("foreach", "_foreach_mul_"), ("generate", "finished check"), ("model", "decode step")],
)
def test_one_op_end_to_end_on_the_native_device_and_flagos(tmp_path, capsys, case_set, op):
    argv = ["--set", case_set, "--ops", op, "--rounds", "2", "--phase", "0.3", "--out", str(tmp_path)]
    assert op_samples.main(argv) == 0
    summary = (tmp_path / "summary.txt").read_text()
    assert summary == capsys.readouterr().out
    lines = summary.splitlines()
    assert lines[1] == f"{op}:"
    ours = next(line for line in lines if line.strip().startswith("libtorch_fl_core.so"))
    native_ns, flagos_ns = (float(v) for v in ours.split()[1:3])
    assert flagos_ns > native_ns  # the flagos phases run torch_fl's kernels; the native ones barely enter it
    assert not list(tmp_path.glob("*.data"))  # perf's samples are removed once read
