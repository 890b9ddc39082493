"""A Triton-shaped kernel launcher for the simulated accelerator: host kernels written in C, compiled with
the system C compiler into shared libraries and launched through the HAL's kernel entry
(``torch_fl._C._kernel_launch``), laid out the way Triton 3.6 lays out its objects where torch_fl's
launch recorder (torch_fl/_launch_recorder.py) looks at them:

- ``runtime.driver.active``: a driver with ``launcher_cls``, ``get_current_target()`` (backend ``host``),
  ``get_current_device()`` and ``get_current_stream(device)``;
- ``runtime.cache.get_cache_manager(hash).get_file(name)``: where a kernel's binary lies;
- a compiled kernel's launcher is made from ``(src, metadata)`` on its first launch and called as
  ``launcher(gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, enter_hook,
  exit_hook, *bound_args)``, with ``src.signature`` typing every argument (``constexpr`` included) and
  ``src.attrs`` marking those specialised as divisible by 16;
- kernel parameters are the non-constexpr arguments at their natural alignment, then two null pointers
  (Triton's global and profile scratch).

A kernel is declared with :func:`jit` from C source whose entry point reads that parameter buffer.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import tempfile
import threading
import types

import torch

_CACHE_DIR = os.environ.get("TORCH_FL_STAND_IN_KERNEL_CACHE") or os.path.join(
    tempfile.gettempdir(), f"torch_fl_stand_in_kernels_{os.getuid()}"
)
_HEADER = """
#include <stdint.h>
#include <string.h>
typedef struct { unsigned int grid[3]; unsigned int program_id[3]; } ctx_t;
"""
_PACK = {
    "i1": "b",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "q",
    "u1": "B",
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "Q",
    "fp16": "e",
    "bf16": "H",
    "fp32": "f",
    "fp64": "d",
}
_lock = threading.Lock()
LAUNCHES = []  # (kernel name, grid) of every launch, in order: tests count Python-path launches


class _CacheManager:
    def __init__(self, key):
        self.dir = os.path.join(_CACHE_DIR, str(key))

    def get_file(self, name):
        path = os.path.join(self.dir, name)
        return path if os.path.exists(path) else None


class _Target:
    backend = "host"
    warp_size = 32


class Launcher:
    """Packs the non-constexpr arguments as the kernel's parameter buffer and launches it."""

    def __init__(self, src, metadata):
        self.src = src
        self.metadata = metadata

    def __call__(
        self,
        gridX,
        gridY,
        gridZ,
        stream,
        function,
        kernel_metadata,
        launch_metadata,
        enter_hook,
        exit_hook,
        *args,
    ):
        from torch_fl import _C

        fmt, values = "", []
        for ty, value in zip(self.src.signature.values(), args, strict=True):
            if ty == "constexpr":
                continue
            code = "Q" if ty.startswith("*") else _PACK[ty]
            size = struct.calcsize(code)
            fmt += "x" * ((-struct.calcsize(fmt)) % size) + code
            if ty.startswith("*"):
                value = 0 if value is None else (value if isinstance(value, int) else value.data_ptr())
            elif ty == "bf16":  # Triton's pack_bf16: the float's high half
                value = struct.unpack("=I", struct.pack("=f", value))[0] >> 16
            values.append(value)
        fmt += "x" * ((-struct.calcsize(fmt)) % 8) + "QQ"
        values += [0, 0]
        params = struct.pack("=" + fmt, *values)
        LAUNCHES.append((self.metadata.name, (gridX, gridY, gridZ)))
        _C._kernel_launch(
            function,
            (gridX, gridY, gridZ),
            (32 * self.metadata.num_warps, 1, 1),
            self.metadata.shared,
            params,
        )


class _Driver:
    launcher_cls = Launcher

    def get_current_target(self):
        return _Target()

    def get_current_device(self):
        return torch.flagos.current_device()

    def get_current_stream(self, device):
        return torch.flagos.current_stream(device).stream_id


