"""``python -m torch_fl``: the environment report."""

from __future__ import annotations

import torch

import torch_fl


def test_report_on_sim(run_python):
    result = run_python(
        "", args=["-m", "torch_fl"], env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_DEVICES": "3"}
    )
    assert result.returncode == 0, repr(result)
    out = result.stdout
    assert torch.__version__ in out, "the report must name the torch version"
    assert torch_fl.__version__ in out
    assert "sim" in out
    assert "libflagos_hal_sim" in out, "the report must name the HAL library in use"
    name = torch.flagos.get_device_name(0) if torch_fl.accelerator() == "sim" else None
    for index in range(3):
        assert f"flagos:{index}" in out, f"device {index} missing from the report"
    assert "flagos:3" not in out
    if name:
        assert name in out
    for key in ("HALs built", "torch built with CUDA"):
        assert key in out, f"build option {key!r} missing from the report"
    assert "FLAGOS_SIM_DEVICES" in out and "Traceback" not in result.stderr


def test_report_explains_unusable_accelerator(run_python):
    result = run_python("", args=["-m", "torch_fl"], env={"FLAGOS_ACCELERATOR": "bogus"})
    assert result.returncode in (0, 1), repr(result)
    assert "Traceback" not in result.stderr, repr(result)
    assert "bogus" in result.stdout
    assert torch.__version__ in result.stdout


def test_report_with_no_devices(run_python):
    result = run_python(
        "", args=["-m", "torch_fl"], env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_DEVICES": "0"}
    )
    assert result.returncode in (0, 1), repr(result)
    assert "Traceback" not in result.stderr, repr(result)
    assert "flagos:0" not in result.stdout
    assert "0" in result.stdout
