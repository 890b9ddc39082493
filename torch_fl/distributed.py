"""flagos in ``torch.distributed``: the ``flagos`` c10d backend (docs/distributed.md).

``import torch_fl`` registers two backends with ``torch.distributed.Backend.register_backend``:

- ``flagos``: flagos tensors only, for the device type ``flagos``; the name to use in a
  ``"device:backend"`` string.
- ``flagos+gloo``: a process group that serves flagos tensors through ``flagos`` and CPU tensors
  through gloo. It is the default backend of the device type ``flagos``
  (``Backend.default_device_backend_map``), so what asks torch for flagos's default backend gets it.

So these all make a group that DDP, FSDP2, DTensor and functional collectives run on::

    dist.init_process_group()                                  # flagos+gloo: flagos and CPU tensors
    dist.init_process_group(device_id=torch.device("flagos", local_rank))   # flagos+gloo
    dist.init_process_group("flagos")                          # flagos tensors only
    dist.init_process_group("cpu:gloo,flagos:flagos")          # as flagos+gloo, named per device

The backend itself is C++ (``csrc/distributed/``): it wraps an inner backend of flagos's native device,
made here: NCCL when flagos is backed by CUDA, gloo over the flagos memory on a HAL of its own (the
simulated accelerator, whose memory is host memory). ``FLAGOS_DIST_CHECK=1`` (the default with gloo) makes
every collective first compare its op, shapes and dtypes across ranks, so a mismatch is a clear error on
every rank; ``0`` (the default with NCCL, where the comparison costs a device sync) skips it. Rank 0's
setting holds for its group.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_fl import _C

BACKEND_NAME = "flagos"
# The device type's default: a group with flagos's backend for flagos tensors and gloo for CPU tensors.
DEFAULT_BACKEND_NAME = "flagos+gloo"
CHECK_ENV = "FLAGOS_DIST_CHECK"


def is_available() -> bool:
    """Whether this torch has torch.distributed and this build of torch_fl has the flagos backend."""
    return dist.is_available() and hasattr(_C, "_FlagosBackend")


def _check_across_ranks(default: bool, store, rank: int) -> bool:
    """FLAGOS_DIST_CHECK as rank 0 of the group reads it: every rank must take part in the comparison or
    none (a rank comparing alone would wait for the others), so rank 0's setting holds for the group."""
    value = os.environ.get(CHECK_ENV) or ""
    if value not in ("", "0", "1"):
        raise ValueError(f"{CHECK_ENV} must be 0 or 1, got {value!r}")
    mine = value == "1" if value else default
    key = "flagos_dist_check"
    if rank == 0:
        store.set(key, "1" if mine else "0")
        return mine
    agreed = store.get(key).decode() == "1"
    if value and agreed != mine:
        warnings.warn(
            f"{CHECK_ENV}={value} on rank {rank}, but rank 0 {'compares' if agreed else 'does not compare'} "
            "collectives across ranks: the group follows rank 0",
            stacklevel=3,
        )
    return agreed


@dataclasses.dataclass(frozen=True)
class _Group:
    """What torch hands a backend creator (``_DistributedBackendOptions``), with the store to use."""

    store: dist.Store
    rank: int
    size: int
    timeout: timedelta
    name: str
    global_ranks: list[int]

    @classmethod
    def of(cls, options) -> _Group:
        timeout = options.timeout
        if not isinstance(timeout, timedelta):
            timeout = timedelta(seconds=float(timeout))
        return cls(
            options.store,
            options.group_rank,
            options.group_size,
            timeout,
            options.group_id,
            list(options.global_ranks_in_group),
        )

    def under(self, prefix: str) -> _Group:
        """The same group with its own keys in the store (for a second backend of one group)."""
        return dataclasses.replace(self, store=dist.PrefixStore(prefix, self.store))


def _gloo(group: _Group) -> dist.ProcessGroupGloo:
    """A gloo backend as torch makes it for a group of its own."""
    backend = dist.ProcessGroupGloo(group.store, group.rank, group.size, group.timeout)
    if hasattr(backend, "options"):  # what torch records for its own gloo groups (not every torch has it)
        backend.options.global_ranks_in_group = group.global_ranks
        backend.options.group_name = group.name
    backend._set_sequence_number_for_group()
    return backend


