"""Devices through torch's generic API: torch.device, torch.accelerator.*, device contexts, threads, processes.

Counterpart of torch_openreg's tests/test_device.py.
"""

from __future__ import annotations

import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

DEVICE = "flagos"


def test_flagos_is_the_current_accelerator():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device(DEVICE)
    assert torch.accelerator.current_accelerator(check_available=True).type == DEVICE
    assert torch.get_device_module(DEVICE) is getattr(torch, DEVICE)


def test_device_count_agrees_with_device_module():
    count = torch.accelerator.device_count()
    assert count >= 1
    assert count == torch.get_device_module(DEVICE).device_count()


def test_torch_device_spellings():
    assert torch.device(DEVICE, 1) == torch.device(f"{DEVICE}:1")
    assert str(torch.device(f"{DEVICE}:0")) == f"{DEVICE}:0"
    assert torch.device("privateuseone:1") == torch.device(f"{DEVICE}:1")
    assert torch.device(DEVICE).index is None


def test_tensors_land_on_the_named_device(two_devices):
    assert torch.randn(2, 3, device=DEVICE).device == torch.device(DEVICE, 0)
    assert torch.randn(2, 3, device=f"{DEVICE}:1").device == torch.device(DEVICE, 1)
    assert torch.randn(2, 3, device=torch.device(DEVICE, 1)).device.index == 1


def test_set_device_index_switches_and_persists(two_devices):
    for index in range(torch.accelerator.device_count()):
        torch.accelerator.set_device_index(index)
        assert torch.accelerator.current_device_index() == index
        assert torch.empty(1, device=DEVICE).device.index == index
    torch.accelerator.set_device_index(f"{DEVICE}:0")
    assert torch.accelerator.current_device_index() == 0


def test_set_device_index_minus_one_is_a_no_op(two_devices):
    torch.accelerator.set_device_index(1)
    torch.accelerator.set_device_index(-1)
    assert torch.accelerator.current_device_index() == 1


def test_out_of_range_device_index_is_an_error():
    count = torch.accelerator.device_count()
    # CUDA and openreg raise RuntimeError; flagos raises IndexError (c10::IndexError) naming the index.
    with pytest.raises((RuntimeError, IndexError), match=str(count)):
        torch.accelerator.set_device_index(count)
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises((RuntimeError, IndexError)):
        torch.empty(1, device=f"{DEVICE}:{count}")


def test_device_of_another_type_is_rejected():
    with pytest.raises(ValueError, match=DEVICE):
        torch.accelerator.set_device_index("cpu")


def test_device_index_context(two_devices):
    with torch.accelerator.device_index(None):
        assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(1):
        assert torch.accelerator.current_device_index() == 1
        assert torch.randn(2, device=DEVICE).device.index == 1
    assert torch.accelerator.current_device_index() == 0


def test_device_index_context_restores_after_exceptions(two_devices):
    with pytest.raises(ValueError):
        with torch.accelerator.device_index(1):
            raise ValueError("inside")
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError):
        with torch.accelerator.device_index(1):
            with torch.accelerator.device_index(0):
                assert torch.accelerator.current_device_index() == 0
                raise RuntimeError("nested")
    assert torch.accelerator.current_device_index() == 0


def test_torch_device_as_context_sets_default_device(two_devices):
    with torch.device(f"{DEVICE}:1"):
        assert torch.empty(2).device == torch.device(DEVICE, 1)
    assert torch.empty(2).device.type == "cpu"


def test_device_capability_lists_supported_dtypes():
    capability = torch.accelerator.get_device_capability(f"{DEVICE}:0")
    dtypes = capability["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= set(dtypes)
    for index in range(1, torch.accelerator.device_count()):
        assert torch.accelerator.get_device_capability(f"{DEVICE}:{index}")["supported_dtypes"] == dtypes


def test_device_properties_of_the_device_module():
    module = torch.get_device_module(DEVICE)
    props = module.get_device_properties(0)
    assert props.name and props.total_memory > 0
    assert module.get_device_name(0) == props.name
    assert module.get_device_capability(0) == (props.major, props.minor)
    assert torch.accelerator.get_memory_info(0)[1] == props.total_memory


def test_errors_leave_the_device_usable(two_devices):
    torch.accelerator.set_device_index(1)
    with pytest.raises(RuntimeError):
        torch.matmul(torch.randn(5, 5, device=DEVICE), torch.randn(3, 3, device=DEVICE))
    assert torch.accelerator.current_device_index() == 1
    z = torch.randn(5, 5, device=DEVICE)
    torch.testing.assert_close((z @ z).cpu(), z.cpu() @ z.cpu(), rtol=1e-4, atol=1e-4)


def test_current_device_is_per_thread(two_devices):
    torch.accelerator.set_device_index(1)
    seen = {}

    def worker():
        seen["start"] = torch.accelerator.current_device_index()
        torch.accelerator.set_device_index(0)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen["start"] == 0  # a new thread starts on device 0, as with CUDA
    assert torch.accelerator.current_device_index() == 1


def test_concurrent_device_switching(two_devices):
    errors = []
    barrier = threading.Barrier(4)

    def worker(thread_id):
        barrier.wait()
        index = thread_id % 2
        for _ in range(25):
            torch.accelerator.set_device_index(index)
            x = torch.randn(10, 10, device=DEVICE)
            total = torch.matmul(x, x).sum()
            if torch.accelerator.current_device_index() != index or total.device.index != index:
                errors.append((thread_id, torch.accelerator.current_device_index(), total.device))

    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(worker, i) for i in range(4)]:
            future.result()
    assert errors == []


def test_init_and_is_initialized():
    module = torch.get_device_module(DEVICE)
    module.init()
    assert module.is_initialized()


def test_forked_child_cannot_reinitialize(run_python):
    code = """
    import multiprocessing, torch, torch_fl
    torch.flagos.init()
    def child(queue):
        try:
            torch.empty(1, device="flagos")
            queue.put("no error")
        except RuntimeError as error:
            queue.put(str(error))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    process = ctx.Process(target=child, args=(queue,))
    process.start()
    process.join(60)
    print("RESULT " + __import__("json").dumps(queue.get(timeout=5)))
    """
    message = run_python(code).check().json()
    assert "forked subprocess" in message and "spawn" in message


def test_spawned_child_uses_the_device(run_python, tmp_path):
    # spawn re-imports __main__, so the script must be a file
    script = tmp_path / "spawn_child.py"
    script.write_text(
        textwrap.dedent(
            """
    import json, multiprocessing, torch, torch_fl
    def child(queue):
        torch.accelerator.set_device_index(0)
        x = torch.ones(10, 10, device="flagos")
        queue.put((str(x.device), torch.matmul(x, x).sum().item()))
    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        process = ctx.Process(target=child, args=(queue,))
        process.start()
        result = queue.get(timeout=60)
        process.join(60)
        print("RESULT " + json.dumps(result))
    """
        )
    )
    device, total = run_python("", args=[str(script)]).check().json()
    assert device == f"{DEVICE}:0" and total == 1000.0
