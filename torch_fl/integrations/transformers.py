"""The Hugging Face ``Trainer`` on flagos: :class:`FlagosTrainingArguments`.

The ``Trainer`` places the model and the batches on ``TrainingArguments.device``, which transformers
chooses from the devices it lists: with one process, ``cuda:0`` wherever CUDA is available, whatever
accelerate's state says; with several, accelerate's state, whose distributed mode accelerate ties to its
own device list. Neither has a setting that names another device on an NVIDIA machine, so the device
choice is made by a subclass of ``TrainingArguments``, as the integrations of other out-of-tree devices
(optimum-habana's, optimum-neuron's) make it: ``FlagosTrainingArguments`` takes every argument of
``TrainingArguments`` and makes accelerate's process state with
:func:`torch_fl.integrations.accelerate.flagos_state` (one process, or one per rank under
``torchrun``/``accelerate launch``, DDP on the flagos c10d backend)::

    from torch_fl.integrations.transformers import FlagosTrainingArguments
    args = FlagosTrainingArguments(output_dir="out", bf16=True)
    Trainer(model=model, args=args, train_dataset=data).train()   # on flagos:<local rank>

``bf16=True`` (and ``fp16=True``) autocast on flagos. transformers checks ``bf16=True`` against the GPUs it
knows, so where there is none (the simulated accelerator) it refuses it; accelerate's
``ACCELERATE_MIXED_PRECISION=bf16``, which the ``Trainer`` reads, asks for the same autocast there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

import torch
import transformers
from accelerate.state import AcceleratorState
from transformers import TrainingArguments
from transformers.trainer_pt_utils import AcceleratorConfig

from torch_fl.integrations.accelerate import DEFAULT_BACKEND, flagos_state

TESTED_VERSION = "5.17.0"

# The one part of TrainingArguments this subclass replaces: where every other property (n_gpu,
# parallel_mode, world_size, process_index) gets the device and accelerate's state from. A transformers
# without it would silently keep its own device choice.
if not isinstance(TrainingArguments.__dict__.get("_setup_devices"), cached_property):
    raise ImportError(
        f"transformers {transformers.__version__} has no TrainingArguments._setup_devices, where "
        f"FlagosTrainingArguments chooses the device (tested with transformers {TESTED_VERSION})"
    )


@dataclass
class FlagosTrainingArguments(TrainingArguments):
    """``TrainingArguments`` whose device is this process's flagos device. ``ddp_backend``, when given, is
    the backend of the process group made for several processes (default ``"cpu:gloo,flagos:flagos"``);
    ``use_cpu`` and DeepSpeed, which choose their own devices, are refused."""

    @cached_property
    def _setup_devices(self) -> torch.device:
        if self.use_cpu:
            raise ValueError(
                "FlagosTrainingArguments trains on flagos: use TrainingArguments for use_cpu=True"
            )
        if self.deepspeed:
            raise ValueError("DeepSpeed chooses its own devices: it does not run on flagos")
        configured = isinstance(self.accelerator_config, AcceleratorConfig) and self.accelerator_config.pop(
            "use_configured_state", False
        )
        if not configured:
            # As TrainingArguments does: a Trainer made earlier in this process leaves accelerate's state,
            # whose mixed precision cannot change once set.
            AcceleratorState._reset_state(reset_partial_state=True)
        self.distributed_state = flagos_state(
            backend=self.ddp_backend or DEFAULT_BACKEND, timeout=timedelta(seconds=self.ddp_timeout)
        )
        self._n_gpu = 1
        return self.distributed_state.device


__all__ = ["FlagosTrainingArguments"]
