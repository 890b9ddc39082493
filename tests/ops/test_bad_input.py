"""Bad input gets a clear error, never a crash or a hang: invalid device indices, negative sizes, broken
accelerator configuration, out-of-bounds views."""

from __future__ import annotations

import os

import pytest
import torch

import torch_fl

# --- invalid device index (checked in a subprocess: a crash there must not take the test run down) -------

BAD_INDEX_CHECKS = {
    "empty": 'torch.empty(3, device="flagos:5")',
    "to": 'torch.randn(3).to("flagos:5")',
    "copy_to_index": 'torch.randn(3).to("flagos").to("flagos:7")',
    "set_device": "torch.flagos.set_device(5)",
    "device_ctx": "exec('with torch.flagos.device(5):\\n    pass')",
    "stream": "torch.flagos.Stream(device=5)",
    "current_stream": "torch.flagos.current_stream(5)",
    "default_stream": "torch.flagos.default_stream(5)",
    "synchronize": "torch.flagos.synchronize(5)",
    "properties": "torch.flagos.get_device_properties(5)",
    "mem_get_info": "torch.flagos.mem_get_info(5)",
    "memory_stats": "torch.flagos.memory_stats(5)",
    "memory_allocated": "torch.flagos.memory_allocated(5)",
    "reset_peak": "torch.flagos.reset_peak_memory_stats(5)",
    "generator": 'torch.Generator("flagos:5")',
    "rng_state": "torch.flagos.get_rng_state(5)",
    "accelerator_set_index": "torch.accelerator.set_device_index(5)",
    "load_map_location": 'torch.load(buf, map_location="flagos:5")',
}

BAD_INDEX_SCRIPT = """
import io, json, sys, torch, torch_fl
torch.empty(1, device="flagos")
buf = io.BytesIO(); torch.save(torch.ones(2).to("flagos"), buf)
checks = json.loads(sys.argv[1])
for name, code in checks.items():
    buf.seek(0)
    try:
        eval(code)
        result = {"raised": None}
    except Exception as e:
        result = {"raised": type(e).__name__, "message": str(e)}
    result["device_after"] = torch.flagos.current_device()
    print("CHECK " + json.dumps([name, result]), flush=True)
"""


@pytest.fixture(scope="module")
def bad_index_results(run_python):
    import json

    result = run_python(
        "",
        args=["-c", BAD_INDEX_SCRIPT, json.dumps(BAD_INDEX_CHECKS)],
        env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_DEVICES": "2"},
    )
    results = {}
    for line in result.stdout.splitlines():
        if line.startswith("CHECK "):
            name, value = json.loads(line[len("CHECK ") :])
            results[name] = value
    return result, results


@pytest.mark.parametrize("name", list(BAD_INDEX_CHECKS))
def test_invalid_device_index_is_a_clear_error(name, bad_index_results):
    proc, results = bad_index_results
    assert name in results, f"the check process died before {name!r}\n{proc!r}"
    res = results[name]
    assert res["raised"] is not None, f"{BAD_INDEX_CHECKS[name]} did not raise"
    assert res["raised"] in ("RuntimeError", "IndexError", "ValueError", "AssertionError"), res
    message = res["message"]
    assert "5" in message or "7" in message, f"the error does not name the bad index: {message!r}"
    assert res["device_after"] == 0


def test_bad_index_process_exits_cleanly(bad_index_results):
    proc, _ = bad_index_results
    assert proc.returncode == 0, repr(proc)


def test_invalid_index_in_process():
    with pytest.raises((RuntimeError, IndexError), match="5"):
        torch.empty(3, device="flagos:5")
    assert torch.flagos.current_device() == 0
    with pytest.raises(IndexError):
        torch.flagos.default_generators[5]


def test_negative_set_device_is_ignored_like_cuda():
    torch.flagos.set_device(-1)
    assert torch.flagos.current_device() == 0


def test_wrong_device_type_arguments():
    with pytest.raises(ValueError, match="flagos"):
        torch.flagos.set_device("cpu")
    with pytest.raises(ValueError, match="flagos"):
        torch.flagos.get_device_properties(torch.device("cpu"))
    with pytest.raises(TypeError):
        torch.flagos.set_device(True)
    with pytest.raises(TypeError):
        torch.flagos.synchronize(1.5)
    with pytest.raises(ValueError):
        torch.flagos.set_stream(torch.Stream(device="cpu"))


