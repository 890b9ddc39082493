"""torch.distributed.checkpoint (DCP) of a sharded FSDP2 model and its optimizer, on a group made with
init_process_group(): written by the ranks of one launch, loaded by another number of ranks (resharding)
into a differently initialised model, which must then hold the saved state bitwise and train on as the
saved run did. Run by test_checkpoint.py."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ranks import DEVICE, RANK, WORLD, init
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from training import (
    MLP,
    assert_params_close,
    checkpoint_writer,
    full_batch,
    mse,
    params_cpu,
    rows_of,
    shard_mlp,
)

STEPS = 2
ROWS = 4  # of a batch of all ranks: launches of 1, 2 and 4 ranks train on the same batches
CONTINUED_SEED = 100  # the batch of the step after the checkpoint


def sharded_mlp(seed: int):
    """The MLP initialised from `seed`, sharded over all ranks with FSDP2, and its Adam optimizer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP()
    model = shard_mlp(model.to(DEVICE), init_device_mesh("flagos", (WORLD,)))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def step(model, opt, seed: int) -> None:
    """One step on this rank's rows of the batch of all ranks."""
    assert ROWS % WORLD == 0, f"{WORLD} ranks cannot share a batch of {ROWS} rows"
    x, y = full_batch(seed, ROWS // WORLD)
    mse(model, rows_of(x), rows_of(y)).backward()
    opt.step()
    opt.zero_grad()


def full_state(model, opt) -> tuple[dict, dict]:
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def paths(folder: str) -> tuple[str, str, str]:
    return (
        os.path.join(folder, "dcp"),
        os.path.join(folder, "reference.pt"),
        os.path.join(folder, "continued.pt"),
    )


def save(folder: str, writer: str) -> dict:
    """Trains STEPS steps, writes the checkpoint (`writer`: "default", DCP's own choice, or "threads", the
    writer that stages every tensor with .cpu()), the full state as a reference, and the parameters after
    one more step."""
    init()
    model, opt = sharded_mlp(seed=0)
    for s in range(STEPS):
        step(model, opt, seed=1 + s)
    checkpoint, reference, continued = paths(folder)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save(
        {"model": model_sd, "optim": optim_sd},
        checkpoint_id=checkpoint,
        storage_writer=checkpoint_writer(checkpoint) if writer == "threads" else None,
    )
    full_model, full_optim = full_state(model, opt)
    if RANK == 0:  # before the next step, which advances Adam's step counts (CPU tensors) in place
        torch.save({"model": full_model, "optim": full_optim}, reference)
    step(model, opt, seed=CONTINUED_SEED)
    after = params_cpu(model)
    if RANK == 0:
        torch.save(after, continued)
    dist.barrier()
    dist.destroy_process_group()
    return {"saved_by": WORLD}


def load(folder: str) -> dict:
    """Loads the checkpoint into a differently initialised model sharded over this launch's ranks."""
    init()
    model, opt = sharded_mlp(seed=1)
    checkpoint, reference, continued = paths(folder)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_model, full_optim = full_state(model, opt)
    compared = 0
    if RANK == 0:
        expected = torch.load(reference, weights_only=False)
        assert full_model.keys() == expected["model"].keys()
        for name, value in expected["model"].items():
            assert torch.equal(full_model[name].cpu(), value), name
            compared += 1
        assert full_optim["state"].keys() == expected["optim"]["state"].keys()
        for name, state_of in expected["optim"]["state"].items():
            for key, value in state_of.items():
                actual = torch.as_tensor(full_optim["state"][name][key]).cpu()
                assert torch.equal(actual, torch.as_tensor(value)), (name, key)
                compared += 1
    # The loaded shards are live: the next step is the saved run's next step (the same full batch; the
    # gradient is reduced over another number of ranks, hence a tolerance).
    step(model, opt, seed=CONTINUED_SEED)
    assert_params_close(params_cpu(model), torch.load(continued), "the step after loading")
    dist.destroy_process_group()
    return {"loaded_by": WORLD, "compared": compared}
