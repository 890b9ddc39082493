"""``python -m examples.qwen3_demo`` (from the repository's root; ``scripts/demo.sh`` runs it): a Qwen3 model
generating text on the flagos device, checked against the reference device.

It reports the environment (device, accelerator), builds Hugging Face's Qwen3ForCausalLM (random weights
from a fixed seed: the tiny shape on the simulated accelerator, Qwen3-0.6B's shape on a GPU; or a local
checkpoint with ``--model``), generates greedily on flagos and on the reference device (the CPU on the
simulated accelerator, CUDA on NVIDIA), checks that logits and token ids agree within the dtype's
tolerance, and prints tokens/s on both and how many operator calls each flagos backend served. Without a
tokenizer (random weights, or a checkpoint without one) the text is shown as token ids. With ``--graphs`` it
also decodes on flagos with a static KV cache twice, eagerly and by graph replay of the captured decode step
(``harness.static_decode``), checks that the token ids are equal and prints decode tokens/s of both. The
exit code is 1 when parity fails.
"""

from __future__ import annotations

import argparse
import sys
import time


def _progress(message: str) -> None:
    print(f"  .. {message}", flush=True)


class _Phase:
    """Prints what is being done, then how long it took."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        _progress(f"{self.what} ...")
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            _progress(f"{self.what}: done in {time.perf_counter() - self.start:.1f} s")


def _token_progress(label: str, total: int):
    """A transformers streamer printing generation progress, at most one line a second."""
    from transformers.generation.streamers import BaseStreamer

    class Progress(BaseStreamer):
        def __init__(self):
            self.seen = -1  # the first put() is the prompt
            self.start = self.last = time.perf_counter()

        def put(self, value):
            self.seen += 1
            now = time.perf_counter()
            if self.seen > 0 and now - self.last >= 1.0:
                self.last = now
                _progress(f"{label}: {self.seen}/{total} tokens, {now - self.start:.1f} s")

        def end(self):
            pass

    return Progress()


def _generate(model, ids, new_tokens: int, device: str, label: str):
    """Greedy generation on ``device``, and its seconds (the device's queued work waited for)."""
    import torch

    from harness import qwen3

    wait = getattr(torch, device).synchronize  # torch.flagos, torch.cuda or torch.cpu
    wait()
    start = time.perf_counter()
    out = qwen3.greedy_generate(
        model, ids, new_tokens, fixed_length=False, streamer=_token_progress(label, new_tokens)
    )
    wait()
    return out, time.perf_counter() - start


def _graph_decode(model, prompt, new_tokens: int) -> bool:
    """Static-cache greedy decode on flagos, eager and by graph replay: token ids equal, decode tokens/s."""
    import torch

    from harness.static_decode import StaticGreedyDecoder

    results = {}
    for name, graphs in (("eager", False), ("graphs", True)):
        decoder = StaticGreedyDecoder(model, graphs=graphs)
        try:
            with _Phase(f"static-cache decode on flagos, {name} (a warm-up run, then {new_tokens} tokens)"):
                decoder.generate(prompt, new_tokens)
                tokens = decoder.generate(prompt, new_tokens).cpu()
        except Exception as e:  # reported as a parity failure: e.g. an op that cannot be captured
            first_line = (str(e).splitlines() or [""])[0]
            print(f"  parity, graph replay: {name} decode FAILED: {type(e).__name__}: {first_line}")
            return False
        results[name] = tokens, (new_tokens - 1) / decoder.decode_seconds
    (eager, eager_rate), (replayed, graph_rate) = results["eager"], results["graphs"]
    same = int((eager == replayed).all(dim=0).sum())
    ok = torch.equal(eager, replayed)
    verdict = "OK" if ok else f"MISMATCH: graph replay gave {' '.join(str(i) for i in replayed[0].tolist())}"
    print(f"  parity, graph replay: token ids {same}/{eager.shape[1]} identical to eager's: {verdict}")
    print(
        f"  decode tokens/s (static cache, prefill excluded): eager {eager_rate:.1f}, graphs "
        f"{graph_rate:.1f} (graphs/eager {graph_rate / eager_rate:.2f})"
    )
    return ok


def run(args: argparse.Namespace) -> int:
    import torch

    import torch_fl
    from torch_fl.__main__ import report

    if args.threads:
        torch.set_num_threads(args.threads)
    if report() != 0:
        print("\nflagos has no usable device here; see the report above.")
        return 1
    try:
        import transformers
    except ImportError:
        print("\nThe demo needs Hugging Face transformers 5.x (scripts/install.sh installs it).")
        return 1
    from harness import qwen3

    reference = qwen3.reference_device()
    dtype = qwen3.parse_dtype(args.dtype, reference)
    shape = qwen3.default_shape(reference) if args.shape == "auto" else args.shape
    source = args.model or f"Qwen3 {shape} shape, random weights (seed {args.seed})"
    print(
        f"\nQwen3 on flagos ({torch_fl.accelerator()}) against {reference}; transformers "
        f"{transformers.__version__}, {torch.get_num_threads()} CPU threads"
    )
    print(f"  model: {source}, {str(dtype).replace('torch.', '')}")

    with _Phase("building the model on the CPU"):
        master = qwen3.build_model(shape, seed=args.seed, dtype=dtype, model_path=args.model)
    c = master.config
    params = sum(p.numel() for p in master.parameters())
    print(
        f"  {params / 1e6:.1f} M parameters: {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads} heads ({c.num_key_value_heads} KV), vocab {c.vocab_size}"
    )
    with _Phase(f"copying it to flagos and to {reference}"):
        on_flagos = qwen3.copy_to(master, "flagos")
        on_reference = qwen3.copy_to(master, reference)
        del master

    tokenizer = qwen3.load_tokenizer(args.model)
    if tokenizer is not None:
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids
        print(f"  prompt: {args.prompt!r} (the checkpoint's tokenizer)")
    else:
        g = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, c.vocab_size, (1, args.prompt_length), generator=g)
    print("  prompt ids: " + " ".join(str(i) for i in ids[0].tolist()))
    # Host -> device the way an input pipeline does it: pinned memory, a non-blocking copy.
    prompt = ids.pin_memory().to("flagos", non_blocking=True)
    prompt_ref = ids.to(reference)
    prompt_length = ids.shape[1]

    with _Phase("warming up both devices (2 tokens each)"):
        qwen3.greedy_generate(on_flagos, prompt, 2)
        qwen3.greedy_generate(on_reference, prompt_ref, 2)
    qwen3.reset_routing_counts()
    out, fl_seconds = _generate(on_flagos, prompt, args.new_tokens, "flagos", "generating on flagos")
    counts = qwen3.routing_counts()
    _progress(f"generated {out.sequences.shape[1] - prompt_length} tokens on flagos in {fl_seconds:.2f} s")
    ref_out, ref_seconds = _generate(
        on_reference, prompt_ref, args.new_tokens, reference, f"generating on {reference}"
    )
    _progress(
        f"generated {ref_out.sequences.shape[1] - prompt_length} tokens on {reference} in {ref_seconds:.2f} s"
    )

    tokens = out.sequences[0, prompt_length:].cpu()
    print("\n  flagos generated ids: " + " ".join(str(i) for i in tokens.tolist()))
    if tokenizer is not None:
        print(f"  flagos generated text: {tokenizer.decode(tokens)!r}")

    with _Phase("checking parity (logits of the whole sequence on both devices)"):
        divergence = qwen3.greedy_divergence(
            ref_out.sequences, out.sequences, ref_out.logits, prompt_length, dtype
        )
        full = ref_out.sequences.cpu()
        with torch.no_grad():
            expected = on_reference(full.to(reference)).logits
            actual = on_flagos(full.to("flagos")).logits
        logits = qwen3.compare_logits(actual, expected, dtype)
    same = 0
    if out.sequences.shape == ref_out.sequences.shape:  # with an end-of-sequence token lengths may differ
        same = int((out.sequences.cpu() == ref_out.sequences.cpu()).all(dim=0)[prompt_length:].sum())
    n_fl = out.sequences.shape[1] - prompt_length
    n_ref = ref_out.sequences.shape[1] - prompt_length
    ids_verdict = "OK" if divergence is None else f"MISMATCH: {divergence}"
    print(f"  parity, token ids: {same}/{n_ref} identical to {reference}'s: {ids_verdict}")
    print(f"  parity, logits:    {logits}")

    fl_rate, ref_rate = n_fl / fl_seconds, n_ref / ref_seconds
    print(
        f"  tokens/s (greedy generate, prefill included): flagos {fl_rate:.1f}, {reference} {ref_rate:.1f} "
        f"(flagos/{reference} {fl_rate / ref_rate:.2f})"
    )
    print(f"  op calls served on flagos during generate, by backend: {qwen3.format_counts(counts)}")
    print(f"  flagos memory: peak {torch.flagos.max_memory_allocated() / 2**20:.0f} MiB allocated")

    ok = divergence is None and logits.ok
    if args.graphs:
        ok = _graph_decode(on_flagos, prompt, args.new_tokens) and ok
    print(
        f"\ntorch_fl {torch_fl.__version__} on the '{torch_fl.accelerator()}' accelerator: {'OK' if ok else 'PARITY FAILED'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.qwen3_demo",
        description=__doc__.split("\n\n")[0].strip("`").replace("``", ""),
    )
    parser.add_argument(
        "--model", metavar="PATH", help="a local Hugging Face causal-LM directory (real weights)"
    )
    parser.add_argument(
        "--shape", choices=["auto", "tiny", "0.6b"], default="auto",
        help="random-weight Qwen3 shape without --model (auto: 0.6b on a GPU, tiny otherwise)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
        help="auto: bfloat16 on a GPU, float32 otherwise",
    )  # fmt: skip
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument(
        "--prompt-length", type=int, default=16, help="prompt length without a tokenizer (16)"
    )
    parser.add_argument(
        "--prompt",
        default="The flagos device runs PyTorch on many chips.",
        help="prompt text (with a tokenizer)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random weights and prompt (default 0)"
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for CPU work (default: torch's)")
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="also decode on flagos with a static KV cache, eagerly and by graph replay, and compare them",
    )
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or args.prompt_length < 1:
        parser.error("--new-tokens and --prompt-length must be at least 1")
    if args.graphs and args.new_tokens < 2:
        parser.error("--graphs needs --new-tokens of at least 2 (decode steps follow the prefill's token)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
