"""Graph replay of compiled flagos graphs: what ``mode="reduce-overhead"`` gives a flagos graph.

Inductor wraps each compiled graph (or each graph partition) whose device is a CUDA device in
``cudagraphify``, whose implementations (the CUDA-graph trees, and the simpler one without trees) use
``torch.cuda``'s graphs, streams and allocator pools and return cuda tensors. :class:`GraphRunner` is the
same wrapping for a flagos graph, built on ``torch.flagos``'s graph API (``FlagosGraph``: torch's CUDA graph
when flagos is backed by CUDA):

- the first call of each input signature runs the compiled code eagerly (the warm-up: Triton's first launch
  loads its kernels; cuBLAS sets up its handle), the second captures it on a side stream and replays it;
  later calls copy the inputs into the graph's input buffers and replay;
- inputs Inductor declares static (parameters, buffers, ``mark_static_address`` tensors such as a static KV
  cache) are used in place; the graph is recorded again when one of them is a different tensor than at
  capture (a new cache, reloaded weights), as the trees do, and at once: a warm-up is per signature, which
  leaves the static inputs' addresses out (the trees warm up each compiled graph once; Hugging Face's
  ``generate`` makes a new static cache per call, which would otherwise cost an eager step per call too);
  other tensor inputs are copied into buffers the graph owns (one ``_foreach_copy_`` per device, as the
  trees copy), and the buffers of inputs the graph mutates are copied back into the caller's tensors;
- outputs are returned as copies: a replay overwrites the graph's output memory, and a caller may keep an
  output past the next call (the trees detect such a use and raise; a copy per output keeps it right);
- the graphs of one compiled callable share one memory pool (the first graph's): sound because nothing in
  the pool outlives its own replay (outputs are copied out), and replays are ordered on the current stream.
  A pool lives as long as its graphs: one shared across callables would outlive the graphs of a callable
  Dynamo dropped, and torch's caching allocator refuses to capture into a pool whose graphs are gone.

An input signature is the shapes, strides and dtypes of the tensor inputs and the values of the integer
inputs (dynamic shapes); up to ``config.triton.cudagraph_unexpected_rerecord_limit`` graphs are recorded
per compiled graph, beyond which the compiled code runs without replay (with one warning). Recordings of one
signature for other static tensors do not count towards that limit: up to ``_STATIC_VARIANTS`` are kept, the
least recently used dropped (with its graph) beyond.

A replayed call costs the caller, beyond the replay itself: checking the copied inputs' shapes, strides and
dtypes and the static inputs' addresses against the last recording used (the addresses in one C++ call,
``torch._C._tensors_data_ptrs_at_indices_equal``, as the trees check them, where torch has it: its CUDA
builds; else one Python pass over precomputed indices, ~70 ns a static input), the copy-in (one
``_foreach_copy_``), and one copy per output. What a recording can lay out once, it does
(``benchmarks/graph_replay_overhead.py`` times the parts).
"""

from __future__ import annotations

import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torch_fl import _C

DEVICE_TYPE = "flagos"
# Recordings kept per input signature for different static tensors (addresses), the least recently used
# dropped beyond: they do not count towards the re-record limit (nor do they for the trees), and a model
# alternating between a few caches keeps a graph for each.
_STATIC_VARIANTS = 4
_ALIGNMENT = 16  # Inductor's kernels assume inputs aligned like this (compile_fx's check of static inputs)

# torch's CUDA builds compare data pointers at indices in C++ (the trees' check); CPU builds lack it.
_native_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_data_ptr = torch.Tensor.data_ptr

_streams = threading.local()  # the capture stream of each device, per thread (as the trees have one per tree)


def _capture_stream(device_index: int) -> torch.Stream:
    """The side stream recordings of this thread capture on for ``device_index``: one, not one per
    recording (each new stream would get a BLAS workspace of its own, and torch's pool hands out 32)."""
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    stream = streams.get(device_index)
    if stream is None:
        stream = streams[device_index] = torch.flagos.Stream(device=device_index)
    return stream


