"""flagos tensors and storages between processes: ``torch.multiprocessing`` queues and pipes, DataLoader
workers, anything pickled by multiprocessing's ``ForkingPickler``.

torch registers a reducer per class with ``ForkingPickler.register`` (torch/multiprocessing/reductions.py):
a tensor of any device but cuda and meta reduces to its typed storage and its geometry, a typed storage
to its untyped storage, and an untyped storage to a shared-memory file (``_share_fd_cpu_``), which only a
CPU storage has; cuda tensors travel as CUDA IPC handles instead. flagos storages are
``torch.UntypedStorage`` objects like CPU ones, so ``register()`` enters one reducer for that class, through
the same hook: it sends flagos storages and hands every other storage to torch's own reducer. Tensors,
views (their geometry over the whole storage), parameters and typed storages then travel as torch sends
them.

How a flagos storage travels depends on the accelerator behind flagos:

- **backed by CUDA**: as CUDA IPC memory, shared. flagos memory is memory of torch's CUDA caching
  allocator; the storage's cuda alias (a byte tensor over the whole storage, ``torch_fl.as_cuda``) is
  reduced by torch's own CUDA tensor reducer (``cudaIpcGetMemHandle`` through ``_share_cuda_``, the
  sender-side reference counting that keeps the memory alive while a receiver holds it, and the event that
  orders the receiver after the sender's queued writes), and the receiver adopts the cuda tensor it
  rebuilds as a flagos storage on the same device (``torch_fl.from_cuda``). Both processes see the same
  memory, as with cuda tensors, with the same rules (the sender keeps the tensor alive while receivers use
  it; receivers see the sender's later writes without ordering: synchronize as with cuda).
- **simulated**: device memory is host memory of the sending process, which another process cannot map.
  The storage's bytes are copied into a CPU shared-memory storage (torch's CPU path then sends it), and the
  receiver copies them into a new flagos storage on the same device index. The receiver gets a copy taken
  at send time: writes in either process after that are not seen by the other.

A storage that cannot be sent raises in the pickler with the reason. ``Queue.put`` pickles in the queue's
feeder thread, where multiprocessing prints the error and drops the item (for every device, cuda
included): send through a ``Pipe`` or pickle with ``ForkingPickler.dumps`` first to see the error in the
sending thread.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import torch
from torch.multiprocessing import reductions as _torch_reductions

from torch_fl import _C

_DEVICE_TYPE = "flagos"


def _bytes_over(storage: torch.UntypedStorage) -> torch.Tensor:
    """A 1-D uint8 tensor over the whole of `storage` (on its device)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _rebuild_empty(index: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device(_DEVICE_TYPE, index))


def _rebuild_from_host(host: torch.UntypedStorage, index: int) -> torch.UntypedStorage:
    device_bytes = torch.empty(host.nbytes(), dtype=torch.uint8, device=torch.device(_DEVICE_TYPE, index))
    device_bytes.copy_(_bytes_over(host))
    return device_bytes.untyped_storage()


def _rebuild_from_cuda(rebuild_cuda_tensor, args) -> torch.UntypedStorage:
    return _C._adopt_native(rebuild_cuda_tensor(*args)).untyped_storage()


def _reduce_through_host(storage: torch.UntypedStorage):
    shared = torch.UntypedStorage._new_shared(storage.nbytes())
    _bytes_over(shared).copy_(_bytes_over(storage))
    return _rebuild_from_host, (shared, storage.device.index)


def _reduce_through_cuda_ipc(storage: torch.UntypedStorage):
    alias = _C._alias_as_native(_bytes_over(storage))
    try:
        rebuild_cuda_tensor, args = _torch_reductions.reduce_tensor(alias)
    except RuntimeError as error:
        raise RuntimeError(
            f"cannot send a flagos storage on {storage.device} to another process: its memory cannot be "
            f"shared through CUDA IPC ({error}). Only memory the flagos allocator handed out can be "
            f"shared; send a copy (tensor.clone()) instead"
        ) from error
    return _rebuild_from_cuda, (rebuild_cuda_tensor, args)


def reduce_storage(storage: torch.UntypedStorage):
    """ForkingPickler's reducer for ``torch.UntypedStorage``: flagos storages as the module docstring says,
    any other storage by torch's reducer."""
    if storage.device.type != _DEVICE_TYPE:
        return _torch_reductions.reduce_storage(storage)
    if storage.nbytes() == 0:
        return _rebuild_empty, (storage.device.index,)
    if _C._backing_type() == "cuda":
        return _reduce_through_cuda_ipc(storage)
    return _reduce_through_host(storage)


def register() -> None:
    """Enters :func:`reduce_storage` for ``torch.UntypedStorage`` with ForkingPickler. torch enters its own
    reducers when ``import torch`` imports torch.multiprocessing, before torch_fl can be imported, so this
    one is the one in force."""
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
