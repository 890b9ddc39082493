"""Kernel binaries loaded and launched through the HAL (torch_fl._C._kernel_load, _kernel_param_layout,
_kernel_launch) on the simulated accelerator, whose binaries are host shared libraries: the kernels below are
compiled with the system C compiler and launched on flagos tensors' memory."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
import torch

import torch_fl

pytestmark = pytest.mark.skipif(
    torch_fl._C._accelerator_name() != "sim", reason="host kernel binaries are the simulated accelerator's"
)

BLOCK = 64

# Each kernel reads its parameters at their natural alignment, as CUDA kernels read theirs.
KERNELS = r"""
#include <unistd.h>

typedef struct { unsigned grid[3]; unsigned program_id[3]; } context_t;

struct axpy_params { const float* x; float* y; float a; int n; };
void axpy_f32(const context_t* c, const void* p) {
  const struct axpy_params* a = p;
  for (int i = c->program_id[0] * 64; i < (int)(c->program_id[0] + 1) * 64 && i < a->n; ++i)
    a->y[i] += a->a * a->x[i];
}

/* Fills y with `value` after a pause in the first program: work that does not wait for it sees old data. */
struct fill_params { float* y; float value; int n; };
void fill_after_pause_f32(const context_t* c, const void* p) {
  const struct fill_params* f = p;
  if (c->program_id[0] == 0) usleep(50000);
  for (int i = c->program_id[0] * 64; i < (int)(c->program_id[0] + 1) * 64 && i < f->n; ++i)
    f->y[i] = f->value;
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> bytes:
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no system C compiler (cc) to build host kernels with")
    directory = tmp_path_factory.mktemp("host_kernels")
    source = directory / "kernels.c"
    source.write_text(KERNELS)
    target = directory / "libkernels.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(target), str(source)], check=True, timeout=60
    )
    return str(target).encode()


def grid_for(n: int) -> tuple[int, int, int]:
    return ((n + BLOCK - 1) // BLOCK, 1, 1)


def axpy(function: int, x: torch.Tensor, y: torch.Tensor, a: float, stream=None) -> None:
    params = struct.pack("PPfi", x.data_ptr(), y.data_ptr(), a, y.numel())
    torch_fl._C._kernel_launch(function, grid_for(y.numel()), (BLOCK, 1, 1), 0, params, stream)


def fill_after_pause(function: int, y: torch.Tensor, value: float, stream=None) -> None:
    params = struct.pack("Pfi", y.data_ptr(), value, y.numel())
    torch_fl._C._kernel_launch(function, grid_for(y.numel()), (BLOCK, 1, 1), 0, params, stream)


def test_axpy_matches_torch_on_the_host(library):
    function = torch_fl._C._kernel_load(0, library, "axpy_f32")
    x = torch.randn(1000)
    y = torch.randn(1000)
    y_flagos = y.to("flagos")
    axpy(function, x.to("flagos"), y_flagos, 2.5)
    torch.testing.assert_close(y_flagos.cpu(), y + 2.5 * x)


def test_repeated_launches_each_run(library):
    function = torch_fl._C._kernel_load(0, library, "axpy_f32")
    x = torch.randn(1000)
    y = torch.randn(1000)
    y_flagos = y.to("flagos")
    x_flagos = x.to("flagos")
    params = struct.pack("PPfi", x_flagos.data_ptr(), y_flagos.data_ptr(), 0.5, y.numel())
    torch_fl._C._kernel_launch(function, grid_for(y.numel()), (BLOCK, 1, 1), 0, params, None, repeat=3)
    torch.testing.assert_close(y_flagos.cpu(), y + 1.5 * x)
    with pytest.raises(RuntimeError, match="repeat must be at least 1"):
        torch_fl._C._kernel_launch(function, grid_for(y.numel()), (BLOCK, 1, 1), 0, params, None, repeat=0)
    torch.testing.assert_close(y_flagos.cpu(), y + 1.5 * x)  # the refused call launched nothing


def test_loads_are_cached_and_errors_name_what_is_missing(library, tmp_path):
    function = torch_fl._C._kernel_load(0, library, "axpy_f32")
    assert torch_fl._C._kernel_load(0, library, "axpy_f32") == function
    assert torch_fl._C._kernel_load(0, library, "fill_after_pause_f32") != function
    assert torch_fl._C._kernel_param_layout(function) is None  # host kernels carry no parameter metadata
    with pytest.raises(RuntimeError, match="no_such_kernel"):
        torch_fl._C._kernel_load(0, library, "no_such_kernel")
    missing = str(tmp_path / "missing.so")
    with pytest.raises(RuntimeError, match="missing.so"):
        torch_fl._C._kernel_load(0, missing.encode(), "axpy_f32")


def test_launches_run_in_order_with_the_work_of_their_stream(library):
    fill = torch_fl._C._kernel_load(0, library, "fill_after_pause_f32")
    axpy_f32 = torch_fl._C._kernel_load(0, library, "axpy_f32")
    x = torch.arange(300, dtype=torch.float32, device="flagos")
    y = torch.zeros(300, device="flagos")
    side = torch.flagos.Stream()
    with torch.flagos.stream(side):  # the current stream
        fill_after_pause(fill, y, 7.0)
        axpy(axpy_f32, x, y, 2.0)  # after the fill, or the fill overwrites it
        doubled = y * 2  # an operator on the same stream waits for both
    torch.flagos.current_stream().wait_stream(side)
    expected = 7.0 + 2.0 * torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close(doubled.cpu(), 2 * expected)
    torch.testing.assert_close(y.cpu(), expected)


def test_launch_on_an_explicit_stream(library):
    fill = torch_fl._C._kernel_load(0, library, "fill_after_pause_f32")
    y = torch.zeros(100, device="flagos")
    side = torch.flagos.Stream()
    fill_after_pause(fill, y, 3.0, stream=side)
    side.synchronize()
    assert torch.flagos.current_stream() == torch.flagos.default_stream()
    assert bool((y.cpu() == 3.0).all())


def test_functions_belong_to_their_device(library, two_devices_only):
    on_1 = torch_fl._C._kernel_load(1, library, "axpy_f32")
    assert on_1 != torch_fl._C._kernel_load(0, library, "axpy_f32")
    x = torch.ones(10, device="flagos:1")
    y = torch.ones(10, device="flagos:1")
    axpy(on_1, x, y, 1.0, stream=torch.flagos.current_stream(1))
    assert bool((y.cpu() == 2.0).all())
    with pytest.raises(RuntimeError, match="device 1 on a stream of device 0"):
        axpy(on_1, x, y, 1.0)  # the current stream is device 0's


def test_a_graph_capture_records_launches_and_replays_them(library):
    axpy_f32 = torch_fl._C._kernel_load(0, library, "axpy_f32")
    x = torch.arange(200, dtype=torch.float32, device="flagos")
    y = torch.zeros(200, device="flagos")
    graph = torch.flagos.FlagosGraph()
    with torch.flagos.graph(graph):
        axpy(axpy_f32, x, y, 1.0)
    assert bool((y.cpu() == 0).all()), "a captured launch ran during the capture"
    graph.replay()
    graph.replay()
    torch.testing.assert_close(y.cpu(), 2 * torch.arange(200, dtype=torch.float32))
