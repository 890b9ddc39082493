"""Shared fixtures of the torch_fl test suite.

The suite runs in one process on the accelerator that ``FLAGOS_ACCELERATOR`` selects (the simulated one on a
machine without a GPU). Behaviour that depends on environment variables read once per process (accelerator
choice, simulated device count, memory size, stream delay) is tested in subprocesses through the
``run_python`` fixture, which always has a timeout so that a hang fails the test instead of hanging CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_fl  # noqa: F401  (registers the flagos device before any test module is collected)
from harness.processes import python_env

SUBPROCESS_TIMEOUT_S = 90


def pytest_collection_modifyitems(config, items):
    # The tests marked slow go first: where several workers run the suite (scripts/test.sh), the long ones
    # then overlap the many short ones instead of running alone at the end. The sort is stable.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def clean_env(overrides: dict | None = None) -> dict:
    """The current environment without any FLAGOS_* variable, plus `overrides`, with the repository's root
    on PYTHONPATH after the entries `overrides` puts there (`harness`, `benchmarks`, `tools`, `examples`)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLAGOS_")}
    env.update({key: str(value) for key, value in (overrides or {}).items()})
    first = tuple(p for p in (overrides or {}).get("PYTHONPATH", "").split(os.pathsep) if p)
    return python_env(env, first=first)


class PythonResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    def __repr__(self) -> str:
        return f"exit code {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"

    def check(self) -> PythonResult:
        assert self.returncode == 0, repr(self)
        return self

    def json(self):
        """The last line of stdout that starts with 'RESULT ', parsed as JSON."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"the subprocess printed no RESULT line\n{self!r}"
        return json.loads(lines[-1][len("RESULT ") :])


def _run_python(
    code: str,
    env: dict | None = None,
    timeout: float = SUBPROCESS_TIMEOUT_S,
    args: list[str] | None = None,
    cwd: str | None = None,
) -> PythonResult:
    """Runs `code` (or `python <args>` when args is given) in a fresh interpreter with a clean FLAGOS_*
    environment plus `env`."""
    command = [sys.executable, *(args if args is not None else ["-c", textwrap.dedent(code)])]
    proc = subprocess.run(
        command, env=clean_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    return PythonResult(proc)


@pytest.fixture(scope="session")
def run_python():
    """``run_python(code, env={...}, timeout=...)`` -> result with .returncode/.stdout/.stderr/.json()."""
    return _run_python


@pytest.fixture(scope="session")
def device_count() -> int:
    return torch.flagos.device_count()


@pytest.fixture
def two_devices_only():
    """Skips the test where fewer than two flagos devices exist (the simulated accelerator has two)."""
    if torch.flagos.device_count() < 2:
        pytest.skip("needs at least two flagos devices")


@pytest.fixture(scope="session")
def backed_by_cuda():
    """Skips the test unless flagos is backed by torch's CUDA (FLAGOS_ACCELERATOR=auto or cuda with a CUDA
    build of torch on an NVIDIA machine). Tests that need it are GPU tests: they carry the ``gpu`` marker,
    usually as ``pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("backed_by_cuda")]``."""
    if torch_fl._C._backing_type() != "cuda":
        pytest.skip("flagos is not backed by torch's CUDA here (simulated accelerator or no CUDA build)")


@pytest.fixture(scope="session")
def flagos_distributed():
    """Skips the test where torch.distributed or torch_fl's c10d backend is not in this build."""
    import torch_fl.distributed

    if not torch_fl.distributed.is_available():
        pytest.skip("torch.distributed or the flagos backend is not available in this build")


@pytest.fixture
def flaggems_unavailable():
    """For tests of a flaggems backend that cannot be used. Where FlagGems is installed and usable (the GPU
    machine) it is switched off for the test and back on afterwards; availability is otherwise decided
    once per process, so it is decided (loaded) first."""
    from torch_fl import _flaggems, routing

    if not _flaggems.load().available:
        yield
        return
    routing._set_flaggems_available(False, "switched off by the test")
    try:
        yield
    finally:
        routing._set_flaggems_available(True, "")


@pytest.fixture(autouse=True)
def _restore_device_and_streams(request):
    """Every test starts and ends on device 0 with the default streams current, whatever it changed."""
    if not torch.flagos.is_available():
        yield
        return
    torch.flagos.set_device(0)
    yield
    for index in range(torch.flagos.device_count()):
        torch.flagos.set_stream(torch.flagos.default_stream(index))
    torch.flagos.set_device(0)
