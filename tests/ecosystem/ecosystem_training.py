"""A tiny regression model trained by Lightning, accelerate and the Hugging Face Trainer, on flagos or on
the reference device, for the tests of this folder.

Each ``*_training`` function trains the same seeded model on the same data and returns what the tests
compare: the loss of every step, where the parameters were, the dtype of the model's output (autocast) and
the trained parameters as one flat list. Run as a script (``python ecosystem_training.py <library>
'<json of the function's arguments>'``) it trains under a launcher (Lightning's own for ``ddp_flagos``,
``torchrun``, ``accelerate launch``) and writes its rank's result as JSON, to ``rank<N>.json`` in the
folder ``ECOSYSTEM_TRAINING_RESULTS`` names (else to stdout, as ``RESULT <json>``).

One process with a batch of B * W samples takes, step by step, the samples that W processes with B each
take together, so that its training is theirs up to rounding: accelerate and the Trainer (sequential
sampling) hand out the unshuffled batches in turn; Lightning shuffles the samples of a distributed run
(DistributedSampler, seed 0), and :func:`lightning_distributed_order` gives the one process their order.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from harness.processes import let_autograd_threads_finish

RESULTS_ENV = "ECOSYSTEM_TRAINING_RESULTS"
FEATURES, HIDDEN, SAMPLES = 8, 16, 64
LEARNING_RATE = 0.1
SEED = 0


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randn(SAMPLES, FEATURES, generator=generator), torch.randn(SAMPLES, 1, generator=generator)


def network() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))


def loss_of(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output.float(), target)


def flat_parameters(module: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in module.parameters()]).tolist()


def _check_reference_process(device: str) -> None:
    """A reference run on another device than flagos: in a process without torch_fl (a CUDA backward
    cannot run beside it) and without an accelerate device chosen for flagos in the environment."""
    if device == "cuda" and "torch_fl" in sys.modules:
        raise RuntimeError("the cuda reference imported torch_fl: a CUDA backward cannot run beside it")
    chosen = os.environ.get("ACCELERATE_TORCH_DEVICE", "")
    if chosen.startswith("flagos"):
        raise RuntimeError(f"ACCELERATE_TORCH_DEVICE={chosen} in the {device} reference's environment")


def _rank() -> int:
    return int(os.environ.get("RANK", 0))


def lightning_distributed_order(world_size: int, batch_size: int) -> list[int]:
    """The samples W processes of Lightning's DDP take, step by step, in one process's order: each
    step's batch of every rank in turn (Lightning gives each rank a shuffling DistributedSampler, seed 0)."""
    shards = [
        list(torch.utils.data.DistributedSampler(range(SAMPLES), num_replicas=world_size, rank=rank, seed=0))
        for rank in range(world_size)
    ]
    steps = len(shards[0]) // batch_size
    return [i for s in range(steps) for shard in shards for i in shard[s * batch_size : (s + 1) * batch_size]]


