"""What reduce-overhead's graph replay on flagos costs per call beyond the replay itself.

``torch_fl/_compile/graph_replay.py``'s ``GraphRunner`` wraps each compiled flagos graph: per call it checks
the inputs against its recordings, copies the non-static inputs into the graph's buffers, replays, and
copies the outputs out. This times, in the same process and on the same recorded graph, a ``GraphRunner``
call (with a fresh input list each call, as Inductor passes one) against the bare ``FlagosGraph.replay()``
of its recording, with an input list like a decoding step of Qwen3 under Hugging Face's ``generate``
(``cache_implementation="static"``): per layer 11 parameters, the layer's key and value caches and its cache
length (``mark_static_address``), plus the embedding, the final norm and the rotary frequencies, all static
inputs; copied inputs: the input ids, the position ids and the attention mask; one output, the last
position's logits. At Qwen3-0.6B's shape (``--layers 28``, the default) that is 395 static inputs and a
1x1x151936 bfloat16 output. The graph itself is tiny (one add into the logits): what it replays is not
what is measured. Each loop of ``--n`` calls ends with one synchronize; ``--repeats`` rounds alternate which
of the two goes first, and medians are printed: microseconds per call, the ratio, the difference, and the
difference split into the call's parts (each timed alone in a loop of its own: matching the recording,
copying the inputs in, the copy of the output, the capture check; the rest is the runner's bookkeeping).

``--generate N``: also the counts behind one generated token of the tiny Qwen3 (``harness.qwen3``),
greedy ``generate`` with a static cache and its decoding step compiled in reduce-overhead mode
(``CompileConfig`` with ``_compile_all_devices``, as ``benchmarks/qwen3.py --compile`` decodes): three
``generate`` calls of N new tokens; for each, GraphRunner calls, recordings, replays and calls without
replay, and Dynamo's graph breaks and recompiles. A token should take one replay and, after the first
call's warm-up, nothing else; each call's new static cache takes one recording.

    python -m benchmarks.graph_replay_overhead [--layers 28] [--cache-length 48] [--n 2000] [--repeats 7]
                                               [--generate 8] [--json [FILE]]

Records (``--json``): the runner's call over the bare replay (median of the rounds' ratios, their range)
and the microseconds it adds.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import torch_fl  # noqa: F401  (registers the flagos device)
from benchmarks import records
from benchmarks.common import Ratio, median, ratios, round_order
from torch_fl._compile import graph_replay

DEVICE = "flagos"
VOCAB = 151936  # Qwen3's vocabulary: the logits output


def decode_step_inputs(layers: int, cache_length: int) -> tuple[list, list[int]]:
    """A decoding step's input list (copied inputs first, then the static ones) and the static indices.
    Parameters are small: their sizes change nothing the runner does per call."""
    ids = torch.zeros(1, 1, dtype=torch.int64, device=DEVICE)
    positions = torch.zeros(1, 1, dtype=torch.int64, device=DEVICE)
    mask = torch.ones(1, 1, 1, cache_length, dtype=torch.bool, device=DEVICE)
    logits_base = torch.zeros(1, 1, VOCAB, dtype=torch.bfloat16, device=DEVICE)  # stands for the embedding
    static = [logits_base]
    for _ in range(layers):
        static += [torch.zeros(64, dtype=torch.bfloat16, device=DEVICE) for _ in range(11)]
        static += [
            torch.zeros(1, 8, cache_length, 128, dtype=torch.bfloat16, device=DEVICE) for _ in range(2)
        ]
        static.append(torch.zeros((), dtype=torch.int64, device=DEVICE))  # the layer's cache length
    static += [torch.zeros(64, dtype=torch.bfloat16, device=DEVICE), torch.zeros(64, device=DEVICE)]
    inputs = [ids, positions, mask, *static]
    return inputs, list(range(3, len(inputs)))


def step(inputs: list) -> list:
    """The compiled step stand-in, in Inductor's boxed convention (it clears its input list)."""
    ids, _, _, logits_base = inputs[:4]
    inputs.clear()
    return [logits_base + ids.to(torch.bfloat16)]


