"""Model tests: Hugging Face Qwen3 on flagos against the reference device.

Shape: ``FLAGOS_QWEN3_SHAPE`` = ``tiny`` (default, what CI runs) or ``0.6b`` (Qwen3-0.6B's architecture;
those runs are marked ``gpu`` and need flagos on CUDA, so they are skipped elsewhere). The reference is
``cuda`` where flagos runs on CUDA, else ``cpu``; the dtype is bfloat16 against CUDA, float32 against the
CPU, or ``FLAGOS_QWEN3_DTYPE``. Weights are random from a fixed seed; nothing is downloaded.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

import harness.qwen3

SHAPE = os.environ.get("FLAGOS_QWEN3_SHAPE", "tiny")
if SHAPE not in harness.qwen3.SHAPES:
    raise pytest.UsageError(
        f"FLAGOS_QWEN3_SHAPE={SHAPE!r}: valid shapes are {', '.join(harness.qwen3.SHAPES)}"
    )
_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)  # before the root conftest's hook turns `gpu` marks into skips
def pytest_collection_modifyitems(config, items):
    if SHAPE == "tiny":
        return
    for item in items:
        if os.path.dirname(str(item.path)).startswith(_HERE):
            item.add_marker(pytest.mark.gpu)
            item.add_marker(pytest.mark.slow)
            if torch.cuda.is_available() and harness.qwen3.reference_device() != "cuda":
                item.add_marker(pytest.mark.skip(reason=f"the {SHAPE} shape runs only with flagos on CUDA"))


@pytest.fixture(scope="session")
def qwen3():
    """What every model test shares: shape, reference device, dtype, tolerances, sizes."""
    pytest.importorskip("transformers", minversion="5.0")
    reference = harness.qwen3.reference_device()
    dtype_name = os.environ.get("FLAGOS_QWEN3_DTYPE", "auto")
    dtype = harness.qwen3.parse_dtype(dtype_name, reference)
    big = SHAPE != "tiny"
    return types.SimpleNamespace(
        shape=SHAPE,
        reference=reference,
        dtype=dtype,
        tol=harness.qwen3.TOLERANCES[dtype],
        batch=2,
        prompt_length=32 if big else 16,
        new_tokens=16,
        train_steps=4,
        lr=1e-3,
    )


@pytest.fixture(scope="session")
def master_model(qwen3):
    """The model on the CPU in float32 (random weights, seed 0); tests copy it to their devices."""
    return harness.qwen3.build_model(qwen3.shape, seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def prompt_ids(qwen3, master_model):
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, master_model.config.vocab_size, (qwen3.batch, qwen3.prompt_length), generator=g)


@pytest.fixture(scope="session")
def compiler_cache(tmp_path_factory) -> str:
    """One folder of Inductor's and Triton's caches for the compile benchmarks run by this test session
    (their ``--compiler-cache``), shared by the pytest-xdist workers: what one run compiled, the next
    reuses. The benchmarks' own default, empty caches in every process, is what they measure with."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's
    folder = base / "compiler-cache"
    folder.mkdir(exist_ok=True)
    return str(folder)
