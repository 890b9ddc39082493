"""accelerate on flagos: :func:`flagos_state`, accelerate's process state (``PartialState``) on flagos.

accelerate chooses its device and its distributed mode from the devices it lists (cuda, xpu, npu, mlu,
musa, hpu, ...); a PrivateUse1 device such as flagos is not among them. What it offers any device:

- ``ACCELERATE_TORCH_DEVICE``: the device of the process state, read when the state is first made. One
  process with ``ACCELERATE_TORCH_DEVICE=flagos`` trains on flagos, mixed precision included (autocast on
  the state's device type).
- Its multi-process CPU mode (``PartialState(cpu=True)`` under ``torchrun``/``accelerate launch``) wraps the
  model in ``DistributedDataParallel(model)`` without device ids, around whatever device the state has, and
  uses the process group that exists when the state is made. It is the one multi-process mode accelerate
  does not tie to a device list.

:func:`flagos_state` puts the two together: the rank's flagos device (``LOCAL_RANK``) in
``ACCELERATE_TORCH_DEVICE``, and with several processes a process group on the flagos c10d backend made
first, then the state in the multi-process CPU mode. Call it before ``Accelerator()``::

    from torch_fl.integrations.accelerate import flagos_state
    flagos_state()
    accelerator = Accelerator(mixed_precision="bf16")   # accelerator.device: flagos:<local rank>

With several processes the state's ``distributed_type`` reads ``MULTI_CPU`` and its ``backend`` ``"gloo"``
(accelerate's labels for that mode), while the group's backend is the one given here.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from accelerate import PartialState

import torch_fl  # noqa: F401  (registers the flagos device)

DEVICE_TYPE = "flagos"
DEVICE_ENV = "ACCELERATE_TORCH_DEVICE"
DEFAULT_BACKEND = "cpu:gloo,flagos:flagos"


def _process_device() -> torch.device:
    """This process's flagos device: the one ``LOCAL_RANK`` names where a launcher set it, else the current
    one. More local ranks than flagos devices is an error, as it is for cuda."""
    count = torch.flagos.device_count()
    if count == 0:
        raise RuntimeError("accelerate cannot run on flagos: no flagos device is available")
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    if local_rank >= count:
        raise RuntimeError(
            f"LOCAL_RANK={local_rank}, but this machine has {count} flagos device(s): start at most {count} "
            "processes per node"
        )
    index = local_rank if local_rank >= 0 else torch.flagos.current_device()
    return torch.device(DEVICE_TYPE, index)


def flagos_state(backend: str = DEFAULT_BACKEND, timeout: timedelta | None = None) -> PartialState:
    """accelerate's process state on this process's flagos device; see the module's docstring.

    ``backend`` and ``timeout`` are those of the process group made when a launcher started the process
    (``LOCAL_RANK`` or ``WORLD_SIZE`` > 1 is set) and none exists yet (the default serves flagos tensors through the flagos backend and CPU tensors through gloo). Made
    once per process: a later call returns the same state, and refuses one made earlier for another device
    (make it first, before ``Accelerator()`` or ``TrainingArguments``)."""
    if PartialState._shared_state:
        state = PartialState()
        if state.device.type != DEVICE_TYPE:
            raise RuntimeError(
                f"accelerate's process state is already made, on {state.device}: call flagos_state() before "
                "Accelerator(), PartialState() or TrainingArguments"
            )
        return state
    requested = os.environ.get(DEVICE_ENV)
    if requested and torch.device(requested).type != DEVICE_TYPE:
        raise RuntimeError(f"{DEVICE_ENV}={requested} asks accelerate for another device than flagos")
    device = _process_device()
    torch.flagos.set_device(device)
    os.environ[DEVICE_ENV] = str(device)
    launched = "LOCAL_RANK" in os.environ or int(os.environ.get("WORLD_SIZE", 1)) > 1
    if not launched:
        return PartialState()
    if not dist.is_initialized():
        kwargs = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(backend, device_id=device, **kwargs)
    return PartialState(cpu=True)


__all__ = ["flagos_state"]
