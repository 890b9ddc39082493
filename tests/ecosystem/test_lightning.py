"""Lightning's Trainer on flagos through ``torch_fl.integrations.lightning``: ``accelerator="flagos"`` with the
``single_flagos`` and ``ddp_flagos`` strategies trains with its parameters and autocast on flagos, as the
same Trainer trains on the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning", reason="Lightning is not installed (pip install -e .[test])")

import ecosystem_training  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

# bf16 autocast: the simulated accelerator runs the CPU's kernels (equal losses); backed by CUDA, bf16
# matmuls round differently from the CPU's, and four SGD steps carry that on.
BF16_TOLERANCE = dict(rtol=2e-2, atol=2e-3)
# fp32: the same steps as one process with twice the batch, but for the order of sums (DDP averages two
# halves' gradients; backed by CUDA, cuBLAS sums in other orders than the CPU).
FP32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def train(**overrides) -> dict:
    arguments = dict(devices=1, precision="bf16-mixed", steps=4, batch_size=16) | overrides
    return ecosystem_training.lightning_training(**arguments)


def test_names_are_in_lightnings_registries():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    import torch_fl.integrations.lightning as integration

    assert AcceleratorRegistry["flagos"]["accelerator"] is integration.FlagosAccelerator
    for name in ("single_flagos", "ddp_flagos", "ddp_spawn_flagos"):
        assert StrategyRegistry[name]["strategy"] in (
            integration.SingleFlagosStrategy,
            integration.DDPFlagosStrategy,
        )
    assert StrategyRegistry["ddp_spawn_flagos"]["init_params"] == {"start_method": "spawn"}


@pytest.mark.parametrize(
    ("devices", "indices"), [(1, [0]), (2, [0, 1]), (-1, [0, 1]), ("2", [0, 1]), ("1,", [1]), ([1], [1])]
)
def test_devices_are_read_as_for_gpus(two_devices_only, devices, indices):
    from torch_fl.integrations.lightning import FlagosAccelerator

    assert FlagosAccelerator.parse_devices(devices) == indices


@pytest.mark.parametrize("devices", [3, 0, [0, 0], [2], "two"])
def test_devices_that_do_not_exist_are_refused(two_devices_only, devices):
    from torch_fl.integrations.lightning import FlagosAccelerator

    with pytest.raises(MisconfigurationException, match="flagos device"):
        FlagosAccelerator.parse_devices(devices)


def test_one_device_bf16_mixed_trains_on_flagos_as_on_the_cpu():
    flagos = train(accelerator="flagos", strategy="single_flagos")
    cpu = train(accelerator="cpu", strategy="auto")
    assert flagos["parameter_devices"] == ["flagos:0"]
    assert flagos["output_dtypes"] == ["torch.bfloat16"], "autocast did not run on flagos"
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cpu["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cpu["parameters"]), **BF16_TOLERANCE
    )


def test_sixteen_bit_mixed_precision_autocasts_and_scales_on_flagos():
    """precision="16-mixed": Lightning makes a CUDA GradScaler for it; the flagos strategy's is flagos's."""
    result = train(accelerator="flagos", strategy="single_flagos", precision="16-mixed", steps=2)
    assert result["output_dtypes"] == ["torch.float16"]
    assert result["precision_device"] == "flagos" and result["scaler_device"] == "flagos"
    assert all(loss == loss for loss in result["losses"]), "a loss is NaN"


def test_one_device_is_the_one_devices_names(two_devices_only):
    result = train(accelerator="flagos", strategy="single_flagos", devices=[1], precision="32-true", steps=1)
    assert result["parameter_devices"] == ["flagos:1"]


def test_automatic_strategy_is_refused_with_the_fix():
    """Lightning's connector gives an accelerator it does not know a CPU single-device strategy: the flagos
    accelerator refuses it, naming the strategy to pass."""
    with pytest.raises(MisconfigurationException, match="strategy='single_flagos'"):
        train(accelerator="flagos", strategy="auto", steps=1)


def test_single_device_strategy_refuses_several_devices(two_devices_only):
    with pytest.raises(MisconfigurationException, match="ddp_flagos"):
        train(accelerator="flagos", strategy="single_flagos", devices=2, steps=1)


@pytest.mark.slow
def test_ddp_over_two_devices_is_one_process_with_both_batches(launch_training):
    """strategy="ddp_flagos", devices=2: Lightning starts the second process itself; each rank trains on its
    own flagos device, and the trained parameters are those of one CPU process taking both ranks' samples
    (fp32, so that the comparison is tight: one device's test covers bf16)."""
    ranks = launch_training(
        "script",
        "lightning",
        dict(
            accelerator="flagos", strategy="ddp_flagos", devices=2, precision="32-true", steps=3, batch_size=8
        ),
    )
    assert [r["parameter_devices"] for r in ranks] == [["flagos:0"], ["flagos:1"]]
    assert ranks[0]["parameters"] == ranks[1]["parameters"], "DDP left the ranks with different parameters"
    cpu = train(
        accelerator="cpu",
        strategy="auto",
        precision="32-true",
        steps=3,
        batch_size=16,
        sample_order=ecosystem_training.lightning_distributed_order(world_size=2, batch_size=8),
    )
    torch.testing.assert_close(
        torch.tensor(ranks[0]["parameters"]), torch.tensor(cpu["parameters"]), **FP32_TOLERANCE
    )
    mean_losses = torch.tensor([ranks[0]["losses"], ranks[1]["losses"]]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor(cpu["losses"]), **FP32_TOLERANCE)


@pytest.mark.gpu
def test_one_device_bf16_mixed_trains_on_flagos_as_on_cuda(train_on_cuda_in_a_clean_process):
    flagos = train(accelerator="flagos", strategy="single_flagos")
    cuda = train_on_cuda_in_a_clean_process(
        "lightning_training", accelerator="cuda", strategy="auto", devices=1, precision="bf16-mixed",
        steps=4, batch_size=16,
    )  # fmt: skip
    assert cuda["parameter_devices"] == ["cuda:0"] and flagos["parameter_devices"] == ["flagos:0"]
    assert flagos["output_dtypes"] == cuda["output_dtypes"] == ["torch.bfloat16"]
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cuda["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cuda["parameters"]), **BF16_TOLERANCE
    )
