"""Per-op host overhead of flagos against the native device, in the same process.

For about 20 common ops on tiny tensors, each op is launched N times on the native device (CPU on the
simulated accelerator, CUDA on NVIDIA) and N times on flagos, each followed by one synchronize, in R rounds
that alternate which device goes first. Printed: microseconds per launch on both devices (medians over the
rounds), the median of the rounds' ratios, the difference, and the median ratio and difference over all ops. On the simulated accelerator the difference is what the
flagos dispatch (router plus native route, or a basic kernel) adds over the native dispatch.

    python -m benchmarks.op_overhead [--n 2000] [--repeats 9] [--ops add,mm]
    python -m benchmarks.op_overhead --set qwen3    # the ops of a Qwen3-0.6B decode step, bf16, its shapes
    python -m benchmarks.op_overhead --set generate # generate's per-token ops outside the model

``--set qwen3`` times what one decode step of Qwen3-0.6B runs (batch 1, one new token, a 40-token cache)
with the model's shapes and dtype: a projection (``F.linear``: t, matmul's reshape, mm, _unsafe_view), the
RMSNorm and rotary sequences, SDPA with grouped KV heads, the gated MLP's activation, the casts; ``ops``
says how many operator calls each case makes, ``diff/op`` what flagos adds per call. Where the ops' own
overhead (the default set) and a model's (benchmarks/qwen3.py) disagree, these cases tell which ops differ.

``--set foreach`` times the tensor-list ops of an optimizer step and of FSDP2 over one tensor per parameter
of Qwen3-0.6B (310 of them, 64 elements each, so that the host, not the kernels, decides): AdamW's
``_foreach_*`` calls, ``_foreach_copy_``, FSDP2's all-gather copy-in (``_chunk_cat``) and copy-out
(``split_with_sizes_copy``). ``diff/op`` is then per tensor of the list.

``--set generate`` times the small ops Hugging Face's ``generate`` and a decoder's rotary set-up run once per
token around the model's layers: the finished-sequence check, position ids, the rotary angles' cos and sin,
filled tensors (``full``, ``new_ones``).

Run it once with FLAGOS_LOG_DISPATCH unset (the default) and, to see what logging costs, once with it set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import torch_fl  # noqa: F401  (registers the flagos device)
from benchmarks import records
from benchmarks.common import Ratio, median, paired_rounds, ratios, synchronize


def native_device() -> str:
    """The device type flagos runs on underneath: the torch device type backing it (cuda), else CPU (the
    simulated accelerator's kernels)."""
    return torch_fl._C._backing_type() or "cpu"


def make_cases(device: str) -> dict:
    """Name -> zero-argument callable that launches the op once on tiny tensors of `device`."""
    g = torch.Generator().manual_seed(0)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)

    a, b = t(16), t(16)
    m1, m2 = t(8, 8), t(8, 8)
    x = t(4, 16)
    out = torch.empty(16, device=device)
    idx = torch.tensor([0, 2, 4, 6], device=device)
    mask = t(16) > 0
    ln_w, ln_b = t(16), t(16)
    nc = t(8, 8).t()
    return {
        "add": lambda: torch.add(a, b),
        "mul": lambda: torch.mul(a, b),
        "sub": lambda: torch.sub(a, b),
        "div": lambda: torch.div(a, b),
        "add_scalar": lambda: a + 1.0,
        "add_": lambda: out.add_(a),
        "relu": lambda: torch.relu(a),
        "sigmoid": lambda: torch.sigmoid(a),
        "tanh": lambda: torch.tanh(a),
        "exp": lambda: torch.exp(a),
        "sum": lambda: a.sum(),
        "mean": lambda: a.mean(),
        "mm": lambda: torch.mm(m1, m2),
        "matmul": lambda: torch.matmul(m1, m2),
        "softmax": lambda: torch.softmax(x, dim=-1),
        "cat": lambda: torch.cat([a, b]),
        "index_select": lambda: torch.index_select(a, 0, idx),
        "copy_": lambda: out.copy_(a),
        "clone": lambda: a.clone(),
        "view+contiguous": lambda: nc.contiguous().view(64),
        "where": lambda: torch.where(mask, a, b),
        "masked_fill": lambda: a.masked_fill(mask, 0.0),
        "layer_norm": lambda: F.layer_norm(x, (16,), ln_w, ln_b),
        "gelu": lambda: F.gelu(a),
        "transpose": lambda: m1.t(),
    }


