"""The places where torch's compiler offers no extension point for flagos, each adapted narrowly.

Every adapter is version-guarded: it adapts a function only where torch has it under that name (torch 2.11
and 2.13 both do), and returns the adapter's name when it installed it, so ``torch_fl._compile.status()``
lists what is in effect. docs/design.md ("torch.compile") says what each touches and why. None changes what
torch does for its own device types: each wrapper answers as the original for every device but flagos.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def _replace_in_inductor(name: str, original: Callable, replacement: Callable) -> None:
    """Points every loaded ``torch._inductor`` module that holds ``original`` as ``name`` at ``replacement``:
    Inductor's modules bind helpers with ``from ..utils import name``, so the defining module alone is not
    enough. Modules loaded later import the defining module's attribute, which is replaced first."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (
            module_name == "torch._inductor" or module_name.startswith("torch._inductor.")
        ):
            continue
        if module.__dict__.get(name) is original:
            setattr(module, name, replacement)


def classify_as_cpu(device_type: str) -> list[str]:
    """Inductor's CPU classification for a device whose kernels are Inductor's C++ (CPU) kernels.

    Inductor decides what kind of backend a device has by its type name: ``get_current_backend()`` answers
    ``config.cpu_backend`` ("cpp") for "cpu" only and the CUDA backend ("triton") for any other type, and the
    scheduler's loop reordering, reindexing and index inversion (SIMD/Triton-only fusion steps) are skipped
    for nodes whose ``is_cpu()`` is true. A device registered with ``CppScheduling`` under another name gets
    Triton's answers for C++ kernels: code generation fails (``masked`` and ``index_expr`` read a CSE
    variable's dtype that C++ kernels do not set; the reindexing step unpacks C++ loop groups as Triton's).
    The three classification helpers answer for ``device_type`` as for "cpu"; ``is_gpu`` stays false.
    """
    from torch._inductor import ir, scheduler, utils

    installed = []
    original_backend = getattr(utils, "get_current_backend", None)
    if original_backend is not None:

        def get_current_backend(device_type_: str | None = None) -> str:
            if not device_type_:
                from torch._inductor.virtualized import V

                device_type_ = V.graph.get_current_device_or_throw().type
            return original_backend("cpu" if device_type_ == device_type else device_type_)

        get_current_backend.__wrapped__ = original_backend  # type: ignore[attr-defined]
        utils.get_current_backend = get_current_backend
        _replace_in_inductor("get_current_backend", original_backend, get_current_backend)
        installed.append("inductor.utils.get_current_backend")

    original_ir_is_cpu = getattr(ir, "is_cpu", None)
    get_device_type = getattr(ir, "get_device_type", None)
    if original_ir_is_cpu is not None and get_device_type is not None:

        def is_cpu(x) -> bool:  # realize/reuse heuristics tuned for CPU kernels
            return original_ir_is_cpu(x) or get_device_type(x) == device_type

        is_cpu.__wrapped__ = original_ir_is_cpu  # type: ignore[attr-defined]
        ir.is_cpu = is_cpu
        _replace_in_inductor("is_cpu", original_ir_is_cpu, is_cpu)
        installed.append("inductor.ir.is_cpu")

    node_class = getattr(scheduler, "BaseSchedulerNode", None)
    original_node_is_cpu = getattr(node_class, "is_cpu", None)
    if original_node_is_cpu is not None:

        def node_is_cpu(self) -> bool:
            if original_node_is_cpu(self):
                return True
            device = self.get_device()
            return device is not None and device.type == device_type

        node_is_cpu.__wrapped__ = original_node_is_cpu  # type: ignore[attr-defined]
        node_class.is_cpu = node_is_cpu
        installed.append("inductor.scheduler.BaseSchedulerNode.is_cpu")
    return installed


