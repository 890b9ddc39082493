"""The functions tests/compile/test_compile.py compiles, and how it compares compiled with eager results.

47 functions in groups (elementwise, reductions, views, indexing, matmul, softmax and losses, norms,
attention, in-place): each group is compiled as one function calling all of its members, and every
member's outputs are compared with eager flagos's on their own. Inputs are copies of seeded CPU tensors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

DEVICE = "flagos"
TOL = {  # compiled against eager, per dtype of the compared output
    torch.float32: dict(rtol=1.3e-5, atol=2e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}


def _tol(dtype: torch.dtype, scale: float) -> dict:
    base = TOL.get(dtype, dict(rtol=0, atol=0))
    return {key: value * scale for key, value in base.items()}


def assert_same(actual, expected, scale: float = 1.0, where: str = "output") -> None:
    """Compiled against eager: same structure; tensors on the same device, of the same dtype and shape,
    values within the dtype's tolerance (times ``scale``: matmuls and reductions of many terms)."""
    if isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, scale, f"{where}[{i}]")
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, where
        return
    assert isinstance(actual, torch.Tensor), f"{where}: {type(actual)}"
    assert actual.device == expected.device, f"{where}: on {actual.device}, eager on {expected.device}"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
    torch.testing.assert_close(
        actual.cpu(),
        expected.cpu(),
        equal_nan=True,
        msg=lambda m: f"{where}: {m}",
        **_tol(expected.dtype, scale),
    )


def rand(*shape, dtype=torch.float32, seed=0, low=None):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = torch.randn(*shape, generator=g, dtype=torch.float32)
    if low is not None:
        t = t.abs() + low
    return t.to(DEVICE, dtype)


def ints(high, *shape, seed=0):
    g = torch.Generator().manual_seed(seed + high)
    return torch.randint(0, high, shape, generator=g).to(DEVICE)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    args: Callable[[], tuple]
    scale: float = 1.0  # tolerance multiplier
    mutates: bool = False  # the function writes into its inputs: compare those too


def _attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _index_put(x, idx, v):
    x[idx] = v
    return x


def _scatter_add(x, idx, src):
    return x.scatter_add(1, idx, src)


def _inplace(x, y):
    x.mul_(2).add_(y)
    y.clamp_(min=0)
    return x.sum()


def _cross_entropy(logits, target):
    return F.cross_entropy(logits, target, label_smoothing=0.1)


