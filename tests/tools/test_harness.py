"""The repository's harness (``harness/``): importing any of its modules leaves torch_fl unimported, so that
a reference process, which must never import torch_fl, can use them; and a function run in a clean process
reports the child's failure with its traceback."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys

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


def test_turns_alternate_blocks(tmp_path):
    """harness.processes.Turns: two processes' blocks run in the order ABBA, one at a time, each waiting for
    the other's; a failed partner (``abort``) ends the wait with an error instead of a hang."""
    assert [harness.processes.Turns.owner(t) for t in range(8)] == [0, 1, 1, 0, 0, 1, 1, 0]
    script = (
        "import sys, time; from harness.processes import Turns\n"
        "log = open(sys.argv[1] + '/log', 'a')\n"
        "def step():\n"
        "    log.write(sys.argv[2] + ' start\\n'); log.flush(); time.sleep(0.01)\n"
        "    log.write(sys.argv[2] + ' end\\n'); log.flush(); return 0.01\n"
        "times = Turns(sys.argv[1], int(sys.argv[2]), block=2, timeout_s=60).take(step, 5)\n"
        "assert len(times) == 6, times\n"
    )
    env = harness.processes.python_env()
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(me)], env=env) for me in (0, 1)
    ]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        for p in procs:  # a hung partner is not left behind
            p.kill()
            p.wait()
    events = (tmp_path / "log").read_text().split()
    owners = [int(events[i]) for i in range(0, len(events), 4)]  # each step: "me start me end"
    assert events[1::4] == ["start"] * 12 and events[3::4] == ["end"] * 12, events
    assert all(events[i] == events[i + 2] for i in range(0, len(events), 4)), events  # one at a time
    assert owners == [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1], owners  # blocks of 2, ABBA
    lonely = harness.processes.Turns(str(tmp_path / "x"), 0, block=1, timeout_s=60)
    os.makedirs(lonely.folder)
    open(os.path.join(lonely.folder, "abort"), "w").close()
    with pytest.raises(RuntimeError, match="never got to 'ready-1'"):
        lonely.take(lambda: 0.0, 1)


def test_turns_of_a_launch_of_several_ranks_are_marked_by_one(tmp_path):
    """A side of several ranks (benchmarks/distributed.py): every rank takes the side's turns, and only the
    one with ``marks`` writes its files, so the other side does not go on before that rank's step ended."""
    import threading

    def side(me: int, marks: bool, out: list) -> threading.Thread:
        turns = harness.processes.Turns(str(tmp_path), me, block=1, timeout_s=60, marks=marks)
        return threading.Thread(target=lambda: out.extend(turns.take(lambda: me, 2)))

    rank0, rank1, other = [], [], []
    threads = [side(0, True, rank0), side(0, False, rank1), side(1, True, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert rank0 == rank1 == [0, 0] and other == [1, 1]
    assert sorted(os.listdir(tmp_path)) == ["done-0", "done-1", "done-2", "done-3", "ready-0", "ready-1"]
    # A side whose only rank does not mark writes nothing: the other side waits for it in vain.
    alone = tmp_path / "alone"
    alone.mkdir()
    quiet = threading.Thread(
        target=lambda: harness.processes.Turns(str(alone), 0, block=1, timeout_s=2, marks=False).take(
            lambda: 0, 1
        )
    )
    quiet.start()
    with pytest.raises(RuntimeError, match="never got to 'ready-0'"):
        harness.processes.Turns(str(alone), 1, block=1, timeout_s=2).take(lambda: 1, 1)
    quiet.join(timeout=30)
    assert os.listdir(alone) == ["ready-1"]


def test_out_variant_leaves_out_samples_that_ask_for_a_tuple():
    """nonzero(as_tuple=True) returns a tuple, which nonzero.out cannot write: the sweep's out= variant
    skips those samples and runs the others."""
    import torch

    from harness import opinfo as opinfo_harness
    from harness.opinfo_variants import run_variant, sample_applies

    samples = list(opinfo_harness.load_op_db()["nonzero"].sample_inputs("cpu", torch.float32))
    kept = [s for s in samples if sample_applies(s, "out")]
    assert 0 < len(kept) < len(samples)
    assert all(sample_applies(s, "") for s in samples)
    for sample in kept[:3]:
        out = run_variant(opinfo_harness.load_op_db()["nonzero"], "out", sample)
        torch.testing.assert_close(out, torch.nonzero(sample.input))
