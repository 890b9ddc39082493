"""accelerate on flagos through ``torch_fl.integrations.accelerate.flagos_state``: ``Accelerator()`` then
trains with its parameters and autocast on flagos, in one process and in one process per device under
``torchrun``, as accelerate trains on the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e .[test])")

import ecosystem_training  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from torch_fl.integrations.accelerate import flagos_state  # noqa: E402

# bf16 autocast: equal on the simulated accelerator (the CPU's kernels); backed by CUDA, bf16 matmuls
# round differently from the CPU's, and four SGD steps carry that on.
BF16_TOLERANCE = dict(rtol=2e-2, atol=2e-3)
# fp32, two processes against one with both batches: only the order of sums differs (and, backed by CUDA,
# cuBLAS's order from the CPU's).
FP32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def test_one_process_bf16_trains_on_flagos_as_on_the_cpu(fresh_accelerate_state):
    flagos = ecosystem_training.accelerate_training("flagos", "bf16", steps=4, batch_size=16)
    fresh_accelerate_state.reset()
    cpu = ecosystem_training.accelerate_training("cpu", "bf16", steps=4, batch_size=16)
    assert flagos["device"] == "flagos:0" and flagos["distributed_type"] == "DistributedType.NO"
    assert flagos["parameter_devices"] == ["flagos:0"]
    assert flagos["output_dtypes"] == ["torch.bfloat16"], "autocast did not run on flagos"
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cpu["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cpu["parameters"]), **BF16_TOLERANCE
    )


def test_state_is_on_the_current_device(fresh_accelerate_state, two_devices_only):
    with torch.flagos.device(1):
        assert flagos_state().device == torch.device("flagos", 1)
    assert Accelerator().device == torch.device("flagos", 1)


def test_a_state_made_for_another_device_is_refused(fresh_accelerate_state):
    Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match="call flagos_state\\(\\) before"):
        flagos_state()


def test_another_device_in_the_environment_is_refused(fresh_accelerate_state, monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu")
    with pytest.raises(RuntimeError, match="another device than flagos"):
        flagos_state()


def test_more_local_ranks_than_devices_is_refused(fresh_accelerate_state, monkeypatch):
    count = torch.flagos.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(count))
    with pytest.raises(
        RuntimeError, match=rf"LOCAL_RANK={count}, but this machine has {count} flagos device"
    ):
        flagos_state()
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_torchrun_two_processes_are_one_process_with_both_batches(launch_training):
    """torchrun, two processes: each trains on its own flagos device, DDP keeps them equal, and the
    parameters are those of one CPU process taking both batches (fp32, for a tight comparison)."""
    arguments = dict(device="flagos", mixed_precision="no", steps=3, batch_size=8)
    ranks = launch_training("torchrun", "accelerate", arguments)
    assert [r["device"] for r in ranks] == ["flagos:0", "flagos:1"]
    assert [r["parameter_devices"] for r in ranks] == [["flagos:0"], ["flagos:1"]]
    assert ranks[0]["parameters"] == ranks[1]["parameters"], "DDP left the ranks with different parameters"
    cpu = ecosystem_training.accelerate_training("cpu", "no", steps=3, batch_size=16)
    torch.testing.assert_close(
        torch.tensor(ranks[0]["parameters"]), torch.tensor(cpu["parameters"]), **FP32_TOLERANCE
    )
    mean_losses = torch.tensor([ranks[0]["losses"], ranks[1]["losses"]]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor(cpu["losses"]), **FP32_TOLERANCE)


@pytest.mark.gpu
def test_one_process_bf16_trains_on_flagos_as_on_cuda(
    fresh_accelerate_state, train_on_cuda_in_a_clean_process
):
    flagos = ecosystem_training.accelerate_training("flagos", "bf16", steps=4, batch_size=16)
    fresh_accelerate_state.reset()  # the reference process inherits no ACCELERATE_TORCH_DEVICE=flagos
    cuda = train_on_cuda_in_a_clean_process(
        "accelerate_training", device="cuda", mixed_precision="bf16", steps=4, batch_size=16
    )
    assert flagos["output_dtypes"] == cuda["output_dtypes"] == ["torch.bfloat16"]
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cuda["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cuda["parameters"]), **BF16_TOLERANCE
    )
