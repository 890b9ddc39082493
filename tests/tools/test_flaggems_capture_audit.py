"""tools/flaggems_capture_audit.py without a GPU: a worker in which a capture failed after capture_begin
takes no further op (on torch 2.11 such a capture leaves the CUDA generator in capture mode, and every later
random op in the process raises), on the simulated accelerator. The audit on a GPU is in
tests/flaggems/test_flaggems_graph_capture.py."""

from __future__ import annotations

import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
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
    # With the stand-in FlagGems, aten::equal (a host bool, FAKE_FLAGGEMS_CAPTURE_OPS) fails every capture
    # after capture_begin: its worker ends, and so does the fresh one that retries its warm capture;
    # index_select.out then runs in a third, fresh worker. One worker at a time, so the order is fixed:
    # equal (neither op is a transformer or priority op, so by name), its retry (ahead of the queue),
    # index_select.out.
    result = run_python(
        None,
        args=["-m", "tools.flaggems_capture_audit", "--stand-in", "--out-dir", str(tmp_path)]
        + ["--ops", "aten::equal,aten::index_select.out", "--workers", "1", "--budget-s", "200"],
        env={**SIM, "FAKE_FLAGGEMS_CAPTURE_OPS": "1"},
        cwd=str(REPO),
        timeout=240,
    )
    assert result.returncode == 0, repr(result)
    report = json.loads((tmp_path / "capture_audit.json").read_text())
    by_op = {r["op"]: r for r in report["results"]}
    equal, index_select = by_op["aten::equal"], by_op["aten::index_select.out"]
    assert equal["status"] == "not-capturable", equal
    assert equal["cold"]["began"] is True and equal["cold"]["captured"] is False
    assert equal["retried"] and "replace_worker" in equal
    assert index_select["status"] == "capturable-cold", index_select
    # Not after equal in worker 0 (where it would run without the replacement), nor after the retry.
    assert (index_select["worker"], index_select["ops_before_in_worker"]) == (2, 0), index_select
    assert report["workers_ended_after_failed_capture"] == 2
    assert "2 workers ended after a capture failed" in (tmp_path / "capture_audit.md").read_text()
