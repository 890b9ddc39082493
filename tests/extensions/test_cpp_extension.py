"""torch_fl.utils.cpp_extension and flagos/extension.h: a C++ extension built by load_inline in the test.

One build per machine (about a minute on two cores), cached across runs in a build folder beside pytest's
temporary folders; the GPU test builds a second, CUDA one. The extension has:
- ``scaled_add``, registered for the CPU only: on the simulated accelerator (whose native device is the CPU)
  it runs on flagos tensors through the native route, without any flagos code;
- ``tagged_mul``, registered for the CPU and, through FLAGOS_LIBRARY_IMPL, for flagos: the flagos kernel
  (which adds 1000, so that it can be told apart) takes precedence over routing, and uses the header's
  device guard, current stream and native views;
- plain functions exercising the rest of the header.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl
from torch_fl.utils import cpp_extension

CPP_SOURCE = r"""
#include <torch/library.h>

namespace {

// Kernels for the CPU: what the native route runs for flagos tensors on the simulated accelerator.
at::Tensor scaled_add_cpu(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "scaled_add_cpu got ", x.device());
  at::Tensor out = at::empty_like(x);
  const at::Tensor xc = x.contiguous();
  const at::Tensor yc = y.contiguous();
  const float* a = xc.data_ptr<float>();
  const float* b = yc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = a[i] + static_cast<float>(alpha) * b[i];
  return out;
}

at::Tensor tagged_mul_cpu(const at::Tensor& x, const at::Tensor& y) {
  return x * y;
}

int64_t g_flagos_calls = 0;
int64_t g_stream_seen = -1;

// The flagos kernel: registered for PrivateUse1, it takes precedence over the routed CPU kernel.
at::Tensor tagged_mul_flagos(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(flagos::is_flagos(x) && flagos::is_flagos(y), "tagged_mul_flagos got ", x.device());
  flagos::DeviceGuard guard(x);
  ++g_flagos_calls;
  g_stream_seen = flagos::current_stream().id();
  at::Tensor out = at::empty(x.sizes(), x.options());  // flagos memory
  at::Tensor native_out = flagos::as_native(out);
  at::mul_out(native_out, flagos::as_native(x), flagos::as_native(y));
  native_out.add_(1000);
  return out;
}

}  // namespace

TORCH_LIBRARY(flagos_test_ext, m) {
  m.def("scaled_add(Tensor x, Tensor y, float alpha) -> Tensor");
  m.def("tagged_mul(Tensor x, Tensor y) -> Tensor");
}

TORCH_LIBRARY_IMPL(flagos_test_ext, CPU, m) {
  m.impl("scaled_add", &scaled_add_cpu);
  m.impl("tagged_mul", &tagged_mul_cpu);
}

FLAGOS_LIBRARY_IMPL(flagos_test_ext, m) {
  m.impl("tagged_mul", &tagged_mul_flagos);
}

int64_t flagos_calls() { return g_flagos_calls; }
int64_t stream_seen() { return g_stream_seen; }
int64_t api_version() { return flagos::api_version(); }
std::string native_device_type() { return c10::DeviceTypeName(flagos::native_device_type(), true); }
uint64_t stream_handle() { return reinterpret_cast<uint64_t>(flagos::native_stream_handle(flagos::current_stream())); }

// A native view written through, then the flagos tensor read back.
at::Tensor double_in_place(at::Tensor t) {
  flagos::as_native(t).mul_(2);
  return t;
}