def make_qwen3_cases(device: str) -> dict:
    """Name -> (callable running one piece of a Qwen3-0.6B decode step on `device`, operator calls it makes).
    bf16 where the model computes in bf16; the RMSNorm and rotary sequences are Hugging Face's."""
    g = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16

    def t(*shape, dtype=bf16):
        return (torch.randn(*shape, generator=g) * 0.1).to(dtype).to(device)

    hidden, residual = t(1, 1, 1024), t(1, 1, 1024)
    norm_weight = t(1024)
    w_gate, w_down, w_q = t(3072, 1024), t(1024, 3072), t(2048, 1024)
    gate, up = t(1, 1, 3072), t(1, 1, 3072)
    q, k, v = t(1, 16, 1, 128), t(1, 8, 40, 128), t(1, 8, 40, 128)
    cos, sin = t(1, 1, 128), t(1, 1, 128)

    def rms_norm(x):
        # transformers' Qwen3RMSNorm: to, pow, mean, add, rsqrt, mul, to, mul
        xf = x.to(torch.float32)
        variance = xf.pow(2).mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(variance + 1e-6)
        return norm_weight * xf.to(bf16)

    def rotate_half(x):
        return torch.cat((-x[..., 64:], x[..., :64]), dim=-1)

    def rotary(x):  # apply_rotary_pos_emb for one of q, k: mul, neg, cat, mul, add (and views)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return (x * c) + (rotate_half(x) * s)

    return {
        "linear 1024->3072": (lambda: F.linear(hidden, w_gate), 1),
        "linear 3072->1024": (lambda: F.linear(gate, w_down), 1),
        "linear q proj": (lambda: F.linear(hidden, w_q), 1),
        "to float32": (lambda: hidden.to(torch.float32), 1),
        "rms_norm": (lambda: rms_norm(hidden), 8),
        "rotary": (lambda: rotary(q), 5),
        "sdpa gqa": (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 1),
        "silu * up": (lambda: F.silu(gate) * up, 2),
        "residual add": (lambda: hidden + residual, 1),
        "kv cat": (lambda: torch.cat([k, k[:, :, :1]], dim=-2), 1),
    }


def make_generate_cases(device: str) -> dict:
    """Name -> (callable running one piece of generate's per-token work outside the layers on `device`,
    operator calls it makes on the device)."""
    g = torch.Generator().manual_seed(0)
    next_token = torch.randint(1000, (1,), generator=g).to(device)
    unfinished = torch.ones(1, dtype=torch.long).to(device)
    angles = torch.randn(1, 1, 128, generator=g).to(device)
    mask = torch.ones(1, 41, dtype=torch.long).to(device)

    def finished_check():  # an end-of-sequence test and the unfinished-sequences update
        done = next_token == 151645
        return (unfinished & ~done).max()

    return {
        "finished check": (finished_check, 4),
        "position ids": (lambda: torch.arange(40, 41, device=device), 2),
        "rotary cos, sin": (lambda: (angles.cos(), angles.sin()), 2),
        "full": (lambda: torch.full((1, 1), 40, device=device), 2),
        "new_ones": (lambda: mask.new_ones((1, 1)), 2),
    }


def make_foreach_cases(device: str, count: int = 310) -> dict:
    """Name -> (callable running one tensor-list op over `count` tensors of `device`, tensors per list)."""
    g = torch.Generator().manual_seed(0)

    def tensors():
        return [torch.randn(64, generator=g).to(device) for _ in range(count)]

    params, grads, exp_avg, exp_avg_sq = tensors(), tensors(), tensors(), tensors()
    denom = [t.abs() + 1 for t in tensors()]
    flat = torch.randn(64 * count, generator=g).to(device)
    sizes = [64] * count
    return {
        "_foreach_mul_": (lambda: torch._foreach_mul_(params, 1.0), count),
        "_foreach_lerp_": (lambda: torch._foreach_lerp_(exp_avg, grads, 0.1), count),
        "_foreach_addcmul_": (lambda: torch._foreach_addcmul_(exp_avg_sq, grads, grads, 0.001), count),
        "_foreach_addcdiv_": (lambda: torch._foreach_addcdiv_(params, exp_avg, denom, -0.001), count),
        "_foreach_sqrt": (lambda: torch._foreach_sqrt(exp_avg_sq), count),
        "_foreach_copy_": (lambda: torch._foreach_copy_(exp_avg, grads), count),
        "_chunk_cat": (lambda: torch._chunk_cat(grads, dim=0, num_chunks=1), count),
        "split_with_sizes_copy": (
            lambda: torch.split_with_sizes_copy(flat, sizes, dim=0, out=params),
            count,
        ),
    }


