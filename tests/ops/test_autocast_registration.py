"""torch.autocast("flagos") as registered: torch.flagos's supported dtypes, the policies' kernels on the
AutocastPrivateUse1 key, and the dtypes those policies hand to the device's kernels. The results of
autocast regions (custom_fwd, GradScaler) are tests/conformance/test_autocast.py."""

from __future__ import annotations

import pytest
import torch


def test_amp_supported_dtypes():
    supported = torch.flagos.get_amp_supported_dtype()
    assert torch.float16 in supported and torch.bfloat16 in supported
    assert torch.float32 not in supported


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_context(dtype):
    assert not torch.is_autocast_enabled("flagos")
    with torch.autocast("flagos", dtype=dtype):
        assert torch.is_autocast_enabled("flagos")
        assert torch.get_autocast_dtype("flagos") == dtype
        assert not torch.is_autocast_enabled("cpu")
        with torch.autocast("flagos", enabled=False):
            assert not torch.is_autocast_enabled("flagos")
        assert torch.is_autocast_enabled("flagos")
    assert not torch.is_autocast_enabled("flagos")


def test_autocast_unsupported_dtype_warns_and_disables():
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("flagos", dtype=torch.float64):
            assert not torch.is_autocast_enabled("flagos")


@pytest.mark.parametrize(
    "op",
    ["aten::mm", "aten::matmul", "aten::linear", "aten::addmm", "aten::bmm", "aten::conv2d", "aten::baddbmm"],
)
def test_lower_precision_policy_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastPrivateUse1"), op


@pytest.mark.parametrize("op", ["aten::layer_norm", "aten::exp", "aten::log_softmax.int", "aten::mse_loss"])
def test_fp32_policy_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastPrivateUse1"), op


AUTOCAST_POLICY_SCRIPT = """
import json, torch, torch_fl

seen = {}

def mm(a, b):
    seen.setdefault("mm", []).append([str(a.dtype), str(b.dtype)])
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)

def exp(a):
    seen.setdefault("exp", []).append([str(a.dtype)])
    return torch.empty_like(a)

def add(a, b, alpha=1):
    seen.setdefault("add", []).append([str(a.dtype), str(b.dtype)])
    return torch.empty_like(a)

# Stand-in PrivateUse1 kernels (compute operators come later) that record the dtypes autocast hands them.
lib = torch.library.Library("aten", "IMPL")
lib.impl("mm", mm, "PrivateUse1")
lib.impl("exp", exp, "PrivateUse1")
lib.impl("add.Tensor", add, "PrivateUse1")

a = torch.randn(4, 3).to("flagos")
b = torch.randn(3, 5).to("flagos")
out = {}
out["mm_plain"] = str(torch.mm(a, b).dtype)
with torch.autocast("flagos", dtype=torch.bfloat16):
    out["mm_bf16"] = str(torch.mm(a, b).dtype)
    out["exp_from_bf16"] = str(torch.exp(a.to(torch.bfloat16)).dtype)
    out["add_mixed"] = str(torch.add(a, a.to(torch.bfloat16)).dtype)
with torch.autocast("flagos", dtype=torch.float16):
    out["mm_fp16"] = str(torch.mm(a, b).dtype)
out["seen"] = seen
print("RESULT " + json.dumps(out))
"""


def test_autocast_policies_cast_inputs(run_python):
    out = run_python(AUTOCAST_POLICY_SCRIPT).check().json()
    assert out["mm_plain"] == "torch.float32"
    assert out["mm_bf16"] == "torch.bfloat16"
    assert out["mm_fp16"] == "torch.float16"
    assert out["seen"]["mm"] == [
        ["torch.float32", "torch.float32"],
        ["torch.bfloat16", "torch.bfloat16"],
        ["torch.float16", "torch.float16"],
    ]
    # exp runs in float32 under autocast; ops without a policy (add) fall through unchanged.
    assert out["seen"]["exp"] == [["torch.float32"]]
    assert out["exp_from_bf16"] == "torch.float32"
    assert out["seen"]["add"] == [["torch.float32", "torch.bfloat16"]]
