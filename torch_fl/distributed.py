"""flagos in ``torch.distributed``: the ``flagos`` c10d backend (docs/distributed.md).

``import torch_fl`` registers it with ``torch.distributed.Backend.register_backend`` for the device type
``flagos``, so these all create it::

    dist.init_process_group()                                  # the accelerator (flagos) picks its backend
    dist.init_process_group(device_id=torch.device("flagos", local_rank))
    dist.init_process_group("flagos")                          # flagos tensors only
    dist.init_process_group("cpu:gloo,flagos:flagos")          # CPU tensors too

Stock DDP (its C++ Reducer), FSDP2, DTensor and functional collectives then run on flagos tensors unchanged.

The backend itself is C++ (``csrc/distributed/``): it wraps an inner backend of flagos's native device,
made here: NCCL when flagos is backed by CUDA, gloo over the flagos memory on a HAL of its own (the
simulated accelerator, whose memory is host memory). ``FLAGOS_DIST_CHECK=1`` (the default with gloo) makes
every collective first compare its op, shapes and dtypes across ranks, so a mismatch is a clear error on
every rank; ``0`` (the default with NCCL, where the comparison costs a device sync) skips it. Rank 0's
setting holds for its group.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import torch.distributed as dist

from torch_fl import _C

BACKEND_NAME = "flagos"
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


def _gloo(options, timeout, backend_options):
    """gloo over host memory: the native device of a HAL's flagos memory is the CPU."""
    inner = dist.ProcessGroupGloo(options.store, options.group_rank, options.group_size, timeout)
    if hasattr(inner, "options"):  # what torch records for its own gloo groups (not every torch has it)
        inner.options.global_ranks_in_group = list(options.global_ranks_in_group)
        inner.options.group_name = options.group_id
    # gloo lacks AVG and PREMUL_SUM; comparing a collective across ranks is one small host all-gather.
    return inner, False, True


def _nccl(options, timeout, backend_options):
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
    nccl_options._timeout = timeout
    nccl_options.global_ranks_in_group = list(options.global_ranks_in_group)
    nccl_options.group_name = options.group_id
    inner = dist.ProcessGroupNCCL(options.store, options.group_rank, options.group_size, nccl_options)
    # NCCL reduces AVG and PREMUL_SUM itself; comparing every collective across ranks would cost a sync.
    return inner, True, False


# The inner backend for flagos's native device (the device type whose kernels run on flagos memory).
_INNER_BACKENDS = {"cpu": _gloo, "cuda": _nccl}


def _create_backend(options, backend_options):
    """torch.distributed's creator (extended API): a flagos backend over the native device's backend."""
    native = _C._backing_type() or "cpu"
    make_inner = _INNER_BACKENDS.get(native)
    if make_inner is None:
        raise RuntimeError(
            f"the flagos distributed backend has no inner backend for native device '{native}'"
        )
    timeout = options.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    inner, native_avg_and_premul, check_default = make_inner(options, timeout, backend_options)
    inner._set_sequence_number_for_group()
    return _C._FlagosBackend(
        inner,
        options.group_rank,
        options.group_size,
        native_avg_and_premul=native_avg_and_premul,
        check_across_ranks=_check_across_ranks(check_default, options.store, options.group_rank),
    )


def _register() -> None:
    if not is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME])


_register()

__all__ = ["BACKEND_NAME", "CHECK_ENV", "is_available"]
