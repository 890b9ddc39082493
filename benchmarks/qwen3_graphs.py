"""``python -m benchmarks.qwen3 --graphs``: static-cache greedy decode, eager and replayed as graphs, on the
reference device and on flagos for each routing config, against Hugging Face's
``generate(cache_implementation="static")``.

Greedy decode with a static KV cache (``harness.static_decode``), batch 1, 16-token prompt,
``--new-tokens`` tokens, in tokens/s of the decode loop: the reference device eager and with its graph
(``torch.cuda.CUDAGraph`` on cuda), flagos eager and with ``torch.flagos.FlagosGraph`` for each config, and
Hugging Face's ``generate(cache_implementation="static")`` on the reference (compiled, CUDA graphs on cuda)
in a process that never imports torch_fl; on a GPU also the same ``generate`` on flagos (native routing) in a
fresh process, compiled as generate compiles on cuda (docs/compile.md): the recipe users pick, on both
devices. Also the graph of the step compiled before capture (``compile_step``: Inductor's kernels, one graph a
step) on the reference GPU and on flagos (native). The token ids of every graph run are checked against the
same step run eagerly: equal, or parting only at a near tie (noted with the top-2 margin); anything else
fails the benchmark. Ratios: flagos graph / reference graph, flagos graph / Hugging Face, flagos graph /
reference eager, the same for the compiled step's graph, and Hugging Face static on flagos / on the reference.

Records (``--json``): ``graph_decode_speed_ratio`` (flagos graph / reference graph),
``compiled_graph_decode_speed_ratio`` (the same for the compiled step's graphs), ``graph_vs_hf_speed_ratio``
and ``compiled_graph_vs_hf_speed_ratio`` (against Hugging Face static on the reference),
``graph_vs_eager_speed_ratio`` (against the reference eager; other configs' under their prefix) and
``hf_static_speed_ratio`` (Hugging Face static on flagos / on the reference).
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

from benchmarks.common import median
from benchmarks.qwen3_records import config_tag
from harness import processes, qwen3


def _decode_tokens_per_s(model, ids, new_tokens: int, graphs: bool, repeats: int, compile_step=False):
    """Median decode speed of ``repeats`` runs after a warm-up run, the last run's tokens; with
    ``compile_step`` also the tokens of the compiled step run eagerly (the graph run's parity reference),
    None otherwise."""
    from harness.static_decode import StaticGreedyDecoder

    decoder = StaticGreedyDecoder(model, graphs=graphs, compile_step=compile_step)
    speeds, tokens = [], None
    for _ in range(repeats + 1):  # the first run warms up
        tokens = decoder.generate(ids, new_tokens).cpu()
        speeds.append((new_tokens - 1) / decoder.decode_seconds)
    compiled_eager = None
    if compile_step:
        decoder.graphs = False  # the same compiled step, so nothing is compiled again
        compiled_eager = decoder.generate(ids, new_tokens).cpu()
    return median(speeds[1:]), tokens, compiled_eager


def _hf_static_tokens_per_s(spec, device: str, new_tokens: int, repeats: int, config_file: str) -> float:
    """Hugging Face's static-cache generate on ``device`` in a fresh process: on the reference one that never
    imports torch_fl; on flagos one that does, with routing config ``config_file``, and the forward compiled
    as generate compiles it on cuda (transformers compiles on cuda-like devices only unless told)."""
    per_token = processes.run_in_clean_process(
        "benchmarks.common:hf_static_decode_seconds",
        spec,
        env={"FLAGOS_BACKEND_CONFIG": config_file} if device == "flagos" else None,
        with_torch_fl=device == "flagos",
        device=device,
        prompt=16,
        tokens=(new_tokens // 2, new_tokens),
        repeats=repeats,
        compile_all_devices=device == "flagos",
    )
    return 1.0 / median(per_token)


class _Rows(dict):
    """The table's rows, each also printed when measured (a run cut short by a time limit still says what
    it measured, and how long each took)."""

    def __init__(self):
        super().__init__()
        self._start = time.perf_counter()

    def __setitem__(self, name, value):
        super().__setitem__(name, value)
        print(f"  [{time.perf_counter() - self._start:5.0f} s] {name}: {value:.1f} tokens/s", flush=True)


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first new-token position where two greedy runs differ, None when they are equal."""
    differs = (a != b).any(0).nonzero()
    return int(differs[0]) if len(differs) else None


def _parity(model, ids, expected: torch.Tensor, actual: torch.Tensor, what: str, failures, notes) -> None:
    """Two greedy runs that should agree: equal, or first parting at a near tie of ``expected``'s step (a
    note), by ``harness.qwen3.greedy_divergence``'s rule: the model's logits for the common prefix (one eager
    forward on the runs' device) put ``actual``'s token within the dtype's tolerance of the top logit. Anything else
    is a failure. Random weights give flat logits, so long runs meet exact ties (a margin of 0.0 in bf16)."""
    step = _first_difference(expected, actual)
    if step is None:
        return
    device = next(model.parameters()).device
    prefix = torch.cat([ids.cpu(), expected[:, :step]], 1).to(device)
    with torch.no_grad():
        logits = model(prefix).logits[:, -1].float().cpu()
    step_logits = [None] * step + [logits]
    why = qwen3.greedy_divergence(
        torch.cat([ids.cpu(), expected], 1),
        torch.cat([ids.cpu(), actual], 1),
        step_logits,
        ids.shape[1],
        next(model.parameters()).dtype,
    )
    top2 = logits[0].topk(2).values
    if why is None:
        notes.append(
            f"{what}: part at new token {step}, a near tie (top-2 margin {float(top2[0] - top2[1]):.3g})"
        )
    else:
        failures.append(f"{what}: {why}")