// from_native over flagos memory is the same memory; over memory the flagos allocator did not hand out it is
// refused on a HAL accelerator.
at::Tensor round_trip(const at::Tensor& t) { return flagos::from_native(flagos::as_native(t)); }
at::Tensor adopt_host_memory(const at::Tensor& cpu) { return flagos::from_native(cpu); }
"""

FUNCTIONS = [
    "flagos_calls",
    "stream_seen",
    "api_version",
    "native_device_type",
    "stream_handle",
    "double_in_place",
    "round_trip",
    "adopt_host_memory",
]

on_sim = pytest.mark.skipif(
    torch_fl.accelerator() != "sim", reason="CPU kernels routed: the simulated accelerator"
)


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    # Beside pytest's numbered temporary folders, so the build is reused by later runs (torch's builder only
    # recompiles when the sources change).
    root = tmp_path_factory.getbasetemp().parent / "torch_fl-cpp-extensions"
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="module")
def ext(build_root):
    build = build_root / "flagos_test_ext"
    build.mkdir(exist_ok=True)
    return cpp_extension.load_inline(
        "flagos_test_ext",
        CPP_SOURCE,
        functions=FUNCTIONS,
        build_directory=str(build),
        extra_cflags=["-O1"],
    )


@on_sim
def test_cpu_kernel_runs_on_flagos_tensors_through_the_native_route(ext):
    x = torch.randn(1000)
    y = torch.randn(1000)
    expected = torch.ops.flagos_test_ext.scaled_add(x, y, 0.5)
    torch.testing.assert_close(expected, x + 0.5 * y)
    before = torch_fl.routing.counts().get("native", 0)
    out = torch.ops.flagos_test_ext.scaled_add(x.to("flagos"), y.to("flagos"), 0.5)
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), expected)
    assert torch_fl.routing.counts()["native"] > before
    assert "native" in torch_fl.routing.explain("flagos_test_ext::scaled_add")


@on_sim
def test_routing_rules_apply_to_extension_ops(ext):
    x = torch.randn(64).to("flagos")
    y = torch.randn(64).to("flagos")
    with torch_fl.routing.override({"flagos_test_ext::scaled_add": "cpu"}):
        out = torch.ops.flagos_test_ext.scaled_add(x, y, 2.0)
    torch.testing.assert_close(out.cpu(), x.cpu() + 2.0 * y.cpu())


def test_flagos_kernel_takes_precedence_over_routing(ext):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = torch.full((2, 3), 2.0)
    calls = ext.flagos_calls()
    out = torch.ops.flagos_test_ext.tagged_mul(x.to("flagos"), y.to("flagos"))
    assert ext.flagos_calls() == calls + 1
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), x * y + 1000)
    # The CPU kernel still serves CPU tensors.
    torch.testing.assert_close(torch.ops.flagos_test_ext.tagged_mul(x, y), x * y)


def test_header_current_stream_and_device(ext, two_devices_only):
    stream = torch.flagos.Stream()
    x = torch.ones(4, device="flagos:1")
    with torch.flagos.stream(stream):
        torch.ops.flagos_test_ext.tagged_mul(x, x)  # on flagos:1: its guard makes device 1 current
    assert ext.stream_seen() == torch.flagos.current_stream(1).stream_id
    with torch.flagos.device(1), torch.flagos.stream(torch.flagos.Stream()):
        current = torch.flagos.current_stream()
        torch.ops.flagos_test_ext.tagged_mul(x, x)
        assert ext.stream_seen() == current.stream_id
    assert ext.stream_handle() != 0


def test_header_versions_and_native_device(ext):
    assert ext.api_version() == 1
    expected = "cpu" if torch_fl.accelerator() == "sim" else "cuda"
    assert ext.native_device_type() == expected


def test_native_views_share_flagos_memory(ext):
    t = torch.arange(5.0).to("flagos")
    assert ext.double_in_place(t) is not None
    torch.testing.assert_close(t.cpu(), torch.arange(5.0) * 2)
    back = ext.round_trip(t)
    assert back.device == t.device and back.data_ptr() == t.data_ptr()
    torch.testing.assert_close(back.cpu(), t.cpu())


def test_as_native_waits_for_queued_copies(ext, run_python):
    """With a stream delay, a native view read right after an async copy into its memory still sees the copy."""
    code = f"""
        import torch, torch_fl
        from torch_fl.utils import cpp_extension
        ext = cpp_extension.load_inline("flagos_test_ext", {CPP_SOURCE!r}, functions={FUNCTIONS!r},
                                        build_directory={str(ext_build_dir(ext))!r}, extra_cflags=["-O1"])
        src = torch.full((1024,), 3.0).pin_memory()
        t = torch.zeros(1024, device="flagos")
        t.copy_(src, non_blocking=True)
        ext.double_in_place(t)
        print("RESULT", float(t.cpu().sum()))
    """
    result = run_python(
        code, env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "20000"}
    ).check()
    assert result.json() == 1024 * 6.0


def ext_build_dir(ext):
    import os

    return os.path.dirname(ext.__file__)


@on_sim
def test_from_native_refuses_memory_flagos_did_not_allocate(ext):
    with pytest.raises(RuntimeError, match="not flagos memory"):
        ext.adopt_host_memory(torch.ones(3))
    with pytest.raises(RuntimeError, match="expected a tensor on the native device"):
        ext.adopt_host_memory(torch.ones(3, device="flagos"))


@pytest.mark.slow
def test_example_custom_op_builds_and_runs(build_root, run_python):
    """examples/custom_op: its CPU (or CUDA) kernel through the native route, its flagos kernel ahead of it
    (the second build of this file, cached beside the first)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    result = run_python(
        "",
        args=[str(root / "examples/custom_op/run.py"), "--build-dir", str(build_root / "custom_op")],
        env={"FLAGOS_ACCELERATOR": torch_fl.accelerator()},
        timeout=600,
    ).check()
    assert result.stdout.rstrip().endswith("OK"), result
    assert "custom_ops::scaled_tanh -> native" in result.stdout, result


