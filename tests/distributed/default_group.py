"""Process groups made as most scripts make them, without naming flagos's backend. init_process_group() and
init_process_group(device_id=...) make a flagos+gloo group (flagos tensors through the flagos backend, CPU
tensors through gloo) on which DDP and FSDP2 train as on a group named for flagos; a group made as "gloo"
is torch's gloo group, for CPU tensors only. Run by test_default_group.py."""

from __future__ import annotations

import torch
import torch.distributed as dist
from ranks import DEVICE, RANK, WORLD, expect_error, flagos_backend, init
from torch.distributed.device_mesh import init_device_mesh
from training import assert_params_close, fsdp_mlp, mlp, train_mlp_ddp, train_mlp_reference

TRIANGLE = WORLD * (WORLD + 1) / 2  # the sum of rank + 1 over the ranks


def rank_tensor(device) -> torch.Tensor:
    return torch.full((3,), float(RANK + 1), device=device)


def serves_flagos_and_cpu(backend_name: str) -> None:
    """The group made is flagos+gloo's: both devices' collectives, object collectives and barriers work."""
    assert dist.get_backend() == backend_name, dist.get_backend()
    assert type(flagos_backend()).__name__ == "_FlagosBackend", type(flagos_backend())
    cpu_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(cpu_backend, dist.ProcessGroupGloo), type(cpu_backend)
    for device in (DEVICE, torch.device("cpu")):
        t = rank_tensor(device)
        dist.all_reduce(t)
        assert t.device.type == device.type and t.cpu().tolist() == [TRIANGLE] * 3, (device, t)
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": RANK})
    assert objects == [{"rank": r} for r in range(WORLD)], objects
    dist.barrier()


def no_backend_argument() -> list[str]:
    """init_process_group(): DDP equal to single-process training, FSDP2 equal to DDP."""
    init(tag="no_backend")
    serves_flagos_and_cpu("undefined")
    assert dist.get_backend_config() == "flagos:flagos+gloo", dist.get_backend_config()
    model = mlp()
    assert_params_close(train_mlp_ddp(model)[0], train_mlp_reference(model), "DDP on init_process_group()")
    done = ["ddp"] + fsdp_mlp(init_device_mesh("flagos", (WORLD,)))
    dist.destroy_process_group()
    return done


def device_id() -> list[str]:
    """init_process_group(device_id=...): the device type's default backend, torch's answer to
    get_default_backend_for_device (what Lightning and transformers ask for)."""
    assert dist.get_default_backend_for_device("flagos") == "flagos+gloo"
    init(tag="device_id", device_id=True)
    serves_flagos_and_cpu("flagos+gloo")
    model = mlp()
    assert_params_close(train_mlp_ddp(model)[0], train_mlp_reference(model), "DDP on a device_id group")
    dist.destroy_process_group()
    return ["ddp"]


def named_gloo() -> list[str]:
    """init_process_group("gloo") is torch's gloo group: CPU tensors only; a flagos collective fails at once
    with torch's error (torch makes gloo for the device types gloo lists, and gloo rejects others)."""
    init("gloo", tag="gloo")
    t = rank_tensor("cpu")
    dist.all_reduce(t)
    assert t.tolist() == [TRIANGLE] * 3, t
    expect_error(
        RuntimeError,
        lambda: dist.all_reduce(rank_tensor(DEVICE)),
        "No backend type associated with device type flagos",
    )
    dist.barrier()
    dist.destroy_process_group()
    return ["cpu_collective", "flagos_collective_refused"]


def run() -> dict:
    return {"no_backend": no_backend_argument(), "device_id": device_id(), "gloo": named_gloo()}