def register_gpu_type(device_type: str) -> list[str]:
    """Makes ``device_type`` one of Inductor's GPU types, and the one ``get_gpu_type()`` names.

    ``is_gpu(t)`` is ``t in GPU_TYPES``: without the type there, Inductor takes the C++ path for it and never
    emits Triton. The list is extended in place (modules imported it by name). ``get_gpu_type()`` asserts at
    most one available GPU type, and both cuda and flagos are available when flagos is backed by CUDA; it
    is cached, so it is answered once with the list narrowed to flagos. The process's one GPU type is then
    flagos: Inductor moves CPU constructors (``ConstructorMoverPass``) and constants to flagos, not cuda.
    """
    from torch._inductor import utils

    gpu_types = getattr(utils, "GPU_TYPES", None)
    get_gpu_type = getattr(utils, "get_gpu_type", None)
    if gpu_types is None or get_gpu_type is None or not hasattr(get_gpu_type, "cache_clear"):
        return []
    if device_type in gpu_types:
        return ["inductor.utils.GPU_TYPES"]
    saved = list(gpu_types)
    try:
        gpu_types[:] = [device_type]
        get_gpu_type.cache_clear()
        get_gpu_type()
    finally:
        gpu_types[:] = [*saved, device_type]
    return ["inductor.utils.GPU_TYPES", "inductor.utils.get_gpu_type"]


def report_as_cuda_to_triton(device_type: str) -> list[str]:
    """``DeviceProperties.create`` describes a ``device_type`` device as the CUDA device of the same index.

    Inductor passes ``DeviceProperties.type`` to Triton as the compile target's backend (Triton's NVIDIA
    backend accepts "cuda" only), to the kernel launcher (the static CUDA launcher serves cuda, xpu and hip)
    and to ``get_interface_for_device`` at run time (torch's CudaInterface: CUDA's current stream, which is
    flagos's). Describing flagos memory as the CUDA device it is gives every one of them what it expects;
    torch does the same for ROCm in the other direction (cuda described as hip). Compile workers then need
    nothing of torch_fl.
    """
    from torch._inductor.runtime.hints import DeviceProperties

    original = getattr(DeviceProperties, "create", None)
    if original is None:
        return []
    if getattr(original, "_flagos_device_type", None) == device_type:
        return ["inductor.runtime.hints.DeviceProperties.create"]

    def create(cls, device):
        if getattr(device, "type", None) == device_type:
            index = device.index if device.index is not None else torch.flagos.current_device()
            device = torch.device("cuda", index)
        return original(device)

    create._flagos_device_type = device_type  # type: ignore[attr-defined]
    DeviceProperties.create = classmethod(create)  # type: ignore[method-assign, assignment]
    return ["inductor.runtime.hints.DeviceProperties.create"]


def build_aot_as(device_type: str, native: str) -> list[str]:
    """AOTInductor builds a ``device_type`` model as a ``native`` one, and keeps ``device_type`` as its key.

    ``AotCodeCompiler.compile`` takes the graph's device type for the compiler and linker flags (``USE_CUDA``,
    CUDA's headers and libraries), the precompiled header (``aoti_include/<type>.h``) and the package's
    ``AOTI_DEVICE_KEY``, which picks the runner at load time. The model a flagos graph generates is the native
    device's (``aot.py``), so it is built with ``native``'s flags; the key written into the package's metadata
    files (and into ``config.aot_inductor.metadata``, which the build fills in) is ``device_type``, the name
    torch_fl's runner is registered under.
    """
    import json
    import pathlib

    from torch._inductor import codecache, config

    compiler = getattr(codecache, "AotCodeCompiler", None)
    original = getattr(compiler, "compile", None)
    if original is None:
        return []
    if getattr(original, "_flagos_device_type", None) == device_type:
        return ["inductor.codecache.AotCodeCompiler.compile"]
    build = original.__func__
    flagos_type = device_type  # the name ``compile`` below takes for its own argument

    def rekey(paths) -> None:
        for path in paths:
            path = pathlib.Path(path)
            metadata = json.loads(path.read_text())
            if metadata.get("AOTI_DEVICE_KEY") == native:
                metadata["AOTI_DEVICE_KEY"] = flagos_type
                path.write_text(json.dumps(metadata))

    def compile(cls, graph, *args, device_type: str, **kwargs):  # noqa: A001 - torch's name
        if device_type != flagos_type:
            return build(cls, graph, *args, device_type=device_type, **kwargs)
        result = build(cls, graph, *args, device_type=native, **kwargs)
        if isinstance(result, (list, tuple)):  # a package's files
            rekey(p for p in result if isinstance(p, str) and p.endswith("_metadata.json"))
        else:  # the model's .so, its metadata beside it
            rekey(pathlib.Path(result).parent.glob("*_metadata.json"))
        config.aot_inductor.metadata["AOTI_DEVICE_KEY"] = flagos_type
        return result

    compile._flagos_device_type = device_type  # type: ignore[attr-defined]
    compiler.compile = classmethod(compile)  # type: ignore[method-assign, assignment]
    return ["inductor.codecache.AotCodeCompiler.compile"]


