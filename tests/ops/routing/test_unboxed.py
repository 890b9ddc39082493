"""The unboxed native-route kernels (csrc/ops/routes/native_unboxed.h): the hottest ops skip the boxed fallback.

``torch_fl._C._routing_unboxed_calls()`` counts the calls the unboxed path served (reset with
``routing.reset_counts()``), so these tests see which way a call went: the unboxed kernel when the op is
routed to ``native``, the boxed route (same counters as the fallback) when a rule sends it elsewhere.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from torch_fl import _C, routing

BACKED = torch_fl._C._backing_type() is not None
# The overload of add whose unboxed kernel these tests watch: add.Tensor, routed directly, when backed; on
# the simulated accelerator add.out (an unboxed kernel standing in for the fallback), called with out=.
ADD = "aten::add.Tensor" if BACKED else "aten::add.out"


@pytest.fixture(autouse=True)
def _clean_routing():
    routing.reset()
    routing.reset_counts()
    yield
    routing.reset()
    routing.load_config(None)


def unboxed() -> int:
    return _C._routing_unboxed_calls()


def test_unboxed_ops_are_registered_for_what_reaches_flagos():
    ops = _C._routing_unboxed_ops()
    assert ops[ADD] == ("direct" if BACKED else "fallback")
    assert (
        ops["aten::native_layer_norm"] == "direct"
    )  # one of the built-in direct routes (ops/routes/entry_kernels.cpp)
    assert "aten::mm.out" in ops or "aten::mm" in ops
    # Explain is unchanged: the op still reaches the router by itself.
    assert routing.explain(ADD).startswith(f"{ADD} -> native (default")


def test_add_takes_the_unboxed_path_and_is_counted_as_native():
    a, b = torch.randn(16, device="flagos"), torch.randn(16, device="flagos")
    before, native = unboxed(), routing.counts()["native"]
    c = torch.add(a, b)
    assert unboxed() == before + 1
    assert routing.counts()["native"] == native + 1
    assert c.device.type == "flagos"
    torch.testing.assert_close(c.cpu(), a.cpu() + b.cpu())


def test_in_place_and_out_return_the_callers_tensors():
    a = torch.randn(16, device="flagos")
    out = torch.empty(16, device="flagos")
    ptr = out.data_ptr()
    before = unboxed()
    assert torch.add(a, a, out=out) is out
    assert out.add_(a) is out
    assert torch.mul(a, 2.0, out=out) is out
    assert unboxed() == before + 3
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)


def test_out_that_must_grow_is_resized():
    a = torch.randn(2, 8, device="flagos")
    out = torch.empty(0, device="flagos")
    assert torch.mm(a, a.t(), out=out) is out
    assert out.shape == (2, 2)
    torch.testing.assert_close(out.cpu(), a.cpu() @ a.cpu().t())


def test_results_match_the_native_device():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, generator=g)
    w, b = torch.randn(16, generator=g), torch.randn(16, generator=g)
    idx = torch.tensor([0, 2, 3])
    mask = x > 0
    cases = {
        "layer_norm": lambda t, w, b, i, m: F.layer_norm(t, (16,), w, b),
        "softmax": lambda t, w, b, i, m: torch.softmax(t, -1),
        "log_softmax": lambda t, w, b, i, m: torch.log_softmax(t, -1),
        "cat": lambda t, w, b, i, m: torch.cat([t, t * 2], 0),
        "where": lambda t, w, b, i, m: torch.where(m, t, w),
        "masked_fill": lambda t, w, b, i, m: t.masked_fill(m, 0.5),
        "index_select": lambda t, w, b, i, m: torch.index_select(t, 0, i),
        "gelu_silu_relu": lambda t, w, b, i, m: F.gelu(t) + F.silu(t) + torch.relu(t),
        "addmm_bmm": lambda t, w, b, i, m: (
            torch.addmm(w, t.t(), t) + torch.bmm(t[None], t.t()[None])[0].sum()
        ),
        "sum_mean": lambda t, w, b, i, m: t.sum(0) + t.mean(-1, keepdim=True),
        "pow_rsqrt_neg": lambda t, w, b, i, m: -(t.pow(2) + 1).rsqrt(),
        # A decoder's rotary set-up and generate's per-token bookkeeping.
        "cos": lambda t, w, b, i, m: torch.cos(t),
        "sin": lambda t, w, b, i, m: torch.sin(t),
        "max": lambda t, w, b, i, m: t.max(),
        "bitwise_and": lambda t, w, b, i, m: m & (t < 0.5),
        "bitwise_or": lambda t, w, b, i, m: m | (t < -0.5),
        "bitwise_not": lambda t, w, b, i, m: ~m,
        "arange": lambda t, w, b, i, m: torch.arange(3, 19, device=t.device, dtype=t.dtype),
        "full": lambda t, w, b, i, m: torch.full((2, 3), 1.5, device=t.device),
        "new_ones": lambda t, w, b, i, m: m.new_ones((1, 4)),
    }
    for name, fn in cases.items():
        expected = fn(x, w, b, idx, mask)
        before = unboxed()
        got = fn(*(t.to("flagos") for t in (x, w, b, idx, mask)))
        assert unboxed() > before, name
        torch.testing.assert_close(got.cpu(), expected, msg=name)


def test_a_rule_sends_the_op_to_its_route_the_boxed_way():
    a = torch.randn(16, device="flagos")
    out = torch.empty(16, device="flagos")
    before = unboxed()
    routing.reset_counts()
    with routing.override({ADD: "cpu"}):
        r = torch.add(a, a, out=out) if ADD.endswith(".out") else torch.add(a, a)
    assert unboxed() == before
    assert routing.counts() == {"native": 0, "cpu": 1, "flaggems": 0, "python": 0}
    if ADD.endswith(".out"):
        assert r is out
    torch.testing.assert_close(r.cpu(), a.cpu() * 2)
    # And back: the next call takes the unboxed path again.
    torch.add(a, a, out=out) if ADD.endswith(".out") else torch.add(a, a)
    assert unboxed() == before + 1


def test_python_route_gets_native_aliases_the_boxed_way():
    seen = []
    native = torch_fl._C._backing_type() or "cpu"

    def impl(*args, **kwargs):
        seen.append(args[0].device.type)
        return torch.ops.aten.add.out(*args, **kwargs) if ADD.endswith(".out") else torch.add(*args, **kwargs)

    routing.register_python_impl(ADD, impl)
    try:
        routing.set(ADD, "python")
        a = torch.ones(4, device="flagos")
        routing.reset_counts()
        before = unboxed()
        if ADD.endswith(".out"):
            out = torch.empty(4, device="flagos")
            assert torch.add(a, a, out=out) is out
            r = out
        else:
            r = torch.add(a, a)
        assert unboxed() == before
        assert seen == [native]
        assert routing.counts()["python"] == 1
        torch.testing.assert_close(r.cpu(), torch.full((4,), 2.0))
    finally:
        routing.set(ADD, None)
        routing.unregister_python_impl(ADD)


def test_kernel_errors_name_the_op():
    # An error the kernel raises on the host on every device (an index out of range is a CUDA device-side
    # assert instead, which would also poison the CUDA context for the tests after it).
    a = torch.randn(4, device="flagos")
    with pytest.raises(
        IndexError, match=r"(?s)Dimension out of range.*while running aten::index_select on flagos"
    ):
        torch.index_select(a, 3, torch.tensor([0], device="flagos"))
    assert torch.equal(torch.index_select(a, 0, torch.tensor([2], device="flagos")).cpu(), a.cpu()[2:3])


@pytest.mark.gpu  # cuda is the second device type
def test_other_device_tensors_are_the_same_device_error():
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(torch.ones(4, device="flagos"), torch.ones(4, device="cuda"))


@pytest.mark.gpu  # cuda is the second device type
def test_list_calls_over_two_devices_are_the_same_device_error(list_calls):
    # Unaliased, CUDA's list kernel sees two devices and falls back to per-tensor ops, each a flagos call
    # that refuses the cuda tensor; the flagos list is left as it was.
    a = [torch.ones(4, device="flagos") for _ in range(3)]
    b = [torch.ones(4, device="cuda") for _ in range(3)]
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_(a, b)
    assert all(torch.equal(t.cpu(), torch.ones(4)) for t in a)


def test_list_kernel_errors_name_the_op(list_calls):
    # An error of the kernel itself (the list's length is checked above it, by autograd). When backed the call
    # reaches the native kernel, with or without aliases; on the simulated accelerator the CPU's composite
    # runs on the flagos tensors (its per-tensor ops are routed) and raises by itself.
    a = [torch.ones(4, device="flagos") for _ in range(3)]
    context = r".*while running aten::_foreach_addcmul_.Tensor on flagos" if BACKED else ""
    # Unaliased, the kernel sees the flagos tensor itself (aliased, its cuda alias): the path was taken.
    seen = ", got flagos:0" if list_calls else ""
    with pytest.raises(RuntimeError, match=r"(?s)Expected scalars to be on CPU" + seen + context):
        torch._foreach_addcmul_(a, a, a, torch.ones(3, device="flagos"))
    assert all(torch.equal(t.cpu(), torch.ones(4)) for t in a)


def test_dispatch_log_is_the_boxed_paths(run_python):
    result = run_python(
        f"""
        import torch, torch_fl
        a = torch.ones(4, device="flagos")
        out = torch.empty(4, device="flagos")
        print("-- go", flush=True)
        torch.add(a, a, out=out) if {ADD.endswith(".out")} else torch.add(a, a)
        torch.add(a, a, out=out) if {ADD.endswith(".out")} else torch.add(a, a)
        """,
        env={"FLAGOS_LOG_DISPATCH": "1"},
    ).check()
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"[flagos dispatch] {ADD} ")]
    assert len(lines) == 2, result.stderr
    assert all(" -> native (default" in line for line in lines)


def test_fresh_result_is_a_plain_flagos_tensor():
    # A native kernel's fresh result becomes the flagos result in place (its TensorImpl and storage
    # relabelled, csrc/ops/routes/native_call.cpp): it must be indistinguishable from a tensor made on flagos.
    a = torch.randn(8, 4, device="flagos")
    before = unboxed()
    r = torch.index_select(a, 0, torch.tensor([1, 3], device="flagos"))
    assert unboxed() == before + 1
    made = torch.empty(2, 4, device="flagos")
    assert torch._C._dispatch_keys(r) == torch._C._dispatch_keys(made)
    assert r.device == made.device and r.untyped_storage().device == made.device
    expected = a.cpu()[[1, 3]]
    # Resizing allocates on flagos, through the flagos allocator, keeping the values.
    torch.flagos.synchronize()
    allocated = torch.flagos.memory_allocated()
    r.resize_(1 << 18)
    assert r.untyped_storage().device == made.device
    assert torch.flagos.memory_allocated() >= allocated + (1 << 20) - 4096  # less the old block
    torch.testing.assert_close(r[:8].cpu().view(2, 4), expected)
    # And it takes part in autograd like any flagos tensor.
    w = r[:8].clone().requires_grad_()
    (w * w).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * expected.reshape(8))


def test_recycled_aliases_hold_no_memory():
    # The native aliases of a call's arguments are kept for reuse: they must not keep the arguments'
    # memory alive once the call is over.
    torch.flagos.synchronize()
    x = torch.randn(1 << 20, device="flagos")
    y = torch.neg(x)
    torch.flagos.synchronize()
    allocated = torch.flagos.memory_allocated()
    del x
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() <= allocated - (4 << 20)
    del y


def test_kept_aliases_follow_their_tensors_memory():
    # A tensor's alias is kept for its next call, which takes it only while it still views that tensor's
    # memory: whatever replaced the memory between the calls, the next call sees the new one.
    x = torch.arange(8.0, device="flagos")
    torch.testing.assert_close(torch.neg(x).cpu(), -torch.arange(8.0))
    x.set_(torch.full((8,), 3.0, device="flagos"))  # another storage
    torch.testing.assert_close(torch.neg(x).cpu(), torch.full((8,), -3.0))
    x.resize_(1 << 16).fill_(2.0)  # the same storage, new memory
    torch.testing.assert_close(torch.neg(x)[-4:].cpu(), torch.full((4,), -2.0))
    x.data = torch.arange(6, dtype=torch.float64, device="flagos")  # another storage and dtype
    torch.testing.assert_close(torch.neg(x).cpu(), -torch.arange(6, dtype=torch.float64))
    # A storage made copy-on-write since: written through the kept alias (an out= argument, which nothing
    # before the native route materialises), the clone must not see it.
    a = torch.arange(4.0, device="flagos")
    torch.add(a, 1)
    clone = torch._lazy_clone(a)
    torch.add(a, 10, out=a)
    torch.testing.assert_close(clone.cpu(), torch.arange(4.0))
    torch.testing.assert_close(a.cpu(), torch.arange(4.0) + 10)
    # Tensors freed and made again, their memory and objects reused: each call sees its own values.
    for i in range(8):
        t = torch.full((16,), float(i), dtype=torch.float32 if i % 2 else torch.int64, device="flagos")
        torch.testing.assert_close(torch.neg(t).cpu(), -torch.full((16,), float(i), dtype=t.dtype))
        del t


@contextlib.contextmanager
def native_kernel_op(namespace: str, schema: str, kernel):
    """A custom op ``namespace::<schema>`` whose CPU and CUDA kernel is the Python function ``kernel``: on
    flagos tensors the native route runs it on their aliases, which it may keep. Yields the op."""
    lib = torch.library.Library(namespace, "DEF")
    try:
        name = schema.split("(", 1)[0]
        lib.define(schema)
        for key in ("CPU", "CUDA"):
            lib.impl(name, kernel, key)
        yield getattr(getattr(torch.ops, namespace), name)
    finally:
        lib._destroy()


def test_an_alias_a_kernel_keeps_keeps_its_memory():
    # The native route's aliases view their arguments' memory without holding it (the caller does, for
    # the call). A kernel that keeps an alias (here a Python kernel of a custom op stashing its input)
    # must find it still viewing that memory after the flagos tensor is gone, and the memory must be freed
    # once the kept alias goes.
    kept = []

    def keep(x):
        kept.append(x)
        return x + 1

    with native_kernel_op("flagos_test_keep", "keep(Tensor x) -> Tensor", keep) as op:
        n = 1 << 18
        x = torch.arange(n, dtype=torch.float32, device="flagos")
        expected = x.cpu()
        torch.flagos.synchronize()
        before = torch.flagos.memory_allocated()
        y = op(x)
        torch.testing.assert_close(y.cpu(), expected + 1)
        del x, y
        # Memory the flagos tensor's release would have returned to the cache is taken again and written.
        others = [torch.full((n,), 7.0, device="flagos") for _ in range(4)]
        torch.flagos.synchronize()
        (alias,) = kept
        assert alias.device.type == (_C._backing_type() or "cpu")
        torch.testing.assert_close(alias.cpu(), expected)
        # Still counted as flagos memory while the alias lives; freed once it goes.
        assert torch.flagos.memory_allocated() >= before - 4096 + 4 * 4 * n
        del others
        torch.flagos.synchronize()
        held = torch.flagos.memory_allocated()
        kept.clear()
        del alias
        torch.flagos.synchronize()
        assert torch.flagos.memory_allocated() <= held - 4 * n


@pytest.mark.parametrize("kept", ["first view", "second view", "the second's memory"])
def test_views_of_one_storage_a_kernel_keeps_keep_their_memory(kept):
    # Two arguments viewing one flagos storage get one native storage (the second alias is made over the
    # first's). The second is dropped after the call unless the kernel kept it; whichever the kernel keeps,
    # the alias or only its memory (a detached view, which holds the storage but not the alias), must keep
    # viewing that memory after the flagos tensor is gone. A custom op runs boxed, whose stack holds the
    # aliases to the end of the call; the unboxed path's release is tests/cpp/native_call_test.cpp's.
    stash = []

    def keep(x, y):
        stash.append({"first view": x, "second view": y, "the second's memory": y.detach()[::2]}[kept])
        return x + y

    with native_kernel_op("flagos_test_keep_views", "keep(Tensor x, Tensor y) -> Tensor", keep) as op:
        n = 1 << 18
        base = torch.arange(2 * n, dtype=torch.float32, device="flagos")
        expected = base.cpu()
        first, second = base[:n], base[n:]
        for _ in range(3):  # the same call again takes the aliases of the one before
            out = op(first, second)
        torch.testing.assert_close(out.cpu(), expected[:n] + expected[n:])
        torch.flagos.synchronize()
        before = torch.flagos.memory_allocated()
        del base, first, second
        # The kept alias holds the whole storage: still counted as flagos memory, and still its values.
        others = [torch.full((2 * n,), 7.0, device="flagos") for _ in range(4)]
        torch.flagos.synchronize()
        assert torch.flagos.memory_allocated() >= before - 4096 + 4 * 8 * n
        want = {
            "first view": expected[:n],
            "second view": expected[n:],
            "the second's memory": expected[n::2],
        }
        for alias in stash:
            torch.testing.assert_close(alias.cpu(), want[kept])
        del others, alias, out
        torch.flagos.synchronize()
        held = torch.flagos.memory_allocated()
        stash.clear()
        torch.flagos.synchronize()
        assert torch.flagos.memory_allocated() <= held - 4 * 2 * n


def test_calls_on_views_of_one_storage_again_and_again():
    # Ops whose arguments view one storage (a cache and a slice of it, in-place and out= views), called
    # repeatedly so that each call takes the aliases the one before left: results as on the CPU.
    k_cpu = torch.randn(1, 8, 40, 16, generator=torch.Generator().manual_seed(0))
    x_cpu = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    k, x = k_cpu.to("flagos"), x_cpu.to("flagos")
    for _ in range(4):
        torch.testing.assert_close(
            torch.cat([k, k[:, :, :1]], dim=-2).cpu(), torch.cat([k_cpu, k_cpu[:, :, :1]], dim=-2)
        )
        torch.testing.assert_close(torch.mul(x[0], x[1]).cpu(), x_cpu[0] * x_cpu[1])
        torch.add(x[0], x[1], out=x[2])
        torch.add(x_cpu[0], x_cpu[1], out=x_cpu[2])
        x[1].mul_(x[0])
        x_cpu[1].mul_(x_cpu[0])
        torch.testing.assert_close(x.cpu(), x_cpu)


def test_recycled_aliases_take_each_calls_geometry():
    # One call after another with other dtypes, shapes, offsets, strides and view bits: each reuses the
    # aliases of the one before, which must take on the new argument's every property.
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(16, generator=g),
        torch.randn(3, 5, generator=g, dtype=torch.float64).t(),
        torch.randn(40, generator=g)[7:31:3],
        torch.arange(12, dtype=torch.int32).view(3, 4)[1:],
        torch.randn(6, generator=g, dtype=torch.complex64).conj(),
        torch.randn(2, 3, generator=g, dtype=torch.bfloat16),
        torch.randn(6, generator=g, dtype=torch.complex64)._neg_view(),
    ]
    for _ in range(2):
        for x in cases:
            f = x.to("flagos")
            torch.testing.assert_close(torch.neg(f).cpu(), torch.neg(x))
            torch.testing.assert_close(torch.mul(f, f).cpu(), torch.mul(x, x))
            torch.testing.assert_close(torch.sum(f).cpu(), torch.sum(x))


def test_unboxed_ops_native_kernels_guard_their_device():
    # When backed, the unboxed path sets no device guard of its own: it relies on each op's native kernel
    # setting its device (no `device_guard: False` in native_functions.yaml).
    yaml = pytest.importorskip("yaml")
    import torchgen

    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged/ATen/native/native_functions.yaml")
    if not os.path.isfile(path):
        pytest.skip("torchgen's native_functions.yaml is not installed")
    with open(path) as f:
        functions = {entry["func"].split("(")[0]: entry for entry in yaml.safe_load(f)}
    assert functions["copy_"].get("device_guard", True) is False  # what the check looks for
    ops = _C._routing_unboxed_ops()
    assert ops
    for op in ops:
        if op == "aten::copy_":
            continue  # takes any mix of devices; CUDA's copy kernel sets the device of each copy itself
        entry = functions[op.removeprefix("aten::")]
        assert entry.get("device_guard", True), op


def test_long_tensor_lists_alias_each_storage_once():
    # A call with a long tensor list (here cat's, 40 views of three storages and 20 tensors of their own)
    # finds what it aliased through maps rather than scans: views of one storage must still share one
    # native storage, and an out= argument is still the caller's tensor.
    g = torch.Generator().manual_seed(0)
    bases = [torch.randn(8, 4, generator=g) for _ in range(3)]
    singles = [torch.randn(1, 4, generator=g) for _ in range(20)]
    pieces = [bases[i % 3][i % 8 : i % 8 + 1] for i in range(40)] + singles
    fl_bases = [b.to("flagos") for b in bases]
    fl_pieces = [fl_bases[i % 3][i % 8 : i % 8 + 1] for i in range(40)] + [s.to("flagos") for s in singles]
    out = torch.empty(60, 4, device="flagos")
    torch.flagos.synchronize()
    allocated = torch.flagos.memory_allocated()
    before = unboxed()
    assert torch.cat(fl_pieces, out=out) is out
    assert unboxed() == before + 1
    torch.testing.assert_close(out.cpu(), torch.cat(pieces))
    fresh = torch.cat(fl_pieces)
    torch.testing.assert_close(fresh.cpu(), torch.cat(pieces))
    del fresh
    torch.flagos.synchronize()
    assert torch.flagos.memory_allocated() == allocated


# The tensor-list ops with unboxed kernels: optimizers' foreach steps and FSDP2's copies. Each case takes
# lists a, b, c, a list p of positive tensors, a 0-dim tensor s and a flat tensor f (made beforehand, so that
# the case makes exactly its op's calls) and returns the tensors to compare. In-place foreach ops return
# their list.
_LIST_CASES = {
    "_foreach_add_.Scalar": lambda a, b, c, p, s, f: torch._foreach_add_(a, 0.5),
    "_foreach_add_.List": lambda a, b, c, p, s, f: torch._foreach_add_(a, b, alpha=2.0),
    "_foreach_add_.ScalarList": lambda a, b, c, p, s, f: torch._foreach_add_(
        a, [0.1 * i for i in range(len(a))]
    ),
    "_foreach_add_.Tensor": lambda a, b, c, p, s, f: torch._foreach_add_(a, s),
    "_foreach_add.List": lambda a, b, c, p, s, f: torch._foreach_add(a, b),
    "_foreach_add.Scalar": lambda a, b, c, p, s, f: torch._foreach_add(a, 2.0),
    "_foreach_sub_.Scalar": lambda a, b, c, p, s, f: torch._foreach_sub_(a, 1.5),
    "_foreach_mul_.Scalar": lambda a, b, c, p, s, f: torch._foreach_mul_(a, 0.9),
    "_foreach_mul_.List": lambda a, b, c, p, s, f: torch._foreach_mul_(a, b),
    "_foreach_mul_.ScalarList": lambda a, b, c, p, s, f: torch._foreach_mul_(
        a, [0.5 + i for i in range(len(a))]
    ),
    "_foreach_mul_.Tensor": lambda a, b, c, p, s, f: torch._foreach_mul_(a, s),
    "_foreach_mul.Scalar": lambda a, b, c, p, s, f: torch._foreach_mul(a, 3.0),
    "_foreach_div_.Scalar": lambda a, b, c, p, s, f: torch._foreach_div_(a, 3.0),
    "_foreach_div_.ScalarList": lambda a, b, c, p, s, f: torch._foreach_div_(
        a, [1.0 + i for i in range(len(a))]
    ),
    "_foreach_div_.List": lambda a, b, c, p, s, f: torch._foreach_div_(a, p),
    "_foreach_div_.Tensor": lambda a, b, c, p, s, f: torch._foreach_div_(a, s),
    "_foreach_lerp_.Scalar": lambda a, b, c, p, s, f: torch._foreach_lerp_(a, b, 0.1),
    "_foreach_lerp_.List": lambda a, b, c, p, s, f: torch._foreach_lerp_(a, b, p),
    "_foreach_addcmul_.Scalar": lambda a, b, c, p, s, f: torch._foreach_addcmul_(a, b, c, 0.01),
    "_foreach_addcmul_.ScalarList": lambda a, b, c, p, s, f: torch._foreach_addcmul_(a, b, c, [0.5] * len(a)),
    "_foreach_addcmul_.Tensor": lambda a, b, c, p, s, f: torch._foreach_addcmul_(
        a, b, c, torch.full((len(a),), 0.5)
    ),
    "_foreach_addcdiv_.Scalar": lambda a, b, c, p, s, f: torch._foreach_addcdiv_(a, b, p, -0.01),
    "_foreach_addcdiv_.ScalarList": lambda a, b, c, p, s, f: torch._foreach_addcdiv_(
        a, b, p, [-0.01] * len(a)
    ),
    "_foreach_addcdiv_.Tensor": lambda a, b, c, p, s, f: torch._foreach_addcdiv_(
        a, b, p, torch.full((len(a),), 0.5)
    ),
    "_foreach_sqrt": lambda a, b, c, p, s, f: torch._foreach_sqrt(p),
    "_foreach_sqrt_": lambda a, b, c, p, s, f: torch._foreach_sqrt_(p),
    "_foreach_neg_": lambda a, b, c, p, s, f: torch._foreach_neg_(a),
    "_foreach_reciprocal_": lambda a, b, c, p, s, f: torch._foreach_reciprocal_(p),
    "_foreach_pow.ScalarAndTensor": lambda a, b, c, p, s, f: torch._foreach_pow(0.9, p),
    "_foreach_norm.Scalar": lambda a, b, c, p, s, f: torch._foreach_norm(a),
    "_foreach_zero_": lambda a, b, c, p, s, f: torch._foreach_zero_(a),
    "_foreach_copy_": lambda a, b, c, p, s, f: torch._foreach_copy_(a, b),
    "_chunk_cat": lambda a, b, c, p, s, f: [torch._chunk_cat(a, dim=0, num_chunks=2)],
    "_chunk_cat.out": lambda a, b, c, p, s, f: [torch._chunk_cat(a, dim=0, num_chunks=1, out=f.view(1, -1))],
    "split_with_sizes_copy.out": lambda a, b, c, p, s, f: (
        torch.split_with_sizes_copy(f, [t.numel() for t in a], out=a) or a
    ),
}


@pytest.mark.gpu  # the list ops' unboxed kernels are registered where backed (composites run on sim)
def test_every_unboxed_list_op_runs_both_ways_here():
    # A list op added to native_unboxed.cpp runs unaliased when backed: it needs a case above, which runs it
    # both ways (some CUDA list kernels refuse flagos tensors: the foreach reductions).
    torch.ones(1, device="flagos")  # the device set up, which registers the direct routes
    prefixes = ("aten::_foreach_", "aten::_chunk_cat", "aten::split_with_sizes_copy")
    listed = {op.removeprefix("aten::") for op in _C._routing_unboxed_ops() if op.startswith(prefixes)}
    assert listed
    assert listed <= set(_LIST_CASES), sorted(listed - set(_LIST_CASES))


# Tensor-list ops without unboxed kernels: their calls take the boxed path, on aliases.
_BOXED_LIST_CASES = {
    "_foreach_maximum_.List": lambda a, b: torch._foreach_maximum_(a, b) or a,
    "_foreach_clamp_min_.Scalar": lambda a, b: torch._foreach_clamp_min_(a, 0.1) or a,
    "_foreach_exp": lambda a, b: torch._foreach_exp(a),
    "_foreach_abs_": lambda a, b: torch._foreach_abs_(a) or a,
    "_foreach_max": lambda a, b: torch._foreach_max(a),
    "_foreach_add.Tensor": lambda a, b: torch._foreach_add(a, b[0][0]),
}


@pytest.mark.parametrize("name", list(_BOXED_LIST_CASES))
def test_boxed_list_ops_match_the_native_device(name):
    g = torch.Generator().manual_seed(1)
    a, b = ([torch.randn(2 + i % 4, generator=g) for i in range(30)] for _ in range(2))
    expected = _BOXED_LIST_CASES[name]([t.clone() for t in a], [t.clone() for t in b])
    fl_a, fl_b = [t.to("flagos") for t in a], [t.to("flagos") for t in b]
    before = routing.counts()["native"]
    got = _BOXED_LIST_CASES[name](fl_a, fl_b)
    if BACKED:
        # One native call for the whole list.
        assert routing.counts()["native"] == before + 1, name
    assert all(t.device.type == "flagos" for t in got)
    torch.testing.assert_close([t.cpu() for t in got], expected)


def test_a_tensor_passed_twice_is_one_alias():
    # Adam's foreach step multiplies the gradients by themselves (_foreach_addcmul_(v, g, g)), and in-place
    # ops may take their own destination again (a.mul_(a)): the kernel sees one tensor twice, as on the
    # native device, and the results match it.
    g = torch.Generator().manual_seed(0)
    v, grads = ([torch.randn(3 + i % 5, generator=g) for i in range(24)] for _ in range(2))
    x = torch.randn(16, generator=g)
    fl_v, fl_grads, fl_x = [t.to("flagos") for t in v], [t.to("flagos") for t in grads], x.to("flagos")
    torch._foreach_addcmul_(v, grads, grads, 0.5)
    torch._foreach_addcmul_(fl_v, fl_grads, fl_grads, 0.5)
    torch.testing.assert_close([t.cpu() for t in fl_v], v)
    torch.testing.assert_close([t.cpu() for t in fl_grads], grads)
    assert fl_x.mul_(fl_x) is fl_x
    torch.testing.assert_close(fl_x.cpu(), x * x)
    torch.testing.assert_close(torch.add(fl_x, fl_x, alpha=2).cpu(), x * x + 2 * x * x)


@pytest.fixture(params=[False, True], ids=["aliased", "unaliased"])
def list_calls(request):
    """Runs a test with tensor-list calls on native aliases and, where the native device's list kernels take
    flagos tensors as they are (CUDA's), once more without aliases; restores the process's setting."""
    before = _C._unaliased_list_calls()
    _C._set_unaliased_list_calls(request.param)
    try:
        if request.param and not _C._unaliased_list_calls():
            pytest.skip("this accelerator's list kernels (host kernels) take native aliases only")
        yield request.param
    finally:
        _C._set_unaliased_list_calls(before)


def test_list_calls_pass_flagos_tensors_where_the_native_kernels_take_them():
    # torch's CUDA list kernels take tensors of any device; the CPU's are composites of per-tensor ops.
    switched_off = os.environ.get("FLAGOS_UNALIASED_LIST_CALLS", "") in ("0", "false", "off", "no")
    assert _C._unaliased_list_calls() == (torch_fl._C._backing_type() == "cuda" and not switched_off)


@pytest.mark.parametrize("name", list(_LIST_CASES))
def test_optimizer_and_fsdp_list_ops_match_the_native_device(name, list_calls):
    g = torch.Generator().manual_seed(0)
    # 24 tensors of mixed sizes: more than a call aliases without its maps.
    a, b, c = ([torch.randn(3 + i % 5, generator=g) for i in range(24)] for _ in range(3))
    p = [torch.rand(3 + i % 5, generator=g) + 0.5 for i in range(24)]
    s = torch.tensor(1.25)
    f = torch.randn(sum(t.numel() for t in a), generator=g)
    inputs = (a, b, c, p, s, f)
    expected = _LIST_CASES[name](
        *[x.clone() if isinstance(x, torch.Tensor) else [t.clone() for t in x] for x in inputs]
    )
    fl_inputs = [
        x.to("flagos") if isinstance(x, torch.Tensor) else [t.to("flagos") for t in x] for x in inputs
    ]
    before = unboxed()
    got = _LIST_CASES[name](*fl_inputs)
    if BACKED:
        # Routed directly when backed: one unboxed call for the whole list (a list kernel that fell back to
        # per-tensor ops on flagos tensors would make more).
        assert _C._routing_unboxed_ops()[f"aten::{name}"] == "direct"
        assert unboxed() == before + 1, name
    assert all(t.device.type == "flagos" for t in got)
    torch.testing.assert_close([t.cpu() for t in got], expected)
