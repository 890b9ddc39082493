"""torch.compile on flagos: Dynamo's device interface and Inductor's backend for the flagos device.

What is registered depends on the accelerator behind flagos (``flavour()``):

- ``"triton"``, flagos backed by torch's CUDA: Inductor generates Triton kernels for flagos tensors, launched
  on flagos's current stream (which is CUDA's), exactly as it does for cuda tensors (``backed.py``);
- ``"cpp"``, flagos on a HAL of its own (the simulated accelerator): Inductor's C++ kernels over flagos's
  host memory, each waiting for the work queued on the device's current stream first, as the native route's
  host kernels do (``host_kernels.py``).

Either way the graph's tensors stay flagos tensors (extern kernels such as ``mm`` reach flagos's router like
eager ops; autograd sees only flagos tensors) and the registration goes through torch's extension points:
``register_interface_for_device``, ``register_backend_for_device``, ``register_device_op_overrides``. Where
torch has none, ``adapters.py`` holds a narrow, version-guarded adapter (docs/design.md, "torch.compile").

When. Importing torch's compiler costs about a second, so ``import torch_fl`` does not: Inductor asks the
PrivateUse1 device module for ``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen`` and
``WrapperFxCodegen`` the first time it compiles anything (``init_backend_registration``), and
``torch.flagos``'s module ``__getattr__`` answers through :func:`inductor_class`, which registers everything
first. Where torch's compiler is already loaded when torch_fl is imported (that hook may then have run
already), ``import torch_fl`` registers at once (:func:`register_if_loaded`). A default ``torch.compile(model)``
and ``backend="inductor"`` therefore just work.
"""

from __future__ import annotations

import re
import sys
import threading

from torch_fl import _C

DEVICE_TYPE = "flagos"
# The names Inductor's PrivateUse1 hook reads from torch.flagos (torch/_inductor/codegen/common.py).
INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")

_lock = threading.RLock()
_interface_registered = False
_inductor_classes: dict[str, object] | None = None
_adapters: list[str] = []
_replays_graphs = False  # whether register_graph_replay is in effect
_warned_cudagraphs = False


def flavour() -> str | None:
    """Which kernels Inductor generates for flagos in this process: ``"triton"`` (backed by CUDA), ``"cpp"``
    (host kernels on a HAL accelerator), or None where flagos has no usable accelerator. Selects the
    accelerator (loads its HAL) without initialising the device."""
    backing = _C._backing_type()
    if backing == "cuda":
        return "triton"
    if backing is None and _C._accelerator_name() is not None:
        return "cpp"
    return None  # no accelerator, or a backing device type torch_fl has no Inductor flavour for


def _flavour_module(kind: str):
    if kind == "triton":
        from torch_fl._compile import backed

        return backed
    from torch_fl._compile import host_kernels

    return host_kernels


def register_graph_replay(device_type: str) -> list[str]:
    """``mode="reduce-overhead"`` (``triton.cudagraphs``) for ``device_type`` graphs on either accelerator:
    Inductor's graph wrapping gives them ``graph_replay.GraphRunner`` (``torch.flagos`` graphs) where it
    would give cuda graphs CUDA graphs (``adapters.replay_graphs_as_cuda``), and graph partitions take their
    nodes where flagos is not a GPU type (``adapters.partition_as_gpu``: the C++ kernels on a HAL
    accelerator, which its graphs record). Returns the adapters installed; none where this torch lacks
    what they adapt, and :func:`warn_if_cudagraphs_requested` then says so."""
    from torch_fl._compile.adapters import partition_as_gpu, replay_graphs_as_cuda

    global _replays_graphs
    names = replay_graphs_as_cuda(device_type)
    if names:
        names += partition_as_gpu(device_type)
    _replays_graphs = bool(names)
    return names