def _gloo_inner(group: _Group, backend_options):
    """gloo over host memory: the native device of a HAL's flagos memory is the CPU."""
    # gloo lacks AVG and PREMUL_SUM; comparing a collective across ranks is one small host all-gather.
    return _gloo(group), False, True


def _nccl_inner(group: _Group, backend_options):
    """NCCL on the CUDA memory flagos tensors live in when flagos is backed by CUDA."""
    if not dist.is_nccl_available():
        raise RuntimeError(
            "flagos is backed by CUDA, and its distributed backend runs on NCCL, but this torch was built "
            "without NCCL"
        )
    nccl_options = backend_options
    if not isinstance(nccl_options, dist.ProcessGroupNCCL.Options):
        if backend_options is not None:
            raise TypeError(
                "pg_options for the flagos backend backed by CUDA must be torch.distributed.ProcessGroupNCCL"
                f".Options, got {type(backend_options).__name__}"
            )
        nccl_options = dist.ProcessGroupNCCL.Options()
        nccl_options.is_high_priority_stream = False
    nccl_options._timeout = group.timeout
    nccl_options.global_ranks_in_group = group.global_ranks
    nccl_options.group_name = group.name
    inner = dist.ProcessGroupNCCL(group.store, group.rank, group.size, nccl_options)
    inner._set_sequence_number_for_group()
    # NCCL reduces AVG and PREMUL_SUM itself; comparing every collective across ranks would cost a sync.
    return inner, True, False


# The inner backend for flagos's native device (the device type whose kernels run on flagos memory).
_INNER_BACKENDS = {"cpu": _gloo_inner, "cuda": _nccl_inner}


def _flagos_backend(group: _Group, backend_options):
    """The flagos backend over the native device's backend."""
    native = _C._backing_type() or "cpu"
    make_inner = _INNER_BACKENDS.get(native)
    if make_inner is None:
        raise RuntimeError(
            f"the flagos distributed backend has no inner backend for native device '{native}'"
        )
    inner, native_avg_and_premul, check_default = make_inner(group, backend_options)
    return _C._FlagosBackend(
        inner,
        group.rank,
        group.size,
        native_avg_and_premul=native_avg_and_premul,
        check_across_ranks=_check_across_ranks(check_default, group.store, group.rank),
    )


def _create_backend(options, backend_options):
    """torch.distributed's creator of ``flagos`` (extended API): the backend for flagos tensors."""
    return _flagos_backend(_Group.of(options), backend_options)


def _create_default_group(options, backend_options):
    """torch.distributed's creator of ``flagos+gloo`` (extended API): a whole ProcessGroup, which torch
    adopts as the group it is making, with gloo for CPU tensors and the flagos backend for flagos tensors.

    A creator's backend serves only the device types torch names for it, and a group made without a
    backend name is one of the accelerator's type whose default backend type is gloo: DDP and
    ``destroy_process_group`` then look for a gloo backend the group would not have. This group has one,
    which also serves the CPU tensors of object collectives and barriers, as ``cpu:gloo,flagos:flagos``
    does."""
    group = _Group.of(options)
    process_group = dist.ProcessGroup(group.store, group.rank, group.size)
    backend_type = dist.ProcessGroup.BackendType
    process_group._register_backend(torch.device("cpu"), backend_type.GLOO, _gloo(group.under("cpu/")))
    process_group._register_backend(
        torch.device(BACKEND_NAME),
        backend_type.CUSTOM,
        _flagos_backend(group.under("flagos/"), backend_options),
    )
    process_group._set_default_backend(backend_type.GLOO)
    return process_group


def _register() -> None:
    if not is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME])
    dist.Backend.register_backend(
        DEFAULT_BACKEND_NAME, _create_default_group, extended_api=True, devices=["cpu", BACKEND_NAME]
    )
    # What init_process_group() and init_process_group(device_id=flagos device) use, and what
    # torch.distributed.get_default_backend_for_device("flagos") answers (the map torch keeps for
    # third-party devices' defaults; register_backend sets it only for a device type without one).
    dist.Backend.default_device_backend_map[BACKEND_NAME] = DEFAULT_BACKEND_NAME


_register()

__all__ = ["BACKEND_NAME", "CHECK_ENV", "DEFAULT_BACKEND_NAME", "is_available"]