# --- sizes, views and copies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(-1, device="flagos"),
        lambda: torch.empty(2, -3, device="flagos"),
        lambda: torch.empty_strided((2, -1), (1, 1), device="flagos"),
        lambda: torch.empty(3, device="flagos").resize_(-2),
        lambda: torch.empty(3, device="flagos").new_empty((4, -5)),
    ],
    ids=["empty", "empty_2d", "empty_strided", "resize_", "new_empty"],
)
def test_negative_sizes(make):
    with pytest.raises(RuntimeError, match="negative"):
        make()


def test_size_overflow():
    with pytest.raises(RuntimeError):
        torch.empty(2**62, dtype=torch.float32, device="flagos")
    with pytest.raises(RuntimeError):
        torch.empty(2**31, 2**31, 2**31, device="flagos")


def test_as_strided_out_of_storage_bounds():
    x = torch.empty(4, device="flagos")
    with pytest.raises(RuntimeError):
        x.as_strided((10,), (1,))
    with pytest.raises(RuntimeError):
        x.as_strided((2,), (1,), 3)
    with pytest.raises(RuntimeError, match="[Nn]egative"):
        x.as_strided((2,), (-1,))


def test_bad_views():
    x = torch.empty(6, device="flagos")
    with pytest.raises(RuntimeError):
        x.view(4, 2)
    with pytest.raises(RuntimeError):
        x.view(2, 3).t().view(6)


def test_item_of_many_elements():
    with pytest.raises(RuntimeError):
        torch.empty(2, device="flagos").item()


def test_cpu_and_flagos_set_mix():
    y = torch.empty(0, device="flagos")
    with pytest.raises(RuntimeError):
        y.set_(torch.empty(4))


# --- indexing with tensors of two devices (torch's rules for a device, as on cuda) -------------------------


def _backed() -> bool:
    """Whether flagos is backed by CUDA, whose kernels check devices on the native route themselves."""
    return torch_fl._C._backing_type() == "cuda"


# What CUDA's kernels say of two devices varies (the generated check, TensorIterator's, an op's own, an out=
# tensor's): each names a device.
_NATIVE_DEVICE_ERROR = "device"


def test_index_with_indices_on_another_device_is_refused(two_devices_only):
    """As PyTorch's test_advancedindex_mixed_devices_error: only cpu or self's device may hold indices."""
    host = torch.randn(3, 4, 4, 4, 3)
    cpu_index = torch.tensor([0, 2, 1])
    for x, ia, ib in (
        (host, cpu_index.to("flagos"), cpu_index.to("flagos")),  # a cpu tensor, flagos indices
        (host, cpu_index, cpu_index.to("flagos")),  # a cpu tensor, cpu and flagos indices
        (host.to("flagos:0"), cpu_index, cpu_index.to("flagos:1")),  # flagos, cpu and another device's
    ):
        message = (
            # Backed by CUDA, CUDA's kernel checks the native route's call, naming its own device.
            rf"indices should be either on cpu or on the same device as the indexed tensor \(({x.device}|cuda:0)\)"
        )
        with pytest.raises(RuntimeError, match=message):
            x[:, ia, None, ib, 0]
        with pytest.raises(RuntimeError, match=message):
            x[ib]


def test_index_with_cpu_indices_works():
    """As PyTorch's test_advancedindex_mixed_cpu_devices: cpu indices (with or without flagos ones) index a
    flagos tensor, in reads and writes."""
    x = torch.randn(3, 4, 4, 4, 3)
    ia = torch.tensor([0, 2, 1])
    for ib in (ia, ia.to("flagos")):
        assert torch.equal(x.to("flagos")[:, ia, None, ib, 0].cpu(), x[:, ia, None, ib.cpu(), 0])
        assert torch.equal(x.to("flagos")[ia].cpu(), x[ia])
        written, expected = x.to("flagos"), x.clone()
        values = torch.randn(expected[:, ia, None, ib.cpu(), 0].shape)
        written[:, ia, None, ib, 0] = values.to("flagos")
        expected[:, ia, None, ib.cpu(), 0] = values
        assert torch.equal(written.cpu(), expected)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_values_on_another_device_is_refused(accumulate):
    """As PyTorch's test_invalid_device (a cuda-only test there): index_put_ takes cpu indices, but its values
    must be on the tensor's device unless they are one 0-dim element."""
    b = torch.zeros(5, device="flagos")
    index = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="device"):
        torch.index_put_(b, (index,), torch.tensor([1.0, 2.0]), accumulate=accumulate)
    assert torch.equal(b.cpu(), torch.zeros(5))
    torch.index_put_(b, (index,), torch.tensor(3.0), accumulate=accumulate)  # a cpu scalar: moved
    torch.index_put_(b, (index,), torch.tensor([1.0, 2.0], device="flagos"), accumulate=accumulate)
    expected = [4.0, 5.0] if accumulate else [1.0, 2.0]
    assert b.cpu().tolist() == expected + [0.0, 0.0, 0.0]