def _clear_blas_workspaces() -> None:
    """Before and after a recording, as the trees do (``clear_cublas_manager``), where flagos is backed by
    CUDA: cuBLAS keeps a workspace per handle and stream for the process's life. One first allocated inside
    a capture comes from the graph's pool, and would pin that pool's memory after the graph is gone (and be
    in use in two places once the pool reuses it). Cleared before, the capture allocates the workspace it
    needs in its pool, as any of its memory; cleared after, nothing but the graph holds it."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None and _C._backing_type() == "cuda":
        clear()


_stats_lock = threading.Lock()
_stats = {"recorded": 0, "replayed": 0, "eager": 0}


def stats() -> dict[str, int]:
    """How many flagos graphs compiled code recorded, how many replays ran and how many calls ran eagerly
    (warm-up calls and calls past the re-record limit), in this process."""
    with _stats_lock:
        return dict(_stats)


def _count(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def is_flagos_graph(inputs: Sequence[Any], constants: Sequence[Any]) -> bool:
    """Whether compiled code with these inputs and constants runs on flagos (Inductor checked that the graph
    has one device; its tensor inputs or constants say which)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == DEVICE_TYPE for t in (*inputs, *constants))


def _taker(idxs: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """``lambda xs: tuple(xs[i] for i in idxs)`` in one C call (``itemgetter`` of one index returns the item
    itself, of none fails)."""
    if len(idxs) > 1:
        return operator.itemgetter(*idxs)
    if len(idxs) == 1:
        (i,) = idxs
        return lambda xs: (xs[i],)
    return lambda xs: ()


def _signature(inputs: Sequence[Any]) -> tuple:
    """What a warm-up is for: the tensor inputs' shapes, strides and dtypes and the other inputs' values
    (integers for dynamic sizes). Static inputs' addresses are left out: a new tensor in a static input's
    place (a new KV cache) needs a recording of its own, not another warm-up."""
    parts = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            parts.append((tuple(x.shape), x.stride(), x.dtype))
        elif isinstance(x, torch.SymInt):
            parts.append(int(x))
        elif isinstance(x, (int, float, bool)):
            parts.append(x)
        else:
            parts.append(type(x).__name__)
    return tuple(parts)


def _expanded_index(x: torch.Tensor) -> tuple | None:
    """The index taking one element along the dimensions ``x`` has expanded (stride 0), or None when it has
    none. Such an input is copied through the index: its buffer has the same zero strides, and a full copy
    would write one element many times (one that overlaps itself is refused)."""
    index = tuple(
        0 if stride == 0 and size > 1 else slice(None)
        for size, stride in zip(x.shape, x.stride(), strict=True)
    )
    return index if any(isinstance(i, int) for i in index) else None


class _Recording:
    """One captured graph with its input buffers and output memory, and the inputs it was captured for.

    Everything a replayed call checks or copies is laid out here once, as index lists and the tuples they
    select, so that a call does no Python work per static input beyond reading its address."""

    def __init__(
        self,
        model: Callable,
        inputs: list[Any],
        static_idxs: list[int],
        mutated_idxs: Sequence[int],
        device_index: int,
        pool: tuple[int, int] | None,
    ):
        static = frozenset(static_idxs)
        self.signature: tuple = ()  # the GraphRunner's _signature of the inputs, which it sets
        self.count = len(inputs)
        self.static_idxs = list(static_idxs)
        # Indexed like the inputs, for torch's C++ check (it compares ptrs[i] with inputs[i], i in static_idxs).
        self.static_ptrs = [inputs[i].data_ptr() if i in static else None for i in range(len(inputs))]
        # In static_idxs' order, for the Python check: one list comparison.
        self.static_ptr_list = [inputs[i].data_ptr() for i in self.static_idxs]
        self.take_static = _taker(self.static_idxs)
        self.copy_idxs = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and i not in static]
        self.copy_meta = [(i, inputs[i].shape, inputs[i].stride(), inputs[i].dtype) for i in self.copy_idxs]
        self.values = [(i, x) for i, x in enumerate(inputs) if not isinstance(x, torch.Tensor)]
        self.copy_back_idxs = [i for i in mutated_idxs if i in self.copy_idxs]
        # Buffers with the inputs' strides (expanded inputs keep their zero strides: one element copied).
        self.buffers: list[Any] = list(inputs)
        for i in self.copy_idxs:
            x = inputs[i]
            self.buffers[i] = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        # Copy-in plan: one _foreach_copy_ per device (one op for the step's few copied inputs, as the trees'
        # _copy_inputs_and_remove_from_src; a foreach op takes tensors of one device: the graph's, or the
        # CPU for a CPU scalar), and expanded inputs one by one through their index.
        by_device: dict[torch.device, list[int]] = {}
        self.expanded_copies: list[tuple[int, tuple]] = []
        for i in self.copy_idxs:
            index = _expanded_index(inputs[i])
            if index is None:
                by_device.setdefault(inputs[i].device, []).append(i)
            else:
                self.expanded_copies.append((i, index))
        self.foreach_copies = [([self.buffers[i] for i in idxs], _taker(idxs)) for idxs in by_device.values()]
        self._copy_in(inputs)
        current = torch.flagos.current_stream()
        capture_stream = _capture_stream(device_index)
        capture_stream.wait_stream(current)
        self.graph = torch.flagos.FlagosGraph()
        _clear_blas_workspaces()
        try:
            with torch.flagos.graph(
                self.graph, pool=pool, stream=capture_stream, capture_error_mode="thread_local"
            ):
                outputs = model(list(self.buffers))  # Inductor's callables clear the list they are given
        finally:
            _clear_blas_workspaces()
        self.output_is_sequence = isinstance(outputs, (list, tuple))
        self.outputs = list(outputs) if self.output_is_sequence else [outputs]
        current.wait_stream(capture_stream)
        # The graph reads static inputs at their addresses; holding them would keep, say, every static KV
        # cache a recording ever saw alive. A later tensor at the same address is the one to read.
        for i in self.static_idxs:
            self.buffers[i] = None

    def matches(self, inputs: Sequence[Any]) -> bool:
        if len(inputs) != self.count:
            return False
        for i, shape, stride, dtype in self.copy_meta:
            x = inputs[i]
            if (
                not isinstance(x, torch.Tensor)
                or x.shape != shape
                or x.stride() != stride
                or x.dtype != dtype
            ):
                return False
        for i, value in self.values:
            if inputs[i] != value:
                return False
        try:
            if _native_ptrs_equal is not None:
                return _native_ptrs_equal(inputs, self.static_ptrs, self.static_idxs)
            return list(map(_data_ptr, self.take_static(inputs))) == self.static_ptr_list
        except (TypeError, AttributeError, RuntimeError):
            # Not a tensor where the recording had a static one (pybind's cast error is a RuntimeError).
            return False

    def _copy_in(self, inputs: Sequence[Any]) -> None:
        for buffers, take in self.foreach_copies:
            torch._foreach_copy_(buffers, take(inputs))
        for i, index in self.expanded_copies:
            self.buffers[i][index].copy_(inputs[i][index])

    def run(self, inputs: list[Any]) -> Any:
        self._copy_in(inputs)
        self.graph.replay()
        for i in self.copy_back_idxs:
            inputs[i].copy_(self.buffers[i])
        results = [_output_copy(o) if isinstance(o, torch.Tensor) else o for o in self.outputs]
        return results if self.output_is_sequence else results[0]


