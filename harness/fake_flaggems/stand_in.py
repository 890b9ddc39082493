"""Loads this folder's flag_gems as the flaggems backend of the current process (the CPU tests of the
FlagGems sweeps, ``benchmarks/flaggems_overhead.py --stand-in``), on the simulated accelerator."""

from __future__ import annotations

import os
import sys


def install() -> str:
    """'' once the stand-in serves the flaggems backend, else why it cannot."""
    import torch_fl
    from torch_fl import _flaggems

    if torch_fl.accelerator() != "sim":
        return "--stand-in runs on the simulated accelerator (FLAGOS_ACCELERATOR=sim)"
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import flag_gems
    finally:
        sys.path.remove(here)
    # Its stand-in triton must not stay visible: torch (inductor, dynamo) would take it for the real one.
    sys.modules.pop("triton", None)
    if not getattr(flag_gems, "__version__", "").endswith("+fake"):
        return f"--stand-in found a real flag_gems ({flag_gems.__file__})"
    status = _flaggems._install(flag_gems)
    return "" if status.available else f"the stand-in FlagGems is unavailable: {status.reason}"
