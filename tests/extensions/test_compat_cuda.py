"""torch_fl.compat's opt-in CUDA compatibility on a machine without CUDA (the simulated accelerator).

- cuda_training_script.py (beside this file), written for CUDA, runs unchanged after
  ``import torch_fl.compat.cuda`` and gives the same losses and parameters as the same script run with
  ``--device cpu``;
- device strings/objects, .cuda(), torch.cuda.* resolve to flagos while the layer is on;
- platform checks keep answering for CUDA (is_available False, version.cuda None);
- disable_cuda() restores every attribute of torch it changed (identity) and torch's behaviour.
"""

from __future__ import annotations

import io
import os

import pytest
import torch

import torch_fl
import torch_fl.compat

SCRIPT = os.path.join(os.path.dirname(__file__), "cuda_training_script.py")
needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the layer refuses where real CUDA exists"
)

# Attributes the layer replaces: (owner, name); compared by identity after disable_cuda().
WATCHED = [
    (torch.cuda, "device_count"),
    (torch.cuda, "current_device"),
    (torch.cuda, "synchronize"),
    (torch.cuda, "Stream"),
    (torch.cuda, "Event"),
    (torch.cuda, "stream"),
    (torch.cuda, "memory_allocated"),
    (torch.cuda, "manual_seed"),
    (torch.cuda, "get_rng_state"),
    (torch.cuda.memory, "_snapshot"),
    (torch.cuda.memory, "memory_allocated"),
    (torch.cuda.random, "manual_seed"),
    (torch, "zeros"),
    (torch, "randn"),
    (torch, "tensor"),
    (torch, "Generator"),
    (torch, "load"),
    (torch, "autocast"),
    (torch, "set_default_device"),
    (torch.amp, "autocast"),
    (torch.amp, "GradScaler"),
    (torch.cuda.amp, "autocast"),
    (torch.cuda.amp, "GradScaler"),
]


def _snapshot_watched():
    return {(id(owner), name): getattr(owner, name) for owner, name in WATCHED} | {
        ("Tensor", name): vars(torch.Tensor).get(name) for name in ("to", "cuda", "new_zeros")
    }


@pytest.fixture
def cuda_compat():
    torch_fl.compat.enable_cuda()
    try:
        yield
    finally:
        torch_fl.compat.disable_cuda()


def _script_result(run_python, *, compat: bool, args=()):
    if compat:
        code = f"""
            import runpy, sys
            import torch_fl.compat.cuda  # the one line a user adds
            sys.argv = ["cuda_training_script.py", *{list(args)!r}]
            runpy.run_path({SCRIPT!r}, run_name="__main__")
        """
        result = run_python(code, env={"FLAGOS_ACCELERATOR": "sim"})
    else:
        result = run_python("", args=[SCRIPT, *args])
    return result.check().json()


@needs_no_cuda
def test_cuda_written_training_script_runs_on_flagos_equal_to_cpu(run_python):
    on_flagos = _script_result(run_python, compat=True)
    on_cpu = _script_result(run_python, compat=False, args=["--device", "cpu"])
    assert on_flagos["parameter_device"] == "flagos:0"
    assert on_flagos["cuda_available"] is False  # platform checks still see no CUDA
    assert on_flagos["device_name"] == torch_fl.flagos.get_device_name(0)
    assert on_flagos["peak_bytes"] > 0 and on_flagos["elapsed_ms"] > 0
    torch.testing.assert_close(torch.tensor(on_flagos["losses"]), torch.tensor(on_cpu["losses"]))
    for got, expected in zip(on_flagos["parameters"], on_cpu["parameters"], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected))
    assert on_cpu["losses"][-1] < on_cpu["losses"][0]  # it trains


@needs_no_cuda
def test_devices_resolve_to_flagos(cuda_compat, two_devices_only):
    assert torch.zeros(2, device="cuda").device == torch.device("flagos", 0)
    assert torch.ones(2, device="cuda:1").device == torch.device("flagos", 1)
    assert torch.tensor([1, 2], device=torch.device("cuda", 1)).device.index == 1
    cpu = torch.arange(4.0)
    assert cpu.cuda().device.type == "flagos"
    assert cpu.cuda(1).device == torch.device("flagos", 1)
    assert cpu.to("cuda").device.type == "flagos"
    assert cpu.to(torch.device("cuda:1"), torch.float64).dtype == torch.float64
    assert cpu.to(device="cuda").device.type == "flagos"
    assert cpu.new_zeros(3, device="cuda").device.type == "flagos"
    assert torch.randn_like(cpu, device="cuda").device.type == "flagos"
    module = torch.nn.Linear(2, 2).cuda()
    assert module.weight.device.type == "flagos"
    assert torch.nn.Linear(2, 2).to("cuda:1").weight.device.index == 1
    generator = torch.Generator("cuda")
    assert generator.device.type == "flagos" and isinstance(generator, torch.Generator)
    assert isinstance(torch.Generator(), torch.Generator)
    # torch.device itself is not replaced: a cuda device stays one until it is used.
    assert torch.device("cuda").type == "cuda"
    assert cpu.to("cpu") is cpu


