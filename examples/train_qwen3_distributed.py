"""Qwen3 trained with stock DDP or FSDP2, one process per device, launched by torchrun from the repository's
root:

    torchrun --nproc-per-node 2 -m examples.train_qwen3_distributed --strategy ddp
    torchrun --nproc-per-node 2 -m examples.train_qwen3_distributed --strategy fsdp2

Each rank trains on flagos:<LOCAL_RANK>. The process group names no backend: flagos, torch's accelerator
once torch_fl is imported, brings its own (NCCL on NVIDIA GPUs, gloo over host memory on the simulated
accelerator; docs/distributed.md). The shape is Qwen3 tiny on the simulated accelerator and Qwen3-0.6B's
architecture (random weights, nothing downloaded) on GPUs, trained in bfloat16 mixed precision there.

``--device cuda`` (NCCL) or ``--device cpu`` (gloo) runs the same training as the reference flagos is
compared with (benchmarks/distributed.py): such a process never imports torch_fl (nor does ``harness``, the
repository's Qwen3 helpers), so it is plain PyTorch (a CUDA backward cannot run in a process that imported
torch_fl, pytorch#161129). ``--results FILE``
writes rank 0's losses and step times as JSON; ``--profile-steps N`` adds N steps profiled on rank 0
(each event's self host time, benchmarks/distributed.py --host-diff). ``--turns FOLDER:ME`` runs the
steps after the first ``--untimed`` in turns with another launch (benchmarks/distributed.py
--side-by-side). ``--cpus 0-15:16-31`` runs local rank i, all its threads, on the i-th CPU list
(benchmarks/distributed.py passes each rank a share of its GPU's NUMA node's CPUs, the same for flagos and
the reference). Needs Hugging Face transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from harness import qwen3
from harness.cpus import bind_to_cpus, cpu_list
from harness.processes import Turns, let_autograd_threads_finish


def parse_args(turn_block: int):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--device", choices=["flagos", "cuda", "cpu"], default="flagos")
    p.add_argument("--shape", choices=["tiny", "0.6b"], help="default: 0.6b on GPUs, tiny otherwise")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--results", help="rank 0 writes the losses and step times here (JSON)")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after the timed steps, this many more under the profiler (host activity, rank 0): each event's "
        "calls and self host time go into --results",
    )
    p.add_argument(
        "--turns",
        metavar="FOLDER:ME",
        help="take the steps after --untimed in turns with another launch given FOLDER and the other ME "
        f"(0 or 1), in blocks of {turn_block} (benchmarks/distributed.py --side-by-side)",
    )
    p.add_argument("--untimed", type=int, default=0, help="with --turns: steps run before the turns begin")
    p.add_argument(
        "--cpus",
        metavar="LIST[:LIST...]",
        help="CPU lists, one per local rank, each as taskset -c takes it (0-15:16-31): local rank i and all "
        "its threads run on the i-th",
    )
    args = p.parse_args()
    if args.cpus is not None:
        try:
            args.cpus = [cpu_list(text) for text in args.cpus.split(":")]
        except ValueError as e:
            p.error(f"--cpus {args.cpus!r}: {e}")
    if args.turns:
        folder, _, me = args.turns.rpartition(":")
        if not folder or me not in ("0", "1"):
            p.error(f"--turns takes FOLDER:ME with ME 0 or 1, got {args.turns!r}")
        if not 0 <= args.untimed < args.steps or (args.steps - args.untimed) % turn_block:
            p.error(
                f"--turns: the steps after --untimed ({args.steps} - {args.untimed}) must be whole turns "
                f"of {turn_block}"
            )
        args.turns = (folder, int(me))
    for name in ("steps", "batch", "seq_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.profile_steps < 0:
        p.error(f"--profile-steps must be 0 (off) or more, got {args.profile_steps}")
    return args


def set_up(kind: str, local_rank: int) -> tuple[torch.device, bool]:
    """The process group and this rank's device; whether it is a GPU (bf16 mixed precision then)."""
    if kind == "flagos":
        # The simulated accelerator has FLAGOS_SIM_DEVICES devices (2 by default): one per local rank.
        # Read when the device is first used, so set before torch_fl is imported. Ignored on GPUs.
        os.environ.setdefault("FLAGOS_SIM_DEVICES", str(max(2, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))
        import torch_fl

        device = torch.device("flagos", local_rank)
        torch.flagos.set_device(device)
        dist.init_process_group(device_id=device)
        return device, torch_fl.accelerator() == "cuda"
    if kind == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device, True
    dist.init_process_group("gloo")
    return torch.device("cpu"), False


def wrap(model, strategy: str, device: torch.device, mixed_precision: bool):
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else None
    )
    kwargs = {"mesh": mesh} if policy is None else {"mesh": mesh, "mp_policy": policy}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def describe(device: torch.device) -> str:
    backend = dist.group.WORLD._get_backend(device)
    if device.type != "flagos":
        return f"{device.type} over {type(backend).__name__}"
    import torch_fl

    return f"flagos ({torch_fl.accelerator()}), the flagos backend over {type(backend.inner).__name__}"


