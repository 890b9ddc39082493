"""What importing torch_fl changes in torch: the CPU allocator is left alone until flagos is used, and
only the simulated accelerator's host kernels wrap it then (README, torch_fl/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch_fl
    from torch_fl import _C
    start = _C._cpu_allocator_id()
    a = torch.randn(256, 256)
    b = (a @ a).sum(0)
    torch.testing.assert_close(b, (a.double() @ a.double()).sum(0).float(), rtol=1e-4, atol=1e-3)
    assert _C._cpu_allocator_id() == start, "import or CPU work replaced the CPU allocator"
    assert not _C._is_initialized(), "CPU work initialised flagos"
    if {use_flagos}:
        x = torch.ones(8, device="flagos") * 2
        assert x.sum().item() == 16
        wrapped = _C._cpu_allocator_id() != start
        backed = _C._backing_type() is not None
        assert wrapped == (not backed), (wrapped, backed)
        c = torch.arange(10.0) + 1  # CPU work after flagos: still correct
        assert c.sum().item() == 55
    print("ok")
    """
)


def _run(use_flagos: bool) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(use_flagos=use_flagos)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("use_flagos", [False, True], ids=["cpu-only", "then-flagos"])
def test_cpu_allocator_untouched_until_flagos_is_used(use_flagos):
    result = _run(use_flagos)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
