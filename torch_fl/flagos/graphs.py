"""Graphs on flagos: ``torch.flagos.FlagosGraph``, ``graph``, ``graph_pool_handle``,
``is_current_stream_capturing`` and ``make_graphed_callables``, named and behaving as ``torch.cuda``'s.

Backed by CUDA a flagos graph is torch's CUDA graph (capture of the CUDA stream that is flagos's current
stream, a private pool in torch's CUDA caching allocator); on the simulated accelerator it records the
operators issued to the capturing stream and replays them on the same memory. See docs/graphs.md.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from torch_fl import _C

from ._utils import _lazy_init

_CAPTURE_ERROR_MODES = ("default", "global", "thread_local", "relaxed")


def graph_pool_handle() -> tuple[int, int]:
    """An opaque pool id: pass it as ``pool=`` to several captures to make their graphs share memory."""
    _lazy_init()
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """True while the current flagos stream of the current device is capturing a graph."""
    if not _C._is_initialized():
        return False
    # The stream's id and device, without the Stream object current_stream() builds (a few us; compiled
    # code replayed as graphs asks on every call).
    stream_id, device_index, _ = _C._get_current_stream(-1)  # -1: the current device
    return _C._is_stream_capturing(stream_id, device_index)


class FlagosGraph(_C._FlagosGraph):
    """A flagos graph: capture the work issued to a stream once, replay it with one call.

    Arguments:
        keep_graph: keep the captured graph after ``capture_end`` (backed by CUDA: do not instantiate it
            until ``instantiate()`` or the first ``replay()``).
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def capture_begin(self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global") -> None:
        """Begin capturing the work issued to the current stream (not the default stream).

        Use the ``graph`` context manager instead where you can: it picks a side stream, synchronises and
        empties the cache first, as capture requires.
        """
        _check_capture_error_mode(capture_error_mode)
        _lazy_init()
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    def capture_end(self) -> None:
        super().capture_end()

    def instantiate(self) -> None:
        super().instantiate()

    def replay(self) -> None:
        """Replay the captured work on the current stream."""
        super().replay()

    def reset(self) -> None:
        """Drop the captured graph and give its pool back; the instance can capture again."""
        super().reset()

    def pool(self) -> tuple[int, int]:
        """The graph's pool id, to share with another capture (``pool=graph.pool()``)."""
        return super().pool()

    def enable_debug_mode(self) -> None:
        super().enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        super().debug_dump(debug_path)

    def register_generator_state(self, generator: torch.Generator) -> None:
        """Make random ops drawing from ``generator`` (a flagos generator) give fresh numbers per replay.

        The device's default generator is registered by every capture; register the ones you create.
        """
        super().register_generator_state(generator)


Graph = FlagosGraph


def _check_capture_error_mode(mode: str) -> None:
    if mode not in _CAPTURE_ERROR_MODES:
        raise ValueError(f"capture_error_mode must be one of {_CAPTURE_ERROR_MODES}, got {mode!r}")


class graph:
    """Context manager that captures the flagos work of its body into ``flagos_graph``.

    As ``torch.cuda.graph``: it synchronises the device, empties the cache (and collects garbage first where
    ``torch.compiler.config.force_cudagraph_gc`` is set), then captures on ``stream`` (by default a side
    stream of the current device: graphs cannot be captured on the default stream). Warm the captured code up on a side stream first (a few eager iterations), so that
    lazy initialisation, autotuning and first-call compilation do not happen under capture.

    Arguments:
        flagos_graph: the ``FlagosGraph`` to capture into.
        pool: a pool id (``graph_pool_handle()`` or ``other_graph.pool()``) to share memory with.
        stream: the stream to capture on.
        capture_error_mode: "global" (default), "thread_local" or "relaxed", as ``torch.cuda.graph``.
    """

    _default_capture_streams: dict[int, torch.Stream] = {}

    def __init__(
        self,
        flagos_graph: FlagosGraph,
        pool: tuple[int, int] | None = None,
        stream: torch.Stream | None = None,
        capture_error_mode: str = "global",
    ):
        _check_capture_error_mode(capture_error_mode)
        _lazy_init()
        if stream is None:
            index = torch.flagos.current_device()
            stream = graph._default_capture_streams.get(index)
            if stream is None:
                stream = torch.flagos.Stream(device=index)
                graph._default_capture_streams[index] = stream
        self.flagos_graph = flagos_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = torch.flagos.stream(stream)

    def __enter__(self) -> None:
        torch.flagos.synchronize()
        # As torch.cuda.graph: a garbage collection per capture only where asked for. It can take most of
        # a second in a process holding a model and Inductor's state, and compiled code in
        # reduce-overhead mode records a graph whenever a static input moves (a new static KV cache).
        if getattr(torch.compiler.config, "force_cudagraph_gc", False):
            gc.collect()
        torch.flagos.empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.flagos_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            self.flagos_graph.capture_end()
        finally:
            self._stream_ctx.__exit__(*exc)


def make_graphed_callables(
    callables: Any,
    sample_args: tuple,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: tuple[int, int] | None = None,
) -> Any:
    """Graphed versions of callables (functions or ``nn.Module``s), forward and backward captured.

    As ``torch.cuda.make_graphed_callables``: each callable's forward pass is captured in one graph and its
    backward pass in another; the returned callables run them through autograd. ``sample_args`` gives one
    tuple of flagos tensors per callable; the graphed callables must then be called with arguments of the
    same shapes, dtypes and ``requires_grad`` (a mismatch raises). Modules keep their eager forward when their
    ``training`` state differs from the one at capture.

    The gradients the backward pass hands to autograd are copies of the backward graph's static gradients,
    so that ``.grad`` accumulates as in eager mode (over micro-batches, or after ``zero_grad(set_to_none=
    False)``) and a gradient kept from one step is not overwritten by the next replay. The outputs are the
    forward graph's memory, which the next call overwrites; each forward must be followed by its backward
    before the callable runs forward again (its saved activations are the graph's too), else the backward
    raises.
    """
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables does not support the autocast caching. Please set `cache_enabled=False`."
        )
    just_one = False
    if not isinstance(callables, tuple):
        just_one = True
        callables = (callables,)
        sample_args = (sample_args,)

    flat_samples = []
    for c, args in zip(callables, sample_args, strict=True):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise RuntimeError("Modules must not have hooks registered at the time they are passed.")
            if any(b.requires_grad for b in c.buffers()):
                raise RuntimeError(
                    "In any callable passed to make_graphed_callables, buffers must have requires_grad=False."
                )
        flat, _ = tree_flatten(args)
        if not all(isinstance(a, torch.Tensor) for a in flat):
            raise TypeError("make_graphed_callables: sample_args must contain only tensors")
        flat_samples.append(tuple(flat))

    # Static inputs: the user's arguments followed by the module's parameters (whose grads backward makes).
    params = [tuple(c.parameters()) if isinstance(c, torch.nn.Module) else () for c in callables]
    static_inputs = [flat_samples[i] + params[i] for i in range(len(callables))]
    needs_grad = [tuple(t.requires_grad for t in inputs) for inputs in static_inputs]

    mempool = graph_pool_handle() if pool is None else pool
    fwd_graphs = [FlagosGraph() for _ in callables]
    bwd_graphs = [FlagosGraph() for _ in callables]

    torch.flagos.synchronize()
    side = torch.flagos.Stream()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):
        for func, args, inputs, grads in zip(callables, sample_args, static_inputs, needs_grad, strict=True):
            for _ in range(num_warmup_iters):
                outputs, _ = tree_flatten(func(*args))
                outputs = tuple(o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad)
                grad_inputs = tuple(i for i, g in zip(inputs, grads, strict=True) if g)
                if outputs and grad_inputs:
                    torch.autograd.grad(
                        outputs,
                        grad_inputs,
                        grad_outputs=tuple(torch.empty_like(o) for o in outputs),
                        only_inputs=True,
                        allow_unused=allow_unused_input,
                    )
                del outputs
    torch.flagos.current_stream().wait_stream(side)
    torch.flagos.synchronize()

    # Forward graphs, in order, then backward graphs in reverse order, all in one pool.
    static_outputs, output_specs = [], []
    for func, args, fwd in zip(callables, sample_args, fwd_graphs, strict=True):
        with graph(fwd, pool=mempool):
            out = func(*args)
        flat_out, spec = tree_flatten(out)
        static_outputs.append(tuple(flat_out))
        output_specs.append(spec)

    static_grad_outputs, static_grad_inputs = [None] * len(callables), [None] * len(callables)
    for i in reversed(range(len(callables))):
        outs_needing_grad = tuple(
            o for o in static_outputs[i] if isinstance(o, torch.Tensor) and o.requires_grad
        )
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outputs[i])
        inputs_needing_grad = tuple(t for t, g in zip(static_inputs[i], needs_grad[i], strict=True) if g)
        with graph(bwd_graphs[i], pool=mempool):
            grads = (
                torch.autograd.grad(
                    outs_needing_grad,
                    inputs_needing_grad,
                    grad_outputs=tuple(g for g in grad_outs if g is not None),
                    only_inputs=True,
                    allow_unused=allow_unused_input,
                )
                if outs_needing_grad and inputs_needing_grad
                else ()
            )
        it = iter(grads)
        static_grad_inputs[i] = tuple(next(it) if g else None for g in needs_grad[i])
        static_grad_outputs[i] = grad_outs

    # The captures' autograd graphs are not needed past the backward capture: keep the outputs' memory only.
    # (Kept, they would hold on to the parameters' AccumulateGrad nodes made on the capture stream, which
    # autograd would then reuse for every training step, with a synchronisation of the two streams.)
    static_outputs = [
        tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs) for outs in static_outputs
    ]

    def make_function(i: int) -> Callable:
        fwd, bwd = fwd_graphs[i], bwd_graphs[i]
        samples = flat_samples[i]
        forward_replays = 0  # of fwd: a backward must follow the forward whose activations the graph holds

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                nonlocal forward_replays
                for static, given in zip(
                    static_inputs[i][: len(samples)], inputs[: len(samples)], strict=True
                ):
                    if static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                fwd.replay()
                forward_replays += 1
                ctx.forward_replay = forward_replays
                return tuple(o.detach() for o in static_outputs[i])

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                if ctx.forward_replay != forward_replays:
                    raise RuntimeError(
                        "make_graphed_callables: the graphed callable ran forward again before this backward; "
                        "its saved activations are the graph's memory, which that forward overwrote. Run each "
                        "forward's backward before the next forward."
                    )
                for static, given in zip(static_grad_outputs[i], grads, strict=True):
                    if static is not None and given is not None and static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                bwd.replay()
                # Copies, not the static gradients themselves: autograd makes a gradient it holds the only
                # reference to a leaf's .grad (a detached static gradient would be one), and adds into a
                # .grad in place, so the next replay would overwrite .grad, and a .grad aliasing the static
                # gradient would be doubled by its own accumulation.
                return tuple(g.clone() if g is not None else None for g in static_grad_inputs[i])

        def functionalized(*user_args):
            flat, _ = tree_flatten(user_args)
            _check_graphed_arguments(flat, samples)
            out = Graphed.apply(*(tuple(flat) + params[i]))
            return tree_unflatten(list(out), output_specs[i])

        return functionalized

    results = []
    for i, func in enumerate(callables):
        graphed = make_function(i)
        if isinstance(func, torch.nn.Module):

            def make_forward(module, training, graphed, eager):
                def forward(*args, **kwargs):
                    if module.training == training:
                        return graphed(*args, **kwargs)
                    return eager(*args, **kwargs)

                return forward

            func.forward = make_forward(func, func.training, graphed, func.forward)
            results.append(func)
        else:
            results.append(graphed)
    return results[0] if just_one else tuple(results)


def _check_graphed_arguments(given: list, samples: tuple) -> None:
    """The arguments of a graphed callable against its sample arguments: a graph reads them by copying them
    into the samples' memory, which would broadcast or convert what does not match."""
    if len(given) != len(samples):
        raise TypeError(
            f"make_graphed_callables: the graphed callable takes {len(samples)} tensors, got {len(given)}"
        )
    for k, (arg, sample) in enumerate(zip(given, samples, strict=True)):
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"make_graphed_callables: argument {k} is a {type(arg).__name__}, not a tensor")
        if arg.shape != sample.shape or arg.dtype != sample.dtype:
            raise ValueError(
                f"make_graphed_callables: argument {k} is {tuple(arg.shape)} {arg.dtype}; the graph was "
                f"captured for {tuple(sample.shape)} {sample.dtype}"
            )
        if arg.requires_grad and not sample.requires_grad:
            raise ValueError(
                f"make_graphed_callables: argument {k} requires grad, but its sample did not: the backward graph "
                "computes no gradient for it. Capture with a sample that requires grad."
            )
