"""Qwen3 trained on flagos with stock DDP or FSDP2, one process per flagos device, launched by torchrun:

    torchrun --nproc-per-node 2 examples/train_qwen3_distributed.py --strategy ddp
    torchrun --nproc-per-node 2 examples/train_qwen3_distributed.py --strategy fsdp2

Each rank trains on flagos:<LOCAL_RANK>. The process group names no backend: flagos, torch's accelerator
once torch_fl is imported, brings its own (NCCL on NVIDIA GPUs, gloo over host memory on the simulated
accelerator; docs/distributed.md). The shape is Qwen3 tiny on the simulated accelerator and Qwen3-0.6B's
architecture (random weights, nothing downloaded) on GPUs, trained in bfloat16 mixed precision there.
Needs Hugging Face transformers.
"""

from __future__ import annotations

import argparse
import os
import time

# The simulated accelerator has FLAGOS_SIM_DEVICES devices (2 by default): one per local rank here. Read
# when the device is first used, so it is set before torch_fl is imported. Ignored on GPUs.
os.environ.setdefault("FLAGOS_SIM_DEVICES", str(max(2, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_fl  # noqa: E402
from torch_fl import _qwen3  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--shape", choices=sorted(_qwen3.SHAPES), help="default: 0.6b on GPUs, tiny on sim")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4)
    return p.parse_args()


def wrap(model, strategy: str, device: torch.device, mixed_precision: bool):
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("flagos", (dist.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else None
    )
    kwargs = {"mesh": mesh} if policy is None else {"mesh": mesh, "mp_policy": policy}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("flagos", local_rank)
    torch.flagos.set_device(device)
    dist.init_process_group(device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    on_gpu = torch_fl.accelerator() == "cuda"
    shape = args.shape or ("0.6b" if on_gpu else "tiny")
    # Parameters in float32; on GPUs the forward runs in bfloat16 (DDP: autocast; FSDP2: its policy).
    model = _qwen3.build_model(shape, seed=0).to(device).train()
    run = wrap(model, args.strategy, device, mixed_precision=on_gpu)
    autocast = on_gpu and args.strategy == "ddp"
    optimizer = torch.optim.AdamW(run.parameters(), lr=args.lr)
    vocab = _qwen3.SHAPES[shape]["vocab_size"]
    if rank == 0:
        inner = type(dist.group.WORLD._get_backend(device).inner).__name__
        print(
            f"{args.strategy} on {world} ranks: Qwen3 {shape} on flagos ({torch_fl.accelerator()}), "
            f"the flagos backend over {inner}"
        )

    for step in range(args.steps):
        # Each rank its own batch (the rank is part of the seed).
        g = torch.Generator().manual_seed(step * world + rank)
        ids = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g).to(device)
        start = time.perf_counter()
        with torch.autocast("flagos", dtype=torch.bfloat16, enabled=autocast):
            loss = run(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        seconds = time.perf_counter() - start
        if rank == 0:
            print(f"step {step}: loss {mean_loss.item():.4f} (mean over ranks), {seconds * 1e3:.0f} ms")

    dist.barrier()
    dist.destroy_process_group()
    _qwen3.let_autograd_threads_finish()


if __name__ == "__main__":
    main()