_COPY_MARK = "_flagos_graph_output"


def _output_copy(output: torch.Tensor) -> torch.Tensor:
    """A replay's output, copied out and marked: Inductor declares a backward graph's saved tensors static
    (the trees keep them at fixed addresses in their pool), but the forward's copies are new tensors every
    step, so a backward runner copies marked inputs into its buffers instead of recording again per step."""
    copy = output.clone(memory_format=torch.preserve_format)
    setattr(copy, _COPY_MARK, True)
    return copy


class GraphRunner:
    """A compiled flagos callable (Inductor's boxed calling convention: one list of inputs, cleared by the
    call) replayed as flagos graphs, one per input signature."""

    def __init__(
        self,
        model: Callable,
        static_input_idxs: Sequence[int],
        mutated_input_idxs: Sequence[int],
        device_index: int,
        rerecord_limit: int,
    ):
        self.model = model
        self.static_input_idxs = sorted(set(static_input_idxs))
        self.mutated_input_idxs = tuple(mutated_input_idxs)
        self.device_index = device_index
        self.rerecord_limit = rerecord_limit
        self.recordings: list[_Recording] = []  # the last one used first
        self.warmed_up: set[tuple] = set()
        self.uncapturable: set[tuple] = set()  # signatures whose capture failed
        self.warned = False
        self.lock = threading.Lock()

    def _static_idxs(self, inputs: Sequence[Any]) -> list[int]:
        # Copied like any other input: a static input that is not aligned as Inductor's kernels assume, and
        # one that is another graph's copied-out output (a new tensor each call: _output_copy).
        return [
            i
            for i in self.static_input_idxs
            if i < len(inputs)
            and isinstance(inputs[i], torch.Tensor)
            and inputs[i].data_ptr() % _ALIGNMENT == 0
            and not getattr(inputs[i], _COPY_MARK, False)
        ]

    def _find(self, inputs: Sequence[Any]) -> _Recording | None:
        for n, recording in enumerate(self.recordings):
            if recording.matches(inputs):
                if n:
                    self.recordings.insert(0, self.recordings.pop(n))
                return recording
        return None

    def __call__(self, inputs: list[Any]) -> Any:
        with self.lock:
            return self._call(inputs)

    def _call(self, inputs: list[Any]) -> Any:
        if torch.flagos.is_current_stream_capturing():
            # Inside the caller's own capture the compiled code is captured with the rest of it.
            _count("eager")
            return self.model(inputs)
        recording = self._find(inputs)
        if recording is None:
            key = _signature(inputs)
            variants = [r for r in self.recordings if r.signature == key]
            signatures = len({r.signature for r in self.recordings}) + (not variants)
            if key not in self.warmed_up or signatures > self.rerecord_limit:
                # The first call of a signature warms up; past the limit a signature runs without replay.
                if key in self.warmed_up:
                    self._warn_limit()
                elif len(self.warmed_up) > 4 * self.rerecord_limit:
                    self.warmed_up.clear()
                self.warmed_up.add(key)
                _count("eager")
                return self.model(inputs)
            if key in self.uncapturable:
                _count("eager")
                return self.model(inputs)
            static_idxs = self._static_idxs(inputs)
            pool = self.recordings[-1].graph.pool() if self.recordings else None
            try:
                recording = _Recording(
                    self.model, inputs, static_idxs, self.mutated_input_idxs, self.device_index, pool
                )
            except Exception as error:  # the capture failed: nothing ran; this signature runs eagerly
                self.uncapturable.add(key)
                warnings.warn(
                    f"torch.compile on '{DEVICE_TYPE}': a compiled graph could not be captured for replay "
                    f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                    "it runs without graph replay for these inputs",
                    stacklevel=3,
                )
                _count("eager")
                return self.model(inputs)
            recording.signature = key
            self.recordings.insert(0, recording)
            if len(variants) >= _STATIC_VARIANTS:
                # A signature's recordings for other static tensors (say, an earlier call's KV cache, which
                # Hugging Face makes anew per generate): the least recently used goes with its graph.
                self.recordings.remove(variants[-1])
            _count("recorded")
        _count("replayed")
        result = recording.run(inputs)
        inputs.clear()
        return result

    def _warn_limit(self) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"torch.compile on '{DEVICE_TYPE}': a compiled graph was recorded for "
                f"{self.rerecord_limit} input signatures (shapes, strides, dtypes or integer inputs); "
                "further signatures run without graph replay "
                "(torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit)",
                stacklevel=3,
            )