# --- other ops with a tensor of another device (the device check of torch's CUDA kernels) ----------------

# (name, call on a flagos tensor `a` and a tensor `b` of another device, the argument torch names)
MIXED_DEVICE_CALLS = [
    ("mm", lambda a, b: torch.mm(a, b), "mat2"),  # an unboxed kernel on every accelerator
    ("addmm", lambda a, b: torch.addmm(a, a, b), "mat2"),
    ("matmul", lambda a, b: a @ b, "mat2"),  # a composite: its mm refuses
    ("cat", lambda a, b: torch.cat([a, b]), "tensors"),  # a list argument
    ("index_select", lambda a, b: a.index_select(0, b[0].long()), "index"),
    ("embedding", lambda a, b: torch.nn.functional.embedding(b[0].long(), a), "index"),
    ("gather", lambda a, b: a.gather(0, b.long()), "index"),  # the boxed fallback
    ("scatter_add", lambda a, b: a.scatter_add(0, b.long(), a), "index"),
]


@pytest.mark.parametrize("call", [c[1] for c in MIXED_DEVICE_CALLS], ids=[c[0] for c in MIXED_DEVICE_CALLS])
@pytest.mark.parametrize("other", ["cpu", "flagos:1"])
def test_ops_refuse_a_tensor_of_another_device_as_cuda_does(call, other, request):
    """cuda's kernels refuse any tensor argument of another device, even a CPU one, where torch's
    native_functions.yaml does not exempt the op (`device_check: NoCheck`): on flagos the router checks the
    same arguments, so a host kernel (the simulated accelerator's) or the cpu route does not quietly run
    them. The error names the argument, as torch's does."""
    if other == "flagos:1":
        request.getfixturevalue("two_devices_only")  # the CPU cases run on one device too (one GPU)
    name = next(c[2] for c in MIXED_DEVICE_CALLS if c[1] is call)
    a, b = torch.randn(2, 2, device="flagos:0"), torch.zeros(2, 2, device=other)
    with pytest.raises(
        RuntimeError, match=rf"Expected all tensors to be on the same device, but got {name} is"
    ):
        call(a, b)
    with torch_fl.routing.override({"aten::mm": "cpu", "aten::gather": "cpu"}):  # the cpu route checks too
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            call(a, b)
    assert torch.equal(call(a, b.to("flagos:0")).cpu(), call(a.cpu(), b.cpu()))


# (name, call on flagos tensors `a` (3x4 floats), `mask` (3x4 bools) and a 3x4 float tensor `b` of another
# device): TensorIterator ops, which the yaml exempts from the generated check and which check in their
# TensorIterator instead (their out= forms and the ones that are not structured run no meta on flagos).
TENSOR_ITERATOR_CALLS = [
    ("where", lambda a, mask, b: torch.where(mask, a, b)),
    ("where_condition", lambda a, mask, b: torch.where(b > 0, a, a)),
    ("logical_and", lambda a, mask, b: torch.logical_and(a, b)),
    ("floor_divide", lambda a, mask, b: torch.floor_divide(a, b)),
    ("binary_cross_entropy", lambda a, mask, b: torch.nn.functional.binary_cross_entropy(a.sigmoid(), b)),
    ("masked_fill_", lambda a, mask, b: a.clone().masked_fill_(b > 0, 1.0)),
    ("add_", lambda a, mask, b: a.clone().add_(b)),  # in place: the unboxed kernel
    ("mul_out", lambda a, mask, b: torch.mul(a, b, out=torch.empty_like(a))),  # the out= tensor on flagos
    ("sin_out", lambda a, mask, b: torch.sin(a, out=b)),  # the out= tensor on the other device
    ("std_out", lambda a, mask, b: torch.std(a, dim=1, out=b[:, 0])),  # a reduction's
]