def replay_graphs_as_cuda(device_type: str) -> list[str]:
    """``mode="reduce-overhead"`` (``config.triton.cudagraphs``) replays graphs for ``device_type`` graphs, as
    Inductor replays CUDA graphs for cuda graphs (on either accelerator: the graphs are ``torch.flagos``'s).

    Inductor has no per-device hook for graph replay. Three places decide it for cuda only:
    - ``cudagraph_utils.check_multiple_devices_or_any_cpu_nodes`` gives a graph whose one device is not of
      type cuda the skip reason "multiple devices"; the wrapper answers "no reason" for one ``device_type``
      device (CPU nodes and several devices still give torch's reasons);
    - ``compile_fx.cudagraphify``, which ``output_code.cudagraph_post_compile`` and
      ``cudagraph_partition_post_compile`` look up when they wrap a graph (or each graph partition): the
      wrapper gives callables whose inputs or constants are ``device_type`` tensors a
      ``graph_replay.GraphRunner`` (``torch.flagos`` graphs), and every other callable torch's wrapping;
    - ``output_code.maybe_handle_backward_generation``, which tells the CUDA-graph trees' manager that a
      backward runs without graphs after a forward that ran with them: there is no such manager for
      ``device_type`` graphs, so the wrapper does nothing for them.
    Torch 2.13's ``config.cudagraph_policy`` replaces the wrapping for every device type at once (and
    changes how partitions are wrapped for cuda too), and the device check still rejects the graph; it is
    therefore not used. Returns the adapters installed; empty where this torch lacks one of the three, and
    then nothing is changed.
    """
    from torch._inductor import compile_fx, config, cudagraph_utils, output_code

    original_check = getattr(cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes", None)
    original_cudagraphify = getattr(compile_fx, "cudagraphify", None)
    original_backward = getattr(output_code, "maybe_handle_backward_generation", None)
    if original_check is None or original_cudagraphify is None or original_backward is None:
        return []
    names = [
        "inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes",
        "inductor.compile_fx.cudagraphify",
        "inductor.output_code.maybe_handle_backward_generation",
    ]
    if getattr(original_cudagraphify, "_flagos_device_type", None) == device_type:
        return names
    using_partition = getattr(cudagraph_utils, "is_using_cudagraph_partition", lambda: False)

    def check_multiple_devices_or_any_cpu_nodes(device_node_mapping):
        devices = [d for d in device_node_mapping if d.type != "meta"]
        if using_partition():  # partitions leave CPU nodes out of the graphs
            devices = [d for d in devices if d.type != "cpu"]
        if len(devices) == 1 and devices[0].type == device_type:
            return None
        return original_check(device_node_mapping)

    def cudagraphify(model, static_input_idxs=(), **kwargs):
        from torch_fl._compile import graph_replay

        torch_wrapped = original_cudagraphify(model, static_input_idxs, **kwargs)
        chosen = None

        def run(new_inputs):
            nonlocal chosen
            if chosen is None:
                if graph_replay.is_flagos_graph(new_inputs, kwargs.get("constants", ())):
                    mutated = kwargs.get("mutated_input_idxs")
                    chosen = graph_replay.GraphRunner(
                        model,
                        static_input_idxs,
                        # Where torch does not say which inputs the graph mutates, every copied input is
                        # copied back (correct, one copy more per input).
                        range(len(new_inputs)) if mutated is None else mutated,
                        kwargs.get("device_index", 0),
                        config.triton.cudagraph_unexpected_rerecord_limit,
                    )
                else:
                    chosen = torch_wrapped
            return chosen(new_inputs)

        return run

    def maybe_handle_backward_generation(compiled_graph, boxed_forward_device_index):
        if device_type in getattr(compiled_graph, "device_types", ()):
            return None
        return original_backward(compiled_graph, boxed_forward_device_index)

    cudagraphify._flagos_device_type = device_type  # type: ignore[attr-defined]
    for module, name, original, replacement in (
        (cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes", original_check,
         check_multiple_devices_or_any_cpu_nodes),
        (compile_fx, "cudagraphify", original_cudagraphify, cudagraphify),
        (output_code, "maybe_handle_backward_generation", original_backward, maybe_handle_backward_generation),
    ):  # fmt: skip
        replacement.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, name, replacement)
        _replace_in_inductor(name, original, replacement)
    return names