def lightning_training(
    accelerator: str,
    strategy: str,
    devices,
    precision: str,
    steps: int,
    batch_size: int,
    sample_order: list[int] | None = None,
) -> dict:
    """``sample_order``: the order the one process takes the samples in (by default, as they are)."""
    import lightning.pytorch as L

    if accelerator == "flagos":
        import torch_fl.integrations.lightning  # noqa: F401  (registers accelerator="flagos" and its strategies)
    else:
        _check_reference_process(accelerator)

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = network()
            self.losses, self.output_dtypes, self.parameter_devices = [], set(), set()

        def training_step(self, batch, batch_index):
            x, y = batch
            output = self.net(x)
            loss = loss_of(output, y)
            self.losses.append(loss.item())
            self.output_dtypes.add(str(output.dtype))
            self.parameter_devices.update(str(p.device) for p in self.parameters())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LEARNING_RATE)

    module = Regression()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*dataset()), batch_size=batch_size, sampler=sample_order
    )
    trainer = L.Trainer(
        accelerator=accelerator,
        strategy=strategy,
        devices=devices,
        precision=precision,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return {
        "rank": trainer.global_rank,
        "precision_device": getattr(trainer.precision_plugin, "device", None),
        "scaler_device": None if scaler is None else str(scaler._device),
        "losses": module.losses,
        "parameter_devices": sorted(module.parameter_devices),
        "output_dtypes": sorted(module.output_dtypes),
        "parameters": flat_parameters(module.net),
    }


def accelerate_training(device: str, mixed_precision: str, steps: int, batch_size: int) -> dict:
    """accelerate's Accelerator on ``device``: "flagos" (``flagos_state``), "cpu" (``Accelerator(cpu=True)``)
    or "cuda" (``Accelerator()``, which picks cuda where it is available)."""
    from accelerate import Accelerator

    if device == "flagos":
        from torch_fl.integrations.accelerate import flagos_state

        flagos_state()
    else:
        _check_reference_process(device)
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision)
    assert accelerator.device.type == device, f"accelerate chose {accelerator.device}, not {device}"
    net = network()
    # The prepared model hands back fp32 outputs under mixed precision: autocast shows in the last layer's.
    output_dtypes = set()
    net[-1].register_forward_hook(lambda layer, inputs, output: output_dtypes.add(str(output.dtype)))
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*dataset()), batch_size=batch_size)
    model, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        with accelerator.autocast():
            loss = loss_of(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {
        "rank": accelerator.process_index,
        "device": str(accelerator.device),
        "distributed_type": str(accelerator.distributed_type),
        "losses": losses,
        "parameter_devices": sorted({str(p.device) for p in net.parameters()}),
        "output_dtypes": sorted(output_dtypes),
        "parameters": flat_parameters(net),
    }


def hf_trainer_training(
    device: str,
    steps: int,
    batch_size: int,
    optim: str = "sgd",
    lr_scheduler_type: str = "constant",
    max_grad_norm: float = 0.0,
) -> dict:
    """The Hugging Face Trainer on ``device``: "flagos" (``FlagosTrainingArguments``), "cpu"
    (``TrainingArguments(use_cpu=True)``) or "cuda" (``TrainingArguments()``, which picks cuda where it is
    available). Mixed precision comes from ``ACCELERATE_MIXED_PRECISION``. ``losses`` are the Trainer's
    logged ones: every step's, averaged over the processes."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    if device == "flagos":
        from torch_fl.integrations.transformers import FlagosTrainingArguments as arguments
    else:
        _check_reference_process(device)
        arguments = TrainingArguments

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = network()
            self.output_dtypes = set()

        def forward(self, x, labels=None):
            output = self.net(x)
            self.output_dtypes.add(str(output.dtype))
            return {"loss": loss_of(output, labels), "logits": output}

    class Samples(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.y = dataset()

        def __len__(self):
            return SAMPLES

        def __getitem__(self, index):
            return {"x": self.x[index], "labels": self.y[index]}

    with tempfile.TemporaryDirectory(prefix="flagos_hf_trainer_") as output_dir:
        args = arguments(
            output_dir=output_dir,
            use_cpu=device == "cpu",
            per_device_train_batch_size=batch_size,
            max_steps=steps,
            learning_rate=LEARNING_RATE,
            optim=optim,
            lr_scheduler_type=lr_scheduler_type,
            max_grad_norm=max_grad_norm,
            train_sampling_strategy="sequential",
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            ddp_timeout=120,
            seed=SEED,
        )
        assert args.device.type == device, f"the Trainer chose {args.device}, not {device}"
        model = Regression()
        trainer = Trainer(model=model, args=args, train_dataset=Samples())
        trainer.train()
    return {
        "rank": args.process_index,
        "device": str(args.device),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "parameter_devices": sorted({str(p.device) for p in model.parameters()}),
        "output_dtypes": sorted(model.output_dtypes),
        "parameters": flat_parameters(model.net),
    }


TRAININGS = {
    "lightning": lightning_training,
    "accelerate": accelerate_training,
    "hf_trainer": hf_trainer_training,
}


def main() -> None:
    library, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = TRAININGS[library](**arguments)
    result = {"rank": _rank(), **result}
    folder = os.environ.get(RESULTS_ENV)
    if folder:  # a file per rank: lines the ranks print to one pipe can interleave
        with open(os.path.join(folder, f"rank{result['rank']}.json"), "w") as file:
            json.dump(result, file)
    else:
        print("RESULT " + json.dumps(result), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    let_autograd_threads_finish()


if __name__ == "__main__":
    main()
