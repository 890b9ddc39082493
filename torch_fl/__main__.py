"""``python -m torch_fl``: an environment report (what a bug report should include)."""

from __future__ import annotations

import os
import platform
import sys


def _line(key: str, value: object) -> None:
    print(f"{key:<26}{value}")


def report() -> int:
    import torch

    import torch_fl

    info = torch_fl.build_info()
    print("torch_fl environment report")
    _line("torch_fl", f"{torch_fl.__version__} (built against torch {info['built_with_torch']})")
    _line("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    _line("python", f"{platform.python_version()} on {platform.machine()} {platform.system()}")
    _line("HALs built", ", ".join(info["hals"]))
    _line("torch built with CUDA", info["torch_has_cuda"])
    for var in ("FLAGOS_ACCELERATOR", "FLAGOS_SIM_DEVICES", "FLAGOS_SIM_MEMORY_BYTES", "FLAGOS_HAL_DIR"):
        if var in os.environ:
            _line(var, os.environ[var])
    flagos = torch.flagos
    accelerator = torch_fl.accelerator()
    if accelerator is None:
        _line("accelerator", f"unavailable: {torch_fl._C._accelerator_error()}")
        _flaggems_lines()
        return 1
    _line("accelerator", accelerator)
    _line("HAL library", torch_fl._C._hal_library())
    _line("devices", flagos.device_count())
    if flagos.device_count() == 0:
        _flaggems_lines()
        return 1
    for index in range(flagos.device_count()):
        props = flagos.get_device_properties(index)
        free, total = flagos.mem_get_info(index)
        _line(
            f"  flagos:{index}",
            f"{props.name}, capability {props.major}.{props.minor}, "
            f"{total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free",
        )
    _line(
        "autocast dtypes", ", ".join(str(d).replace("torch.", "") for d in flagos.get_amp_supported_dtype())
    )
    _flaggems_lines()
    return 0


def _flaggems_lines() -> None:
    from torch_fl import _flaggems

    if os.environ.get(_flaggems.DISABLE_ENV):
        _line(_flaggems.DISABLE_ENV, os.environ[_flaggems.DISABLE_ENV])
    status = _flaggems.load()
    if status.available:
        _line(
            "FlagGems",
            f"available: flag-gems {status.version}, {len(status.ops)} ops "
            f"({len(status.adapted)} out overloads by adapter), loaded in {status.seconds:.1f} s",
        )
    else:
        installed = f"flag-gems {status.version} installed; " if status.version else ""
        _line("FlagGems", f"unavailable: {installed}{status.reason}")
    from torch_fl import _C, routing

    state = "on" if routing.replay_enabled() else "off (FLAGOS_FLAGGEMS_REPLAY=0)"
    _line("FlagGems launch replay", f"{state}, up to {_C._replay_signature_limit()} signatures per op")
    fallback = "on" if routing.flaggems_fallback_enabled() else "off (FLAGOS_FLAGGEMS_FALLBACK=0)"
    _line("FlagGems failures", f"native fallback {fallback}")
    counts = routing.replay_counts()
    if counts["replayed"] or counts["recorded"] or counts["python"]:
        _line(
            "  calls",
            f"{counts['replayed']} replayed, {counts['recorded']} recorded, {counts['python']} in Python",
        )
        for why, n in sorted(counts["refused"].items(), key=lambda kv: -kv[1]):
            _line("  in Python", f"{n}: {why}")


if __name__ == "__main__":
    sys.exit(report())
