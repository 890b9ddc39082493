"""A rank of ``benchmarks/distributed.py``'s collectives part, which starts one per rank under torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node N -m benchmarks.collectives_worker REQUEST

REQUEST (JSON): ``sizes`` (bytes), ``repeats``, ``min_seconds``, ``out`` (where rank 0 writes the rows). Each
op and size: one checked call on each device, then ``repeats`` paired rounds of flagos and the native device
(benchmarks.common.paired_rounds), each timing a loop of calls (``time_collective``).
"""

from __future__ import annotations

import json
import os
import sys
import time

from benchmarks.common import median, paired_rounds
from benchmarks.distributed import OPS, native_device


def collectives_worker(request: dict) -> None:
    os.environ.setdefault("FLAGOS_SIM_DEVICES", str(max(2, int(os.environ["LOCAL_WORLD_SIZE"]))))
    import torch
    import torch.distributed as dist

    import torch_fl  # noqa: F401

    local_rank = int(os.environ["LOCAL_RANK"])
    native = native_device()
    torch.flagos.set_device(local_rank)
    if native == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl,flagos:flagos")
    else:
        dist.init_process_group("cpu:gloo,flagos:flagos")
    rank, world = dist.get_rank(), dist.get_world_size()
    devices = {"flagos": torch.device("flagos", local_rank), "native": torch.device(native, local_rank)}
    if native == "cpu":
        devices["native"] = torch.device("cpu")

    rows = []
    for op in OPS:
        for nbytes in request["sizes"]:
            numel = max(world, nbytes // 4 // world * world)  # divisible by the world size
            for device in devices.values():
                check(op, numel, device, rank, world)
            seconds = paired_rounds(
                {
                    name: lambda d=devices[name], op=op, numel=numel: time_collective(
                        op, numel, d, world, request["min_seconds"]
                    )
                    for name in ("flagos", "native")
                },
                request["repeats"],
            )
            row = dict(op=op, bytes=numel * 4)
            factor = (2 if op == "all_reduce" else 1) * (world - 1) / world if world > 1 else 1.0
            for name in seconds:
                row[f"{name}_seconds"] = median(seconds[name])
                row[f"{name}_gbs"] = numel * 4 / row[f"{name}_seconds"] / 1e9 * factor
            row["ratio"] = row["flagos_gbs"] / row["native_gbs"]
            rows.append(row)
    if rank == 0:
        with open(request["out"], "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def _buffers(op: str, numel: int, device, world: int, fill: float):
    import torch

    if op == "all_reduce":
        t = torch.full((numel,), fill, device=device)
        return t, t
    if op == "all_gather":  # numel: the gathered output's
        return torch.full((numel // world,), fill, device=device), torch.empty(numel, device=device)
    return torch.full((numel,), fill, device=device), torch.empty(numel // world, device=device)


def _issue(op: str, inp, out) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)


def check(op: str, numel: int, device, rank: int, world: int) -> None:
    """One call on ``device`` whose inputs are rank + 1: the result's ends must be what the op makes."""
    inp, out = _buffers(op, numel, device, world, float(rank + 1))
    _issue(op, inp, out)
    if op == "all_gather":
        expected = [(1.0, out[0].item()), (float(world), out[-1].item())]
    else:
        total = world * (world + 1) / 2
        expected = [(total, out[0].item()), (total, out[-1].item())]
    for want, got in expected:
        if got != want:
            raise AssertionError(f"rank {rank}: {op} of {numel * 4} bytes on {device} gave {got}, not {want}")


def time_collective(op: str, numel: int, device, world: int, min_seconds: float) -> float:
    """Seconds per call, the slowest rank's. A timed warm-up call sizes the loop so that it lasts about
    ``min_seconds`` (the ranks agree on the count); the ranks line up on the CPU group before the clock
    starts, so one rank's late start does not count as the collective's time."""
    import torch
    import torch.distributed as dist

    from benchmarks.common import synchronize

    def slowest(seconds: float) -> float:  # a CPU tensor: the group's gloo; also lines the ranks up
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    inp, out = _buffers(op, numel, device, world, 0.0)
    _issue(op, inp, out)  # the first call of a size may set up buffers: not timed
    synchronize(device)
    slowest(0.0)
    start = time.perf_counter()
    _issue(op, inp, out)
    synchronize(device)
    one_call = slowest(time.perf_counter() - start)
    iterations = max(5, min(2000, int(min_seconds / max(one_call, 1e-7))))
    slowest(0.0)
    start = time.perf_counter()
    for _ in range(iterations):
        _issue(op, inp, out)
    synchronize(device)
    return slowest((time.perf_counter() - start) / iterations)


if __name__ == "__main__":
    collectives_worker(json.loads(sys.argv[1]))
