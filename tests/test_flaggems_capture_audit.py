"""tools/flaggems_capture_audit.py without a GPU: a worker in which a capture failed after capture_begin
takes no further op (on torch 2.11 such a capture leaves the CUDA generator in capture mode, and every later
random op in the process raises), on the simulated accelerator. The audit on a GPU is in
tests/test_graphs_flaggems_gpu.py."""

from __future__ import annotations

import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SIM = {"FLAGOS_ACCELERATOR": "sim"}


def test_capture_records_whether_capture_begin_succeeded(run_python):
    # In a subprocess: backed by CUDA, a failed capture would spoil the test process's generator.
    result = run_python(
        """
        import json
        import torch
        import torch_fl
        from tools import flaggems_capture_worker as w

        w.BACKEND = "native"  # no routing rule: this needs no FlagGems
        class Static:
            args, kwargs = (torch.ones(4, device="flagos"), torch.ones(4, device="flagos")), {}
        stream = torch.flagos.Stream()
        add = torch.ops.aten.add.Tensor
        seen = {}
        for name, func, on in (
            ("ok", add, stream),
            ("fails in the body", lambda a, b: (a + b).cpu(), stream),  # a blocking copy: refused
            ("capture_begin fails", add, torch.flagos.default_stream()),  # not on the default stream
        ):
            before = list(w.FAILED_CAPTURES)
            _, _, record = w.capture("aten::add.Tensor", func, Static, on)
            seen[name] = [record["captured"], record.get("began"), w.spoils_process(record),
                          w.FAILED_CAPTURES != before]
        print("RESULT " + json.dumps(seen))
        """,
        env=SIM,
        cwd=str(REPO),
    )
    assert result.returncode == 0, repr(result)
    assert result.json() == {
        "ok": [True, None, False, False],
        "fails in the body": [False, True, True, True],
        "capture_begin fails": [False, False, False, False],
    }


def test_must_end():
    from tools.flaggems_capture_worker import must_end

    assert not must_end({"op": "aten::add.Tensor", "status": "no-sample"})
    assert must_end({"op": "aten::add.Tensor", "exit": True})
    assert must_end({"op": "aten::add.Tensor", "replace_worker": "a capture failed after capture_begin"})


@pytest.mark.slow
def test_audit_replaces_the_worker_after_a_failed_capture(run_python, tmp_path):
    # With the stand-in FlagGems no flaggems call can be captured (the python route's blocking copies):
    # add.Tensor's cold capture fails, so its worker ends, and so does the fresh one that retries its warm
    # capture; _softmax.out (a capture of its out= adapter's copy only) then runs in a third, fresh worker.
    # One worker at a time, so the order is fixed: add.Tensor (a transformer op listed first), its retry
    # (ahead of the queue), _softmax.out.
    result = run_python(
        None,
        args=["-m", "tools.flaggems_capture_audit", "--stand-in", "--out-dir", str(tmp_path)]
        + ["--ops", "aten::add.Tensor,aten::_softmax.out", "--workers", "1", "--budget-s", "200"],
        env=SIM,
        cwd=str(REPO),
        timeout=240,
    )
    assert result.returncode == 0, repr(result)
    report = json.loads((tmp_path / "capture_audit.json").read_text())
    by_op = {r["op"]: r for r in report["results"]}
    add, softmax = by_op["aten::add.Tensor"], by_op["aten::_softmax.out"]
    assert add["status"] == "not-capturable", add
    assert add["cold"]["began"] is True and add["cold"]["captured"] is False
    assert add["retried"] and "replace_worker" in add
    assert softmax["status"] == "capturable-cold", softmax
    # Not after add.Tensor in worker 0 (where it would run without the replacement), nor after the retry.
    assert (softmax["worker"], softmax["ops_before_in_worker"]) == (2, 0), softmax
    assert report["workers_ended_after_failed_capture"] == 2
    assert "2 workers ended after a capture failed" in (tmp_path / "capture_audit.md").read_text()
