"""Training with stock DDP and FSDP2 on flagos, each compared with a reference trained in the same process:
- DDP (an MLP and Qwen3 tiny, with and without find_unused_parameters, static_graph, no_sync,
  gradient_as_bucket_view, fp16/bf16 compression hooks) against single-process training on the
  concatenated batch;
- FSDP2 (fully_shard, with and without mixed precision) against DDP;
- a distributed checkpoint (torch.distributed.checkpoint) written by FSDP2 ranks and loaded by any number of
  ranks.
Run by test_training.py."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ranks import DEVICE, RANK, WORLD, init
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import harness.qwen3

STEPS = 3
F32 = harness.qwen3.TOLERANCES[torch.float32]


class MLP(nn.Module):
    def __init__(self, unused_branch: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)
        # Parameters the forward never uses: DDP must be told (find_unused_parameters).
        self.unused = nn.Linear(4, 4) if unused_branch else None

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def mlp(unused_branch: bool = False) -> MLP:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return MLP(unused_branch)


def full_batch(seed: int, rows_per_rank: int, world: int = WORLD):
    """The batch of all ranks (the same on every rank); this rank trains on rows_of() it."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(world * rows_per_rank, 8, generator=g), torch.randn(
        world * rows_per_rank, 4, generator=g
    )


def rows_of(t: torch.Tensor) -> torch.Tensor:
    return t.chunk(WORLD)[RANK]


def mse(model, x, y):
    return nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE))


def params_cpu(model) -> dict[str, torch.Tensor]:
    """Full parameters on the CPU (DTensors of FSDP2 gathered; DDP's `module.` prefix dropped)."""
    out = {}
    for name, p in model.named_parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = p.detach().float().cpu()
    return out


