"""The Hugging Face Trainer on flagos through ``torch_fl.integrations.transformers.FlagosTrainingArguments``:
it trains with its parameters and autocast on flagos, in one process and in one process per device under
``accelerate launch``, as the Trainer trains on the CPU (``use_cpu=True``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e .[test])")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")

import ecosystem_training  # noqa: E402

from torch_fl.integrations.transformers import FlagosTrainingArguments  # noqa: E402

# bf16 autocast: equal on the simulated accelerator (the CPU's kernels); backed by CUDA, bf16 matmuls
# round differently from the CPU's, and four steps carry that on.
BF16_TOLERANCE = dict(rtol=2e-2, atol=2e-3)
# fp32, two processes against one with both batches: only the order of sums differs (and, backed by CUDA,
# cuBLAS's order from the CPU's).
FP32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def test_one_process_bf16_trains_on_flagos_as_on_the_cpu(fresh_accelerate_state, monkeypatch):
    """With the Trainer's defaults (AdamW, a linear schedule, gradient clipping). bf16 comes from
    accelerate's ACCELERATE_MIXED_PRECISION: transformers refuses bf16=True where it finds no GPU."""
    kw = dict(steps=4, batch_size=16, optim="adamw_torch", lr_scheduler_type="linear", max_grad_norm=1.0)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    flagos = ecosystem_training.hf_trainer_training("flagos", **kw)
    fresh_accelerate_state.reset()
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cpu = ecosystem_training.hf_trainer_training("cpu", **kw)
    assert flagos["device"] == "flagos:0"
    assert flagos["parameter_devices"] == ["flagos:0"]
    assert flagos["output_dtypes"] == ["torch.bfloat16"], "autocast did not run on flagos"
    assert len(flagos["losses"]) == 4
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cpu["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cpu["parameters"]), **BF16_TOLERANCE
    )


def test_arguments_that_choose_another_device_are_refused(fresh_accelerate_state, tmp_path):
    with pytest.raises(ValueError, match="use_cpu"):
        FlagosTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])


def test_arguments_device_is_the_current_device(fresh_accelerate_state, tmp_path, two_devices_only):
    with torch.flagos.device(1):
        args = FlagosTrainingArguments(output_dir=str(tmp_path), report_to=[])
        assert args.device == torch.device("flagos", 1)
    assert args.n_gpu == 1 and args.world_size == 1


@pytest.mark.slow
def test_accelerate_launch_two_processes_are_one_process_with_both_batches(
    launch_training, fresh_accelerate_state
):
    """``accelerate launch --multi_gpu --num_processes 2``: each process trains on its own flagos device,
    DDP keeps them equal, and the parameters are those of one CPU process taking both batches (fp32, for
    a tight comparison). The Trainer's logged losses are the mean over the processes."""
    ranks = launch_training("accelerate", "hf_trainer", dict(device="flagos", steps=3, batch_size=8))
    assert [r["device"] for r in ranks] == ["flagos:0", "flagos:1"]
    assert [r["parameter_devices"] for r in ranks] == [["flagos:0"], ["flagos:1"]]
    assert ranks[0]["parameters"] == ranks[1]["parameters"], "DDP left the ranks with different parameters"
    cpu = ecosystem_training.hf_trainer_training("cpu", steps=3, batch_size=16)
    torch.testing.assert_close(
        torch.tensor(ranks[0]["parameters"]), torch.tensor(cpu["parameters"]), **FP32_TOLERANCE
    )
    torch.testing.assert_close(
        torch.tensor(ranks[0]["losses"]), torch.tensor(cpu["losses"]), **FP32_TOLERANCE
    )


@pytest.mark.gpu
def test_one_process_bf16_trains_on_flagos_as_on_cuda(
    fresh_accelerate_state, monkeypatch, train_on_cuda_in_a_clean_process
):
    kw = dict(steps=4, batch_size=16, optim="adamw_torch", lr_scheduler_type="linear", max_grad_norm=1.0)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    flagos = ecosystem_training.hf_trainer_training("flagos", **kw)
    fresh_accelerate_state.reset()  # the reference process inherits no ACCELERATE_TORCH_DEVICE=flagos
    cuda = train_on_cuda_in_a_clean_process(
        "hf_trainer_training", env={"ACCELERATE_MIXED_PRECISION": "bf16"}, device="cuda", **kw
    )
    assert cuda["device"] == "cuda:0" and flagos["device"] == "flagos:0"
    assert flagos["output_dtypes"] == cuda["output_dtypes"] == ["torch.bfloat16"]
    torch.testing.assert_close(torch.tensor(flagos["losses"]), torch.tensor(cuda["losses"]), **BF16_TOLERANCE)
    torch.testing.assert_close(
        torch.tensor(flagos["parameters"]), torch.tensor(cuda["parameters"]), **BF16_TOLERANCE
    )
