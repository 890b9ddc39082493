"""examples/train_qwen3_distributed.py under torchrun, 2 processes on the simulated accelerator, DDP and
FSDP2: the launch a user types works (each rank on flagos:<LOCAL_RANK>, no backend named)."""

import os
import subprocess
import sys

import pytest
from process_control import stop_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_qwen3_distributed.py")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_torchrun_example(launch, strategy):  # `launch`: skips where the flagos backend is unavailable
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    env.update(FLAGOS_ACCELERATOR="sim", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        EXAMPLE,
        "--strategy",
        strategy,
        "--steps",
        "2",
    ]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        output = stop_launcher(proc)  # torchrun and the ranks it started
        pytest.fail(f"torchrun did not finish within 150 s\n{output[-6000:]}")
    assert proc.returncode == 0, output[-6000:]
    assert (
        f"{strategy} on 2 ranks: Qwen3 tiny on flagos (sim), the flagos backend over ProcessGroupGloo"
        in output
    )
    assert "step 1: loss" in output, output[-6000:]