def assert_params_close(actual: dict, expected: dict, what: str, *, rtol=1e-5, atol=1e-6) -> None:
    assert actual.keys() == expected.keys(), what
    for name in expected:
        torch.testing.assert_close(
            actual[name], expected[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{what}: {n}: {m}"
        )


def relative_update_error(actual: dict, expected: dict, start: dict) -> float:
    """||actual update - expected update|| / ||expected update|| over all weights (Adam turns tiny
    gradient differences into full steps, so weights are compared as a whole: harness.qwen3.Tolerance)."""
    num = sum(float((actual[k] - expected[k]).norm() ** 2) for k in expected)
    den = sum(float((expected[k] - start[k]).norm() ** 2) for k in expected)
    return (num / den) ** 0.5


# ---- DDP -----------------------------------------------------------------------------------------------


def train_mlp_reference(model, micro_batches: int = 1, seed: int = 1):
    """SGD on the concatenated batch of all ranks, in this process."""
    model = copy.deepcopy(model).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = full_batch(seed + step, 4 * micro_batches)
        # Every micro-batch of every rank contributes its mean loss; DDP averages over ranks.
        loss = sum(
            mse(model, xm, ym) for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True)
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
    return params_cpu(model)


def train_mlp_ddp(model, *, micro_batches: int = 1, seed: int = 1, hook=None, **ddp_kwargs):
    ddp = DDP(copy.deepcopy(model).to(DEVICE), device_ids=[DEVICE.index], bucket_cap_mb=1e-4, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = full_batch(seed + step, 4 * micro_batches)
        # Each rank's rows, interleaved so that micro-batch m of every rank is micro-batch m of the full batch.
        xs = [rows_of(xm) for xm in x.chunk(micro_batches)]
        ys = [rows_of(ym) for ym in y.chunk(micro_batches)]
        for m in range(micro_batches - 1):
            with ddp.no_sync():
                mse(ddp, xs[m], ys[m]).backward()
        mse(ddp, xs[-1], ys[-1]).backward()
        opt.step()
        opt.zero_grad()
    return params_cpu(ddp), ddp


def bf16_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16_compress_hook under another name: DDP refuses that name unless torch itself was built
    with CUDA and NCCL (a check of torch's build, not of the device: torch 2.13 CPU wheels lack both)."""
    return default_hooks.bf16_compress_hook(state, bucket)


# DDP checks the annotations' objects (this module's annotations are strings: `from __future__`).
bf16_hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def ddp_mlp() -> list[str]:
    done = []
    plain, with_unused = mlp(), mlp(unused_branch=True)
    expected = train_mlp_reference(plain)
    expected_unused = train_mlp_reference(with_unused)
    variants = {
        "default": (plain, {}),
        "find_unused_parameters": (with_unused, dict(find_unused_parameters=True)),
        "static_graph": (plain, dict(static_graph=True)),
        "gradient_as_bucket_view": (plain, dict(gradient_as_bucket_view=True)),
    }
    for name, (model, kwargs) in variants.items():
        reference = expected_unused if model is with_unused else expected
        params, ddp = train_mlp_ddp(model, **kwargs)
        assert_params_close(params, reference, f"DDP MLP {name}")
        done.append(name)
    # DDP's logger timed the iterations on flagos (the TimerRegistry entry, csrc/distributed/reducer_timer.cpp).
    timings = ddp._get_ddp_logging_data()
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert timings.get(key, 0) > 0, (key, timings)
    done.append("device_timer")
    assert_params_close(
        train_mlp_ddp(plain, micro_batches=2)[0], train_mlp_reference(plain, 2), "DDP MLP no_sync"
    )
    done.append("no_sync")
    for name, hook, rtol in (
        ("fp16_compress_hook", default_hooks.fp16_compress_hook, 2e-3),
        ("bf16_compress_hook", bf16_hook, 2e-2),
    ):
        assert_params_close(
            train_mlp_ddp(plain, hook=hook)[0], expected, f"DDP MLP {name}", rtol=rtol, atol=rtol
        )
        done.append(name)
    return done


def qwen3_batch(seed: int, world: int = WORLD) -> torch.Tensor:
    vocab = harness.qwen3.SHAPES["tiny"]["vocab_size"]
    return torch.randint(0, vocab, (2 * world, 16), generator=torch.Generator().manual_seed(seed))


def train_qwen3(model, wrap, ids_of_step) -> tuple[dict, list[float]]:
    """STEPS AdamW steps; `wrap(model)` -> the module to run (DDP, FSDP2 or the model itself)."""
    run = wrap(model)
    opt = torch.optim.AdamW(run.parameters(), lr=1e-3, foreach=False)
    losses = []
    for step in range(STEPS):
        ids = ids_of_step(step).to(DEVICE)
        loss = run(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return params_cpu(run), losses


def ddp_qwen3(master) -> tuple[list[str], dict]:
    start = params_cpu(master)
    expected, _ = train_qwen3(harness.qwen3.copy_to(master, DEVICE).train(), lambda m: m, qwen3_batch)
    done = []
    trained = None
    for find_unused in (False, True):
        model = harness.qwen3.copy_to(master, DEVICE).train()
        actual, _ = train_qwen3(
            model,
            lambda m, f=find_unused: DDP(m, device_ids=[DEVICE.index], find_unused_parameters=f),
            lambda step: rows_of(qwen3_batch(step)),
        )
        error = relative_update_error(actual, expected, start)
        assert error < F32.update_rtol, (
            f"DDP Qwen3 (find_unused_parameters={find_unused}): update error {error}"
        )
        done.append(f"qwen3_find_unused_{find_unused}")
        trained = actual
    return done, trained


# ---- FSDP2 -----------------------------------------------------------------------------------------------


def shard_mlp(model, mesh, mp_policy=None):
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def shard_qwen3(model, mesh, mp_policy=None):
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def fsdp_mlp(mesh) -> list[str]:
    ddp_result, _ = train_mlp_ddp(mlp())
    model = shard_mlp(mlp().to(DEVICE), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = full_batch(1 + step, 4)
        mse(model, rows_of(x), rows_of(y)).backward()
        opt.step()
        opt.zero_grad()
    assert_params_close(params_cpu(model), ddp_result, "FSDP2 MLP against DDP")
    # Mixed precision: bf16 parameters, fp32 gradient reduction.
    start = params_cpu(mlp())
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard_mlp(mlp().to(DEVICE), mesh, policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = full_batch(1 + step, 4)
        out = model(rows_of(x).to(DEVICE))
        assert out.dtype == torch.bfloat16
        nn.functional.mse_loss(out.float(), rows_of(y).to(DEVICE)).backward()
        opt.step()
        opt.zero_grad()
    actual = params_cpu(model)
    assert all(p.to_local().dtype == torch.float32 for p in model.parameters())
    error = relative_update_error(actual, ddp_result, start)
    assert error < 0.05, f"FSDP2 MLP in bf16 mixed precision against fp32 DDP: update error {error}"
    return ["fsdp2_mlp", "fsdp2_mlp_mixed_precision"]


def checkpoint_writer(path: str) -> FileSystemWriter:
    """torch.distributed.checkpoint's writer for flagos tensors. With one writer thread its staging loader
    moves tensors of torch._utils._get_available_device_type() to the CPU, which is "cuda" wherever CUDA
    exists: backed by CUDA, flagos tensors would reach the file writer unmoved ("Tensor must be on CPU",
    torch 2.11 and 2.13). With two threads each tensor is copied with .cpu() (docs/distributed.md)."""
    return FileSystemWriter(path, thread_count=2)


def fsdp_qwen3(master, mesh, ddp_trained, checkpoint: str | None) -> list[str]:
    start = params_cpu(master)
    model = shard_qwen3(harness.qwen3.copy_to(master, DEVICE).train(), mesh)
    run = model
    opt = torch.optim.AdamW(run.parameters(), lr=1e-3, foreach=False)
    for step in range(STEPS):
        ids = rows_of(qwen3_batch(step)).to(DEVICE)
        run(ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    actual = params_cpu(model)
    error = relative_update_error(actual, ddp_trained, start)
    assert error < F32.update_rtol, f"FSDP2 Qwen3 against DDP: update error {error}"
    done = ["fsdp2_qwen3"]
    if checkpoint:
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=os.path.join(checkpoint, "dcp"),
            storage_writer=checkpoint_writer(os.path.join(checkpoint, "dcp")),
        )
        full_model, full_optim = get_state_dict(
            model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if RANK == 0:
            torch.save({"model": full_model, "optim": full_optim}, os.path.join(checkpoint, "reference.pt"))
        dist.barrier()
        done.append("dcp_save")
    return done


# ---- Entry points (one process group each) ------------------------------------------------------------------


def run_ddp(qwen3: bool = True) -> dict:
    init(device_id=True)
    result = {"mlp": ddp_mlp()}
    if qwen3:
        result["qwen3"], _ = ddp_qwen3(harness.qwen3.build_model("tiny", seed=0))
    dist.destroy_process_group()
    return result


def run_fsdp(checkpoint: str | None = None) -> dict:
    init(device_id=True)
    mesh = init_device_mesh("flagos", (WORLD,))
    master = harness.qwen3.build_model("tiny", seed=0)
    result = {"mlp": fsdp_mlp(mesh)}
    qwen3_ddp, ddp_trained = ddp_qwen3(master)
    result["qwen3"] = qwen3_ddp + fsdp_qwen3(master, mesh, ddp_trained, checkpoint)
    dist.destroy_process_group()
    return result


def run_load(checkpoint: str) -> dict:
    """Loads the checkpoint run_fsdp wrote (on any number of ranks) into a differently initialised model
    sharded over this group, and compares the full model and optimizer state with the reference."""
    init(device_id=True)
    mesh = init_device_mesh("flagos", (WORLD,))
    model = shard_qwen3(
        harness.qwen3.copy_to(harness.qwen3.build_model("tiny", seed=1), DEVICE).train(), mesh
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(checkpoint, "dcp"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_model, full_optim = get_state_dict(
        model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if RANK == 0:
        reference = torch.load(os.path.join(checkpoint, "reference.pt"), weights_only=False)
        assert full_model.keys() == reference["model"].keys()
        for name, value in reference["model"].items():
            assert torch.equal(full_model[name].cpu(), value), name
        for name, state_of in reference["optim"]["state"].items():
            for key, value in state_of.items():
                assert torch.equal(
                    torch.as_tensor(full_optim["state"][name][key]).cpu(), torch.as_tensor(value)
                ), (name, key)
    # The loaded model trains on (one step: the shards are live flagos tensors).
    ids = rows_of(qwen3_batch(0)).to(DEVICE)
    model(ids, labels=ids).loss.backward()
    opt.step()
    dist.destroy_process_group()
    return {"loaded_by": WORLD, "parameters": len(full_model)}
