"""Loads this folder's flag_gems as the flaggems backend of the current process (the CPU tests of the
FlagGems sweeps, ``python -m benchmarks.flaggems_overhead --stand-in``), on the simulated accelerator.
Processes that should find it through ``import flag_gems`` put this folder first on their ``PYTHONPATH``
instead (tests/flaggems/test_flaggems.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

FOLDER = os.path.dirname(os.path.abspath(__file__))


def _import_stand_in(name: str):
    """The module ``name`` of this folder, imported as ``name`` (sys.modules), without changing sys.path;
    the module already imported under that name, where there is one."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.machinery.PathFinder.find_spec(name, [FOLDER])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def install() -> str:
    """'' once the stand-in serves the flaggems backend, else why it cannot."""
    import torch_fl
    from torch_fl import _flaggems

    if torch_fl.accelerator() != "sim":
        return "--stand-in runs on the simulated accelerator (FLAGOS_ACCELERATOR=sim)"
    had_triton = "triton" in sys.modules
    _import_stand_in("triton")  # the stand-in flag_gems imports triton, as the real one does
    try:
        flag_gems = _import_stand_in("flag_gems")
    finally:
        # Its stand-in triton must not stay visible: torch (inductor, dynamo) would take it for the real one.
        if not had_triton:
            sys.modules.pop("triton", None)
    if not getattr(flag_gems, "__version__", "").endswith("+fake"):
        return f"--stand-in found a real flag_gems ({flag_gems.__file__})"
    status = _flaggems._install(flag_gems)
    return "" if status.available else f"the stand-in FlagGems is unavailable: {status.reason}"