@pytest.mark.parametrize(
    "call", [c[1] for c in TENSOR_ITERATOR_CALLS], ids=[c[0] for c in TENSOR_ITERATOR_CALLS]
)
@pytest.mark.parametrize("other", ["cpu", "flagos:1"])
def test_tensor_iterator_ops_refuse_a_tensor_of_another_device(call, other, request):
    """A TensorIterator op refuses a tensor of another device that is not a 0-dim CPU input, with
    TensorIterator's error, on the native and on the cpu route; once the devices agree it gives the CPU's
    result."""
    if other == "flagos:1":
        request.getfixturevalue("two_devices_only")
    a = torch.rand(3, 4, device="flagos:0")
    mask = a > 0.5
    b = torch.rand(3, 4, device=other)
    # TensorIterator names the first operand's device first (outputs come first), and the CPU last.
    pattern = "flagos:0 and cpu!" if other == "cpu" else "(flagos:0 and flagos:1|flagos:1 and flagos:0)!"
    # Backed by CUDA, the native route leaves the check to CUDA's kernel, whose words differ by op.
    if _backed():
        pattern = _NATIVE_DEVICE_ERROR
    with pytest.raises(RuntimeError, match=pattern):
        call(a, mask, b)
    with torch_fl.routing.override(
        {"aten::where.self": "cpu", "aten::add_.Tensor": "cpu", "aten::mul.out": "cpu"}
    ):
        with pytest.raises(RuntimeError, match=pattern):  # the router's check for these three
            call(a, mask, b)
    expected = call(a.cpu(), mask.cpu(), b.cpu())
    # A CUDA kernel's sin or std may differ from the CPU's in the last bit.
    torch.testing.assert_close(call(a, mask, b.to("flagos:0")).cpu(), expected)


_CALLS_OF_TWO_TENSORS = [(name, call) for name, call, _ in MIXED_DEVICE_CALLS] + [
    (name, lambda a, b, call=call: call(a, a > 0.5, b)) for name, call in TENSOR_ITERATOR_CALLS
]


@pytest.mark.gpu  # cuda is the other device type
@pytest.mark.parametrize(
    "call", [c[1] for c in _CALLS_OF_TWO_TENSORS], ids=[c[0] for c in _CALLS_OF_TWO_TENSORS]
)
def test_a_cuda_tensor_beside_flagos_ones_is_refused(call):
    """Backed by CUDA, the native route leaves the device check to CUDA's kernels, which would see a cuda
    tensor and the flagos tensors' cuda aliases as one device: the native call refuses the cuda tensor
    itself, and the flagos tensors are left as they were."""
    a = torch.rand(2, 2, device="flagos")
    before = a.cpu()
    with pytest.raises(RuntimeError, match="device"):
        call(a, torch.rand(2, 2, device="cuda"))
    assert torch.equal(a.cpu(), before)


def test_tensor_iterator_ops_take_0_dim_cpu_inputs_not_outputs():
    """A 0-dim CPU tensor is a scalar input to a TensorIterator op; as its output it is refused."""
    a = torch.arange(3.0, device="flagos")
    assert torch.where(torch.tensor(True), a, a).cpu().tolist() == [0.0, 1.0, 2.0]
    assert a.clone().add_(torch.tensor(1.0)).cpu().tolist() == [1.0, 2.0, 3.0]
    assert torch.pow(torch.tensor(2.0), a).cpu().tolist() == [1.0, 2.0, 4.0]
    out = torch.tensor(5.0)
    with pytest.raises(RuntimeError, match=_NATIVE_DEVICE_ERROR if _backed() else "flagos:0 and cpu!"):
        torch.sum(a, 0, out=out)
    assert out.item() == 5.0  # refused before anything ran


def test_a_0_dim_cpu_tensor_is_refused_where_cuda_refuses_it():
    """The device check exempts no 0-dim tensor (only TensorIterator ops, exempt from it, take them)."""
    with pytest.raises(RuntimeError, match="but got index is on cpu"):
        torch.ones(3, device="flagos").index_select(0, torch.tensor(1))


def test_a_refused_out_call_leaves_its_out_tensor_as_it_was():
    a, out = torch.ones(2, 2, device="flagos"), torch.full((2, 2), 7.0, device="flagos")
    with pytest.raises(
        RuntimeError, match="but got self is on (flagos|cuda):0, different from other tensors on cpu"
    ):
        torch.mm(a, a, out=torch.empty(2, 2))
    with pytest.raises(RuntimeError, match="but got mat2 is on cpu"):
        torch.mm(a, torch.ones(2, 2), out=out)
    assert torch.equal(out.cpu(), torch.full((2, 2), 7.0))


