"""Stopping what a test started: tests/distributed's launchers with a time limit."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_launcher(proc: subprocess.Popen, grace_s: float = 60) -> str:
    """Stops a launcher started in a session of its own (``start_new_session=True``) and returns its output:
    torchrun starts each rank in a session of its own too, so killing torchrun would leave the ranks
    running. SIGTERM makes torchrun (and benchmarks/distributed.py, through its torchrun) stop the ranks;
    whatever is left after ``grace_s`` is killed."""
    proc.terminate()
    try:
        output, _ = proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    return output or ""
