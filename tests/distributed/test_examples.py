"""``examples.train_qwen3_distributed`` under torchrun, 2 processes on the simulated accelerator, DDP and
FSDP2: the launch a user types works (each rank on flagos:<LOCAL_RANK>, no backend named)."""

import os
import sys

import pytest

from benchmarks.distributed import run_stoppably
from harness.processes import python_env


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.slow
def test_torchrun_example(launch, strategy):  # `launch`: skips where the flagos backend is unavailable
    pytest.importorskip("transformers")
    env = python_env({k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")})
    env.update(FLAGOS_ACCELERATOR="sim", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "examples.train_qwen3_distributed",
        "--strategy",
        strategy,
        "--steps",
        "2",
    ]
    returncode, output = run_stoppably(command, env, timeout=150)  # stopped: torchrun and its ranks
    if returncode is None:
        pytest.fail(f"torchrun did not finish within 150 s\n{output[-6000:]}")
    assert returncode == 0, output[-6000:]
    assert (
        f"{strategy} on 2 ranks: Qwen3 tiny on flagos (sim), the flagos backend over ProcessGroupGloo"
        in output
    )
    assert "step 1: loss" in output, output[-6000:]
