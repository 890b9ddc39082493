"""Records what one call of a FlagGems wrapper does, so that the router can replay it from C++.

The flaggems route (csrc/python/launch_recording.cpp) records a call signature's first calls: it calls
:func:`begin`, runs FlagGems' Python wrapper as usual, and takes the :class:`Recording` from :func:`end`.
While a thread records, two watchers see what the wrapper does on that thread, and nothing else:

- every Triton launch, through the launcher class of Triton's active driver (:func:`watch`, which wraps
  ``driver.launcher_cls`` once so that launchers made from then on report to the recording thread; one
  attribute check per launch otherwise): the kernel binary, grid, block, shared memory and every
  argument, typed by the kernel's signature;
- every ATen call, through a ``TorchDispatchMode``: allocations (``empty`` and its kin) and views are
  part of a plan; so are copies between tensors on the device (``contiguous`` or ``reshape`` of a strided
  tensor, ``clone``, a dtype conversion, ``copy_``) and fills (``zeros``, ``full``, ``zero_``, ``fill_``),
  which a replay makes with the native route's ``copy_`` and ``fill_``; anything else that does device
  work (a native kernel) or reads data on the host (``.item()``) makes the recording a refusal that names
  it.

Nothing here decides whether a call is replayable beyond that: the C++ side matches pointers to the
call's tensors and allocations, compares recordings, and keeps or refuses the plan.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Recording", "begin", "end", "watch", "watched"]

# Argument kinds, shared with csrc/python/launch_recording.cpp (ParamKind). Triton passes booleans (``i1``,
# ``u1``) as one byte and half floats as their two-byte bit patterns.
PTR, I32, I64, U32, U64, FP32, FP64, I8, I16, U8, U16, FP16, BF16 = range(13)
_SCALAR_KINDS = {
    "i1": I8,
    "i8": I8,
    "i16": I16,
    "i32": I32,
    "i64": I64,
    "u1": U8,
    "u8": U8,
    "u16": U16,
    "u32": U32,
    "u64": U64,
    "fp16": FP16,
    "bf16": BF16,
    "fp32": FP32,
    "f32": FP32,
    "fp64": FP64,
}
_FLOAT_KINDS = frozenset((FP16, BF16, FP32, FP64))
# Where a backend's compiler leaves a kernel's binary in Triton's cache, and whether the HAL loads the file's
# bytes or its path (host kernels of the simulated accelerator are shared libraries, loaded by path).
_BINARIES = {"cuda": ("cubin", False), "hip": ("hsaco", False), "host": ("so", True)}

_ALLOCATIONS = frozenset(
    name
    for name in (
        "empty.memory_format",
        "empty_strided.default",
        "empty_like.default",
        "new_empty.default",
        "new_empty_strided.default",
        "empty_permuted.default",
    )
)
# ATen functions that copy a tensor into new memory: recorded as copies the replay makes natively.
_COPIES = frozenset(("clone.default", "_to_copy.default"))
# ATen functions that make new memory filled with one value (the value: a constant, or the argument at that
# position or keyword), and the in-place fills: recorded as fills the replay makes natively.
_FILLED = {
    "zeros.default": 0,
    "zeros_like.default": 0,
    "new_zeros.default": 0,
    "ones.default": 1,
    "ones_like.default": 1,
    "new_ones.default": 1,
    "full.default": (1, "fill_value"),
    "full_like.default": (1, "fill_value"),
    "new_full.default": (2, "fill_value"),
}
_FILLS = {"zero_.default": 0, "fill_.Scalar": (1, "value")}
_HOST_READS = frozenset(
    ("_local_scalar_dense.default", "equal.default", "is_nonzero.default", "item.default")
)
# ATen functions that read only types and metadata (a wrapper's type promotion): no device work.
_METADATA = frozenset(
    (
        "aten::promote_types",
        "aten::result_type",
        "aten::can_cast",
        "aten::is_same_size",
        "aten::is_contiguous",
        "aten::size",
        "aten::stride",
        "aten::numel",
        "aten::dim",
        "aten::sym_size",
        "aten::sym_stride",
        "aten::sym_numel",
        "aten::sym_storage_offset",
    )
)


class Recording:
    """What one wrapper call did: ``launches`` (tuples, see :func:`_describe`), ``allocations`` ((data
    pointer, bytes, launches made before it) of each storage it allocated), ``steps`` (the copies and fills
    it made through ATen) and ``refusal`` (why it cannot be replayed, or None)."""

    __slots__ = ("launches", "allocations", "steps", "refusal", "stream")

    def __init__(self, stream: int | None):
        self.launches: list[tuple] = []
        self.allocations: list[tuple[int, int]] = []
        # ("copy", launches before it, destination, source) or ("fill", launches before it, destination, value)
        self.steps: list[tuple] = []
        self.refusal: str | None = None
        self.stream = stream

    def refuse(self, reason: str) -> None:
        if self.refusal is None:
            self.refusal = reason


_local = threading.local()
_lock = threading.Lock()
_drivers: list[Any] = []  # the drivers whose launcher class is watched, with their triton module
_binary_cache: dict[tuple[str, str], bytes | None] = {}


def _current() -> Recording | None:
    return getattr(_local, "recording", None)


class _Watch(TorchDispatchMode):
    """Classifies each ATen call the wrapper makes while recording."""

    def __init__(self, recording: Recording, host_scalars: frozenset = frozenset()):
        super().__init__()
        self.recording = recording
        self.host_scalars = host_scalars

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.recording.refusal is None:
            try:
                self._classify(func, args, kwargs, out)
            except Exception as exc:  # noqa: BLE001  (watching must never fail the wrapper's call)
                self.recording.refuse(f"runs {func._schema.name}, which the recorder cannot classify ({exc})")
        return out

    def _classify(self, func, args, kwargs, out) -> None:
        name = f"{func._schema.name.partition('::')[2]}.{func._overloadname}"
        if name in _ALLOCATIONS:
            if isinstance(out, torch.Tensor) and out.device.type != "meta":
                storage = out.untyped_storage()
                self.recording.allocations.append(
                    (storage.data_ptr(), storage.nbytes(), len(self.recording.launches))
                )
        elif func._schema.name in _METADATA:
            pass
        elif name == "broadcast_tensors.default" and _shares_memory(out, args[0] if args else ()):
            pass  # expanded views of its inputs (a wrapper's broadcasting): no device work
        elif name in _HOST_READS:
            if not self._reads_host_scalars(args):
                self.recording.refuse(f"reads device data on the host ({func._schema.name})")
        elif name == "copy_.default":
            self._copy(func, args[0], args[1])
        elif name in _FILLED or name in _FILLS:
            if name in _FILLED and isinstance(out, torch.Tensor):
                storage = out.untyped_storage()
                self.recording.allocations.append(
                    (storage.data_ptr(), storage.nbytes(), len(self.recording.launches))
                )
            value = _FILLED.get(name) if name in _FILLED else _FILLS[name]
            if isinstance(value, tuple):
                index, keyword = value
                value = args[index] if len(args) > index else (kwargs or {}).get(keyword)
            self._fill(func, out if name in _FILLED else args[0], value)
        elif name in _COPIES or (_is_view(func) and not _shares_memory(out, args)):
            # A copy into new memory; also what a view-typed op returns when it cannot view
            # (``contiguous`` of a strided tensor, ``reshape`` of one that no view can reshape).
            src = args[0] if args else None
            if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
                self.recording.refuse(f"runs {func._schema.name} inside the wrapper")
            else:
                storage = out.untyped_storage()
                self.recording.allocations.append(
                    (storage.data_ptr(), storage.nbytes(), len(self.recording.launches))
                )
                self._copy(func, out, src)
        elif not _is_view(func):
            self.recording.refuse(f"runs {func._schema.name} inside the wrapper")

    def _copy(self, func, dst, src) -> None:
        """Records `dst`'s values copied from `src` (the native route's ``copy_`` makes them again on
        replay), or refuses what that cannot reproduce."""
        if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
            self.recording.refuse(f"runs {func._schema.name} with a non-tensor source inside the wrapper")
            return
        if src.device != dst.device or src.layout != torch.strided or dst.layout != torch.strided:
            self.recording.refuse(f"runs {func._schema.name} across devices or layouts inside the wrapper")
            return
        if dst.shape != src.shape:
            if not (dst.is_contiguous() and dst.numel() == src.numel()):
                self.recording.refuse(f"runs {func._schema.name} (a reshaping copy) inside the wrapper")
                return
            dst = dst.view(src.shape)  # a reshape's copy: the source's elements in order
        self.recording.steps.append(("copy", len(self.recording.launches), dst, src))

    def _fill(self, func, dst, value) -> None:
        """Records `dst` filled with `value` (the native route's ``fill_`` fills it again on replay)."""
        if not isinstance(dst, torch.Tensor) or dst.layout != torch.strided or dst.device.type == "meta":
            self.recording.refuse(f"runs {func._schema.name} on a non-strided tensor inside the wrapper")
        elif isinstance(value, bool | int | float):
            self.recording.steps.append(("fill", len(self.recording.launches), dst, value))
        else:
            self.recording.refuse(f"runs {func._schema.name} with a value of type {type(value).__name__}")

    def _reads_host_scalars(self, args) -> bool:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(
            t.device.type == "cpu" and t.dim() == 0 and t.data_ptr() in self.host_scalars for t in tensors
        )


def _shares_memory(out, args) -> bool:
    """Whether every tensor `out` holds lies in the storage of one of the tensors in `args`."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    return all(not isinstance(o, torch.Tensor) or o.untyped_storage().data_ptr() in storages for o in outs)


def _is_view(func) -> bool:
    schema = func._schema
    if func.is_view or schema.name in ("aten::detach", "aten::alias", "aten::lift_fresh"):
        return True
    returns = schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def begin(host_scalars=()) -> tuple[Recording, _Watch | None]:
    """Starts recording this thread's launches and ATen calls (every launch is expected on the current
    stream of the driver's current device, as it is now). `host_scalars`: data pointers of the call's
    0-dim CPU tensor arguments, whose values are part of the call's signature: reading them on the host is
    no device read."""
    if getattr(_local, "recording", None) is not None:
        raise RuntimeError("torch_fl: a launch recording is already underway on this thread")
    if not _drivers:
        # Nothing can be replayed without watched launches: no need to watch ATen calls either.
        recording = Recording(None)
        recording.refuse("no Triton driver is watched")
        return recording, None
    stream = None
    if _drivers:
        try:
            driver = _drivers[0]
            stream = driver.get_current_stream(driver.get_current_device())
        except Exception:  # noqa: BLE001  (a driver without these: launches' streams are not checked)
            stream = None
    recording = Recording(stream)
    mode = _Watch(recording, frozenset(host_scalars))
    mode.__enter__()
    _local.recording = recording
    return recording, mode


def end(token: tuple[Recording, _Watch]) -> Recording:
    """Stops the recording `begin` started and returns it."""
    recording, mode = token
    if mode is None:
        return recording
    _local.recording = None
    mode.__exit__(None, None, None)
    return recording


def watched() -> bool:
    return bool(_drivers)


def watch(triton_module) -> bool:
    """Wraps the launcher class of `triton_module`'s active driver (the real Triton or a stand-in with the
    same layout) so launchers made from now on report launches to a recording thread. Idempotent; False
    when the module has no launcher class to wrap."""
    try:
        driver = triton_module.runtime.driver.active
        base = driver.launcher_cls
    except Exception:  # noqa: BLE001  (a Triton without this layout: nothing is watched, nothing replayed)
        return False
    with _lock:
        if getattr(base, "_torch_fl_watched", False):
            return True
        try:
            backend = driver.get_current_target().backend
        except Exception:  # noqa: BLE001
            backend = "cuda"
        try:
            warp_size = int(driver.get_current_target().warp_size)
        except Exception:  # noqa: BLE001
            warp_size = 32
        driver.launcher_cls = _launcher_class(base, triton_module, backend, warp_size)
        _drivers.append(driver)
    return True


def _launcher_class(base, triton_module, backend: str, warp_size: int):
    class _Launcher(base):
        _torch_fl_watched = True

        def __init__(self, src, metadata, *args, **kwargs):
            super().__init__(src, metadata, *args, **kwargs)
            self._torch_fl_src = src
            self._torch_fl_metadata = metadata

        def __call__(self, gridX, gridY, gridZ, stream, function, *args):
            recording = getattr(_local, "recording", None)
            if recording is not None:
                _record_launch(self, recording, (gridX, gridY, gridZ), stream, args)
            return super().__call__(gridX, gridY, gridZ, stream, function, *args)

    _Launcher.__name__ = _Launcher.__qualname__ = f"Recording{base.__name__}"
    _Launcher._torch_fl_triton = triton_module
    _Launcher._torch_fl_backend = backend
    _Launcher._torch_fl_warp_size = warp_size
    return _Launcher


def _record_launch(launcher, recording: Recording, grid, stream, args) -> None:
    if recording.refusal is not None:
        return
    if recording.stream is not None and stream != recording.stream:
        recording.refuse("launches on a stream other than the current one")
        return
    try:
        launch = _describe(launcher, grid, args)
    except _Unreplayable as exc:
        recording.refuse(str(exc))
        return
    recording.launches.append(launch)


class _Unreplayable(Exception):
    pass


def _describe(launcher, grid, args) -> tuple:
    """(image, name, grid, threads per program, shared bytes, params, trailing null pointers), params a
    list of (kind, value, divisible by 16)."""
    metadata = launcher._torch_fl_metadata
    signature = getattr(launcher._torch_fl_src, "signature", None)
    if not isinstance(signature, dict):
        raise _Unreplayable("a kernel without a signature dict (Triton layout not known)")
    name = getattr(metadata, "name", None)
    if not name:
        raise _Unreplayable("a kernel without a name in its metadata")
    for attr in ("launch_cooperative_grid", "launch_pdl"):
        if getattr(metadata, attr, False):
            raise _Unreplayable(f"kernel {name} launches with {attr}")
    if getattr(metadata, "num_ctas", 1) != 1 or any(
        d != 1 for d in getattr(metadata, "cluster_dims", ()) or ()
    ):
        raise _Unreplayable(f"kernel {name} launches clusters")
    trailing = 0
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(metadata, attr):
            if getattr(metadata, attr):
                raise _Unreplayable(f"kernel {name} needs {attr.replace('_size', '')} memory")
            trailing += 1
    types = list(signature.values())
    if len(args) < len(types):
        raise _Unreplayable(f"kernel {name}: fewer launch arguments than its signature")
    values = args[len(args) - len(types) :]
    divisible = _divisible_params(launcher._torch_fl_src)
    params = []
    for index, (ty, value) in enumerate(zip(types, values, strict=True)):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            raise _Unreplayable(f"kernel {name}: tuple argument")
        if ty.startswith("*"):
            # A pointer's fourth element: whether it is an empty tensor's, which may point just past the
            # end of the memory it was cut from (and is never read).
            empty = isinstance(value, torch.Tensor) and value.numel() == 0
            params.append((PTR, _pointer(value, name), index in divisible, empty))
        elif ty in _SCALAR_KINDS:
            kind = _SCALAR_KINDS[ty]
            params.append((kind, float(value) if kind in _FLOAT_KINDS else int(value), index in divisible))
        else:
            raise _Unreplayable(f"kernel {name}: argument type {ty} is not replayable")
    image = _binary(launcher, metadata, name)
    threads = int(getattr(metadata, "num_warps", 4)) * launcher._torch_fl_warp_size
    shared = int(getattr(metadata, "shared", 0) or 0)
    return (image, name, tuple(int(g) for g in grid), threads, shared, params, trailing)


def _pointer(value, kernel: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is None:
        raise _Unreplayable(f"kernel {kernel}: a pointer argument of type {type(value).__name__}")
    return int(data_ptr())


def _divisible_params(src) -> set[int]:
    """Indices of the arguments Triton specialised as divisible by 16 (``tt.divisibility``)."""
    found: set[int] = set()
    attrs = getattr(src, "attrs", None)
    if isinstance(attrs, dict):
        for key, values in attrs.items():
            index = key[0] if isinstance(key, tuple) and key else key
            if isinstance(index, int) and any(
                isinstance(v, (list, tuple)) and v and v[0] == "tt.divisibility" for v in values
            ):
                found.add(index)
    return found


def _binary(launcher, metadata, name: str) -> bytes:
    backend = launcher._torch_fl_backend
    ext, by_path = _BINARIES.get(backend, (None, False))
    if ext is None:
        raise _Unreplayable(f"kernel binaries of Triton backend {backend!r} are not known")
    file_hash = getattr(metadata, "hash", None)
    key = (str(file_hash), name)
    if key not in _binary_cache:
        image = None
        try:
            path = launcher._torch_fl_triton.runtime.cache.get_cache_manager(file_hash).get_file(
                f"{name}.{ext}"
            )
            if path:
                if by_path:
                    image = path.encode()
                else:
                    with open(path, "rb") as f:
                        image = f.read()
        except Exception:  # noqa: BLE001
            image = None
        _binary_cache[key] = image
    image = _binary_cache[key]
    if image is None:
        raise _Unreplayable(f"kernel {name}: its binary is not in Triton's cache")
    return image