def launch_time(fn, device: str, n: int) -> float:
    """(N launches + one synchronize) / N, in microseconds."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / n * 1e6


def compare(ref_fn, fl_fn, native: str, n: int, repeats: int) -> tuple[float, float, float]:
    """Native and flagos microseconds per launch and their ratio: medians over `repeats` rounds, each round
    timing one device right after the other (alternating which goes first), so that drift in clocks and
    caches over the run falls on both alike."""
    for fn, device in ((ref_fn, native), (fl_fn, "flagos")):  # warm-up
        for _ in range(min(n, 100)):
            fn()
        synchronize(device)
    times = paired_rounds(
        {"ref": lambda: launch_time(ref_fn, native, n), "fl": lambda: launch_time(fl_fn, "flagos", n)},
        repeats,
    )
    return median(times["ref"]), median(times["fl"]), median(ratios(times["fl"], times["ref"]))


SETS = {  # --set -> (what its records' details say, its metric ids' prefix)
    "tiny": ("ops on tiny tensors", ""),
    "qwen3": ("ops of a Qwen3-0.6B decode step at its shapes (bf16)", "qwen3_"),
    "foreach": ("tensor-list ops over 310 tensors (Qwen3-0.6B's parameters)", "foreach_"),
    "generate": ("ops generate runs per token outside a decoder's layers", "generate_"),
}
# --set -> its cases' maker, for the sets whose cases make several operator calls.
MAKERS = {"qwen3": make_qwen3_cases, "foreach": make_foreach_cases, "generate": make_generate_cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="launches per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ops", default="", help="comma-separated subset of the ops")
    parser.add_argument(
        "--set",
        choices=tuple(SETS),
        default="tiny",
        help="tiny tensors (default), a Qwen3 decode step, tensor-list ops over 310 tensors, or generate's "
        "per-token ops outside the model",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)

    torch.set_num_threads(args.threads)
    native = native_device()
    if args.set in MAKERS:
        make = MAKERS[args.set]
        ref_cases, fl_cases = make(native), make("flagos")
        calls = {name: case[1] for name, case in ref_cases.items()}
        ref_cases = {name: case[0] for name, case in ref_cases.items()}
        fl_cases = {name: case[0] for name, case in fl_cases.items()}
    else:
        ref_cases, fl_cases = make_cases(native), make_cases("flagos")
        calls = dict.fromkeys(ref_cases, 1)
    names = [n.strip() for n in args.ops.split(",") if n.strip()] or list(ref_cases)
    log = os.environ.get("FLAGOS_LOG_DISPATCH", "")
    print(
        f"torch {torch.__version__}, native device {native}, N={args.n}, repeats={args.repeats}, "
        f"threads={args.threads}, set {args.set}, FLAGOS_LOG_DISPATCH={log or '(unset)'}"
    )
    print(
        f"{'op':18} {native + ' us':>9} {'flagos us':>10} {'ratio':>7} {'diff us':>8} {'ops':>4} {'diff/op':>8}"
    )
    op_ratios, diffs = {}, []
    with torch.no_grad():
        for name in names:
            ref, fl, ratio = compare(ref_cases[name], fl_cases[name], native, args.n, args.repeats)
            op_ratios[name] = ratio
            diffs.append(fl - ref)
            n_ops = calls[name]
            print(
                f"{name:18} {ref:9.2f} {fl:10.2f} {ratio:7.2f} {fl - ref:8.2f} {n_ops:4} {(fl - ref) / n_ops:8.2f}"
            )
    summary, added = Ratio.of(op_ratios.values()), median(diffs)
    print(f"median ratio {summary.median:.2f}, median difference {added:.2f} us over {len(names)} ops")
    what, prefix = SETS[args.set]
    worst = sorted(op_ratios, key=op_ratios.get, reverse=True)[:2]
    worst_text = ", ".join(f"{name} {op_ratios[name]:.2f}" for name in worst)
    rec.add(
        f"{prefix}median_ratio",
        summary.median,
        "time ratio",
        range=summary.range,
        detail=f"{len(names)} {what}, median of the per-op ratios; worst {worst_text}",
    )
    rec.add(
        f"{prefix}median_added_us",
        added,
        "us added",
        detail=f"{len(names)} {what}: median time flagos adds per op",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