def per_call_us(fn, n: int) -> float:
    torch.flagos.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.flagos.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def overhead(args, rec: records.Recorder) -> None:
    inputs, static_idxs = decode_step_inputs(args.layers, args.cache_length)
    runner = graph_replay.GraphRunner(step, static_idxs, (), torch.flagos.current_device(), 8)
    for _ in range(3):  # warm-up, recording, one replay
        runner(list(inputs))
    (recording,) = runner.recordings
    output = recording.outputs[0]
    cases = {
        "GraphRunner call": lambda: runner(list(inputs)),
        "bare replay": recording.graph.replay,
    }
    parts = {
        "match": lambda: recording.matches(inputs),
        "copy in": lambda: recording._copy_in(inputs),
        "output copy": lambda: graph_replay._output_copy(output),
        "capture check": torch.flagos.is_current_stream_capturing,
    }
    times: dict[str, list[float]] = {name: [] for name in (*cases, *parts)}
    for r in range(args.repeats):
        for name in round_order(list(cases), r):
            times[name].append(per_call_us(cases[name], args.n))
        for name, fn in parts.items():  # each alone, after the two cases of the round
            times[name].append(per_call_us(fn, args.n))
    med = {name: median(values) for name, values in times.items()}
    summary = Ratio.of(ratios(times["GraphRunner call"], times["bare replay"]))
    native = graph_replay._native_ptrs_equal is not None
    print(
        f"torch {torch.__version__}, accelerator {torch_fl._C._backing_type() or 'sim'}, "
        f"{len(inputs)} inputs ({len(static_idxs)} static, checked in {'C++' if native else 'Python'}), "
        f"output 1x1x{VOCAB} bf16, N={args.n}, repeats={args.repeats}"
    )
    runner_us, replay_us = med["GraphRunner call"], med["bare replay"]
    print(f"{'GraphRunner call':18} {runner_us:8.1f} us")
    print(f"{'bare replay':18} {replay_us:8.1f} us")
    print(f"ratio {summary.text()}, difference {runner_us - replay_us:.1f} us, of it:")
    accounted = 0.0
    for name in parts:
        accounted += med[name]
        print(f"  {name:16} {med[name]:8.1f} us")
    print(f"  {'the rest':16} {runner_us - replay_us - accounted:8.1f} us")
    shape = f"{len(inputs)} inputs ({len(static_idxs)} static)"
    rec.add(
        "runner_time_ratio",
        summary.median,
        "time ratio",
        range=summary.range,
        detail=f"a GraphRunner call of a decode step's graph, {shape}, against its bare replay",
        baseline="bare replay",
    )
    rec.add(
        "runner_added_us",
        runner_us - replay_us,
        "us added",
        detail=f"a GraphRunner call, {shape}: time it adds to the bare replay",
        baseline="bare replay",
    )


def generate_counts(new_tokens: int) -> None:
    import torch._dynamo.utils as dynamo_utils
    from transformers import CompileConfig

    from harness import qwen3

    model = qwen3.copy_to(qwen3.build_model("tiny"), DEVICE)
    prompt = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    calls = [0]
    original = graph_replay.GraphRunner.__call__

    def counted(self, inputs):
        calls[0] += 1
        return original(self, inputs)

    graph_replay.GraphRunner.__call__ = counted
    try:
        print(f"tiny Qwen3, generate of {new_tokens} new tokens ({new_tokens - 1} compiled decoding steps):")
        for n in range(3):
            config = CompileConfig(mode="reduce-overhead")
            config._compile_all_devices = True
            stats, before = graph_replay.stats(), calls[0]
            dynamo = {k: sum(dynamo_utils.counters[k].values()) for k in ("graph_break", "recompiles")}
            qwen3.greedy_generate(
                model, prompt, new_tokens, cache_implementation="static", compile_config=config
            )
            after = graph_replay.stats()
            counts = {k: after[k] - stats[k] for k in after}
            dynamo = {k: sum(dynamo_utils.counters[k].values()) - v for k, v in dynamo.items()}
            print(
                f"  call {n + 1}: GraphRunner calls {calls[0] - before}, recorded {counts['recorded']}, "
                f"replayed {counts['replayed']}, without replay {counts['eager']}; "
                f"graph breaks {dynamo['graph_break']}, recompiles {dynamo['recompiles']}"
            )
    finally:
        graph_replay.GraphRunner.__call__ = original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (28: Qwen3-0.6B)")
    parser.add_argument("--cache-length", type=int, default=48, help="the static cache's length")
    parser.add_argument("--n", type=int, default=2000, help="calls per loop")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--generate", type=int, default=0, help="also count a tiny Qwen3 generate's calls")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    torch.set_num_threads(args.threads)
    with torch.no_grad():
        overhead(args, rec)
    if args.generate:
        generate_counts(args.generate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