def test_cuda_sources_need_a_cuda_torch():
    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA")
    with pytest.raises(RuntimeError, match="need a CUDA build of torch"):
        cpp_extension.load_inline("never_built", "", cuda_sources="__global__ void k() {}")
    with pytest.raises(RuntimeError, match="need a CUDA build of torch"):
        cpp_extension.FlagosExtension("never_built", ["kernel.cu"])


def test_flagos_extension_adds_torch_fl_headers_and_library():
    extension = cpp_extension.FlagosExtension("my_ops", ["my_ops.cpp"], include_dirs=["mine"])
    assert extension.include_dirs[0] == "mine"
    assert cpp_extension.include_paths()[0] in extension.include_dirs
    # The core library (libtorch_fl_core.so, beside torch_fl._C) implements flagos/extension.h.
    assert "-ltorch_fl_core" in extension.extra_link_args
    import os

    assert os.path.isfile(os.path.join(cpp_extension.library_paths()[0], "libtorch_fl_core.so"))
    assert os.path.isfile(os.path.join(cpp_extension.include_paths()[0], "flagos", "extension.h"))


# --- GPU: a CUDA kernel, flagos backed by CUDA -------------------------------------------------------------

CUDA_DECLARATIONS = r"""
at::Tensor axpy_on_flagos_stream(const at::Tensor& x, const at::Tensor& y, double a);
uint64_t flagos_stream_handle();
"""

CUDA_SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <flagos/extension.h>
#include <torch/library.h>

__global__ void axpy_kernel(const float* x, const float* y, float* out, float a, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

static void launch(const at::Tensor& x, const at::Tensor& y, at::Tensor& out, double a, cudaStream_t stream) {
  const int64_t n = out.numel();
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  axpy_kernel<<<blocks, threads, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                                              static_cast<float>(a), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Registered for CUDA only, written as for any CUDA tensor: flagos tensors reach it through the native route.
at::Tensor axpy_cuda(const at::Tensor& x, const at::Tensor& y, double a) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "axpy_cuda expects CUDA tensors, got ", x.device());
  const at::Tensor xc = x.contiguous();
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);
  launch(xc, yc, out, a, at::cuda::getCurrentCUDAStream());
  return out;
}

TORCH_LIBRARY(flagos_cuda_ext, m) { m.def("axpy(Tensor x, Tensor y, float a) -> Tensor"); }
TORCH_LIBRARY_IMPL(flagos_cuda_ext, CUDA, m) { m.impl("axpy", &axpy_cuda); }

// A plain (pybind) function on flagos tensors through the header: native views and flagos's stream.
at::Tensor axpy_on_flagos_stream(const at::Tensor& x, const at::Tensor& y, double a) {
  TORCH_CHECK(flagos::is_flagos(x) && flagos::is_flagos(y), "expected flagos tensors");
  flagos::DeviceGuard guard(x);
  const at::Tensor xc = x.contiguous();
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);
  at::Tensor native_out = flagos::as_native(out);
  const auto stream = static_cast<cudaStream_t>(flagos::native_stream_handle(flagos::current_stream()));
  launch(flagos::as_native(xc), flagos::as_native(yc), native_out, a, stream);
  return out;
}

uint64_t flagos_stream_handle() {
  return reinterpret_cast<uint64_t>(flagos::native_stream_handle(flagos::current_stream()));
}
"""


@pytest.mark.gpu
@pytest.mark.usefixtures("backed_by_cuda")
def test_cuda_kernel_registered_for_cuda_runs_on_flagos_tensors(build_root):
    build = build_root / "flagos_cuda_ext"
    build.mkdir(exist_ok=True)
    ext = cpp_extension.load_inline(
        "flagos_cuda_ext",
        CUDA_DECLARATIONS,
        cuda_sources=CUDA_SOURCE,
        functions=["axpy_on_flagos_stream", "flagos_stream_handle"],
        build_directory=str(build),
    )
    x = torch.randn(10_000)
    y = torch.randn(10_000)
    expected = 2.5 * x + y
    out = torch.ops.flagos_cuda_ext.axpy(x.to("flagos"), y.to("flagos"), 2.5)
    assert out.device.type == "flagos"
    torch.testing.assert_close(out.cpu(), expected)
    # The same CUDA kernel on cuda tensors, as written.
    torch.testing.assert_close(torch.ops.flagos_cuda_ext.axpy(x.cuda(), y.cuda(), 2.5).cpu(), expected)
    # Launched on flagos's stream through the header, inside a flagos stream context.
    stream = torch.flagos.Stream()
    with torch.flagos.stream(stream):
        out2 = ext.axpy_on_flagos_stream(x.to("flagos"), y.to("flagos"), 2.5)
        assert ext.flagos_stream_handle() == torch.cuda.current_stream().cuda_stream
    stream.synchronize()
    torch.testing.assert_close(out2.cpu(), expected)
