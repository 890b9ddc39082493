"""The flagos backend on NCCL, flagos backed by CUDA: the scenarios of test_collectives.py and
test_training.py with one process per GPU. World size 1 runs on any GPU machine; larger world sizes run
where as many GPUs are visible (docs/distributed.md says what only several GPUs show)."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _world_sizes():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    sizes = [1, 2] if count < 2 else [1, count]
    return [pytest.param(n, marks=pytest.mark.skipif(count < n, reason=f"needs {n} GPUs")) for n in sizes]


@pytest.mark.parametrize("world_size", _world_sizes())
def test_nccl_collectives(launch, world_size):
    # FLAGOS_DIST_CHECK=1: the comparison across ranks runs on NCCL too (it is off by default there).
    run = launch(
        "collectives", "run", world_size, accelerator="cuda", env={"FLAGOS_DIST_CHECK": "1"}, timeout=300
    )
    for r in run.check().results:
        assert r["backend"] == "ProcessGroupNCCL"
        assert r["init"] == ["no_backend_argument", "device_id", "named_flagos"]
        assert len(r["compared_with_gloo"]) == 11 and len(r["flagos_only"]) == 6


@pytest.mark.parametrize("world_size", _world_sizes())
def test_nccl_ddp(launch, world_size):
    for r in launch("training", "run_ddp", world_size, accelerator="cuda", timeout=300).check().results:
        assert len(r["mlp"]) == 8 and len(r["qwen3"]) == 2


@pytest.mark.parametrize("world_size", _world_sizes())
def test_nccl_fsdp2_and_checkpoint(launch, world_size, tmp_path):
    args = {"checkpoint": str(tmp_path)}
    launch("training", "run_fsdp", world_size, args=args, accelerator="cuda", timeout=300).check()
    launch("training", "run_load", world_size, args=args, accelerator="cuda", timeout=300).check()
