"""torch_fl: the `flagos` PyTorch device.

``import torch_fl`` registers the device (PyTorch's PrivateUse1 key, renamed ``flagos``) and the
``torch.flagos`` module. The accelerator behind it is chosen at first use by ``FLAGOS_ACCELERATOR``
(auto, sim or cuda). What that changes in torch beyond the new device:

- ``torch.accelerator`` now answers ``flagos``, also on a CUDA machine, so argument-less
  ``pin_memory()`` and ``init_process_group()`` go to flagos (as they would for any PrivateUse1 plugin);
  ``torch.distributed`` gets the c10d backend ``flagos`` for the device and ``flagos+gloo`` (flagos and
  CPU tensors), the device's default backend (``torch_fl.distributed``).
- On the simulated accelerator, the first use of the flagos device wraps torch's CPU allocator, so that
  host kernels running flagos operators allocate flagos memory. Other CPU allocations go to the original
  allocator unchanged; a process that never uses flagos keeps torch's CPU allocator as it is.
- A CUDA backward pass fails in a process that imported torch_fl when flagos is backed by CUDA
  (pytorch/pytorch#161129, docs/design.md); flagos training is unaffected.
- ``torch.flagos`` has the legacy typed storage classes (``torch.flagos.FloatStorage``, ...) that
  ``Tensor.storage_type()`` returns, entered in ``torch._storage_classes`` as torch.cuda enters its own.
- multiprocessing's ``ForkingPickler`` gets a reducer for ``torch.UntypedStorage`` that sends flagos
  storages (shared through CUDA IPC when backed by CUDA, copied on the simulated accelerator) and hands
  every other storage to torch's reducer (torch_fl/_multiprocessing.py).
- The first ``torch.compile`` registers flagos with Dynamo and Inductor (torch_fl/_compile); backed by
  CUDA, flagos is then Inductor's one GPU type in the process (docs/compile.md).
"""

from __future__ import annotations

from importlib import metadata as _metadata

import torch

_BACKEND_NAME = "flagos"


def _claim_privateuse1() -> None:
    current = torch._C._get_privateuse1_backend_name()
    if current == _BACKEND_NAME:
        return
    if current != "privateuseone":
        raise RuntimeError(
            f"torch_fl cannot register the 'flagos' device: PyTorch's PrivateUse1 backend is already "
            f"claimed by '{current}' in this process, and torch allows only one. Import torch_fl in a "
            f"process that does not load the '{current}' plugin."
        )
    torch.utils.rename_privateuse1_backend(_BACKEND_NAME)


_claim_privateuse1()

# Loading _C registers the runtime (hooks, guard, allocators) and the operators for PrivateUse1.
from torch_fl import _C, flagos  # noqa: E402

# The version is written once, in pyproject.toml: the installed distribution's metadata has it (importlib
# .metadata is already loaded by torch; the look-up costs under a millisecond). A source tree on sys.path
# without installed metadata falls back to the version the extension was built with (scikit-build-core
# passes the same pyproject.toml version to CMake).
try:
    __version__ = _metadata.version("torch_fl")
except _metadata.PackageNotFoundError:
    __version__ = str(_C._build_info()["version"])

torch._register_device_module(_BACKEND_NAME, flagos)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

# torch.compile: registered lazily, with Dynamo when it is imported and with Inductor when it first asks
# torch.flagos for its classes; at once only if torch's compiler is loaded already (torch_fl/_compile).
from torch_fl import _compile  # noqa: E402

_compile.register_if_loaded()

# routing validates FLAGOS_BACKEND_CONFIG and FLAGOS_OP_* now (a typo fails here, naming the file or
# variable); distributed registers the flagos c10d backend (torch.distributed is loaded by `import torch`
# already: this costs a few dictionary entries); _multiprocessing's reducer lets torch.multiprocessing
# queues, pipes and DataLoader workers send flagos tensors.
from torch_fl import _multiprocessing, distributed, routing  # noqa: E402

_multiprocessing.register()


def build_info() -> dict:
    """What this build of torch_fl contains: version, the torch it was built against, HALs built."""
    return dict(_C._build_info())


def accelerator() -> str | None:
    """Name of the accelerator behind flagos ('sim', 'cuda'), or None when none is usable."""
    return _C._accelerator_name()


def as_cuda(tensor: torch.Tensor) -> torch.Tensor:
    """A cuda tensor sharing memory with flagos tensor `tensor` (same shape, strides and dtype; no copy).
    The view keeps the memory alive. Needs flagos backed by torch's CUDA (the cuda accelerator)."""
    return _C._alias_as_native(tensor)


def from_cuda(tensor: torch.Tensor) -> torch.Tensor:
    """A flagos tensor sharing memory with cuda tensor `tensor` (no copy); the reverse of `as_cuda`."""
    return _C._adopt_native(tensor)


def to_dlpack(tensor: torch.Tensor):
    """A DLPack capsule of flagos tensor `tensor` (described as CUDA memory, which it is), no copy."""
    return torch.utils.dlpack.to_dlpack(as_cuda(tensor))


def from_dlpack(external) -> torch.Tensor:
    """A flagos tensor over CUDA memory given as a DLPack capsule or an object with ``__dlpack__``."""
    tensor = torch.from_dlpack(external)
    if tensor.device.type != "cuda":
        raise ValueError(f"torch_fl.from_dlpack expects CUDA memory, got memory on {tensor.device}")
    return from_cuda(tensor)


def is_flaggems_available() -> bool:
    """Whether FlagGems can serve as the ``flaggems`` backend in this process (flagos on the cuda accelerator,
    flag_gems installed and importable, ``FLAGOS_DISABLE_FLAGGEMS`` unset). The first call loads FlagGems
    (imports flag_gems and Triton: seconds); ``torch_fl._flaggems.status().reason`` says why not."""
    from torch_fl import _flaggems

    return _flaggems.load().available


def is_flaggems_enabled() -> bool:
    """Whether FlagGems runs any op now: it is available and at least one op's effective route (config,
    ``FLAGOS_OP_*``, API or override; see :func:`torch_fl.routing.table`) is ``flaggems``. Loads FlagGems
    like :func:`is_flaggems_available`."""
    if not is_flaggems_available():
        return False
    return any(row["backend"] == "flaggems" for row in routing.table().values())


def get_registered_ops() -> list[str]:
    """The ops FlagGems implements for the ``flaggems`` backend, as canonical names (``aten::mm.out``,
    ``aten::add.Tensor``), sorted: FlagGems' own table plus the ``out`` overloads served by adapting its
    functional ops (see docs/flaggems.md). Empty when FlagGems is unavailable. Loads FlagGems like
    :func:`is_flaggems_available`."""
    from torch_fl import _flaggems

    return list(_flaggems.load().ops)


__all__ = [
    "flagos",
    "routing",
    "distributed",
    "build_info",
    "accelerator",
    "as_cuda",
    "from_cuda",
    "to_dlpack",
    "from_dlpack",
    "is_flaggems_available",
    "is_flaggems_enabled",
    "get_registered_ops",
    "__version__",
]
