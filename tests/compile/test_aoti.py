"""AOTInductor on flagos: ``torch.export`` + ``aoti_compile_and_package`` + ``aoti_load_package`` of a flagos
program, run on flagos tensors and compared with the same module on the native device (the CPU on the
simulated accelerator, cuda when flagos is backed by CUDA). One package is compiled per module (about 15 s)
and shared by the tests."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import torch_fl

DEVICE = "flagos"
NATIVE = "cuda" if torch_fl.accelerator() == "cuda" else "cpu"


class Model(torch.nn.Module):
    """Generated kernels (matmul epilogue, softmax), c-shim ops (addmm, index_select, sort) and a buffer
    returned as it is (the model's own memory, which the runner copies into flagos memory)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)
        self.weight = torch.nn.Parameter(torch.randn(16, 4))
        self.register_buffer("offsets", torch.arange(4.0))

    def forward(self, x, index):
        hidden = torch.relu(self.linear(x))
        logits = hidden @ self.weight + self.offsets
        values, order = torch.sort(logits, dim=-1)
        return logits.softmax(-1), torch.index_select(hidden, 0, index), values, order, self.offsets


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    torch.manual_seed(0)
    model = Model().to(DEVICE).eval()
    x, index = torch.randn(5, 8, device=DEVICE), torch.tensor([0, 3], device=DEVICE)
    program = torch.export.export(model, (x, index), dynamic_shapes=({0: Dim("rows", min=2)}, None))
    path = torch._inductor.aoti_compile_and_package(
        program, package_path=str(tmp_path_factory.mktemp("aoti") / "m.pt2")
    )
    return model, path


def _check(model, outputs, x, index, device):
    reference = model.to(NATIVE)(x.to(NATIVE), index.to(NATIVE))
    model.to(DEVICE)
    assert len(outputs) == len(reference)
    for got, want in zip(outputs, reference, strict=True):
        assert got.device == torch.device(device)
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=1e-5, rtol=1e-4)


def test_package_runs_on_flagos_tensors(package):
    model, path = package
    loaded = torch._inductor.aoti_load_package(path)
    assert loaded.get_metadata()["AOTI_DEVICE_KEY"] == DEVICE
    index = torch.tensor([1, 2], device=DEVICE)  # the exported shape: its size is static
    for rows in (5, 9):  # the exported batch, and another through the dynamic dimension
        x = torch.randn(rows, 8, device=DEVICE)
        _check(model, loaded(x, index), x, index, f"{DEVICE}:0")


# With every stream task of the simulated accelerator delayed, the copy into the model's input is still
# queued when the model is called.
_STREAM_ORDER_SCRIPT = """
import json, os, torch, torch_fl
loaded = torch._inductor.aoti_load_package(os.environ["AOTI_PACKAGE"])
source = torch.randn(64, 8).pin_memory()
x = torch.zeros(64, 8, device="flagos")
index = torch.tensor([63, 7], device="flagos")  # made first: a copy from pageable memory waits for the stream
torch.flagos.synchronize()
x.copy_(source, non_blocking=True)
pending = not torch.flagos.current_stream().query()
outputs = loaded(x, index)
print("RESULT " + json.dumps({"pending": pending, "source": source.tolist(),
                              "outputs": [o.cpu().tolist() for o in outputs]}))
"""


