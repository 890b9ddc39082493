"""Fixtures of the ecosystem tests: ``launch_training`` runs ``ecosystem_training.py`` under a launcher
(several processes) and returns each rank's result; ``fresh_accelerate_state`` gives a test accelerate's
process state to make, and takes it away afterwards (accelerate keeps one per process);
``train_on_cuda_in_a_clean_process`` trains the cuda reference of the GPU tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from harness.processes import python_env, run_in_clean_process

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ecosystem_training.py")
LAUNCH_TIMEOUT_S = 240


def _launcher_command(launcher: str, processes: int) -> list[str]:
    if launcher == "script":  # the script starts the other processes itself (Lightning's ddp_flagos)
        return [sys.executable, SCRIPT]
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={processes}",
            SCRIPT,
        ]
    if launcher == "accelerate":
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={processes}",
            "--num_machines=1", "--dynamo_backend=no", "--main_process_port=0", SCRIPT,
        ]  # fmt: skip
    raise ValueError(f"unknown launcher {launcher!r}")


def _launch_training(
    launcher: str, library: str, arguments: dict, processes: int = 2, env: dict | None = None
) -> list[dict]:
    """Every rank's result, by rank. The launcher runs in a session of its own: when it outlives the
    timeout, it is asked to stop (SIGTERM: torchrun then stops its workers, which run in sessions of their
    own), then killed with everything left in its session."""
    with tempfile.TemporaryDirectory(prefix="flagos_ecosystem_") as results:
        child_env = {
            key: value for key, value in os.environ.items() if not key.startswith(("FLAGOS_", "ACCELERATE_"))
        }
        child_env.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **(env or {})})
        child_env.update({"ECOSYSTEM_TRAINING_RESULTS": results, "HF_HOME": os.path.join(results, "hf")})
        command = [*_launcher_command(launcher, processes), library, json.dumps(arguments)]
        proc = subprocess.Popen(
            command, env=python_env(child_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, cwd=HERE,
        )  # fmt: skip
        try:
            output, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            pytest.fail(f"{launcher} did not finish within {LAUNCH_TIMEOUT_S} s\n{output[-8000:]}")
        files = sorted(name for name in os.listdir(results) if name.endswith(".json"))
        assert proc.returncode == 0 and len(files) == processes, (
            f"{launcher}: exit code {proc.returncode}, results {files}\n{output[-8000:]}"
        )
        ranks = []
        for name in files:
            with open(os.path.join(results, name)) as file:
                ranks.append(json.load(file))
    return sorted(ranks, key=lambda result: result["rank"])


def _train_on_cuda_in_a_clean_process(function: str, env: dict | None = None, **kwargs) -> dict:
    paths = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": paths, **(env or {})}
    return run_in_clean_process(f"ecosystem_training:{function}", env=env, timeout=LAUNCH_TIMEOUT_S, **kwargs)


@pytest.fixture(scope="session")
def train_on_cuda_in_a_clean_process(backed_by_cuda):
    """``train_on_cuda_in_a_clean_process(function, env=None, **kwargs)``: ``ecosystem_training.<function>``
    in a process without torch_fl, where a CUDA backward can run (harness.processes.backward_runs_here)."""
    return _train_on_cuda_in_a_clean_process


@pytest.fixture(scope="session")
def launch_training(flagos_distributed, device_count):
    """``launch_training(launcher, library, arguments, processes=2, env=None)``: launcher is "script",
    "torchrun" or "accelerate"."""
    if device_count < 2:
        pytest.skip("the two-process runs put each process on a flagos device of its own")
    return _launch_training


@pytest.fixture
def fresh_accelerate_state(monkeypatch):
    """accelerate's process state unmade and no ACCELERATE_* variable set, before and after the test; the
    fixture's ``reset()`` does it again within the test."""
    from accelerate.state import AcceleratorState

    # The variables set before the test are put back at its end (monkeypatch); those the test's own calls
    # set (flagos_state() sets ACCELERATE_TORCH_DEVICE) are dropped, so no later test or child inherits them.
    for name in [name for name in os.environ if name.startswith("ACCELERATE_")]:
        monkeypatch.delenv(name)

    class Fresh:
        @staticmethod
        def reset() -> None:
            for name in [name for name in os.environ if name.startswith("ACCELERATE_")]:
                del os.environ[name]
            AcceleratorState._reset_state(reset_partial_state=True)

    Fresh.reset()
    yield Fresh
    Fresh.reset()
