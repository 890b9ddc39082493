"""Memory-overlap checks on flagos as on CPU: a copy or an out=/in-place op whose written tensor partly
overlaps an input, or whose written elements overlap each other, raises the same RuntimeError with the same
message (at::assert_no_internal_overlap / assert_no_partial_overlap); full overlap and disjoint views run.
Views with gaps whose elements interleave (x[:, 1:] and x[:, :-1] of one matrix) are "too hard" for those
checks: CPU copies them element by element in its iteration order, flagos through a staging copy, so such
results are not compared here. Also: indexing with a uint8 mask warns as often as on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_fl

DEVICE = "flagos"

# The CPU is the reference here because it is flagos's native device on the simulated accelerator; backed by
# CUDA, flagos runs CUDA's kernels, and tests/ops/test_semantics_backed.py compares the same cases with cuda.
cpu_is_native = pytest.mark.skipif(
    torch_fl._C._backing_type() is not None,
    reason="compares with the CPU, flagos's native device on sim; test_semantics_backed.py compares with cuda",
)


def outcome(fn, device):
    """('ok', values on the CPU) or (exception type, first line of its message without flagos's context)."""
    try:
        result = fn(device)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e).splitlines()[0].split(" (while running")[0]
    return "ok", result.detach().cpu()


def assert_same_outcome(fn):
    f, c = outcome(fn, DEVICE), outcome(fn, "cpu")
    assert f[0] == c[0], (f, c)
    if c[0] == "ok":
        torch.testing.assert_close(f[1], c[1], equal_nan=True)
    else:
        assert f[1] == c[1]
    return c


def x10(d):
    return torch.arange(10.0, device=d)


CASES = {
    # copies between flagos tensors
    "copy_partial_overlap": lambda d: (lambda x: (x[1:].copy_(x[:-1]), x)[1])(x10(d)),
    "copy_partial_overlap_2d": lambda d: (lambda x: (x.view(5, 2)[1:].copy_(x.view(5, 2)[:-1]), x)[1])(
        x10(d)
    ),
    "copy_full_overlap": lambda d: (lambda x: (x.copy_(x.view(10)), x)[1])(x10(d)),
    "copy_same_data_other_dtype": lambda d: (
        lambda x: (x.view(torch.int32).copy_(x.view(torch.int32)), x)[1]
    )(x10(d)),
    "copy_disjoint_views": lambda d: (lambda x: (x[5:].copy_(x[:5]), x)[1])(x10(d)),
    "copy_interleaved_views": lambda d: (lambda x: (x[1::2].copy_(x[::2]), x)[1])(x10(d)),
    "copy_conversion_partial_overlap": lambda d: (lambda x: (x[1:].copy_(x[:-1].t()), x)[1])(x10(d)),
    "copy_into_expanded": lambda d: torch.zeros(1, device=d).expand(5).copy_(x10(d)[:5]),
    "copy_into_expanded_from_cpu": lambda d: torch.zeros(1, device=d).expand(5).copy_(torch.arange(5.0)),
    # out= and in-place ops
    "add_out_partial_overlap": lambda d: (lambda x: (torch.add(x[:-1], 1, out=x[1:]), x)[1])(x10(d)),
    "add_out_full_overlap": lambda d: (lambda x: (torch.add(x, 1, out=x), x)[1])(x10(d)),
    "add_out_internal_overlap": lambda d: torch.add(
        torch.ones(5, device=d), 1, out=torch.zeros(1, device=d).expand(5)
    ),
    "add__partial_overlap": lambda d: (lambda x: (x[1:].add_(x[:-1]), x)[1])(x10(d)),
    "add__internal_overlap": lambda d: torch.zeros(1, device=d).expand(5).add_(1),
    "mul_out_partial_overlap": lambda d: (lambda x: (torch.mul(x[:-1], x[1:], out=x[1:]), x)[1])(x10(d)),
    "cat_out_overlap": lambda d: (lambda x: (torch.cat([x[:3], x[3:6]], out=x[2:8]), x)[1])(x10(d)),
    "index_select_out_overlap": lambda d: (
        lambda x: (torch.index_select(x, 0, torch.tensor([0, 1, 2], device=d), out=x[1:4]), x)[1]
    )(x10(d)),
    "gather_out_overlap": lambda d: (
        lambda x: (torch.gather(x, 0, torch.tensor([0, 1], device=d), out=x[:2]), x)[1]
    )(x10(d)),
    "mm_out_overlap": lambda d: (
        lambda x: (torch.mm(x.view(2, 5)[:, :2], x.view(5, 2)[:2], out=x.view(5, 2)[:2]), x)[1]
    )(x10(d)),
    "neg_out_disjoint": lambda d: (lambda x: (torch.neg(x[:5], out=x[5:]), x)[1])(x10(d)),
}


@cpu_is_native
@pytest.mark.parametrize("name", list(CASES))
def test_overlap_as_on_cpu(name):
    assert_same_outcome(CASES[name])


def test_the_partial_overlap_error():
    x = x10(DEVICE)
    with pytest.raises(
        RuntimeError, match="some elements of the input tensor and the written-to tensor refer"
    ):
        x[1:].copy_(x[:-1])
    assert torch.equal(x.cpu(), torch.arange(10.0))  # nothing was written


def test_copies_between_devices_do_not_overlap(two_devices_only):
    a = x10("flagos:0")
    b = x10("flagos:1")
    b[1:].copy_(a[:-1])
    assert torch.equal(b.cpu(), torch.tensor([0.0, 0, 1, 2, 3, 4, 5, 6, 7, 8]))


def uint8_indexing(d):
    x = torch.arange(10.0, device=d).view(2, 5)
    m = (x > 3).to(torch.uint8)
    r = [x[m], x[:, m[1]], x[m[:, 0]], x[m[:, 4], 1:], x[0, m[1]]]
    return torch.cat([t.flatten() for t in r])


def test_uint8_mask_indexing_warns_as_on_cpu():
    counts = {}
    for d in ("cpu", DEVICE):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = uint8_indexing(d).cpu()
        counts[d] = sum("indexing with dtype torch.uint8 is now deprecated" in str(w.message) for w in caught)
        if d == "cpu":
            expected = result
    assert counts[DEVICE] == counts["cpu"] == 5
    assert torch.equal(result, expected)
