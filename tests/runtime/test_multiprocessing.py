"""flagos tensors between processes: torch.multiprocessing queues (spawn), both sharing strategies, and
DataLoader workers with flagos as the pin and target device (torch_fl/_multiprocessing.py).

Each test starts its processes with the spawn context, waits for them with a timeout and terminates any
left in `finally`, so a lost message fails the test instead of hanging it. The worker functions are at module
level: spawn imports this module in the child to find them.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, TensorDataset

import torch_fl

DEVICE = "flagos"
TIMEOUT_S = 60


@contextlib.contextmanager
def spawned(target, *args):
    """A spawn-context process running target(*args), stopped however the block ends."""
    process = mp.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    try:
        yield process
        process.join(TIMEOUT_S)
        assert process.exitcode == 0, f"the child exited with {process.exitcode}"
    finally:
        if process.is_alive():
            process.kill()
            process.join(TIMEOUT_S)


def describe(t: torch.Tensor) -> dict:
    """What the receiver saw, as plain Python values (a CPU tensor sent back would live in the child's
    shared memory, which the parent can no longer open once the child has exited)."""
    return {
        "device": str(t.device),
        "type": type(t).__name__,
        "dtype": t.dtype,
        "requires_grad": t.requires_grad,
        "geometry": (tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()),
        "values": t.detach().cpu().tolist(),
    }


def describe_received(inbox, outbox, count):
    for _ in range(count):
        outbox.put(describe(inbox.get(timeout=TIMEOUT_S)))


def test_tensors_arrive_on_flagos_with_their_values(two_devices_only):
    base = torch.arange(24.0, device=f"{DEVICE}:1").reshape(4, 6)
    sent = [
        base,
        base[1:, ::2],  # a view: its geometry over the whole storage travels
        torch.nn.Parameter(torch.randn(3, 2, device=DEVICE)),
        torch.randn(5, device=DEVICE).to(torch.bfloat16),
        torch.arange(7, device=DEVICE) > 3,
        torch.empty(0, 3, device=DEVICE),
    ]
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    with spawned(describe_received, inbox, outbox, len(sent)):
        for t in sent:
            inbox.put(t)
        received = [outbox.get(timeout=TIMEOUT_S) for _ in sent]
    for t, seen in zip(sent, received, strict=True):
        assert seen["device"] == str(t.device)
        assert seen["type"] == type(t).__name__ and seen["requires_grad"] == t.requires_grad
        assert seen["dtype"] == t.dtype
        assert seen["geometry"] == (
            tuple(t.shape),
            t.stride(),
            t.storage_offset(),
            t.untyped_storage().nbytes(),
        )
        assert seen["values"] == t.detach().cpu().tolist()


def describe_typed_storage(inbox, outbox):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        storage = inbox.get(timeout=TIMEOUT_S)
        outbox.put((str(storage.device), storage.dtype, storage.tolist(), type(storage).__name__))


def test_typed_storage_arrives_on_flagos():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = torch.arange(5, dtype=torch.int32, device=DEVICE).storage()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    with spawned(describe_typed_storage, inbox, outbox):
        inbox.put(storage)
        assert outbox.get(timeout=TIMEOUT_S) == (
            str(storage.device),
            torch.int32,
            [0, 1, 2, 3, 4],
            "TypedStorage",
        )


@pytest.fixture(params=["file_descriptor", "file_system"])
def sharing_strategy(request):
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy(request.param)
    yield request.param
    mp.set_sharing_strategy(previous)


def write_received(inbox, outbox):
    received = inbox.get(timeout=TIMEOUT_S)
    received.add_(100)
    torch.accelerator.synchronize()
    outbox.put(received.cpu().tolist())
    outbox.put(inbox.get(timeout=TIMEOUT_S).cpu().tolist())  # the tensor sent again after the sender wrote it


def test_simulated_accelerator_sends_a_copy(sharing_strategy):
    """On the simulated accelerator the receiver gets a copy taken at send time: neither process sees the
    other's later writes (docs/ecosystem.md)."""
    if torch_fl._C._backing_type() is not None:
        pytest.skip("backed by CUDA, flagos tensors are shared (test_backed_tensors_share_memory)")
    x = torch.arange(4.0, device=DEVICE)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    with spawned(write_received, inbox, outbox):
        inbox.put(x)
        assert outbox.get(timeout=TIMEOUT_S) == [100.0, 101.0, 102.0, 103.0]
        assert torch.equal(x.cpu(), torch.arange(4.0))  # the receiver's write stayed there
        x.add_(10)
        inbox.put(x)
        assert outbox.get(timeout=TIMEOUT_S) == [10.0, 11.0, 12.0, 13.0]


def write_then_report(inbox, outbox):
    received = inbox.get(timeout=TIMEOUT_S)
    received.add_(100)
    torch.accelerator.synchronize()
    outbox.put("written")
    inbox.get(timeout=TIMEOUT_S)  # keeps the received tensor alive until the sender has looked


@pytest.mark.gpu
@pytest.mark.usefixtures("backed_by_cuda")
def test_backed_tensors_share_memory():
    """Backed by CUDA, a flagos tensor travels as CUDA IPC memory: the receiver's writes are the sender's."""
    x = torch.arange(4.0, device=DEVICE)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    with spawned(write_then_report, inbox, outbox):
        inbox.put(x[1:])
        assert outbox.get(timeout=TIMEOUT_S) == "written"
        assert torch.equal(x.cpu(), torch.tensor([0.0, 101.0, 102.0, 103.0]))
        inbox.put("done")


def write_shared_host(inbox, outbox):
    inbox.get(timeout=TIMEOUT_S).fill_(7)
    outbox.put("written")


def test_cpu_tensors_are_still_shared():
    """The reducer for torch.UntypedStorage hands CPU storages to torch's: they stay in shared memory."""
    host = torch.zeros(3)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    with spawned(write_shared_host, inbox, outbox):
        inbox.put(host)
        assert outbox.get(timeout=TIMEOUT_S) == "written"
    assert torch.equal(host, torch.full((3,), 7.0))


# --- DataLoader workers -----------------------------------------------------------------------------------


def test_dataloader_workers_pin_for_flagos():
    data, labels = torch.randn(20, 3), torch.arange(20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 deprecates pin_memory_device (the accelerator is used)
        loader = DataLoader(
            TensorDataset(data, labels),
            batch_size=4,
            num_workers=2,
            pin_memory=True,
            pin_memory_device=DEVICE,
            multiprocessing_context="spawn",
            timeout=TIMEOUT_S,
        )
        batches = list(loader)
    assert all(x.is_pinned() and y.is_pinned() for x, y in batches)
    on_device = [x.to(DEVICE, non_blocking=True) for x, _ in batches]
    torch.accelerator.synchronize()
    assert torch.equal(torch.cat(on_device).cpu(), data)
    assert torch.equal(torch.cat([y for _, y in batches]), labels)


class FlagosSquares(Dataset):
    """Items made on flagos in the worker process."""

    def __len__(self):
        return 12

    def __getitem__(self, index):
        return torch.tensor([float(index)], device=DEVICE) ** 2


def test_dataloader_workers_make_flagos_tensors():
    loader = DataLoader(
        FlagosSquares(), batch_size=3, num_workers=2, multiprocessing_context="spawn", timeout=TIMEOUT_S
    )
    devices, values = [], []
    for batch in loader:  # read while the workers live (backed by CUDA, their memory is the batches')
        devices.append(batch.device.type)
        values.append(batch.cpu())
    assert devices == [DEVICE] * 4
    assert torch.equal(torch.cat(values).flatten(), torch.arange(12.0) ** 2)