@pytest.mark.skipif(torch_fl.accelerator() != "sim", reason="the simulated accelerator's stream delay")
def test_the_model_waits_for_work_queued_on_its_inputs(package, run_python):
    """The runner orders a package's C++ kernels after the work queued on the device's stream: an input
    whose values are still being copied in when the model is called is read once the copy has landed."""
    model, path = package
    env = {"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "200000", "AOTI_PACKAGE": path}
    out = run_python(_STREAM_ORDER_SCRIPT, env=env, timeout=240).check().json()
    assert out["pending"], "the copy was not pending when the model was called: the test proves nothing"
    x, index = torch.tensor(out["source"]), torch.tensor([63, 7])
    reference = model.to("cpu")(x, index)
    model.to(DEVICE)
    for got, want in zip(out["outputs"], reference, strict=True):
        torch.testing.assert_close(torch.tensor(got, dtype=want.dtype), want, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(torch.flagos.device_count() < 2, reason="needs two flagos devices")
def test_package_loaded_for_another_device(package):
    model, path = package
    current = torch.flagos.current_device()
    loaded = torch._inductor.aoti_load_package(path, device_index=1)
    assert torch.flagos.current_device() == current  # loading leaves the current device alone
    x, index = torch.randn(3, 8, device=f"{DEVICE}:1"), torch.tensor([2, 0], device=f"{DEVICE}:1")
    _check(model.to(f"{DEVICE}:1"), loaded(x, index), x, index, f"{DEVICE}:1")
    with pytest.raises(RuntimeError, match=r"input 0 of the AOTInductor model is on flagos:0.*flagos:1"):
        loaded(torch.randn(3, 8, device=f"{DEVICE}:0"), index.to(f"{DEVICE}:0"))
    with pytest.raises(IndexError, match="invalid flagos device index"):
        torch._inductor.aoti_load_package(path, device_index=torch.flagos.device_count())


@pytest.mark.skipif(
    torch_fl.accelerator() == "cuda", reason="backed by CUDA a package may return CPU tensors"
)
def test_cpu_outputs_are_refused_at_compile_time_on_a_hal_accelerator():
    class ToCpu(torch.nn.Module):
        def forward(self, x):
            return (x * 2).cpu()

    program = torch.export.export(ToCpu(), (torch.ones(2, device=DEVICE),))
    with pytest.raises(Exception, match="output 0 of the graph is a CPU tensor"):
        torch._inductor.aoti_compile_and_package(program)


def test_constants_loaded_as_native_device_tensors(tmp_path):
    # A package without its weights: load_constants hands them to the model, whose runtime takes tensors of
    # its own device type (docs/compile.md): cuda views of the flagos weights when backed, CPU copies on the
    # simulated accelerator.
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(DEVICE)
    x = torch.randn(3, 8, device=DEVICE)
    path = torch._inductor.aoti_compile_and_package(
        torch.export.export(model, (x,)),
        package_path=str(tmp_path / "weightless.pt2"),
        inductor_configs={"aot_inductor.package_constants_in_so": False},
    )
    loaded = torch._inductor.aoti_load_package(path)
    weights = {name: p.detach() for name, p in model.named_parameters() if name in loaded.get_constant_fqns()}
    assert weights
    with pytest.raises(RuntimeError):  # flagos tensors themselves are refused by the model's runtime
        loaded.load_constants(weights, check_full_update=False)
    native = {name: torch_fl.as_cuda(w) if NATIVE == "cuda" else w.cpu() for name, w in weights.items()}
    loaded.load_constants(native, check_full_update=False)
    out = loaded(x)  # one output: the tensor itself
    assert out.device == torch.device(f"{DEVICE}:0")
    torch.testing.assert_close(out.cpu(), model.to(NATIVE)(x.to(NATIVE)).cpu(), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(torch_fl.accelerator() == "cuda", reason="a HAL accelerator's host kernels")
def test_capture_is_refused_on_a_hal_accelerator(package):
    # The model's C++ kernels run on the calling thread: a graph could not replay them, so capturing a call
    # is an error, and the model runs as before once the capture is over.
    model, path = package
    loaded = torch._inductor.aoti_load_package(path)
    x, index = torch.randn(3, 8, device=DEVICE), torch.tensor([0, 1], device=DEVICE)
    with torch.flagos.stream(torch.flagos.Stream()):
        with pytest.raises(RuntimeError, match="cannot be captured into a flagos graph"):
            with torch.flagos.graph(torch.flagos.FlagosGraph()):
                loaded(x, index)
    _check(model, loaded(x, index), x, index, f"{DEVICE}:0")