def partition_as_gpu(device_type: str) -> list[str]:
    """Graph partitions (``config.graph_partition``, torch's default) take ``device_type`` nodes as GPU nodes.

    With partitions, reduce-overhead wraps each partition rather than the graph, and
    ``Scheduler.should_partition`` keeps out of partitions every node whose ``is_gpu()`` is false (reason
    "<device> ops"): a graph of C++ kernels on flagos, whose type is not one of Inductor's GPU types, then
    has no partition and nothing is replayed. While ``should_partition`` runs, ``BaseSchedulerNode.is_gpu``
    answers true for ``device_type`` nodes, so they meet the checks GPU nodes meet (device copies, control
    flow, unbacked sizes, CUDA-graph-unsafe ops...); everywhere else (fusion, loop merging, zero-dim CPU
    scalars) it answers as before. Nothing is installed where ``device_type`` is a GPU type already.
    """
    import threading

    from torch._inductor import scheduler, utils

    scheduler_class = getattr(scheduler, "Scheduler", None)
    node_class = getattr(scheduler, "BaseSchedulerNode", None)
    original_partition = getattr(scheduler_class, "should_partition", None)
    original_is_gpu = getattr(node_class, "is_gpu", None)
    if original_partition is None or original_is_gpu is None or utils.is_gpu(device_type):
        return []
    names = ["inductor.scheduler.Scheduler.should_partition", "inductor.scheduler.BaseSchedulerNode.is_gpu"]
    if getattr(original_partition, "_flagos_device_type", None) == device_type:
        return names
    deciding = threading.local()

    def should_partition(self, node):
        depth = getattr(deciding, "depth", 0)  # should_partition recurses into fused nodes
        deciding.depth = depth + 1
        try:
            return original_partition(self, node)
        finally:
            deciding.depth = depth

    def is_gpu(self) -> bool:
        if getattr(deciding, "depth", 0):
            device = self.get_device()
            if device is not None and device.type == device_type:
                return True
        return original_is_gpu(self)

    should_partition._flagos_device_type = device_type  # type: ignore[attr-defined]
    for replacement, original in ((should_partition, original_partition), (is_gpu, original_is_gpu)):
        replacement.__wrapped__ = original  # type: ignore[attr-defined]
    scheduler_class.should_partition = should_partition
    node_class.is_gpu = is_gpu
    return names


def capturable_optimizer_state(device_type: str) -> list[str]:
    """A compiled optimizer step keeps its state on ``device_type``, as Dynamo keeps it on cuda.

    Before tracing an optimizer's first step, Dynamo sets ``capturable=True`` on each param group whose
    parameters are all cuda (or xpu) tensors and have no state yet (``OptimizerVariable._set_capturable``),
    so that the state, the ``step`` counters included, is created on the GPU; the traced code takes the
    capturable branch either way. For flagos parameters the flag stayed False, so the ``step`` counters were
    CPU tensors: the compiled step then had C++ kernels of its own (compiled with the host compiler) and
    GPU kernels reading CPU scalars. The wrapper sets the flag, under Dynamo's same conditions, for groups of
    ``device_type`` parameters (torch's optimizers support capturable state on the PrivateUse1 device), then
    runs Dynamo's own. It is installed with the device interface, which torch_fl registers when Dynamo is
    imported (``_compile._AfterImport``), before anything is traced.
    """
    try:
        from torch._dynamo.variables.optimizer import OptimizerVariable
    except ImportError:  # pragma: no cover
        return []
    original = getattr(OptimizerVariable, "_set_capturable", None)
    if original is None:
        return []
    names = ["dynamo.variables.optimizer.OptimizerVariable._set_capturable"]
    if getattr(original, "_flagos_device_type", None) == device_type:
        return names

    def _set_capturable(self, tx):
        state = getattr(self.value, "state", {})
        for group in getattr(self.value, "param_groups", ()):
            params = group.get("params", [])
            if (
                "capturable" in group
                and params
                and all(p.device.type == device_type and p not in state for p in params)
            ):
                group["capturable"] = True
        return original(self, tx)

    _set_capturable._flagos_device_type = device_type  # type: ignore[attr-defined]
    _set_capturable.__wrapped__ = original  # type: ignore[attr-defined]
    OptimizerVariable._set_capturable = _set_capturable
    return names