# The functions, in groups: each group is compiled as one function calling all of its members (Dynamo
# inlines them into one graph), which costs one compilation instead of one per function; every function's
# outputs are compared on their own.
GROUPS = {
    "elementwise": [
        Case("arith_scalars", lambda x: (x * 2 + 1) / 3 - x**2, lambda: (rand(8, 16),)),
        Case("broadcast", lambda x, y: x * y + y.exp(), lambda: (rand(4, 8, 16), rand(16))),
        Case(
            "activations",
            lambda x: F.gelu(x) + F.silu(x) + torch.sigmoid(x) * torch.tanh(x),
            lambda: (rand(32, 8),),
        ),
        Case(
            "gelu_tanh_relu6", lambda x: F.gelu(x, approximate="tanh") - F.relu6(x * 4), lambda: (rand(64),)
        ),
        Case(
            "unary_math",
            lambda x: x.sqrt() + x.rsqrt() + x.log() + x.reciprocal(),
            lambda: (rand(16, 8, low=0.5),),
        ),
        Case(
            "where_clamp", lambda x: torch.where(x > 0, x, 0.1 * x).clamp(-0.5, 0.75), lambda: (rand(8, 16),)
        ),
        Case(
            "compare_logical",
            lambda x, y: ((x > y) & (x < 1)) | ~(y > 0),
            lambda: (rand(8, 8), rand(8, 8, seed=1)),
        ),
        Case("integer_ops", lambda a: (a * 3 + 7) // 4 + a % 5 - (a >> 1), lambda: (ints(100, 32),)),
        Case(
            "dtype_casts",
            lambda x: x.half().float() + x.to(torch.int32).float() * 0.5,
            lambda: (rand(16, 4) * 10,),
            100.0,  # Inductor skips the float16 rounding in between (config.emulate_precision_casts is off)
        ),
        Case(
            "bf16_math",
            lambda x, y: (x * y + 1).sin() * 0.5,
            lambda: (rand(8, 32, dtype=torch.bfloat16), rand(32, dtype=torch.bfloat16)),
        ),
    ],
    "reductions": [
        Case("sum_mean_dims", lambda x: (x.sum(0), x.mean(-1), x.sum()), lambda: (rand(16, 32),), 4.0),
        Case(
            "amax_amin_argmax",
            lambda x: (x.amax(1), x.amin(0), x.argmax(-1), x.argmin(0)),
            lambda: (rand(12, 20),),
        ),
        Case("var_std", lambda x: (x.var(0), x.std(-1, unbiased=False)), lambda: (rand(32, 8),), 4.0),
        Case("logsumexp", lambda x: torch.logsumexp(x, dim=-1), lambda: (rand(8, 64),), 2.0),
        Case(
            "prod_any_all",
            lambda x: (x.prod(-1), (x > 0).any(0), (x > -3).all()),
            lambda: (rand(4, 6) * 0.5 + 1,),
        ),
        Case("cumsum", lambda x: torch.cumsum(x, dim=1), lambda: (rand(4, 32),), 4.0),
        Case(
            "vector_norm",
            lambda x: torch.linalg.vector_norm(x, dim=-1) + x.norm(),
            lambda: (rand(8, 16),),
            2.0,
        ),
    ],
    "views": [
        Case(
            "view_permute",
            lambda x: x.view(4, 8, 4).permute(2, 0, 1).contiguous() + 1,
            lambda: (rand(4, 32),),
        ),
        Case("transpose_reshape", lambda x: x.transpose(0, 1).reshape(-1) * 2, lambda: (rand(6, 10),)),
        Case("slice_steps", lambda x: x[::2, 1::3] + x[1::2, :-1:3], lambda: (rand(8, 12),)),
        Case(
            "expand_unsqueeze",
            lambda x: x.unsqueeze(1).expand(4, 3, 8) * torch.arange(3, device=x.device).view(1, 3, 1),
            lambda: (rand(4, 8),),
        ),
        Case(
            "cat_stack",
            lambda x, y: torch.cat([x, y * 2], dim=0) + torch.stack([x, y]).sum(0).repeat(2, 1),
            lambda: (rand(4, 8), rand(4, 8, seed=2)),
        ),
        Case(
            "split_chunk",
            lambda x: sum(c.sum(0) for c in x.chunk(4, dim=0)) + x.split([2, 6], dim=1)[1].sum(),
            lambda: (rand(8, 8),),
        ),
        Case("flip_roll", lambda x: x.flip(-1) + torch.roll(x, shifts=3, dims=0), lambda: (rand(8, 5),)),
        Case("rope", _rope, lambda: (rand(2, 4, 8, 16), rand(8, 16), rand(8, 16, seed=3))),
    ],
    "indexing": [
        Case("gather", lambda x, i: torch.gather(x, 1, i), lambda: (rand(8, 16), ints(16, 8, 4))),
        Case(
            "index_select_embedding",
            lambda w, i: w.index_select(0, i) + F.embedding(i, w),
            lambda: (rand(32, 8), ints(32, 10)),
        ),
        Case(
            "advanced_index", lambda x, i: x[i] * 2 + x[:, i[:3]].sum(), lambda: (rand(16, 16), ints(16, 5))
        ),
        Case(
            "index_put",
            _index_put,
            lambda: (rand(10, 4), torch.tensor([1, 3, 7], device=DEVICE), rand(3, 4, seed=4)),
            mutates=True,
        ),
        Case("scatter_add", _scatter_add, lambda: (rand(4, 8), ints(8, 4, 6), rand(4, 6, seed=5))),
        Case(
            "masked_fill_tril",
            lambda x: x.masked_fill(
                torch.ones(8, 8, dtype=torch.bool, device=x.device).tril().logical_not(), -1.0
            ),
            lambda: (rand(8, 8),),
        ),
    ],
    "matmul": [
        Case(
            "mm_addmm",
            lambda a, b, c: torch.addmm(c, a, b) + a @ b,
            lambda: (rand(8, 16), rand(16, 12), rand(12)),
            8.0,
        ),
        Case(
            "bmm_baddbmm",
            lambda a, b: torch.baddbmm(a @ b, a, b, alpha=0.5),
            lambda: (rand(3, 8, 8), rand(3, 8, 8, seed=6)),
            8.0,
        ),
        Case(
            "matmul_3d_2d", lambda x, w: torch.matmul(x, w).relu(), lambda: (rand(2, 5, 16), rand(16, 8)), 8.0
        ),
        Case(
            "einsum",
            lambda a, b: torch.einsum("bij,bjk->bik", a, b).sum(-1),
            lambda: (rand(2, 4, 8), rand(2, 8, 6)),
            8.0,
        ),
        Case(
            "linear",
            lambda x, w, b: F.linear(x, w, b).tanh(),
            lambda: (rand(4, 16), rand(8, 16), rand(8)),
            8.0,
        ),
    ],
    "softmax_losses": [
        Case(
            "softmax_log_softmax",
            lambda x: (x.softmax(-1), F.log_softmax(x, dim=0)),
            lambda: (rand(8, 32),),
            2.0,
        ),
        Case("cross_entropy", _cross_entropy, lambda: (rand(16, 10), ints(10, 16)), 2.0),
        Case(
            "mse_smooth_l1",
            lambda x, y: F.mse_loss(x, y) + F.smooth_l1_loss(x, y),
            lambda: (rand(8, 8), rand(8, 8, seed=7)),
            2.0,
        ),
    ],
    "norms": [
        Case(
            "layer_norm",
            lambda x, w, b: F.layer_norm(x, (16,), w, b),
            lambda: (rand(4, 8, 16), rand(16), rand(16, seed=8)),
            4.0,
        ),
        Case(
            "rms_norm",
            lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
            lambda: (rand(4, 32), rand(32)),
            4.0,
        ),
        Case(
            "group_norm",
            lambda x, w, b: F.group_norm(x, 2, w, b),
            lambda: (rand(2, 4, 6), rand(4), rand(4, seed=9)),
            4.0,
        ),
        Case(
            "batch_norm_eval",
            lambda x, m, v: F.batch_norm(x, m, v, training=False),
            lambda: (rand(8, 4), rand(4), rand(4, low=0.5)),
            4.0,
        ),
    ],
    "attention": [
        Case(
            "sdpa_causal",
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            lambda: (rand(1, 2, 8, 16), rand(1, 2, 8, 16, seed=10), rand(1, 2, 8, 16, seed=11)),
            8.0,
        ),
        Case(
            "sdpa_mask_gqa",
            lambda q, k, v, m: F.scaled_dot_product_attention(
                q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=m
            ),
            lambda: (
                rand(2, 4, 6, 8),
                rand(2, 2, 6, 8, seed=12),
                rand(2, 2, 6, 8, seed=13),
                rand(6, 6, seed=14) > 0,
            ),
            8.0,
        ),
        Case(
            "manual_attention",
            _attention,
            lambda: (
                rand(2, 6, 8),
                rand(2, 6, 8, seed=15),
                rand(2, 6, 8, seed=16),
                torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril(),
            ),
            8.0,
        ),
    ],
    "in_place": [
        Case("inplace_inputs", _inplace, lambda: (rand(8, 8), rand(8, 8, seed=17)), 2.0, mutates=True),
    ],
}
CASES = [case for group in GROUPS.values() for case in group]
