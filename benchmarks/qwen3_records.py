"""The metric ids of ``python -m benchmarks.qwen3``'s figures, and its records of a config's results
(benchmarks/records.py). An id is ``<config><shape><compiled_><part><size>_<kind>``: the config's tag
(``config_tag``: nothing for native), the shape's (``shape_tag``: nothing for the device's default shape),
``compiled_`` under ``--compile``, the part (``prefill``, ``decode``, ``train_step``), a size other than the
default (``_1x4096``, ``_8x1024``) and the kind (``time_ratio``, ``speed_ratio``).
"""

from __future__ import annotations

import os
import re

from benchmarks.common import Ratio
from harness import qwen3


def config_tag(config: str) -> str:
    """How a routing config names its figures in metric ids: nothing for ``native``, else its file name
    without extension and accelerator suffix, and ``_`` (``flaggems_`` for flaggems_cuda.conf)."""
    if config == "native":
        return ""
    stem = re.sub(r"_(cuda|sim)$", "", os.path.splitext(os.path.basename(config))[0].lower())
    return re.sub(r"[^a-z0-9]+", "_", stem).strip("_") + "_"


def shape_tag(model_path: str | None, shape: str, reference: str) -> str:
    """How the model names its figures in metric ids: nothing for the reference device's default shape,
    ``model_`` for a checkpoint, else the shape (``tiny_`` on a GPU)."""
    if model_path:
        return "model_"
    return "" if shape == qwen3.default_shape(reference) else re.sub(r"\W", "", shape) + "_"


def record(rec, results: dict, tag: str, model: str, sizes, defaults, ref_first, reference) -> None:
    """A record per ratio benchmarks.qwen3's ``report`` prints of ``results`` (part -> its ``Result``), ``tag``
    (config, shape) in front of the id, sizes other than ``defaults`` in it; with ``ref_first`` (compiled,
    the first config) the first calls too."""
    compiled = "compiled_" if ref_first is not None else ""
    ids = {
        "prefill": "prefill" + (f"_1x{sizes[0]}" if sizes[0] != defaults[0] else ""),
        "decode": "decode",
        "train": "train_step" + (f"_{sizes[2]}x{sizes[3]}" if sizes[2:] != defaults[2:] else ""),
    }
    what = {
        "prefill": f"prefill 1x{sizes[0]}",
        "decode": f"greedy decode at batch 1, {sizes[1]} tokens" + (", static cache" if compiled else ""),
        "train": f"training step {sizes[2]}x{sizes[3]}" + (", whole step compiled" if compiled else ""),
    }
    for part, result in results.items():
        kind = "speed ratio" if part == "decode" else "time ratio"
        pairs = Ratio.of(result.pairs) if result.pairs else None
        detail = f"{model}{', compiled' if compiled else ''}: {what[part]}"
        detail += f"; pairs' median {pairs.median:.2f}" if pairs else "; no pairs (processes of their own)"
        metric = f"{tag}{compiled}{ids[part]}_{kind.replace(' ', '_')}"
        rec.add(metric, result.fl / result.ref, kind, range=pairs and pairs.range, detail=detail)
        if ref_first is not None:
            first = {**result.first, **({reference: ref_first[part]} if part in ref_first else {})}
            detail = f"{model}: first compiled {what[part]}, compilation included"
            ratio = first["flagos"] / first[reference]
            rec.add(f"{tag}compiled_first_{ids[part]}_time_ratio", ratio, "time ratio", detail=detail)
