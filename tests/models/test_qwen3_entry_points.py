"""The Qwen3 entry points: ``python -m examples.qwen3_demo`` and ``python -m benchmarks.qwen3``, with random
weights and with ``--model`` on a checkpoint saved here."""

from __future__ import annotations

import re

import pytest
import torch

import harness.processes
import harness.qwen3

pytest.importorskip("transformers", minversion="5.0")

TIMEOUT_S = 900  # the 0.6b shape builds and runs the full-size model


def _ids(stdout: str, label: str) -> list[int]:
    lines = [line for line in stdout.splitlines() if line.strip().startswith(label)]
    assert len(lines) == 1, f"expected one '{label}' line in\n{stdout}"
    return [int(tok) for tok in lines[0].split(":", 1)[1].split()]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, qwen3):
    """A Qwen3 checkpoint of the test shape (seed 7, unlike the demo's default 0) with a word-level
    tokenizer ("w0" .. "w<vocab-1>"), built here: nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("qwen3-checkpoint")
    model = harness.qwen3.build_model(qwen3.shape, seed=7, dtype=qwen3.dtype)
    model.save_pretrained(path)
    vocab = {f"w{i}": i for i in range(model.config.vocab_size)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0").save_pretrained(path)
    return path


def test_demo(run_python, qwen3):
    result = run_python(
        "", args=["-m", "examples.qwen3_demo", "--shape", qwen3.shape, "--new-tokens", "8"], timeout=TIMEOUT_S
    )
    assert result.returncode == 0, repr(result)
    out = result.stdout
    assert "accelerator" in out and "HAL library" in out, "the demo starts with torch_fl's environment report"
    assert re.search(r"parity, token ids: 8/8 identical to \w+'s: OK", out), out
    assert re.search(r"parity, logits: .*: OK", out), out
    assert re.search(r"tokens/s .*: flagos [\d.]+, (cpu|cuda) [\d.]+", out), out
    assert "op calls served on flagos" in out
    assert len(_ids(out, "flagos generated ids")) == 8
    assert out.rstrip().endswith(": OK")


def test_demo_graphs(run_python):
    """--graphs: static-cache decode on flagos, eager and by graph replay, with equal token ids (tiny shape,
    simulated accelerator)."""
    result = run_python(
        "",
        args=["-m", "examples.qwen3_demo", "--graphs", "--shape", "tiny", "--new-tokens", "4"],
        env={"FLAGOS_ACCELERATOR": "sim"},
        timeout=90,
    )
    assert result.returncode == 0, repr(result)
    out = result.stdout
    assert "'sim' accelerator" in out, out
    assert re.search(r"parity, token ids: 4/4 identical to cpu's: OK", out), out
    assert re.search(r"parity, graph replay: token ids 4/4 identical to eager's: OK", out), out
    rates = re.search(r"decode tokens/s .*: eager ([\d.]+), graphs ([\d.]+) \(graphs/eager ([\d.]+)\)", out)
    assert rates and all(float(rate) > 0 for rate in rates.groups()), out
    assert out.rstrip().endswith(": OK")


def test_demo_graphs_fails_when_replay_differs(monkeypatch, capsys, qwen3):
    """Graph replay giving other token ids than eager decode makes the demo report it and exit 1."""
    from examples import qwen3_demo
    from harness import static_decode

    generate = static_decode.StaticGreedyDecoder.generate

    def off_by_one_when_replayed(self, input_ids, new_tokens):
        tokens = generate(self, input_ids, new_tokens)
        return tokens + 1 if self.graphs else tokens

    monkeypatch.setattr(static_decode.StaticGreedyDecoder, "generate", off_by_one_when_replayed)
    code = qwen3_demo.main(["--shape", qwen3.shape, "--new-tokens", "3", "--graphs"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert re.search(r"parity, token ids: 3/3 identical to \w+'s: OK", out), out
    assert re.search(r"parity, graph replay: token ids 0/3 identical to eager's: MISMATCH", out), out
    assert "PARITY FAILED" in out


def test_demo_with_model(run_python, qwen3, checkpoint):
    """--model: the demo runs the checkpoint (its tokens are the checkpoint's, recomputed here on the
    reference device) and uses the checkpoint's tokenizer."""
    result = run_python(
        "",
        args=[
            "-m",
            "examples.qwen3_demo",
            "--model",
            str(checkpoint),
            "--new-tokens",
            "6",
            "--prompt",
            "w5 w17 w99 w3 w64",
        ],
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, repr(result)
    prompt = _ids(result.stdout, "prompt ids")
    generated = _ids(result.stdout, "flagos generated ids")
    assert prompt == [5, 17, 99, 3, 64]
    assert "flagos generated text: '" + " ".join(f"w{i}" for i in generated) + "'" in result.stdout

    model = harness.qwen3.copy_to(
        harness.qwen3.build_model(model_path=checkpoint, dtype=qwen3.dtype), qwen3.reference
    )
    expected = harness.qwen3.greedy_generate(model, torch.tensor([prompt]).to(qwen3.reference), 6)
    problem = harness.qwen3.greedy_divergence(
        expected.sequences, torch.tensor([prompt + generated]), expected.logits, len(prompt), qwen3.dtype
    )
    assert problem is None, f"{problem}\n{result.stdout}"


def test_demo_fails_when_parity_fails(capsys, qwen3):
    """A wrong kernel on flagos (mm.out off by 5%) makes the demo report the mismatch and exit 1."""
    import torch_fl
    from examples import qwen3_demo

    def wrong_mm_out(self, mat2, *, out):
        return torch.mm(self, mat2, out=out).mul_(1.05)

    def wrong_mm(self, mat2):
        return torch.mm(self, mat2).mul_(1.05)

    # Both overloads: backed by CUDA, torch.mm reaches aten::mm itself; elsewhere its composite's mm.out.
    torch_fl.routing.register_python_impl("aten::mm.out", wrong_mm_out)
    torch_fl.routing.register_python_impl("aten::mm", wrong_mm)
    try:
        code = qwen3_demo.main(["--shape", qwen3.shape, "--new-tokens", "4"])
    finally:
        torch_fl.routing.unregister_python_impl("aten::mm.out")
        torch_fl.routing.unregister_python_impl("aten::mm")
    out = capsys.readouterr().out
    assert code == 1, out
    assert re.search(r"parity, logits: .*MISMATCH", out), out
    assert "PARITY FAILED" in out


def test_demo_reports_routing_counts(monkeypatch, capsys, qwen3):
    """Where torch_fl.routing has counts()/reset_counts() (another change adds them), the demo resets the
    counts before generating on flagos and prints them per backend; stand-ins here until they land."""
    import torch_fl
    from examples import qwen3_demo

    calls = []
    monkeypatch.setattr(torch_fl.routing, "reset_counts", lambda: calls.append("reset"), raising=False)
    monkeypatch.setattr(
        torch_fl.routing,
        "counts",
        lambda: calls.append("counts") or {"native": 1234, "cpu": 5},
        raising=False,
    )
    assert qwen3_demo.main(["--shape", qwen3.shape, "--new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "by backend: native 1234, cpu 5" in out, out
    assert calls == ["reset", "counts"]


def test_benchmark_with_model(run_python, checkpoint, tmp_path):
    config = tmp_path / "mm_on_cpu.conf"
    config.write_text("mm = cpu\nmm.out = cpu\n")  # backed by CUDA torch.mm reaches aten::mm itself
    args = ["-m", "benchmarks.qwen3", "--model", str(checkpoint), "--repeats", "1"]
    args += ["--prompt-length", "16", "--new-tokens", "4", "--batch", "1", "--train-length", "16"]
    result = run_python("", args=[*args, "--configs", f"native,{config}"], timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    out = result.stdout
    assert f"model: {checkpoint}" in out
    sections = out.split("\nconfig ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["native (no config rules)", str(config)], out
    for section in sections:
        assert re.search(r"prefill 1x16 \(ms\)\s+[\d.]+\s+[\d.]+\s+time [\d.]+", section), section
        assert re.search(r"decode \(tokens/s\)\s+[\d.]+\s+[\d.]+\s+speed [\d.]+", section), section
        assert re.search(r"train step 1x16 \(ms\)\s+[\d.]+\s+[\d.]+\s+time [\d.]+", section), section
    counts = sections[1].split("op calls on flagos by backend:")[1].splitlines()[0]
    if "n/a" not in counts:  # torch_fl.routing.counts() exists: mm.out ran on the cpu backend
        assert re.search(r"\bcpu [1-9]", counts), counts


def test_benchmark_top_ops(run_python, qwen3):
    args = ["-m", "benchmarks.qwen3", "--shape", qwen3.shape, "--repeats", "1"]
    args += ["--prompt-length", "16", "--new-tokens", "4", "--batch", "1", "--train-length", "16"]
    result = run_python("", args=[*args, "--top-ops", "3"], timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    table = result.stdout.split(
        "top 3 aten ops on flagos, one call of each of prefill, decode, train profiled"
    )
    assert len(table) == 2, result.stdout
    lines = table[1].splitlines()[1:]
    header = ["op", "calls", "device", "ms", "share", "host", "ms", "backend"]
    assert lines[0].split() == header, result.stdout
    row = re.compile(r"    (aten::\S+) +(\d+) +([\d.]+) +([\d.]+)% +([\d.]+)   (\S+)")
    rows = [row.fullmatch(line) for line in lines[1:] if line.startswith("    aten::")]
    assert len(rows) == 3 and all(rows), result.stdout
    times = [float(match[3]) for match in rows]
    assert times == sorted(times, reverse=True) and times[0] > 0, result.stdout
    assert all(int(match[2]) > 0 and match[6] != "?" for match in rows), result.stdout


def _paired_train_row(out: str, size: str, blocks: int) -> re.Match:
    """The table's train-step row of a side-by-side run: both times positive and the pairs' median and range
    over ``blocks`` paired blocks (the whole row is match 0)."""
    row = re.search(rf"train step {size} \(ms\)\s+([\d.]+)\s+([\d.]+)\s+time [\d.]+\s+(.*)", out)
    assert row and float(row[1]) > 0 and float(row[2]) > 0, out
    assert re.fullmatch(rf"[\d.]+  \([\d.]+-[\d.]+ over {blocks}\)", row[3].strip()), out
    return row


@pytest.mark.slow
def test_benchmark_compiled_training_side_by_side(run_python, qwen3, tmp_path, compiler_cache):
    """benchmarks/qwen3.py --compile --side-by-side: the two compiled training processes run at the same
    time and their timed steps take turns in blocks, which the table pairs (20 steps each at the least: 4
    blocks of 5). The tiny shape and the session's compiler caches, so that it compiles in under a minute."""
    args = ["-m", "benchmarks.qwen3", "--shape", "tiny", "--compile", "--parts", "train"]
    args += ["--repeats", "1", "--batch", "1", "--train-length", "8", "--compiler-cache", compiler_cache]
    args += ["--side-by-side", "--train-results", str(tmp_path)]
    result = run_python("", args=args, timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    out = result.stdout
    row = _paired_train_row(out, "1x8", blocks=4)
    assert re.search(r"first train call \(s\)\s+[\d.]+\s+[\d.]+", out), out
    # Again with the saved runs: both are taken (one taken alone would leave the other running alone).
    again = run_python("", args=args, timeout=TIMEOUT_S)
    assert again.returncode == 0, repr(again)
    taken = re.findall(r"\.\. train on (\w+): taken from ", again.stdout)
    assert sorted(taken) == sorted(["flagos", qwen3.reference]), again.stdout
    assert row[0] in again.stdout, again.stdout  # the same figures
    bad = run_python("", args=[*args[:2], "--parts", "prefill", "--side-by-side"], timeout=TIMEOUT_S)
    assert bad.returncode != 0 and "--parts must include train" in bad.stderr, repr(bad)


def test_benchmark_eager_training_side_by_side_with_host_diff(run_python, qwen3):
    """benchmarks/qwen3.py --parts train --side-by-side --host-diff: eager training of both devices in
    processes of their own whose timed steps take turns (paired blocks), then each device's step profiled
    in a fresh process: the phases and the events whose host time flagos exceeds most."""
    args = ["-m", "benchmarks.qwen3", "--shape", qwen3.shape, "--parts", "train", "--repeats", "1"]
    args += ["--batch", "1", "--train-length", "8", "--side-by-side", "--host-diff", "4"]
    result = run_python("", args=args, timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    out = result.stdout
    _paired_train_row(out, "1x8", blocks=4)
    for phase in ("forward", "backward", "optimizer"):
        assert re.search(rf"\n    {phase} +[\d.]+ +[\d.]+   [\d.]+x\n", out), out
    table = out.split("self host time of one profiled step, all events:")[1].splitlines()[1:]
    assert table[0].split()[:3] == ["event", "calls", "calls"], out
    assert len([line for line in table[1:5] if re.search(r"[\d.]+ +-?[\d.]+$", line)]) == 4, out


@pytest.mark.slow
def test_compile_time_benchmark(run_python, qwen3):
    """benchmarks/compile_time.py: the first compiled prefill on flagos and on the native device, each in a
    fresh process with empty compiler caches (the benchmark's default), with Dynamo's phases side by side
    (one layer, so that it compiles in seconds)."""
    args = ["-m", "benchmarks.compile_time", "--part", "prefill", "--shape", qwen3.shape]
    result = run_python("", args=[*args, "--layers", "1", "--length", "16", "--top", "5"], timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    out = result.stdout
    assert re.search(rf"First compiled prefill call, Qwen3 {qwen3.shape}, 1 layers, 1 fresh", out), out
    first = re.search(r"\| first call \(s\) \| ([\d.]+) \| ([\d.]+) \| \*\*([\d.]+)\*\* \|", out)
    assert first and float(first[1]) > 0 and float(first[2]) > 0, out
    phases = out.split("largest difference first (top 5)")[1].split("\n## ")[0]
    row = re.compile(r"\| \S+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \|")
    rows = [line for line in phases.splitlines() if line.startswith("| ") and "phase" not in line]
    assert len(rows) == 5 and all(row.fullmatch(line) for line in rows), out


@pytest.mark.slow
def test_compile_time_benchmark_steps(run_python, qwen3, compiler_cache):
    """benchmarks/compile_time.py --steps: after the first compiled training step, steady steps on each
    device (synchronised, and the host's time per step) and the host calls flagos spends most over. With
    the session's compiler caches (--compiler-cache)."""
    args = ["-m", "benchmarks.compile_time", "--part", "train", "--shape", qwen3.shape]
    args += ["--layers", "1", "--length", "8", "--top", "1", "--steps", "3", "--host-top", "3"]
    args += ["--compiler-cache", compiler_cache]
    result = run_python("", args=args, timeout=TIMEOUT_S)
    assert result.returncode == 0, repr(result)
    out = result.stdout
    steps = out.split("## Compiled training steps after the first (ms: median (range))")[1].split("\n## ")[0]
    cell = r"([\d.]+) \([\d.]+-[\d.]+\)"
    rows = re.findall(
        rf"\| (step, synchronised|host time per step) \| {cell} \| {cell} \| \*\*[\d.]+\*\* \|", steps
    )
    assert [r[0] for r in rows] == ["step, synchronised", "host time per step"], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), out
    host = out.split("flagos's excess first (top 3)")[1].split("\n## ")[0]
    excess = [float(m) for m in re.findall(r"^\| .+ \| [\d.]+ \| [\d.]+ \| ([+-][\d.]+) \|$", host, re.M)]
    assert len(excess) == 3 and excess == sorted(excess, reverse=True), out
    bad = run_python("", args=[*args[:2], "--part", "prefill", "--steps", "2"], timeout=TIMEOUT_S)
    assert bad.returncode != 0 and "--steps times training steps" in bad.stderr, repr(bad)


def test_graph_benchmark_parity_rule():
    """benchmarks/qwen3.py --graphs: two runs that should agree may part only at a near tie of the first
    run's step (a note); parting anywhere else is a failure."""
    from benchmarks.qwen3_graphs import _parity
    from harness.static_decode import StaticGreedyDecoder

    model = harness.qwen3.copy_to(harness.qwen3.build_model("tiny", dtype=torch.float32), "flagos")
    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    expected = StaticGreedyDecoder(model, graphs=False).generate(ids.to("flagos"), 6).cpu()
    failures, notes = [], []
    _parity(model, ids, expected, expected.clone(), "same", failures, notes)
    assert failures == [] and notes == []

    step = 3
    with torch.no_grad():
        logits = model(torch.cat([ids, expected[:, :step]], 1).to("flagos")).logits[0, -1].cpu()
    far = expected.clone()
    far[0, step] = int(logits.argmin())  # the least likely token: no tie
    _parity(model, ids, expected, far, "far", failures, notes)
    assert len(failures) == 1 and failures[0].startswith("far: ") and "not a near tie" in failures[0]

    # An exact tie: the head's row of another token made equal to the chosen token's.
    tied = int(logits.argsort()[-2])
    with torch.no_grad():
        head = model.lm_head.weight
        head[tied] = head[int(expected[0, step])]
    near = expected.clone()
    near[0, step] = tied
    failures.clear()
    _parity(model, ids, expected, near, "near", failures, notes)
    assert failures == [] and len(notes) == 1 and notes[0].startswith(f"near: part at new token {step}")
