"""Processes and threads: fork after initialisation gives a clear error in the child (spawn works), and
threads switch devices and streams independently."""

from __future__ import annotations

import threading

import torch

FORK_AFTER_INIT_SCRIPT = r"""
import json, os, signal, sys, time, torch, torch_fl
import multiprocessing as mp

def child_report(code):
    os._exit(code)

def spawn_worker(queue):
    import torch, torch_fl
    x = torch.arange(6, dtype=torch.float32).to("flagos")
    queue.put((str(x.device), x.cpu().tolist(), torch.flagos._is_in_bad_fork()))

def wait_child(pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hang"

if __name__ == "__main__":
    out = {}
    x = torch.arange(4, dtype=torch.float32).to("flagos")   # initialises the accelerator
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)                                     # never outlive the test
        code = 10
        try:
            if not torch.flagos._is_in_bad_fork():
                code = 11
            else:
                torch.empty(2, device="flagos")
                code = 12                                    # no error at all
        except RuntimeError as e:
            code = 0 if "forked subprocess" in str(e) else 13
        except BaseException:
            code = 14
        os._exit(code)
    out["child"] = wait_child(pid)

    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        try:
            torch.flagos.synchronize()
            code = 12
        except RuntimeError as e:
            code = 0 if "forked subprocess" in str(e) else 13
        except BaseException:
            code = 14
        os._exit(code)
    out["child_sync"] = wait_child(pid)

    # The parent is unaffected.
    out["parent_bad_fork"] = torch.flagos._is_in_bad_fork()
    out["parent_ok"] = torch.equal(x.cpu(), torch.arange(4, dtype=torch.float32))
    y = torch.arange(3).to("flagos")
    out["parent_new_ok"] = y.cpu().tolist() == [0, 1, 2]

    # spawn works
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=spawn_worker, args=(queue,))
    proc.start()
    try:
        out["spawn"] = queue.get(timeout=60)
    except Exception as e:
        out["spawn"] = repr(e)
    proc.join(30)
    if proc.is_alive():
        proc.kill()
    out["spawn_exit"] = proc.exitcode
    print("RESULT " + json.dumps(out))
"""


def test_fork_after_init_errors_in_child_and_spawn_works(run_python, tmp_path):
    script = tmp_path / "fork_after_init.py"
    script.write_text(FORK_AFTER_INIT_SCRIPT)
    out = run_python("", args=[str(script)], cwd=str(tmp_path), timeout=120).check().json()
    codes = {
        11: "child not marked as bad fork",
        12: "child used flagos without an error",
        13: "error does not mention 'forked subprocess'",
        14: "unexpected exception type",
    }
    assert out["child"] == 0, f"fork child: {codes.get(out['child'], out['child'])}"
    assert out["child_sync"] == 0, (
        f"fork child (synchronize): {codes.get(out['child_sync'], out['child_sync'])}"
    )
    assert out["parent_bad_fork"] is False
    assert out["parent_ok"] is True and out["parent_new_ok"] is True
    assert out["spawn"] == ["flagos:0", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], False], out["spawn"]
    assert out["spawn_exit"] == 0


FORK_BEFORE_INIT_SCRIPT = r"""
import json, os, signal, time, torch, torch_fl
count = torch.flagos.device_count()      # querying does not initialise
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    try:
        x = torch.arange(5, dtype=torch.int32).to("flagos")
        os._exit(0 if x.cpu().tolist() == [0, 1, 2, 3, 4] and not torch.flagos._is_in_bad_fork() else 3)
    except BaseException:
        os._exit(4)
deadline = time.monotonic() + 30
code = "hang"
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        break
    time.sleep(0.02)
else:
    os.kill(pid, signal.SIGKILL)
print("RESULT " + json.dumps({"count": count, "child": code, "parent_init": torch.flagos.is_initialized()}))
"""


def test_fork_before_init_child_can_use_flagos(run_python):
    out = run_python(FORK_BEFORE_INIT_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim"}).check().json()
    assert out["count"] == 2
    assert out["parent_init"] is False
    assert out["child"] == 0, "a child forked before initialisation must be able to use flagos"


def _run_threads(target, count):
    errors = []
    barrier = threading.Barrier(count)

    def wrapper(tid):
        try:
            barrier.wait(timeout=30)
            target(tid)
        except BaseException as e:  # noqa: BLE001 (reported to the main thread)
            errors.append((tid, repr(e)))

    threads = [threading.Thread(target=wrapper, args=(tid,), daemon=True) for tid in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "threads hung"
    assert not errors, errors


def test_new_thread_starts_on_device_0_with_default_stream(two_devices_only):
    torch.flagos.set_device(1)
    side = torch.flagos.Stream(device=1)
    torch.flagos.set_stream(side)
    seen = {}

    def probe():
        seen["device"] = torch.flagos.current_device()
        seen["stream_is_default"] = torch.flagos.current_stream(1) == torch.flagos.default_stream(1)
        torch.flagos.set_device(0)
        torch.flagos.set_stream(torch.flagos.Stream(device=1))

    t = threading.Thread(target=probe)
    t.start()
    t.join(timeout=30)
    assert seen == {"device": 0, "stream_is_default": True}
    assert torch.flagos.current_device() == 1, "another thread's set_device leaked into this one"
    assert torch.flagos.current_stream(1) == side, "another thread's set_stream leaked into this one"


def test_threads_switch_devices_and_streams(device_count):
    iterations = 150
    streams = {
        dev: [torch.flagos.Stream(device=dev), torch.flagos.Stream(device=dev, priority=-1)]
        for dev in range(device_count)
    }
    base = [torch.flagos.memory_allocated(i) for i in range(device_count)]

    def work(tid):
        gen = torch.Generator().manual_seed(tid)
        own = tid % device_count
        torch.flagos.set_device(own)
        for i in range(iterations):
            dev = (tid + i) % device_count
            with torch.flagos.device(dev):
                assert torch.flagos.current_device() == dev
                s = streams[dev][(tid + i) % 2]
                with torch.flagos.stream(s):
                    assert torch.flagos.current_stream() == s
                    src = torch.randn(257, generator=gen)
                    d = src.to("flagos", non_blocking=(i % 2 == 0))
                    assert d.device.index == dev
                    other = d.to(f"flagos:{(dev + 1) % device_count}")
                    back = other.cpu()
                    assert torch.equal(back, src), f"thread {tid} iteration {i}: wrong data"
                assert torch.flagos.current_stream() == torch.flagos.default_stream(dev)
            assert torch.flagos.current_device() == own, f"thread {tid}: device not restored"
            if i % 10 == 0:
                torch.flagos.set_stream(streams[own][0])
                assert torch.flagos.current_stream() == streams[own][0]
                torch.flagos.set_stream(torch.flagos.default_stream(own))

    _run_threads(work, 8)
    torch.flagos.synchronize()
    assert [torch.flagos.memory_allocated(i) for i in range(device_count)] == base


def test_threads_allocate_concurrently():
    base = torch.flagos.memory_allocated()

    def work(tid):
        keep = []
        for i in range(300):
            t = torch.empty(1 + (tid * 131 + i * 17) % 5000, dtype=torch.uint8, device="flagos")
            if i % 4 == 0:
                keep.append(t)
        stats = torch.flagos.memory_stats()
        assert stats["allocated_bytes.all.current"] >= 0
        del keep

    _run_threads(work, 6)
    assert torch.flagos.memory_allocated() == base