def warn_if_cudagraphs_requested(accelerator: str) -> None:
    """Once per process, where CUDA graphs were asked for (``mode="reduce-overhead"``,
    ``triton.cudagraphs``) and flagos graphs are not replayed (:func:`register_graph_replay` found nothing
    to adapt): Inductor's CUDA-graph trees take graphs of device type cuda only, so a flagos graph runs
    without graph replay, and Inductor says so only in its ``cudagraph_skips`` counter."""
    import warnings

    from torch._inductor import config

    global _warned_cudagraphs
    if _replays_graphs or _warned_cudagraphs or not config.triton.cudagraphs:
        return
    _warned_cudagraphs = True
    warnings.warn(
        f"torch.compile: CUDA graphs (mode='reduce-overhead') are not replayed for '{DEVICE_TYPE}' graphs on "
        f"{accelerator}: the compiled graph runs without them (Inductor's CUDA-graph trees take device type "
        f"cuda only; torch._dynamo.utils.counters['inductor']['cudagraph_skips'] counts the graphs)",
        stacklevel=2,
    )


# Generated code allocates flagos buffers through torch_fl._C._empty_strided under this name (the wrapper's
# header imports it), as it allocates cuda buffers through torch's C++ empty_strided_cuda.
EMPTY_STRIDED = f"empty_strided_{DEVICE_TYPE}"
EMPTY_STRIDED_IMPORT = f"from torch_fl._C import _empty_strided as {EMPTY_STRIDED}"
# What Inductor's make_allocation writes for a device without a C++ helper of torch's.
_GENERIC_ALLOCATION = re.compile(
    rf"^(?P<head>\w+ = )empty_strided\((?P<args>.*), device='{DEVICE_TYPE}', dtype=(?P<dtype>[\w.]+)\)"
    r"(?P<tail>.*)$"
)


class FastAllocations:
    """Wrapper-code mixin (before Inductor's wrapper class in the bases): a flagos buffer is allocated by
    ``empty_strided_flagos(size, stride, dtype, device_index)`` instead of ``torch.empty_strided(size, stride,
    device='flagos', dtype=...)``, which Inductor writes for devices it has no C++ helper for: about 1.2 us
    less a buffer on the simulated accelerator, and a graph allocates hundreds per call. The device's index
    is explicit (C++ kernels on a HAL accelerator run without a device guard). A line of another form
    (memory tracking, a torch that writes allocations differently) is left as it is."""

    def make_allocation(self, name, device, *args, **kwargs):
        line = super().make_allocation(name, device, *args, **kwargs)
        if isinstance(line, str) and device.type == DEVICE_TYPE:
            match = _GENERIC_ALLOCATION.match(line)
            if match:
                index = -1 if device.index is None else device.index  # -1: the current device
                line = (
                    f"{match['head']}{EMPTY_STRIDED}({match['args']}, {match['dtype']}, {index})"
                    f"{match['tail']}"
                )
        return line


def register_backend(device_type: str, scheduling, wrapper, cpp_wrapper, fx_wrapper=None) -> None:
    """``register_backend_for_device``, passing the FX wrapper only to a torch whose signature has it."""
    import inspect

    from torch._inductor.codegen.common import register_backend_for_device

    kwargs = {}
    if (
        fx_wrapper is not None
        and "device_fx_wrapper_codegen" in inspect.signature(register_backend_for_device).parameters
    ):
        kwargs["device_fx_wrapper_codegen"] = fx_wrapper
    register_backend_for_device(device_type, scheduling, wrapper, cpp_wrapper, **kwargs)


def register_device_interface() -> bool:
    """Registers flagos's Dynamo ``DeviceInterface`` (imports torch._dynamo). False where flagos has no
    accelerator."""
    global _interface_registered
    kind = flavour()
    if kind is None:
        return False
    with _lock:
        if not _interface_registered:
            from torch._dynamo.device_interface import register_interface_for_device

            from torch_fl._compile.adapters import capturable_optimizer_state
            from torch_fl._compile.device_interface import interface_for

            interface = interface_for(kind)
            register_interface_for_device(DEVICE_TYPE, interface)
            for index in range(_C._device_count()):
                register_interface_for_device(f"{DEVICE_TYPE}:{index}", interface)
            _adapters.extend(capturable_optimizer_state(DEVICE_TYPE))
            _interface_registered = True
    return True