@needs_no_cuda
def test_torch_cuda_calls_resolve_to_flagos(cuda_compat):
    assert torch.cuda.device_count() == torch_fl.flagos.device_count()
    assert torch.cuda.current_device() == torch_fl.flagos.current_device()
    assert torch.cuda.device_count is torch_fl.flagos.device_count  # bound, not wrapped: no added cost
    stream = torch.cuda.Stream()
    assert isinstance(stream, torch_fl.flagos.Stream)
    with torch.cuda.stream(stream):
        assert torch.cuda.current_stream() == stream
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    event.synchronize()
    torch.cuda.synchronize()
    torch.cuda.synchronize("cuda:0")
    with torch.cuda.device("cuda:0"):
        assert torch.cuda.current_device() == 0
    t = torch.empty(1 << 20, device="cuda")
    assert torch.cuda.memory_allocated() >= t.nbytes
    assert torch.cuda.memory_allocated("cuda") == torch.cuda.memory_allocated(0)
    assert "memory summary" in torch.cuda.memory_summary()
    torch.cuda.manual_seed(7)
    a = torch.randn(4, device="cuda")
    state = torch.cuda.get_rng_state("cuda")
    torch.cuda.manual_seed(7)
    torch.testing.assert_close(torch.randn(4, device="cuda").cpu(), a.cpu())
    torch.cuda.set_rng_state(state, "cuda")
    assert torch.cuda.get_device_properties(0).total_memory > 0
    torch.cuda.memory._record_memory_history(stacks="python")
    try:
        assert torch.cuda.memory._snapshot()["segments"]
    finally:
        torch.cuda.memory._record_memory_history(None)


@needs_no_cuda
def test_autocast_grad_scaler_load_and_default_device(cuda_compat, tmp_path):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.randn(4, 4, device="cuda") @ torch.randn(4, 4, device="cuda")
    assert y.dtype == torch.bfloat16 and y.device.type == "flagos"
    with torch.cuda.amp.autocast(dtype=torch.bfloat16):
        assert (torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")).dtype == torch.bfloat16
    scaler = torch.amp.GradScaler("cuda")
    weight = torch.ones(3, device="cuda", requires_grad=True)
    scaler.scale((weight * 2).sum()).backward()
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler.step(optimizer)
    scaler.update()
    torch.testing.assert_close(weight.detach().cpu(), torch.zeros(3))
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cuda")
    assert loaded["w"].device.type == "flagos"
    torch.set_default_device("cuda")
    try:
        assert torch.empty(1).device.type == "flagos"
    finally:
        torch.set_default_device(None)


@needs_no_cuda
def test_platform_checks_still_see_no_cuda(cuda_compat):
    assert torch.cuda.is_available() is False
    # What the build says, unchanged: None and False on a CPU build of torch; a CUDA build with no GPU visible
    # (the GPU machine's torch with CUDA_VISIBLE_DEVICES empty) still has its CUDA version.
    assert torch.backends.cuda.is_built() is torch._C._has_cuda
    assert (torch.version.cuda is None) is (not torch._C._has_cuda)
    assert torch.zeros(1, device="cuda").is_cuda is False  # a flagos tensor says so


@needs_no_cuda
def test_disable_restores_torch(two_devices_only):
    before = _snapshot_watched()
    torch_fl.compat.enable_cuda()
    torch_fl.compat.enable_cuda()  # idempotent
    assert torch_fl.compat.is_cuda_enabled()
    changed = _snapshot_watched()
    assert all(changed[key] is not before[key] for key in before), [
        k for k in before if changed[k] is before[k]
    ]
    torch_fl.compat.disable_cuda()
    torch_fl.compat.disable_cuda()  # idempotent
    assert not torch_fl.compat.is_cuda_enabled()
    after = _snapshot_watched()
    assert all(after[key] is before[key] for key in before), [k for k in before if after[k] is not before[k]]
    # torch's behaviour is back: CUDA is CUDA again, and torch.flagos takes no cuda device.
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")
    with pytest.raises((RuntimeError, AssertionError)):
        torch.ones(1).cuda()
    assert torch.cuda.device_count() == 0
    with pytest.raises(ValueError, match="expected a flagos device"):
        torch_fl.flagos.synchronize("cuda")
    # And it can be turned on again.
    torch_fl.compat.enable_cuda()
    try:
        assert torch.zeros(1, device="cuda:1").device == torch.device("flagos", 1)
    finally:
        torch_fl.compat.disable_cuda()


def test_refused_where_real_cuda_exists(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="real CUDA devices"):
        torch_fl.compat.enable_cuda()
    assert not torch_fl.compat.is_cuda_enabled()


def test_never_on_by_default(run_python):
    result = run_python(
        """
        import json, torch, torch_fl, torch_fl.compat
        print("RESULT", json.dumps([torch_fl.compat.is_cuda_enabled(), torch.cuda.device_count(),
                                    torch.zeros is torch._C._VariableFunctions.zeros]))
        """
    ).check()
    assert result.json() == [False, torch.cuda.device_count(), True]


@pytest.mark.gpu
def test_refused_on_an_nvidia_machine():
    with pytest.raises(RuntimeError, match="real CUDA devices"):
        torch_fl.compat.enable_cuda()
