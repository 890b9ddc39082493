"""FlagGems as the ``flaggems`` backend of the router.

Nothing here runs at ``import torch_fl``: FlagGems (and Triton) are imported on first need, which is the
first routing decision that asks for ``flaggems`` (the router calls :func:`_load_from_router`), or an
explicit :func:`load` (``torch_fl.is_flaggems_available()`` and friends, ``python -m torch_fl``).

Loading learns FlagGems' table of (aten op -> Python function) through ``flag_gems.enable(registrar=...)``
with a registrar of our own that only records the pairs, so FlagGems registers nothing into torch (its
``Register`` would add CUDA kernels to ``aten`` for the whole process). The functions become the router's
``flaggems`` implementations. The python route calls them with the flagos tensors aliased as CUDA tensors,
so FlagGems sees the CUDA tensors it expects and launches on torch's current CUDA stream, which is
flagos's current stream.

On flagos most structured ATen ops reach the router as their ``out`` overload (``aten::add.Tensor`` and
``aten::add_.Tensor`` run a composite kernel that calls ``aten::add.out``), while FlagGems mostly
implements the functional overload. For such an ``out`` overload, when FlagGems has the functional
overload with the same arguments but not the ``out`` one, the ``out`` overload is registered with an
adapter: it calls FlagGems' functional function and copies the result into ``out`` (resizing it like
torch does); in-place calls arrive as ``out=self`` and work the same way. The copy costs one extra
device-side copy of the output.

Where FlagGems cannot be used (``FLAGOS_DISABLE_FLAGGEMS=1``, not installed, flagos not on the cuda
accelerator, ``import flag_gems`` failing, no usable ``enable(registrar=...)``) the backend is unavailable
and the reason is kept: the router's fall-through warning, ``routing.explain`` and ``python -m torch_fl``
show it. See docs/flaggems.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType

import torch

from torch_fl import _C

__all__ = ["Status", "load", "status", "implementation", "routable_ops", "DISABLE_ENV"]

DISABLE_ENV = "FLAGOS_DISABLE_FLAGGEMS"
DISTRIBUTION = "flag-gems"


@dataclasses.dataclass(frozen=True)
class Status:
    """What loading FlagGems found.

    ``state``: ``"available"`` or ``"unavailable"`` (``"unknown"`` from :func:`status` before any load);
    ``reason``: why it is unavailable; ``version``: the installed flag-gems distribution (None when not
    installed); ``ops``: canonical names of the ops with a flaggems implementation (sorted);
    ``adapted``: ``out`` overload -> FlagGems' functional op it wraps; ``skipped``: FlagGems' op keys that
    were not registered, and why; ``warnings``: what FlagGems warned while its table was read;
    ``seconds``: how long loading took.
    """

    state: str
    reason: str = ""
    version: str | None = None
    ops: tuple[str, ...] = ()
    adapted: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def available(self) -> bool:
        return self.state == "available"


_lock = threading.RLock()
_status: Status | None = None
_impls: dict[str, Callable] = {}  # canonical op name -> the callable registered with the router


class _Unusable(Exception):
    """FlagGems cannot serve as the flaggems backend; the message is the reason."""


def status() -> Status:
    """The result of the last load, without loading (``state == "unknown"`` before the first)."""
    with _lock:
        if _status is not None:
            return _status
    state, reason = _C._routing_flaggems_state()
    return Status(state=state, reason=reason, version=installed_version())


def load() -> Status:
    """Loads FlagGems as the flaggems backend once per process (later calls return the same result).

    Imports flag_gems and Triton on the first call where they are usable (seconds); never raises for an
    unusable FlagGems: the result says why it is unavailable."""
    global _status
    with _lock:
        if _status is None:
            _status = _load()
        return _status


def implementation(op: str) -> Callable | None:
    """The callable registered for ``op`` (canonical name, e.g. ``aten::add.out``), or None."""
    with _lock:
        return _impls.get(op)


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load_from_router() -> None:
    """Called by the router (with the GIL) the first time a decision needs the flaggems backend."""
    load()


def _install(module: ModuleType, *, require_cuda: bool = False) -> Status:
    """Tests: loads `module`, a stand-in for flag_gems with its ``enable(registrar=...)`` protocol, as the
    flaggems backend of this process (instead of the real FlagGems)."""
    global _status
    with _lock:
        _status = _load(module, require_cuda=require_cuda)
        return _status


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip() not in ("", "0", "false", "False", "no", "off")


def _environment_reason() -> str:
    """Why FlagGems cannot be used here without importing it, or ''."""
    if _truthy(os.environ.get(DISABLE_ENV)):
        return f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if importlib.util.find_spec("flag_gems") is None:
        return (
            "flag_gems is not installed (pip install --no-deps flag-gems, plus sqlalchemy and PyYAML; "
            "see docs/flaggems.md)"
        )
    import torch_fl

    accelerator = torch_fl.accelerator()
    if accelerator is None:
        return f"no accelerator is usable ({_C._accelerator_error()})"
    if accelerator != "cuda":
        return f"FlagGems needs flagos on the cuda accelerator; flagos runs on '{accelerator}'"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    return ""


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()[:300]


def _load(module: ModuleType | None = None, *, require_cuda: bool = True) -> Status:
    """Loads FlagGems (or `module`, a stand-in with the same ``enable(registrar=...)`` protocol, for tests)
    and publishes the result to the router. ``require_cuda=False`` skips the environment checks (tests on
    the simulated accelerator)."""
    start = time.perf_counter()
    version = installed_version()
    try:
        if require_cuda:
            reason = _environment_reason()
            if reason:
                raise _Unusable(reason)
        if module is None:
            try:
                module = importlib.import_module("flag_gems")
            except Exception as exc:  # noqa: BLE001  (any import failure makes the backend unavailable)
                raise _Unusable(f"import flag_gems failed: {_short(exc)}") from None
        version = getattr(module, "__version__", None) or version
        entries, skipped, caught = _learn_table(module)
        ops, adapted = _register(entries, skipped)
        if not ops:
            raise _Unusable(f"FlagGems {version} implements no operator of this torch {torch.__version__}")
    except _Unusable as exc:
        _C._routing_set_flaggems_available(False, str(exc))
        return Status("unavailable", str(exc), version, seconds=round(time.perf_counter() - start, 3))
    _watch_launches(module)
    _C._routing_set_flaggems_available(True, "")
    return Status(
        "available",
        "",
        version,
        tuple(sorted(ops)),
        adapted,
        skipped,
        tuple(caught),
        round(time.perf_counter() - start, 3),
    )


def _watch_launches(module: ModuleType) -> None:
    """Lets the flaggems route record FlagGems' launches (torch_fl/_launch_recorder.py) through the Triton
    it imported (a stand-in names its own in ``_torch_fl_triton``). Without a Triton of the known layout,
    calls are never replayed: their recordings say why."""
    from torch_fl import _launch_recorder

    triton_module = getattr(module, "_torch_fl_triton", None) or sys.modules.get("triton")
    if triton_module is not None:
        _launch_recorder.watch(triton_module)


# ---- Reading FlagGems' table -------------------------------------------------------------------------


def _make_collector(module: ModuleType):
    """A registrar class for ``flag_gems.enable(registrar=...)`` that records instead of registering.

    FlagGems 5.x constructs the registrar as ``registrar(config, user_include_ops=..., user_exclude_ops=...,
    cpp_patched_ops=..., lib=..., full_config_by_func=...)``, where ``config`` is a sequence of
    ``(aten op key, function[, condition])``; its own ``Register`` then filters the entries (a false
    condition, an excluded function name, an op patched by its C++ extension, ops its vendor backend does
    not support) and calls ``lib.impl(key, fn, "CUDA")`` for each. This class applies the same filters
    and keeps the pairs. ``flag_gems.all_registered_ops()`` and ``all_registered_keys()`` keep working."""

    class Collector:
        instances: list = []

        def __init__(
            self,
            config,
            user_include_ops=None,
            user_exclude_ops=None,
            cpp_patched_ops=None,
            lib=None,
            full_config_by_func=None,
            **_ignored,
        ):
            include = set(user_include_ops or ())
            exclude = set(user_exclude_ops or ()) | set(_vendor_unused_ops(module))
            patched = set(cpp_patched_ops or ())
            self.entries: list[tuple[str, Callable]] = []
            self.skipped: dict[str, str] = {}
            for item in config:
                if not item or len(item) < 2:
                    continue
                key, fn = item[0], item[1]
                name = getattr(fn, "__name__", str(fn))
                if include and name not in include and key not in include:
                    continue
                if len(item) > 2:
                    try:
                        enabled = bool(item[2]())
                    except Exception as exc:  # noqa: BLE001
                        self.skipped[key] = f"its condition raised {_short(exc)}"
                        continue
                    if not enabled:
                        self.skipped[key] = "FlagGems disables it for this torch"
                        continue
                if name in exclude or key in exclude:
                    self.skipped[key] = "excluded by FlagGems' configuration for this vendor"
                    continue
                if key in patched:
                    self.skipped[key] = "implemented by FlagGems' C++ extension, which registers itself"
                    continue
                self.entries.append((key, fn))
            Collector.instances.append(self)

        def get_all_ops(self):
            return [getattr(fn, "__name__", str(fn)) for _, fn in self.entries]

        def get_all_keys(self):
            return [key for key, _ in self.entries]

        def get_unused_ops(self):
            return sorted(self.skipped)

    return Collector


def _vendor_unused_ops(module: ModuleType) -> list[str]:
    """The ops FlagGems' vendor backend declares unsupported (none on NVIDIA), as its Register does."""
    try:
        runtime = module.runtime
        vendor = runtime.device.vendor_name
        if vendor == "nvidia":
            return []
        return list(runtime.backend.get_unused_ops(vendor) or [])
    except Exception:  # noqa: BLE001  (a stand-in module or another layout: no vendor exclusions)
        return []


