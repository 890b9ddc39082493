"""Multi-process tests of the flagos c10d backend: the `launch` fixture starts one process per rank
(`worker.py`, a fresh interpreter each, rendezvous through a FileStore in a temporary folder), waits for
all of them within a timeout, kills every rank still running when it expires, and returns what each rank
printed. A rank's checks are assertions in the scenario it runs; its last `RESULT <json>` line is its
answer. Many checks share one process group per launch, so the whole folder stays quick on 2 cores."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from harness.processes import python_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


@dataclasses.dataclass
class RankOutput:
    rank: int
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str

    @property
    def result(self):
        lines = [line for line in self.stdout.splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT ") :]) if lines else None

    def log(self) -> str:
        return (
            f"==== rank {self.rank}: exit code {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n"
            f"--- stderr ---\n{self.stderr[-6000:]}"
        )


@dataclasses.dataclass
class Launch:
    ranks: list[RankOutput]
    timed_out: bool
    elapsed_s: float

    def logs(self) -> str:
        return "\n".join(r.log() for r in self.ranks)

    def check(self) -> Launch:
        """Every rank exited 0 and answered."""
        assert not self.timed_out, f"ranks still running after the timeout were killed\n{self.logs()}"
        for r in self.ranks:
            assert r.returncode == 0 and r.result is not None, self.logs()
        return self

    @property
    def results(self) -> list:
        return [r.result for r in self.ranks]


def _env(overrides: dict) -> dict:
    """This process's environment without FLAGOS_* variables, plus `overrides`, with the repository's root
    on PYTHONPATH (as tests/conftest.py's clean_env)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLAGOS_")}
    env.update({key: str(value) for key, value in overrides.items()})
    return python_env(env)


def _launch(
    module: str,
    function: str,
    world_size: int,
    *,
    args: dict | None = None,
    timeout: float = 120,
    env: dict | None = None,
    store_dir: str | None = None,
    accelerator: str = "sim",
    rank_env: dict | None = None,
) -> Launch:
    """`accelerator`: the simulated one by default, so these run the same on a machine with one GPU (NCCL
    needs a GPU per rank); the GPU tests ask for "cuda". `rank_env`: {rank: {variable: value}} on top of
    `env` for single ranks."""
    with tempfile.TemporaryDirectory(prefix="flagos_dist_") as tmp:
        procs, files = [], []
        for rank in range(world_size):
            overrides = {
                "RANK": rank,
                "WORLD_SIZE": world_size,
                "LOCAL_RANK": rank,
                "LOCAL_WORLD_SIZE": world_size,
                # Each rank uses flagos:<local rank>: the simulated accelerator needs that many devices.
                "FLAGOS_SIM_DEVICES": max(2, world_size),
                "FLAGOS_TEST_STORE": store_dir or tmp,
                "FLAGOS_ACCELERATOR": accelerator,
                # The simulated accelerator's scenarios run as on a machine without a GPU, also on one
                # that has a GPU: with a CUDA device visible, DDP's reducer on the simulated device fails
                # torch's check that its staging tensor is pinned (a known defect of that combination).
                **({"CUDA_VISIBLE_DEVICES": ""} if accelerator == "sim" else {}),
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": 1,
                **(env or {}),
                **((rank_env or {}).get(rank, {})),
            }
            out = open(os.path.join(tmp, f"rank{rank}.out"), "w+")
            err = open(os.path.join(tmp, f"rank{rank}.err"), "w+")
            files.append((out, err))
            command = [sys.executable, WORKER, module, function, json.dumps(args or {})]
            # Its own session, so that a timeout can kill the rank and anything it started.
            procs.append(
                subprocess.Popen(command, env=_env(overrides), stdout=out, stderr=err, start_new_session=True)
            )
        start = time.monotonic()
        timed_out = False
        try:
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, start + timeout - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        elapsed = time.monotonic() - start
        outputs = []
        for rank, (proc, (out, err)) in enumerate(zip(procs, files, strict=True)):
            out.seek(0)
            err.seek(0)
            outputs.append(
                RankOutput(
                    rank,
                    None if timed_out and proc.returncode < 0 else proc.returncode,
                    out.read(),
                    err.read(),
                )
            )
            out.close()
            err.close()
    return Launch(outputs, timed_out, elapsed)


@pytest.fixture(scope="session")
def launch(flagos_distributed):
    """``launch(module, function, world_size, args={...}, timeout=s, env={...})`` -> Launch: runs
    ``module.function(**args)`` (a file in this folder) on every rank."""
    return _launch
