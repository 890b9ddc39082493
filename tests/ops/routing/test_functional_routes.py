"""Routes on ops that do not reach the router by themselves, and the per-backend call counters.

On flagos, ops without a native kernel of their own run a composite kernel that calls other ops
(aten::mv calls addmv_), and CompositeImplicitAutograd ops (aten::linear) decompose; a rule naming such an op
registers the router's kernel for it, so the rule takes effect. Ops with a native kernel (aten::mm,
aten::add.Tensor) reach the router by themselves, with or without a rule. ``routing.counts()``
shows which backend served each call, which is how these tests see which route ran.

In-process tests change the API and config levels and restore them; the environment is tested in
subprocesses. The kernel registrations these tests cause stay for the process (by design): with no rule,
a registered op behaves as before, which test_reset_route_behaves_as_never_routed checks.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from torch_fl import routing

NATIVE = "CUDA" if torch_fl.accelerator() == "cuda" else "CPU"
NATIVE_DEVICE = NATIVE.lower()
# Backed by torch's CUDA, results are CUDA's: equal to CPU's within float32 tolerance, not bitwise. Ops with a
# native kernel reach the router under their own name on every accelerator (ops/routes/entry_kernels.h).
BACKED = torch_fl._C._backing_type() is not None
ZERO = {"native": 0, "cpu": 0, "flaggems": 0, "python": 0}


@pytest.fixture(autouse=True)
def _clean_routing():
    routing.reset()
    yield
    routing.reset()
    routing.load_config(None)


def counts_of(fn):
    """(result of fn(), routing.counts() of the calls fn made)."""
    torch.flagos.synchronize()
    routing.reset_counts()
    result = fn()
    return result, routing.counts()


def only(**backends) -> dict:
    return {**ZERO, **backends}


def mats():
    a = torch.randn(5, 3)
    b = torch.randn(3, 4)
    return a, b, a.to("flagos"), b.to("flagos")


def assert_equal(flagos_result, expected):
    assert flagos_result.device.type == "flagos"
    exact = {} if BACKED else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(flagos_result.cpu(), expected, **exact)


# ---- the functional op itself takes its route ---------------------------------------------------------


def test_api_route_on_mm_runs_on_cpu():
    a, b, fa, fb = mats()
    routing.set("aten::mm", "cpu")
    result, counts = counts_of(lambda: torch.mm(fa, fb))
    assert counts == only(cpu=1), "the whole mm ran on the cpu route, nothing else was routed"
    assert_equal(result, a @ b)
    assert routing.explain("mm") == "aten::mm -> cpu (api)"


def test_python_impl_of_mm_is_called_for_torch_mm():
    a, b, fa, fb = mats()
    calls = []

    def mm(self, mat2):
        calls.append((self.device.type, mat2.device.type, tuple(self.shape), tuple(mat2.shape)))
        return torch.mm(self, mat2)

    try:
        assert routing.register_python_impl("aten::mm", mm) == "aten::mm"
        result, counts = counts_of(lambda: torch.mm(fa, fb))
        matmul_result = fa @ fb  # torch.matmul of two matrices calls aten::mm too
    finally:
        routing.unregister_python_impl("aten::mm")
    assert calls == [(NATIVE_DEVICE, NATIVE_DEVICE, (5, 3), (3, 4))] * 2
    assert counts == only(python=1)
    assert_equal(result, a @ b)
    assert_equal(matmul_result, a @ b)


def test_config_line_on_add_tensor(tmp_path):
    conf = tmp_path / "add.conf"
    conf.write_text("add.Tensor = cpu\n")
    routing.load_config(str(conf))
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    result, counts = counts_of(lambda: x.to("flagos") + y.to("flagos"))
    assert counts["cpu"] == 1, counts
    assert_equal(result, x + y)
    assert routing.explain("add.Tensor") == f"aten::add.Tensor -> cpu (config {conf}:1)"


def test_override_context_routes_mm_and_restores():
    a, b, fa, fb = mats()
    with routing.override({"aten::mm": "cpu"}):
        inside, inside_counts = counts_of(lambda: torch.mm(fa, fb))
    after, after_counts = counts_of(lambda: torch.mm(fa, fb))
    assert inside_counts == only(cpu=1)
    assert after_counts == only(native=1), "after the block mm runs natively again"
    assert_equal(inside, a @ b)
    assert_equal(after, a @ b)


def test_env_var_routes_mm_in_a_fresh_process(run_python):
    result = run_python(
        """
        import json, torch, torch_fl
        from torch_fl import routing
        a, b = torch.randn(5, 3), torch.randn(3, 4)
        routing.reset_counts()
        c = torch.mm(a.to("flagos"), b.to("flagos"))
        counts = routing.counts()
        exact = torch.equal(c.cpu(), a @ b)
        print("RESULT " + json.dumps([counts, exact, routing.explain("mm"), c.device.type]))
        """,
        env={"FLAGOS_OP_mm": "cpu"},
    ).check()
    counts, exact, explained, device = result.json()
    assert counts["cpu"] == 1 and counts["native"] == 0, counts
    assert exact and device == "flagos"
    assert explained == "aten::mm -> cpu (env FLAGOS_OP_mm)"


def test_backend_config_at_import_routes_add_tensor(run_python, tmp_path):
    conf = tmp_path / "import.conf"
    conf.write_text("aten::add.Tensor = cpu\n")
    result = run_python(
        """
        import json, torch, torch_fl
        from torch_fl import routing
        x = torch.ones(3, device="flagos")
        routing.reset_counts()
        y = x + x
        print("RESULT " + json.dumps([routing.counts()["cpu"], y.cpu().tolist()]))
        """,
        env={"FLAGOS_BACKEND_CONFIG": str(conf)},
    ).check()
    assert result.json() == [1, [2.0, 2.0, 2.0]]


def test_log_dispatch_shows_the_routed_op_and_the_composite_path(run_python):
    # mm has a native kernel: its calls reach the router as mm, with a rule or without. mv has only a
    # composite kernel: with a rule its calls reach the router as mv; with the rule removed the composite runs
    # again and calls addmv_, which is routed on its own.
    result = run_python(
        """
        import torch, torch_fl
        from torch_fl import routing
        a, v = torch.ones(2, 2, device="flagos"), torch.ones(2, device="flagos")
        for op, call in (("mm", lambda: torch.mm(a, a)), ("mv", lambda: torch.mv(a, v))):
            routing.set(op, "cpu")
            call()
            routing.set(op, None)
            call()
        """,
        env={"FLAGOS_LOG_DISPATCH": "1"},
    ).check()
    lines = [line for line in result.stderr.splitlines() if line.startswith("[flagos dispatch] aten::m")]
    lines += [
        line for line in result.stderr.splitlines() if line.startswith("[flagos dispatch] aten::addmv_")
    ]
    native = f"native (default: native has a {NATIVE} kernel)"
    assert lines == [
        "[flagos dispatch] aten::mm -> cpu (api)",
        f"[flagos dispatch] aten::mm -> {native}",
        "[flagos dispatch] aten::mv -> cpu (api)",
        f"[flagos dispatch] aten::mv -> {native}; note: no rule names it, so on flagos it runs its "
        "CompositeExplicitAutograd kernel, which calls other ops that are routed on their own "
        "(FLAGOS_LOG_DISPATCH=1 shows them)",
        f"[flagos dispatch] aten::addmv_ -> {native}",
    ], result.stderr


def test_explicit_native_runs_the_op_itself_not_its_out_overload():
    a, b, fa, fb = mats()
    routing.set("aten::mm", "native")
    with routing.override({"aten::mm.out": "cpu"}):
        result, counts = counts_of(lambda: torch.mm(fa, fb))
    assert counts == only(native=1), "mm ran natively itself; mm.out (routed to cpu) was not called"
    assert_equal(result, a @ b)


def test_reset_route_behaves_as_never_routed():
    a = torch.randn(5, 3)
    v = torch.randn(3)
    fa, fv = a.to("flagos"), v.to("flagos")
    before = torch.mv(fa, fv)
    routing.set("aten::mv", "cpu")
    torch.mv(fa, fv)
    routing.set("aten::mv", None)
    # With no rule, mv runs its composite kernel again, which calls addmv_: routing addmv_ shows it.
    with routing.override({"aten::addmv_": "cpu"}):
        after, counts = counts_of(lambda: torch.mv(fa, fv))
    assert counts == only(cpu=1)
    assert_equal(before, a @ v)
    assert_equal(after, a @ v)
    assert "no rule names it, so on flagos it runs its CompositeExplicitAutograd kernel" in routing.explain(
        "mv"
    )


def test_in_place_and_out_variants_of_a_routed_functional_op_are_unaffected():
    x = torch.randn(8)
    fx = x.to("flagos")
    routing.set("aten::add.Tensor", "cpu")
    y = fx.clone()
    y.add_(fx)  # add_.Tensor: an op of its own, not routed
    torch.testing.assert_close(y.cpu(), x + x, rtol=0, atol=0)
    out = torch.empty(8, device="flagos")
    torch.add(fx, fx, out=out)
    torch.testing.assert_close(out.cpu(), x + x, rtol=0, atol=0)


# ---- kernels that must not be replaced ----------------------------------------------------------------

# Every basic kernel of flagos (csrc/ops/kernels/basic_ops.cpp, copy.cpp; registered in csrc/ops/registration.cpp).
BASIC_OPS = [
    "aten::empty.memory_format",
    "aten::empty_strided",
    "aten::as_strided",
    "aten::view",
    "aten::_reshape_alias",
    "aten::resize_",
    "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset",
    "aten::set_.source_Tensor",
    "aten::set_",
    "aten::_local_scalar_dense",
    "aten::record_stream",
    "aten::_copy_from",
    "aten::_copy_from_and_resize",
]


def privateuse1_kernel(op: str) -> str:
    table = torch._C._dispatch_dump_table(op)
    return next(line for line in table.splitlines() if line.startswith("PrivateUse1:"))


@pytest.mark.parametrize("op", BASIC_OPS)
def test_routes_never_replace_a_basic_kernel(op):
    before = privateuse1_kernel(op)
    assert "csrc/ops/" in before and "[kernel]" in before, before
    routing.set(op, "cpu")
    with routing.override({op: "python"}):
        assert privateuse1_kernel(op) == before
    assert privateuse1_kernel(op) == before
    assert "flagos has a kernel of its own for it (registered at " in routing.explain(op)
    x, counts = counts_of(lambda: torch.empty(3, 4, device="flagos").view(12))
    assert counts == ZERO and x.shape == (12,)


# ---- CompositeImplicitAutograd ops ---------------------------------------------------------------------


def test_routed_implicit_autograd_op_runs_its_route_and_keeps_autograd():
    x = torch.randn(4, 3)
    w = torch.randn(5, 3)
    fx, fw = x.to("flagos"), w.to("flagos")
    routing.set("aten::linear", "cpu")
    result, counts = counts_of(lambda: F.linear(fx, fw))
    assert counts == only(cpu=1)
    assert_equal(result, F.linear(x, w))
    assert "when autograd records a call" in routing.explain("linear")

    # When autograd records the call, linear decomposes as before: its derivative comes from that.
    fw_leaf = fw.clone().requires_grad_()
    w_leaf = w.clone().requires_grad_()
    out, counts = counts_of(lambda: F.linear(fx, fw_leaf))
    assert counts["cpu"] == 0 and counts["native"] >= 1, counts
    assert out.grad_fn is not None
    out.square().sum().backward()
    F.linear(x, w_leaf).square().sum().backward()
    assert fw_leaf.grad.device.type == "flagos"
    torch.testing.assert_close(fw_leaf.grad.cpu(), w_leaf.grad)
    with torch.no_grad():
        _, counts = counts_of(lambda: F.linear(fx, fw_leaf))
    assert counts == only(cpu=1), "under no_grad nothing is recorded, so the route applies"


# ---- ops of other libraries -----------------------------------------------------------------------------


def test_custom_op_with_a_composite_kernel_and_its_redefinition():
    x = torch.arange(4.0)
    lib = torch.library.Library("flagos_test_routes", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda t: t * 2, "CompositeImplicitAutograd")
    op = "flagos_test_routes::twice"
    routing.set(op, "cpu")
    result, counts = counts_of(lambda: torch.ops.flagos_test_routes.twice(x.to("flagos")))
    assert counts == only(cpu=1)
    assert_equal(result, x * 2)
    routing.set(op, None)
    del lib  # the op is deregistered; the router's kernel for it stays

    # Defined again, now with a CPU kernel only: with no composite left, the default chain applies.
    lib = torch.library.Library("flagos_test_routes", "DEF")
    try:
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda t: t * 3, "CPU")
        result, counts = counts_of(lambda: torch.ops.flagos_test_routes.twice(x.to("flagos")))
        if NATIVE == "CPU":
            assert counts == only(native=1)
            assert routing.explain(op) == f"{op} -> native (default: native has a CPU kernel)"
        else:
            assert counts == only(cpu=1)
            assert routing.explain(op) == f"{op} -> cpu (default: native has no {NATIVE} kernel)"
        assert_equal(result, x * 3)
    finally:
        del lib


# ---- ops flagos routes directly from the start --------------------------------------------------------


@pytest.mark.parametrize(
    "op",
    ["native_layer_norm", "native_group_norm", "addr", "convolution", "convolution_backward", "mse_loss"],
)
def test_builtin_direct_ops_reach_the_router(op):
    assert routing.explain(op) == f"aten::{op} -> native (default: native has a {NATIVE} kernel)"


def test_layer_norm_matches_the_native_kernel():
    x = torch.randn(6, 33) * 10 + 3
    w, b = torch.randn(33), torch.randn(33)
    result, counts = counts_of(lambda: F.layer_norm(x.to("flagos"), (33,), w.to("flagos"), b.to("flagos")))
    assert counts == only(native=1), "one native_layer_norm call, not a decomposition"
    assert_equal(result, F.layer_norm(x, (33,), w, b))

    fw = w.to("flagos").requires_grad_()
    F.layer_norm(x.to("flagos"), (33,), fw, b.to("flagos")).square().sum().backward()
    w.requires_grad_()
    F.layer_norm(x, (33,), w, b).square().sum().backward()
    assert fw.grad.device.type == "flagos"
    # Against the CPU: bitwise on sim (the same CPU kernels); close when backed by CUDA (a CUDA backward
    # cannot run beside flagos, see docs/design.md, so the CPU is the reference there too).
    assert_equal(fw.grad, w.grad)


def test_mse_loss_does_not_warn():
    x, y = torch.randn(16, 5), torch.randn(16, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for reduction in ["mean", "sum", "none"]:
            result = F.mse_loss(x.to("flagos"), y.to("flagos"), reduction=reduction)
            assert_equal(result, F.mse_loss(x, y, reduction=reduction))


def test_convolution_forward_and_backward():
    x = torch.randn(2, 3, 9, 9)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    reference = conv(x)
    reference.sum().backward()
    expected_grad = conv.weight.grad.clone()
    conv.zero_grad()
    conv_fl = conv.to("flagos")
    out = conv_fl(x.to("flagos"))
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), reference.detach())
    assert conv_fl.weight.grad.device.type == "flagos"
    torch.testing.assert_close(conv_fl.weight.grad.cpu(), expected_grad)


# ---- counters -------------------------------------------------------------------------------------------


def test_counts_and_reset():
    routing.reset_counts()
    assert routing.counts() == ZERO
    x = torch.randn(16, device="flagos")
    _, counts = counts_of(lambda: (x.exp(), x.sin(), x.cos()))
    assert counts == only(native=3)
    with routing.override({"aten::exp": "cpu"}):
        _, counts = counts_of(lambda: (x.exp(), x.sin()))
    assert counts == only(native=1, cpu=1)
    routing.reset_counts()
    assert routing.counts() == ZERO


def test_counts_name_the_backend_after_fall_through(flaggems_unavailable):
    x = torch.randn(16, device="flagos")
    routing.set("aten::exp", "flaggems")  # unavailable here: falls through to native
    with warnings.catch_warnings():
        # The fall-through warning is once per process (tests/flaggems/test_flaggems.py checks it in a fresh
        # one).
        warnings.simplefilter("ignore")
        _, counts = counts_of(lambda: x.exp())
    assert counts == only(native=1)


def test_counts_are_exact_across_threads():
    x = torch.randn(8, device="flagos")
    per_thread, threads = 500, 4
    barrier = threading.Barrier(threads)

    def work():
        barrier.wait(10)
        for _ in range(per_thread):
            x.neg()

    routing.reset_counts()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert routing.counts() == only(native=per_thread * threads)


def test_counts_of_a_live_thread_and_reset_while_it_lives():
    # Counters are kept per thread and summed on read: a thread's calls count while it lives and after
    # it exits, and a reset clears what it had counted without losing its later calls.
    x = torch.randn(8, device="flagos")
    counted, resume, done = threading.Event(), threading.Event(), threading.Event()

    def work():
        for _ in range(30):
            x.neg()
        counted.set()
        resume.wait(30)
        for _ in range(7):
            x.neg()
        done.set()

    routing.reset_counts()
    worker = threading.Thread(target=work)
    worker.start()
    assert counted.wait(30)
    assert routing.counts() == only(native=30)
    routing.reset_counts()
    assert routing.counts() == ZERO
    resume.set()
    assert done.wait(30)
    assert routing.counts() == only(native=7)
    worker.join(30)
    assert routing.counts() == only(native=7)
    routing.reset_counts()
    assert routing.counts() == ZERO