def _learn_table(module: ModuleType) -> tuple[list[tuple[str, Callable]], dict[str, str], list[str]]:
    enable = getattr(module, "enable", None)
    version = getattr(module, "__version__", "?")
    if enable is None:
        raise _Unusable(f"FlagGems {version} has no flag_gems.enable()")
    try:
        params = inspect.signature(enable).parameters
    except (TypeError, ValueError):
        params = {}
    if "registrar" not in params:
        raise _Unusable(f"FlagGems {version}: flag_gems.enable() takes no registrar= argument")
    collector = _make_collector(module)
    # lib=None: should a FlagGems version ignore the registrar, its own Register fails on every op instead
    # of registering it into torch. unused=[]: no exclusions beyond FlagGems' vendor list (None only
    # makes 5.x warn that it found no exclude list).
    kwargs: dict = {"registrar": collector}
    if "lib" in params:
        kwargs["lib"] = None
    if "unused" in params:
        kwargs["unused"] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            enable(**kwargs)
        except Exception as exc:  # noqa: BLE001
            raise _Unusable(f"flag_gems.enable(registrar=...) raised {_short(exc)}") from None
    if not collector.instances:
        raise _Unusable(f"FlagGems {version}: flag_gems.enable() did not use the registrar it was given")
    instance = collector.instances[-1]
    return instance.entries, dict(instance.skipped), [str(w.message) for w in caught]