def profile_host(args, rank: int, train_step) -> dict | None:
    """``--profile-steps`` more steps, on rank 0 under the profiler (the other ranks run them unprofiled):
    each host event name's [calls, self host microseconds] over those steps, the steps' wall time, and on
    a CUDA GPU (cuda, or flagos backed by it) each kernel's and copy's [calls, device microseconds]; the
    host events then include the CUDA runtime calls (cudaLaunchKernel, cudaMemcpyAsync, ...)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    steps = range(args.steps, args.steps + args.profile_steps)
    if rank != 0:
        for step in steps:
            train_step(step)
        return None
    start = time.perf_counter()
    on_cuda = args.device != "cpu" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for step in steps:
            train_step(step)
    wall = time.perf_counter() - start
    events: dict[str, list[float]] = {}
    device_events: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == DeviceType.CPU:
            row = events.setdefault(event.name, [0, 0.0])
            row[1] += event.self_cpu_time_total
        elif event.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1):
            row = device_events.setdefault(event.name, [0, 0.0])
            row[1] += event.time_range.elapsed_us()
        else:
            continue
        row[0] += 1
    return {
        "steps": args.profile_steps,
        "wall_seconds": wall,
        "events": events,
        "device_events": device_events,
    }


def main() -> None:
    args = parse_args(Turns.BLOCK)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpus is not None:
        bind_to_cpus(args.cpus, local_rank)
    device, on_gpu = set_up(args.device, local_rank)
    rank, world = dist.get_rank(), dist.get_world_size()

    shape = args.shape or ("0.6b" if on_gpu else "tiny")
    # Parameters in float32; on GPUs the forward runs in bfloat16 (DDP: autocast; FSDP2: its policy).
    model = qwen3.build_model(shape, seed=0).to(device).train()
    run = wrap(model, args.strategy, device, mixed_precision=on_gpu)
    autocast = on_gpu and args.strategy == "ddp"
    optimizer = torch.optim.AdamW(run.parameters(), lr=args.lr)
    vocab = qwen3.SHAPES[shape]["vocab_size"]
    if rank == 0:
        print(f"{args.strategy} on {world} ranks: Qwen3 {shape} on {describe(device)}")

    def train_step(step: int):
        # Each rank its own batch (the rank is part of the seed), the same on every device.
        g = torch.Generator().manual_seed(step * world + rank)
        ids = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = run(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # a SUM: gloo, the CPU reference's backend, has no AVG
        # The host's share: how long queuing the step took. Near the step time, the step is host-bound.
        issued = time.perf_counter() - start
        mean_loss = total.item() / world  # .item() waits for the step's device work
        return mean_loss, issued, time.perf_counter() - start

    losses, seconds, issue_seconds, spans = [], [], [], []
    steps = iter(range(args.steps))

    def record_step():
        step = next(steps)
        began = time.monotonic()  # one clock for every process of the host: launches side by side compare
        loss, issued, took = train_step(step)
        spans.append((began, time.monotonic()))
        losses.append(loss)
        issue_seconds.append(issued)
        seconds.append(took)
        if rank == 0:
            print(f"step {step}: loss {loss:.4f} (mean over ranks), {took * 1e3:.0f} ms")

    if args.turns:
        # Every rank waits for its side's turn; rank 0 hands the turns over, after its step has read the
        # loss back, so the whole launch is idle while the other side runs.
        for _ in range(args.untimed):
            record_step()
        turns = Turns(*args.turns, marks=rank == 0)
        turns.take(record_step, args.steps - args.untimed)
    else:
        for _ in range(args.steps):
            record_step()
    host_profile = profile_host(args, rank, train_step) if args.profile_steps else None

    if rank == 0 and args.results:
        results = dict(
            device=args.device,
            on=describe(device),
            strategy=args.strategy,
            shape=shape,
            world_size=world,
            mixed_precision=on_gpu,
            losses=losses,
            step_seconds=seconds,
            issue_seconds=issue_seconds,
            step_spans=spans,
            imported_torch_fl="torch_fl" in sys.modules,
            cpus=sorted(os.sched_getaffinity(0)),
            host_profile=host_profile,
        )
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    let_autograd_threads_finish()


if __name__ == "__main__":
    main()
