"""A rank that fails while the others communicate: the others must fail with torch's distributed error
type, naming the flagos backend, the op and their rank, within the group's timeout, never hang.
Run by test_failures.py; the last rank is the one that fails."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from ranks import DEVICE, RANK, WORLD, init


def run(mode: str, timeout_s: float) -> dict:
    init(device_id=True, timeout_s=timeout_s)
    t = torch.ones(4, device=DEVICE)
    dist.all_reduce(t)  # every rank is there
    if RANK == WORLD - 1:
        if mode == "raise":
            raise RuntimeError("this rank fails on purpose")
        if mode == "die":
            os._exit(3)
        if mode == "stall":  # alive but silent, past the others' timeout
            time.sleep(timeout_s + 5)
            os._exit(4)
    start = time.monotonic()
    try:
        for _ in range(3):
            dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001  (the test checks the type)
        result = {
            "error_type": type(e).__name__,
            "is_dist_error": isinstance(e, dist.DistError),
            "message": str(e)[:3000],
            "seconds": time.monotonic() - start,
        }
    else:
        result = {"error_type": None}
    # The group is broken: leave without tearing it down (that would talk to the failed rank).
    print("RESULT " + __import__("json").dumps(result), flush=True)
    os._exit(0)


def check_setting() -> dict:
    """FLAGOS_DIST_CHECK differs between ranks: the group follows rank 0, so a mismatch still raises on all."""
    import warnings

    from ranks import expect_error, flagos_backend

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        init()
    checks = flagos_backend().check_across_ranks
    expect_error(
        ValueError,
        lambda: dist.all_reduce(torch.ones(4 if RANK == 0 else 8, device=DEVICE)),
        "does not match across ranks",
    )
    dist.destroy_process_group()
    return {"checks": checks, "warned": any("the group follows rank 0" in str(w.message) for w in caught)}
