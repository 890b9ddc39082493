"""Greedy decoding with a static KV cache, its decode step captured once in a graph and replayed per token.

Used by ``python -m examples.qwen3_demo --graphs`` and ``python -m benchmarks.qwen3 --graphs``. The step
(forward of one token at a position held in a device tensor, argmax, the token written to the output
buffer, the position advanced) touches only memory allocated before capture or by the capture itself, so
one ``replay()`` is all the host does per token. ``graphs=False`` runs the same step eagerly: the parity
reference.

The graph API is the device's own (``torch.flagos`` or ``torch.cuda``), so the same decoder measures
flagos against cuda.

``compile_step=True`` compiles the step with ``torch.compile`` (Inductor's default mode, no graphs of its own)
before capture: the graph then replays Inductor's fused kernels, with the ops Inductor leaves to ATen (``mm``)
routed as eager ones. That is what Hugging Face's static-cache ``generate`` does on cuda (compiled, CUDA
graphs by Inductor's ``reduce-overhead``), with one graph per step instead of Inductor's graph trees.
Compiled and eager steps may part at a near tie (fused arithmetic, and transformers' masking takes its
tracing path under compile), so a compiled graph run is compared with the compiled step run eagerly.
"""

from __future__ import annotations

import time

import torch


def _device_module(device: torch.device):
    return getattr(torch, device.type)


def _decode_step(model, token, position, slot, generated, cache) -> None:
    """One greedy step: the next token from ``token`` at ``position``, written to ``generated`` at ``slot + 1``
    and to ``token``; ``slot`` and ``position`` advanced. Device work only, nothing read back."""
    logits = model(
        input_ids=token,
        position_ids=position.view(1, 1).expand(token.shape[0], 1),
        past_key_values=cache,
        cache_position=position,
        use_cache=True,
    ).logits
    next_token = logits[:, -1:].argmax(-1)
    token.copy_(next_token)
    slot.add_(1)
    generated.index_copy_(1, slot, next_token)
    position.add_(1)


class StaticGreedyDecoder:
    """Greedy decoder of a Hugging Face causal LM with transformers' ``StaticCache``.

    ``generate(input_ids, new_tokens)`` returns the generated token ids (batch, new_tokens); prefill runs
    eagerly, each decode step by graph replay when ``graphs`` is true, compiled when ``compile_step`` is
    (once per decoder: a later call's new cache needs no recompilation).
    """

    def __init__(self, model, *, graphs: bool = True, warmup: int = 2, compile_step: bool = False):
        self.model = model
        self.graphs = graphs
        self.warmup = warmup
        self.graph = None
        self.decode_seconds = 0.0  # the last generate's decode loop (after prefill, warm-up and capture)
        self._step = (
            torch.compile(_decode_step, fullgraph=True, dynamic=False) if compile_step else _decode_step
        )

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        from transformers import StaticCache

        model, device = self.model, input_ids.device
        batch, prompt = input_ids.shape
        dm = _device_module(device)
        self.graph = None  # the last call's graph and its pool, before this call allocates
        cache = StaticCache(config=model.config, max_cache_len=prompt + new_tokens)

        out = model(
            input_ids=input_ids,
            past_key_values=cache,
            cache_position=torch.arange(prompt, device=device),
            use_cache=True,
        )
        token = out.logits[:, -1:].argmax(-1)
        del out
        position = torch.full((1,), prompt, dtype=torch.long, device=device)
        generated = torch.zeros(batch, new_tokens + 1, dtype=torch.long, device=device)
        generated[:, :1] = token
        slot = torch.zeros(1, dtype=torch.long, device=device)  # where the next token goes in `generated`

        def step():
            self._step(model, token, position, slot, generated, cache)

        if not self.graphs:
            dm.synchronize()
            start = time.perf_counter()
            for _ in range(new_tokens - 1):
                step()
            dm.synchronize()
            self.decode_seconds = time.perf_counter() - start
            return generated[:, :new_tokens].clone()

        # Warm up on the stream the capture then uses (lazy initialisation, autotuning, first-call
        # compilation, and per-stream state such as cuBLAS's workspace, which a capture would otherwise
        # allocate from the graph's pool and so pin the pool after the graph is gone), undoing what the
        # warm-up steps advanced; they wrote the cache at positions the replays overwrite.
        # transformers' StaticLayer keeps its own write position (cumulative_length) besides cache_position.
        counters = [
            c for c in (getattr(layer, "cumulative_length", None) for layer in cache.layers) if c is not None
        ]
        saved = (token.clone(), position.clone(), slot.clone(), [c.clone() for c in counters])
        side = dm.Stream()
        side.wait_stream(dm.current_stream())
        with dm.stream(side):
            for _ in range(self.warmup):
                step()
        dm.current_stream().wait_stream(side)
        token.copy_(saved[0])
        position.copy_(saved[1])
        slot.copy_(saved[2])
        for counter, value in zip(counters, saved[3], strict=True):
            counter.copy_(value)
        generated[:, 1:].zero_()

        graph_class = torch.flagos.FlagosGraph if device.type == "flagos" else torch.cuda.CUDAGraph
        graph = graph_class()
        with dm.graph(graph, stream=side):
            step()
        self.graph = graph  # kept for inspection; its pool holds the step's memory
        dm.synchronize()
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            graph.replay()
        dm.synchronize()
        self.decode_seconds = time.perf_counter() - start
        return generated[:, :new_tokens].clone()