# ---- Registering with the router ---------------------------------------------------------------------


def _schema(canonical: str):
    name, _, overload = canonical.partition(".")
    return torch._C._get_schema(name, overload)


def _is_write(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _signature(args) -> list[tuple[str, str, bool]]:
    return [(a.name, str(a.type), a.kwarg_only) for a in args]


def _out_overloads(functional: str, overloads: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Of `overloads` (canonical names of the op's overloads), the ``out`` overloads whose other arguments
    are `functional`'s (a canonical name without mutable arguments): [(name, names of the out arguments)]."""
    schema = _schema(functional)
    if any(_is_write(a) for a in schema.arguments) or not schema.returns:
        return []
    if not all(str(r.type) == "Tensor" for r in schema.returns):
        return []
    wanted = _signature(schema.arguments)
    found = []
    for name in overloads:
        if name == functional:
            continue
        candidate = _schema(name)
        outs = [a for a in candidate.arguments if _is_write(a)]
        others = [a for a in candidate.arguments if not _is_write(a)]
        if len(outs) != len(schema.returns) or not all(a.kwarg_only for a in outs):
            continue
        if _signature(others) == wanted:
            found.append((name, [a.name for a in outs]))
    return found


def _copy_into(out: torch.Tensor, result) -> None:
    """What torch's out= kernels do with a result: check the cast, resize (warning when a non-empty
    output changes shape), copy."""
    if not isinstance(result, torch.Tensor):
        result = torch.as_tensor(result, device=out.device)
    if not torch.can_cast(result.dtype, out.dtype):
        raise RuntimeError(f"result type {result.dtype} can't be cast to the desired output type {out.dtype}")
    if out.shape != result.shape:
        if out.numel() != 0:
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, "
                f"which does not match the required output shape {list(result.shape)}. This behavior is "
                "deprecated, and in a future PyTorch release outputs will not be resized unless they have "
                "zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
                "elements with t.resize_(0).",
                UserWarning,
                stacklevel=2,
            )
        out.resize_(result.shape)
    _C._routing_copy_into_out(out, result)  # out may be a native alias of flagos memory: the route's copy


def _copy_results(outs, result):
    """The end of an ``out`` adapter: FlagGems' functional `result` copied into `outs` (the out arguments,
    in schema order), returned as the ``out`` overload returns them."""
    if len(outs) == 1:
        _copy_into(outs[0], result)
        return outs[0]
    for out, value in zip(outs, result, strict=True):
        _copy_into(out, value)
    return tuple(outs)


def _out_adapter(fn: Callable, functional: str, out_names: list[str]) -> Callable:
    """``out`` overload implemented by FlagGems' functional `fn`: same arguments, result copied to out.

    The python route (csrc/python/python_route_caller.cpp) recognises an adapter by its
    ``_torch_fl_out_adapter`` attribute, (fn, out names), and calls `fn` itself: when every result is a
    plain tensor of its out's shape whose dtype casts to the out's, all this does is ``out.copy_(result)``,
    which it does in C++; any other result goes through :func:`_copy_results`, as here."""

    def adapter(*args, **kwargs):
        outs = [kwargs.pop(name) for name in out_names]
        return _copy_results(outs, fn(*args, **kwargs))

    adapter.__name__ = f"{getattr(fn, '__name__', 'flaggems')}_out_adapter"
    adapter.__qualname__ = adapter.__name__
    adapter.__doc__ = f"{functional} by FlagGems, result copied into {', '.join(out_names)}"
    adapter.flaggems_functional = functional
    adapter._torch_fl_out_adapter = (fn, tuple(out_names))
    return adapter


def _register(
    entries: list[tuple[str, Callable]], skipped: dict[str, str]
) -> tuple[set[str], dict[str, str]]:
    """Registers FlagGems' functions, then out adapters; returns (registered names, adapted)."""
    direct: dict[str, Callable] = {}
    for key, fn in entries:
        try:
            canonical = _C._routing_canonical_name(key if "::" in key else f"aten::{key}")
        except ValueError:
            skipped[key] = f"not an operator of torch {torch.__version__}"
            continue
        if canonical in direct:
            skipped[key] = f"listed twice by FlagGems; the first entry for {canonical} is used"
            continue
        direct[canonical] = fn
    overloads: dict[str, list[str]] = {}
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::"):
            overloads.setdefault(name.partition(".")[0], []).append(name)
    adapters: dict[str, Callable] = {}
    adapted: dict[str, str] = {}
    for functional, fn in direct.items():
        for out_name, out_args in _out_overloads(functional, overloads.get(functional.partition(".")[0], [])):
            if out_name in direct or out_name in adapters:
                continue
            adapters[out_name] = _out_adapter(fn, functional, out_args)
            adapted[out_name] = functional
    with _lock:
        for canonical, fn in {**direct, **adapters}.items():
            _C._routing_set_flaggems_impl(canonical, fn)
            _impls[canonical] = fn
    return set(direct) | set(adapters), adapted


def routable_ops() -> list[str]:
    """The ops with a flaggems implementation that a routing rule can send there: all but those flagos
    has a kernel of its own for (copies, views, empty). Composite ops count: a rule naming one makes its
    calls reach the router (ops/routes/entry_kernels.h), and with flagos backed by CUDA most functional ops reach it
    directly. Loads FlagGems; [] when it is unavailable."""
    if not load().available:
        return []
    return [name for name in load().ops if _C._routing_is_routable(name)]
