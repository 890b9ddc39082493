"""What every scenario in this folder shares: this rank's facts (from the launcher's environment), process
group set-up on the flagos device, and small assertion helpers."""

from __future__ import annotations

import datetime
import os
import warnings

import torch
import torch.distributed as dist

import torch_fl  # noqa: F401  (registers the flagos device and its c10d backend)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
DEVICE = torch.device("flagos", LOCAL_RANK)

# The tests use the collectives' names that torch 2.11 and 2.13 both have; 2.13 calls some deprecated.
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
warnings.filterwarnings("ignore", category=FutureWarning, message=".*is deprecated.*")


def init(
    backend: str | None = None, *, tag: str = "main", device_id: bool = False, timeout_s: float = 60
) -> None:
    """A process group over a FileStore of the launch's folder (`tag` names it, one per group made)."""
    torch.flagos.set_device(LOCAL_RANK)
    kwargs = dict(
        init_method="file://" + os.path.join(os.environ["FLAGOS_TEST_STORE"], f"store-{tag}"),
        rank=RANK,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    if backend is not None:
        kwargs["backend"] = backend
    if device_id:
        kwargs["device_id"] = DEVICE
    dist.init_process_group(**kwargs)


def flagos_backend(group=None):
    """The process group's backend for flagos tensors (a torch_fl._C._FlagosBackend)."""
    return (group or dist.group.WORLD)._get_backend(torch.device("flagos"))


def expect_error(error_type, function, *fragments: str) -> str:
    """Runs `function`, which must raise `error_type` with every one of `fragments` in its message."""
    try:
        function()
    except error_type as e:
        message = str(e)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} is not in the error message:\n{message}"
        return message
    raise AssertionError(f"expected {error_type.__name__} containing {fragments}, nothing was raised")