runtime = types.SimpleNamespace(
    driver=types.SimpleNamespace(active=_Driver()),
    cache=types.SimpleNamespace(get_cache_manager=_CacheManager),
)


def _type_of(value) -> str:
    if value is None or isinstance(value, torch.Tensor):
        return "*fp32" if value is None else f"*{_DTYPES[value.dtype]}"
    if isinstance(value, bool):
        return "u1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


_DTYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32"}


def _divisible(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


class _Compiled:
    def __init__(self, src, metadata, function):
        self.src = src
        self.metadata = metadata
        self.function = function
        self.run = None


class Kernel:
    """``kernel[grid](*args)`` launches; arguments named in ``constexprs`` are compiled in as #defines."""

    def __init__(self, name: str, source: str, arg_names: list[str], constexprs=(), num_warps=4, types=None):
        self.name = name
        self.source = source
        self.arg_names = list(arg_names)
        self.constexprs = set(constexprs)
        self.num_warps = num_warps
        self.types = dict(types or {})  # forced types, e.g. {"n": "i64"}
        self._compiled: dict = {}

    def __getitem__(self, grid):
        def launch(*args):
            return self.run(grid, *args)

        return launch

    def _compile(self, signature, constants, device):
        defines = "".join(f"#define {k} {v}\n" for k, v in sorted(constants.items()))
        text = _HEADER + defines + self.source
        digest = hashlib.sha256((text + self.name).encode()).hexdigest()[:32]
        manager = _CacheManager(digest)
        path = os.path.join(manager.dir, f"{self.name}.so")
        with _lock:
            if not os.path.exists(path):
                os.makedirs(manager.dir, exist_ok=True)
                source_path = os.path.join(manager.dir, f"{self.name}.c")
                with open(source_path, "w") as f:
                    f.write(text)
                partial = f"{path}.{os.getpid()}.tmp"
                subprocess.run(
                    ["cc", "-O1", "-shared", "-fPIC", "-o", partial, source_path],
                    check=True,
                    capture_output=True,
                )
                os.replace(partial, path)
        from torch_fl import _C

        function = _C._kernel_load(device, path.encode(), self.name)
        metadata = types.SimpleNamespace(
            name=self.name,
            hash=digest,
            num_warps=self.num_warps,
            num_ctas=1,
            cluster_dims=(1, 1, 1),
            shared=0,
            global_scratch_size=0,
            global_scratch_align=1,
            profile_scratch_size=0,
            profile_scratch_align=1,
            launch_cooperative_grid=False,
            launch_pdl=False,
        )
        return signature, metadata, function

    def run(self, grid, *args):
        if callable(grid):
            grid = grid(dict(zip(self.arg_names, args, strict=True)))
        grid = tuple(grid) + (1,) * (3 - len(grid))
        signature, attrs, constants = {}, {}, {}
        for index, (name, value) in enumerate(zip(self.arg_names, args, strict=True)):
            if name in self.constexprs:
                signature[name] = "constexpr"
                constants[name] = value
            else:
                signature[name] = self.types.get(name) or _type_of(value)
                if _divisible(value):
                    attrs[(index,)] = [["tt.divisibility", 16]]
        device = torch.flagos.current_device()
        key = (tuple(signature.items()), tuple(sorted(attrs)), tuple(sorted(constants.items())), device)
        compiled = self._compiled.get(key)
        if compiled is None:
            signature, metadata, function = self._compile(signature, constants, device)
            src = types.SimpleNamespace(signature=signature, attrs=attrs, constants=constants)
            compiled = self._compiled[key] = _Compiled(src, metadata, function)
        if compiled.run is None:
            compiled.run = runtime.driver.active.launcher_cls(compiled.src, compiled.metadata)
        stream = runtime.driver.active.get_current_stream(device)
        compiled.run(
            grid[0], grid[1], grid[2], stream, compiled.function, compiled.metadata, None, None, None, *args
        )
        return compiled


def jit(name: str, source: str, arg_names: list[str], **kwargs) -> Kernel:
    return Kernel(name, source, arg_names, **kwargs)