def test_ops_exempt_from_the_device_check_still_take_cpu_tensors():
    """What cuda takes: 0-dim CPU tensors in TensorIterator ops, CPU indices, copies, foreach ops with a
    CPU scalar tensor."""
    a = torch.ones(3, device="flagos")
    assert (a + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]
    assert torch.where(a > 0, a, torch.tensor(0.0)).cpu().tolist() == [1.0, 1.0, 1.0]
    assert a[torch.tensor([0, 2])].cpu().tolist() == [1.0, 1.0]
    a.copy_(torch.arange(3.0))
    torch._foreach_mul_([a], torch.tensor(2.0))
    assert a.cpu().tolist() == [0.0, 2.0, 4.0]


# --- broken configuration (each in its own process: the variables are read once) ------------------------

CONFIG_SCRIPT = """
import json, torch, torch_fl
out = {"available": torch.flagos.is_available(), "count": torch.flagos.device_count(),
       "accelerator": torch_fl.accelerator(), "acc_count": torch.accelerator.device_count(),
       "allocated": torch.flagos.memory_allocated()}
try:
    torch.empty(2, device="flagos")
    out["tensor_error"] = None
except Exception as e:
    out["tensor_error"] = [type(e).__name__, str(e)]
try:
    torch.flagos.current_device()
    out["current_device_error"] = None
except Exception as e:
    out["current_device_error"] = [type(e).__name__, str(e)]
try:
    torch.randn(2).pin_memory()
    out["pin_error"] = None
except Exception as e:
    out["pin_error"] = [type(e).__name__, str(e)]
print("RESULT " + json.dumps(out))
"""


def _check_unusable(out):
    assert out["available"] is False
    assert out["count"] == 0
    assert out["acc_count"] == 0
    assert out["allocated"] == 0
    assert out["tensor_error"] is not None, "creating a tensor without a usable accelerator must raise"
    assert out["tensor_error"][0] == "RuntimeError", out["tensor_error"]
    assert out["current_device_error"] is not None and out["current_device_error"][0] == "RuntimeError"
    return out["tensor_error"][1]


def test_zero_sim_devices(run_python):
    out = (
        run_python(CONFIG_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_DEVICES": "0"}).check().json()
    )
    message = _check_unusable(out)
    assert "FLAGOS_SIM_DEVICES" in message or "no devices" in message, message


def test_cuda_accelerator_without_gpu(run_python):
    if torch.cuda.is_available() or os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU is present")
    out = run_python(CONFIG_SCRIPT, env={"FLAGOS_ACCELERATOR": "cuda"}).check().json()
    message = _check_unusable(out)
    assert "cuda" in message.lower(), message
    assert out["accelerator"] is None


def test_bogus_accelerator(run_python):
    out = run_python(CONFIG_SCRIPT, env={"FLAGOS_ACCELERATOR": "bogus"}).check().json()
    message = _check_unusable(out)
    assert "bogus" in message
    for valid in ("auto", "sim", "cuda"):
        assert valid in message, f"the error should list the valid value {valid!r}: {message}"
    assert out["accelerator"] is None


@pytest.mark.parametrize(
    "env,name",
    [
        ({"FLAGOS_SIM_DEVICES": "two"}, "FLAGOS_SIM_DEVICES"),
        ({"FLAGOS_SIM_DEVICES": "-1"}, "FLAGOS_SIM_DEVICES"),
        ({"FLAGOS_SIM_MEMORY_BYTES": "lots"}, "FLAGOS_SIM_MEMORY_BYTES"),
        ({"FLAGOS_SIM_STREAM_DELAY_US": "soon"}, "FLAGOS_SIM_STREAM_DELAY_US"),
    ],
    ids=["devices_word", "devices_negative", "memory_word", "delay_word"],
)
def test_invalid_sim_settings(run_python, env, name):
    out = run_python(CONFIG_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim", **env}).check().json()
    message = _check_unusable(out)
    assert name in message, f"the error should name {name}: {message}"


def test_explicit_sim_and_memory_suffixes(run_python):
    out = (
        run_python(
            """
        import json, torch, torch_fl
        print("RESULT " + json.dumps([torch_fl.accelerator(), torch.flagos.device_count(),
                                      torch.flagos.mem_get_info()[1]]))
        """,
            env={"FLAGOS_ACCELERATOR": " SIM ", "FLAGOS_SIM_DEVICES": "3", "FLAGOS_SIM_MEMORY_BYTES": "2G"},
        )
        .check()
        .json()
    )
    assert out == ["sim", 3, 2 * 2**30]