def tag_compile_cache() -> None:
    """Adds torch_fl's compile code to the compile caches' key (``torch.compiler.config.cache_key_tag``,
    where this torch has it; a user's own tag is kept in front). Inductor keys a cached graph by torch's
    sources and configuration, not by a device backend's: without the tag, a graph cached under an earlier
    torch_fl would be loaded with the code generated for that version (helpers it calls that changed since)."""
    import hashlib
    import pathlib

    from torch.compiler import config

    if not hasattr(config, "cache_key_tag"):
        return
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    tag = f"torch_fl-{digest.hexdigest()[:16]}"
    if tag not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}+{tag}" if config.cache_key_tag else tag


def register_inductor() -> dict[str, object] | None:
    """Registers Inductor's backend for flagos (and the device interface it needs); returns the classes
    published on torch.flagos, or None where flagos has no accelerator. Idempotent."""
    global _inductor_classes
    kind = flavour()
    if kind is None:
        return None
    with _lock:
        if _inductor_classes is None:
            register_device_interface()
            tag_compile_cache()
            classes, adapters = _flavour_module(kind).register(DEVICE_TYPE)
            _adapters.extend(adapters)
            _inductor_classes = classes
    return _inductor_classes


def inductor_class(name: str):
    """``torch.flagos.<name>`` for Inductor's PrivateUse1 hook: registers, then returns the class. Raises
    AttributeError where flagos has no accelerator (the hook then leaves flagos unregistered)."""
    classes = register_inductor()
    if classes is None or classes.get(name) is None:
        raise AttributeError(f"module 'torch.flagos' has no attribute '{name}' (no flagos accelerator)")
    return classes[name]


def register_if_loaded() -> None:
    """At ``import torch_fl``: registers now what torch's already loaded compiler needs (Inductor's hook may
    have run before torch_fl existed); otherwise imports nothing, and registers the device interface when
    Dynamo is imported (:class:`_AfterImport`): Dynamo traces a whole function before Inductor's hook asks
    torch.flagos for anything, and what it traces may need flagos's interface (an optimizer's first step
    asks whether its state can live on the device: ``adapters.capturable_optimizer_state``)."""
    if "torch._inductor.codegen.common" in sys.modules:
        register_inductor()
    elif "torch._dynamo.device_interface" in sys.modules:
        register_device_interface()
    else:
        _AfterImport.install("torch._dynamo", _register_after_dynamo)


def _register_after_dynamo() -> None:
    import warnings

    try:
        register_device_interface()
    except Exception as error:  # Dynamo's import must not fail for torch_fl; the first compile says more
        warnings.warn(
            f"torch_fl could not register the '{DEVICE_TYPE}' device with Dynamo when it was imported "
            f"({type(error).__name__}: {error}); it registers at the first compile instead",
            stacklevel=2,
        )


class _AfterImport:
    """An import-system finder that runs ``callback`` once, right after the module ``name`` has been
    executed (imported in full). Dynamo has no hook for device backends, and importing it at ``import
    torch_fl`` would cost about a second; this finder only wraps that one module's loader (the spec comes
    from the finders after it) and leaves ``sys.meta_path`` once the module has run. A lookup that does not
    import (``importlib.util.find_spec``) leaves it in place for the real import."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    @classmethod
    def install(cls, name: str, callback) -> None:
        if name in sys.modules or any(isinstance(f, cls) and f.name == name for f in sys.meta_path):
            return
        sys.meta_path.insert(0, cls(name, callback))

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            if self in sys.meta_path:  # once: the module has run
                sys.meta_path.remove(self)
                self.callback()

        loader.exec_module = exec_then_call
        return spec


def status() -> dict:
    """What is registered: ``flavour``, ``device_interface`` and ``inductor`` (bools), the ``adapters``
    installed (docs/design.md lists them) and ``graph_replay``: reduce-overhead's flagos graphs recorded and
    replayed so far, and the calls that ran without replay (``graph_replay.stats()``)."""
    from torch_fl._compile import graph_replay

    return {
        "flavour": flavour(),
        "device_interface": _interface_registered,
        "inductor": _inductor_classes is not None,
        "adapters": list(_adapters),
        "graph_replay": graph_replay.stats(),
    }
