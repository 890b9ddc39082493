"""Fresh outputs of native kernels become flagos tensors without a copy.

On the simulated accelerator the native kernels are CPU kernels; while one runs on the native route its
thread's CPU allocations come from the flagos allocator (runtime::HostKernelAllocations), so the memory a
kernel allocates for its result already is flagos memory and is adopted as it is (Python code on the python
and flaggems routes is not a host kernel: its allocations stay host memory). These tests show that no
copy happens (the flagos result's memory is the memory the kernel returned; no copy op runs), that
``torch.flagos.memory_allocated()`` counts adopted outputs and forgets them and the kernels' temporaries,
and that CPU allocations elsewhere stay CPU memory. When flagos is backed by torch's CUDA,
tests/runtime/test_backed_accelerator.py covers the same for CUDA kernels.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch.profiler import profile

import torch_fl
from torch_fl import routing

pytestmark = pytest.mark.skipif(
    torch_fl._C._backing_type() is not None, reason="the simulated accelerator's host kernels"
)

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _clean_routing():
    routing.reset()
    yield
    routing.reset()


def test_python_code_results_are_host_memory_and_copied():
    # Python code (the python and flaggems routes) is not a host kernel: what it allocates on the CPU
    # stays host memory (it may keep it, or copy into it from flagos), so its results are copied into
    # flagos memory, each on its own even where they share a CPU storage.
    produced = []

    def aminmax(x, dim=None, keepdim=False):
        both = torch.stack([x.min(), x.max()])
        produced.append(both)
        return both[0], both[1]

    x = torch.randn(100)
    torch.flagos.synchronize()
    base = torch.flagos.memory_allocated()
    try:
        routing.register_python_impl("aten::aminmax", aminmax)
        lo, hi = torch.aminmax(x.to("flagos"))
    finally:
        routing.unregister_python_impl("aten::aminmax")
    assert produced[0].device.type == "cpu"
    assert lo.device.type == hi.device.type == "flagos"
    assert produced[0].data_ptr() not in (lo.data_ptr(), hi.data_ptr())
    assert (lo.item(), hi.item()) == (x.min().item(), x.max().item())
    s = torch.flagos.Stream()
    hi.record_stream(s)
    del lo, hi
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() == base


def test_native_route_runs_no_copy_for_a_fresh_result():
    x = torch.randn(4096)
    fx = x.to("flagos")
    torch.relu(fx)  # warm-up
    with profile() as prof:
        y = torch.relu(fx)
    ops = {e.name for e in prof.events()}
    assert "aten::relu" in ops
    assert not ops & {"aten::copy_", "aten::_copy_from", "aten::empty_strided"}, sorted(ops)
    assert torch.equal(y.cpu(), torch.relu(x))


def test_memory_allocated_counts_adopted_results_and_forgets_temporaries():
    x = torch.randn(MiB, device="flagos")
    ln = torch.nn.functional.layer_norm
    torch.relu(x), ln(x.view(256, -1), (4096,)), torch.sort(x)  # warm-up
    torch.flagos.synchronize()
    base = torch.flagos.memory_allocated()
    y = torch.relu(x)
    assert torch.flagos.memory_allocated() - base == 4 * MiB
    del y
    assert torch.flagos.memory_allocated() == base
    # Kernels with temporaries and several results: nothing stays allocated once the results are gone.
    results = [ln(x.view(256, -1), (4096,)), *torch.sort(x), torch.cumsum(x, 0)]
    assert torch.flagos.memory_allocated() - base >= sum(r.nbytes for r in results)
    del results
    assert torch.flagos.memory_allocated() == base


def test_cpu_allocations_outside_the_route_are_cpu_memory():
    torch.flagos.synchronize()
    base = torch.flagos.memory_allocated()
    t = torch.empty(4 * MiB, dtype=torch.uint8)
    u = torch.relu(torch.randn(MiB))
    assert torch.flagos.memory_allocated() == base
    del t, u


def test_threads_mixing_flagos_routes_and_cpu_work():
    x = torch.randn(64, 64)
    fx = x.to("flagos")
    expected = torch.relu(x) + x.sin()
    torch.flagos.synchronize()
    base = torch.flagos.memory_allocated()
    errors = []
    barrier = threading.Barrier(4)

    def on_flagos():
        barrier.wait(10)
        for _ in range(200):
            got = (torch.relu(fx) + fx.sin()).cpu()
            if not torch.equal(got, expected):
                errors.append("flagos result differs")

    def on_cpu():
        barrier.wait(10)
        for _ in range(200):
            got = torch.relu(x) + x.sin()
            if not torch.equal(got, expected):
                errors.append("cpu result differs")

    threads = [threading.Thread(target=f) for f in (on_flagos, on_flagos, on_cpu, on_cpu)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() == base