def graphs_main(
    master,
    spec,
    reference: str,
    configs: list[str],
    new_tokens: int,
    repeats: int,
    use_config,
    rec,
    shape_id: str,
) -> int:
    """``use_config(config, native_file)`` loads a routing config (qwen3.py's); ``rec`` records the ratios,
    their ids after ``shape_id`` (benchmarks.qwen3_records)."""
    ids = torch.randint(0, master.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    rows, failures, notes = _Rows(), [], []
    ref_model = qwen3.copy_to(master, reference)
    rows[f"{reference} eager"], ref_tokens, _ = _decode_tokens_per_s(
        ref_model, ids.to(reference), new_tokens, False, repeats
    )
    if reference != "cpu":
        rows[f"{reference} graph"], tokens, _ = _decode_tokens_per_s(
            ref_model, ids.to(reference), new_tokens, True, repeats
        )
        _parity(ref_model, ids, ref_tokens, tokens, f"{reference} graph vs eager", failures, notes)
        # The step compiled before capture (what Hugging Face's compiled generate replays, one graph a step).
        speed, tokens, compiled_eager = _decode_tokens_per_s(
            ref_model, ids.to(reference), new_tokens, True, repeats, compile_step=True
        )
        rows[f"{reference} graph (compiled step)"] = speed
        _parity(
            ref_model,
            ids,
            compiled_eager,
            tokens,
            f"{reference} compiled step, graph vs eager",
            failures,
            notes,
        )
    del ref_model
    fl_model = qwen3.copy_to(master, "flagos")
    with tempfile.TemporaryDirectory() as tmp:
        native_file = os.path.join(tmp, "native.conf")
        with open(native_file, "w") as f:
            f.write("# no rules\n")
        for config in configs:
            use_config(config, native_file)
            name = "native" if config == "native" else os.path.basename(config)
            eager, eager_tokens, _ = _decode_tokens_per_s(
                fl_model, ids.to("flagos"), new_tokens, False, repeats
            )
            rows[f"flagos eager ({name})"] = eager
            if name == "native":
                compiled = f"flagos graph ({name}, compiled step)"
                try:
                    speed, tokens, compiled_eager = _decode_tokens_per_s(
                        fl_model, ids.to("flagos"), new_tokens, True, repeats, compile_step=True
                    )
                    rows[compiled] = speed
                    _parity(fl_model, ids, compiled_eager, tokens, f"{compiled} vs eager", failures, notes)
                except Exception as e:  # noqa: BLE001 - reported below
                    failures.append(f"{compiled}: {type(e).__name__}: {str(e).splitlines()[0]}")
            try:
                speed, tokens, _ = _decode_tokens_per_s(fl_model, ids.to("flagos"), new_tokens, True, repeats)
            except Exception as e:  # reported, not hidden: a config whose ops cannot be captured
                failures.append(f"flagos graph ({name}): {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            rows[f"flagos graph ({name})"] = speed
            _parity(fl_model, ids, eager_tokens, tokens, f"flagos graph ({name}) vs eager", failures, notes)
        del fl_model
        hf_static = f"Hugging Face static cache ({reference}, clean process)"
        hf_static_flagos = "Hugging Face static cache (flagos, native, compiled, clean process)"
        devices = {hf_static: reference}
        if reference != "cpu":  # the recipe of docs/compile.md; on the CPU generate does not replay graphs
            devices[hf_static_flagos] = "flagos"
        for row, device in devices.items():
            try:
                rows[row] = _hf_static_tokens_per_s(spec, device, new_tokens, repeats, native_file)
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(f"{row}: {e}")

    print(f"\ndecode tokens/s, batch 1, 16-token prompt, {new_tokens} new tokens (median of {repeats})")
    for name, value in rows.items():
        print(f"  {name:<58} {value:10.1f}")
    native, compiled = "flagos graph (native)", "flagos graph (native, compiled step)"
    hf_anchor = f"Hugging Face static cache ({reference}, clean process)"
    ratios = [  # (flagos's row, the baseline's, label, metric, the baseline as a record names it)
        (
            compiled,
            f"{reference} graph (compiled step)",
            f"{compiled} / reference's",
            "compiled_graph_decode",
            None,
        ),
        (
            compiled,
            hf_anchor,
            f"{compiled} / Hugging Face static",
            "compiled_graph_vs_hf",
            "HF static generate",
        ),
        (native, f"{reference} graph", f"{native} / reference graph", "graph_decode", None),
        (native, hf_anchor, f"{native} / Hugging Face static", "graph_vs_hf", "HF static generate"),
        (native, f"{reference} eager", f"{native} / reference eager", "graph_vs_eager", f"{reference} eager"),
        (hf_static_flagos, hf_static, "Hugging Face static cache: flagos / reference", "hf_static", None),
    ]
    for name in rows:
        if name.startswith("flagos graph (") and not name.startswith("flagos graph (native"):
            config = name.removeprefix("flagos graph (").removesuffix(")")
            label, metric = f"{name} / reference eager", f"{config_tag(config)}graph_vs_eager"
            ratios.append((name, f"{reference} eager", label, metric, f"{reference} eager"))
    for row, baseline, label, metric, named in ratios:
        if row in rows and baseline in rows:
            ratio = rows[row] / rows[baseline]
            print(f"  {label:<58} {ratio:10.2f}")
            what = f"{label}, static-cache decode of {new_tokens} tokens, median of {repeats}"
            rec.add(f"{shape_id}{metric}_speed_ratio", ratio, "speed ratio", detail=what, baseline=named)
    for note in notes:
        print(f"  note: {note}")
    for failure in failures:
        print(f"  FAILED: {failure}")
    return 1 if failures else 0
