"""Every collective of the flagos backend against gloo on CPU tensors in the same process group
("cpu:gloo,flagos:flagos"), plus what only flagos has (AVG and PREMUL_SUM, which gloo lacks, coalescing on a
device, futures holding flagos tensors), the ways a process group reaches the flagos backend, and bad input.
Run by test_collectives.py on 2 and 4 ranks."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from ranks import DEVICE, RANK, WORLD, expect_error, flagos_backend, init

import torch_fl

CPU = torch.device("cpu")
PREMUL = 0.5
F32 = torch.float32


def data(shape, dtype=F32, seed=0) -> torch.Tensor:
    """Rank-dependent CPU data, the same for every call with the same seed."""
    g = torch.Generator().manual_seed(1000 * RANK + seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g, dtype=dtype)


def reduce_op(device: torch.device, name: str):
    """(op, before, after) for reduce op `name`: on flagos the op itself; on CPU (gloo lacks AVG and
    PREMUL_SUM) the SUM and the scaling that define them."""
    ops = {
        "sum": dist.ReduceOp.SUM,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "product": dist.ReduceOp.PRODUCT,
    }
    same = lambda t: t  # noqa: E731
    if name in ops:
        return ops[name], same, same
    if device.type == "flagos":
        if name == "avg":
            return dist.ReduceOp.AVG, same, same
        if name == "premul":
            return dist._make_nccl_premul_sum(PREMUL), same, same
        return dist._make_nccl_premul_sum(torch.tensor([PREMUL], device=device)), same, same  # premul_tensor
    if name == "avg":

        def average(t):
            return torch.div(t, WORLD, rounding_mode=None if t.is_floating_point() else "trunc")

        return dist.ReduceOp.SUM, same, average
    return dist.ReduceOp.SUM, lambda t: t * PREMUL, same


def broadcast(dev):
    out = []
    for src in (0, WORLD - 1):
        t = data((5, 3), seed=1).to(dev)
        dist.broadcast(t, src)
        out.append(t)
    t = data((7,), torch.int64, seed=2).to(dev)
    dist.broadcast(t, WORLD - 1)
    return out + [t]


def all_reduce(dev):
    out = []
    for name in ("sum", "avg", "min", "max", "product", "premul", "premul_tensor"):
        op, before, after = reduce_op(dev, name)
        t = before(data((4, 6), seed=3).to(dev))
        dist.all_reduce(t, op=op)
        out.append(after(t))
    for dtype in (torch.int64, torch.bfloat16, torch.float64):
        for name in ("sum", "avg", "max"):
            op, before, after = reduce_op(dev, name)
            t = before(data((9,), dtype, seed=4).to(dev))
            dist.all_reduce(t, op=op)
            out.append(after(t))
    return out


def reduce(dev):
    out = []
    dst = WORLD - 1
    for name in ("sum", "avg", "max", "premul"):
        op, before, after = reduce_op(dev, name)
        t = before(data((3, 4), seed=5).to(dev))
        dist.reduce(t, dst, op=op)
        if RANK == dst:
            out.append(after(t))
    return out


def all_gather(dev):
    x = data((2, 3), seed=6).to(dev)
    listed = [torch.empty_like(x) for _ in range(WORLD)]
    dist.all_gather(listed, x)
    into = torch.empty(WORLD * 2, 3, device=dev)
    dist.all_gather_into_tensor(into, x)
    xi = data((5,), torch.int64, seed=7).to(dev)
    into_i = torch.empty(WORLD * 5, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(into_i, xi)
    return listed + [into, into_i]


def reduce_scatter(dev):
    out = []
    for name in ("sum", "avg", "max", "premul"):
        op, before, after = reduce_op(dev, name)
        inputs = [before(data((3,), seed=10 + i).to(dev)) for i in range(WORLD)]
        result = torch.empty(3, device=dev)
        dist.reduce_scatter(result, inputs, op=op)
        out.append(after(result))
        flat = before(data((WORLD * 4,), seed=20).to(dev))
        result = torch.empty(4, device=dev)
        dist.reduce_scatter_tensor(result, flat, op=op)
        out.append(after(result))
    return out


def all_to_all(dev):
    x = data((WORLD * 2, 3), seed=30).to(dev)
    even = torch.empty_like(x)
    dist.all_to_all_single(even, x)
    # Rank r sends j + 1 rows to rank j, and so receives r + 1 rows from every rank.
    in_splits = [j + 1 for j in range(WORLD)]
    out_splits = [RANK + 1] * WORLD
    x2 = data((sum(in_splits), 2), seed=31).to(dev)
    uneven = torch.empty(sum(out_splits), 2, device=dev)
    dist.all_to_all_single(uneven, x2, out_splits, in_splits)
    inputs = [data((2,), seed=40 + j).to(dev) for j in range(WORLD)]
    outputs = [torch.empty(2, device=dev) for _ in range(WORLD)]
    served_by_gloo = dev == CPU or type(flagos_backend().inner).__name__ == "ProcessGroupGloo"
    if served_by_gloo and not _gloo_has_list_all_to_all():
        # gloo before torch 2.13 has no list all_to_all (CPU tensors, and the flagos backend over gloo hands
        # the list form to gloo): there the single-tensor form moves the same data.
        flat = torch.empty(WORLD * 2, device=dev)
        dist.all_to_all_single(flat, torch.cat(inputs))
        outputs = list(flat.split(2))
    else:
        dist.all_to_all(outputs, inputs)
    return [even, uneven] + outputs


def _gloo_has_list_all_to_all() -> bool:
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def gather_scatter(dev):
    x = data((4,), seed=50).to(dev)
    gathered = [torch.empty(4, device=dev) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(x, gathered, dst=0)
    pieces = [data((3,), seed=60 + j).to(dev) for j in range(WORLD)] if RANK == WORLD - 1 else None
    piece = torch.empty(3, device=dev)
    dist.scatter(piece, pieces, src=WORLD - 1)
    return (gathered or []) + [piece]


def point_to_point(dev):
    if WORLD == 1:  # a rank cannot send to itself
        return []
    nxt, prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    x = data((6,), seed=70).to(dev)
    ring = torch.empty(6, device=dev)
    # Odd ranks receive first. Unbatched, the pair issued send-first on both ranks hangs on NCCL, for cuda
    # tensors too (torch 2.11 on two H200s: each rank's receive waits for ever; docs/distributed.md).
    send, receive = (lambda: dist.isend(x, nxt)), (lambda: dist.irecv(ring, prev))
    for request in [issue() for issue in ((receive, send) if RANK % 2 else (send, receive))]:
        request.wait()
    pair = torch.zeros(3, device=dev)
    if RANK == 0:
        dist.send(data((3,), seed=71).to(dev), 1)
    elif RANK == 1:
        dist.recv(pair, 0)
    batched = torch.empty(6, device=dev)
    ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, batched, prev)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return [ring, pair, batched]


def coalesced(dev):
    tensors = [data((3,), seed=80 + i).to(dev) for i in range(3)]
    with dist._coalescing_manager():  # recorded, then one allreduce_coalesced
        for t in tensors:
            dist.all_reduce(t)
    return tensors


def functional(dev):
    group = dist.group.WORLD
    x = data((WORLD * 2, 3), seed=100).to(dev)
    results = [
        funcol.all_reduce(x, "sum", group),
        funcol.all_gather_tensor(x, 0, group),
        funcol.reduce_scatter_tensor(x, "sum", 0, group),
        funcol.all_to_all_single(x, None, None, group),
    ]
    return [funcol.wait_tensor(r) for r in results]


def async_future(dev):
    t = data((4,), seed=90).to(dev)
    work = dist.all_reduce(t, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    assert work.result()[0].device == dev
    return [t, doubled.wait()]


COMPARED = [
    broadcast,
    all_reduce,
    reduce,
    all_gather,
    reduce_scatter,
    all_to_all,
    gather_scatter,
    point_to_point,
    coalesced,
    functional,
    async_future,
]


def compare_with_gloo() -> list[str]:
    """Each check run on CPU tensors (gloo) and on flagos tensors (the flagos backend): equal results."""
    names = []
    for check in COMPARED:
        expected = check(CPU)
        actual = check(DEVICE)
        assert len(actual) == len(expected), check.__name__
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert a.device == DEVICE, f"{check.__name__}[{i}] came back on {a.device}"
            torch.testing.assert_close(a.cpu(), e, msg=lambda m, n=check.__name__, i=i: f"{n}[{i}]: {m}")
        names.append(check.__name__)
    return names


def flagos_only() -> list[str]:
    """What gloo cannot be a reference for: checked against values computed from gloo's SUM."""
    done = []
    # An emulated PREMUL_SUM leaves a reduce-scatter's input as it was.
    flat = data((WORLD * 4,), seed=20).to(DEVICE)
    before = flat.cpu()
    dist.reduce_scatter_tensor(torch.empty(4, device=DEVICE), flat, op=dist._make_nccl_premul_sum(PREMUL))
    assert torch.equal(flat.cpu(), before)
    done.append("premul_keeps_input")

    # Coalescing on the flagos device (startCoalescing/endCoalescing), async, with AVG inside.
    expected = []
    for i in range(3):
        t = data((3,), seed=80 + i)
        dist.all_reduce(t)
        expected.append(t / WORLD)
    tensors = [data((3,), seed=80 + i).to(DEVICE) for i in range(3)]
    with dist._coalescing_manager(device=DEVICE, async_ops=True) as cm:
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
    cm.wait()
    for t, e in zip(tensors, expected, strict=True):
        torch.testing.assert_close(t.cpu(), e)
    outputs = [torch.empty(WORLD * 2, device=DEVICE) for _ in range(2)]
    with dist._coalescing_manager(device=DEVICE):
        for i, o in enumerate(outputs):
            dist.all_gather_into_tensor(o, torch.full((2,), float(RANK + i), device=DEVICE))
    for i, o in enumerate(outputs):
        assert o.cpu().tolist() == [float(r + i) for r in range(WORLD) for _ in range(2)]
    scattered = [torch.empty(2, device=DEVICE) for _ in range(2)]
    with dist._coalescing_manager(device=DEVICE):
        for o in scattered:
            dist.reduce_scatter_tensor(
                o, torch.full((WORLD * 2,), float(RANK + 1), device=DEVICE), op=dist.ReduceOp.AVG
            )
    for o in scattered:
        torch.testing.assert_close(o.cpu(), torch.full((2,), (WORLD + 1) / 2))
    done.append("coalescing_manager")

    # A future's value is the caller's flagos tensors, also when AVG finishes on flagos; polling works too.
    t = data((4,), seed=91).to(DEVICE)
    reference = data((4,), seed=91)
    dist.all_reduce(reference)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    value = work.get_future().wait()[0]
    assert value.device == DEVICE and value.data_ptr() == t.data_ptr()
    torch.testing.assert_close(value.cpu(), reference / WORLD)
    t = data((4,), seed=91).to(DEVICE)
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    while not work.is_completed():
        pass
    torch.testing.assert_close(t.cpu(), reference / WORLD)
    # The future of a work whose inner work has none (gloo's reduce_scatter_tensor): completed all the same.
    flat = data((WORLD * 4,), seed=20)
    summed = flat.clone()
    dist.all_reduce(summed)
    out = torch.empty(4, device=DEVICE)
    work = dist.reduce_scatter_tensor(out, flat.to(DEVICE), op=dist.ReduceOp.AVG, async_op=True)
    value = work.get_future().wait()[0]
    assert value.data_ptr() == out.data_ptr()
    torch.testing.assert_close(value.cpu(), (summed / WORLD).chunk(WORLD)[RANK])
    done.append("futures")

    # Functional collectives with AVG (gloo lacks it).
    x = data((WORLD * 2, 3), seed=100)
    summed = x.clone()
    dist.all_reduce(summed)
    avg = funcol.wait_tensor(funcol.all_reduce(x.to(DEVICE), "avg", dist.group.WORLD))
    torch.testing.assert_close(avg.cpu(), summed / WORLD)
    scattered = funcol.wait_tensor(funcol.reduce_scatter_tensor(x.to(DEVICE), "avg", 0, dist.group.WORLD))
    torch.testing.assert_close(scattered.cpu(), (summed / WORLD).chunk(WORLD)[RANK])
    done.append("functional_avg")

    # DTensor on a flagos device mesh.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("flagos", (WORLD,))
    full = torch.randn(WORLD * 2, 4, generator=torch.Generator().manual_seed(7))
    sharded = distribute_tensor(full.to(DEVICE), mesh, [Shard(0)])
    assert sharded.to_local().device == DEVICE and tuple(sharded.to_local().shape) == (2, 4)
    assert torch.equal(sharded.redistribute(mesh, [Replicate()]).to_local().cpu(), full)
    assert torch.equal(sharded.full_tensor().cpu(), full)
    torch.testing.assert_close((sharded * 2 + 1).full_tensor().cpu(), full * 2 + 1)
    local = data((3, 3), seed=110)
    partial = DTensor.from_local(local.to(DEVICE), mesh, [Partial()])
    summed = local.clone()
    dist.all_reduce(summed)
    torch.testing.assert_close(partial.redistribute(mesh, [Replicate()]).to_local().cpu(), summed)
    done.append("dtensor")

    # Object collectives and barriers.
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": RANK})
    assert objects == [{"rank": r} for r in range(WORLD)]
    dist.barrier()
    flagos_backend().barrier().wait()
    done.append("objects_barrier")
    return done


def bad_input() -> list[str]:
    """Clear errors naming the op, the tensor and the rank; the group keeps working after each."""
    where = f"flagos backend (rank {RANK})"
    t = torch.ones(4, device=DEVICE)
    expect_error(
        ValueError,
        lambda: dist.all_reduce(t, op=dist.ReduceOp.RedOpType(9)),
        f"{where}: all_reduce: unknown reduce op 9",
    )
    expect_error(
        ValueError,
        lambda: flagos_backend().allreduce([torch.ones(4)]),
        f"{where}: all_reduce: tensor 0 is on cpu, not on a flagos device",
        "cpu:gloo,flagos:flagos",
    )
    expect_error(
        ValueError,
        lambda: dist.all_gather([torch.empty(4, device=DEVICE)] * (WORLD - 1) + [torch.empty(4)], t),
        f"{where}: all_gather: output list 0, tensor {WORLD - 1} is on cpu",
    )
    expect_error(
        ValueError,
        lambda: dist.all_gather_into_tensor(torch.empty(3, device=DEVICE), t),
        f"{where}: all_gather_into_tensor: the output has 3 elements",
        # (at world size 1 the sizes must simply be equal, and the message says so)
        *([f"world size ({WORLD}) times"] if WORLD > 1 else ["but the input has 4"]),
    )
    # A list's tensor and a pair's, named with their places (the names are written only for an error).
    expect_error(
        ValueError,
        lambda: dist.all_gather(
            [torch.empty(4, device=DEVICE)] * (WORLD - 1) + [torch.empty(5, device=DEVICE)], t
        ),
        f"{where}: all_gather: output list 0, tensor {WORLD - 1} has 5 elements (shape [5]) but input 0 has 4",
    )
    expect_error(
        ValueError,
        lambda: dist.group.WORLD.allgather_into_tensor_coalesced(
            [torch.empty(4 * WORLD, device=DEVICE), torch.empty(3, device=DEVICE)], [t, t]
        ),
        f"{where}: all_gather_into_tensor_coalesced: output 1 has 3 elements (shape [3])",
        *([f"world size ({WORLD}) times input 1's 4 elements"] if WORLD > 1 else ["but input 1 has 4"]),
    )

    if WORLD == 1 or not flagos_backend().check_across_ranks:
        ok = torch.ones(4, device=DEVICE)
        dist.all_reduce(ok)
        assert ok.cpu().tolist() == [float(WORLD)] * 4
        return ["unknown_op", "cpu_tensor", "sizes"]
    # Across ranks: every rank raises, naming both ranks.
    shaped = torch.ones(4 if RANK == 0 else 8, device=DEVICE)
    expect_error(
        ValueError,
        lambda: dist.all_reduce(shaped),
        f"{where}: all_reduce does not match across ranks",
        "tensor 0 has shape [",
        "[4]",
        "[8]",
        f"on rank {RANK}",
    )
    typed = torch.ones(4, device=DEVICE, dtype=torch.float64 if RANK == WORLD - 1 else torch.float32)
    expect_error(
        ValueError,
        lambda: dist.all_gather_into_tensor(torch.empty(4 * WORLD, device=DEVICE, dtype=typed.dtype), typed),
        "all_gather_into_tensor does not match across ranks",
        "dtype Double",
        "dtype Float",
    )
    expect_error(
        ValueError,
        lambda: dist.broadcast(t, 0) if RANK == 0 else dist.all_reduce(t),
        "does not match across ranks",
        "runs broadcast",
        "runs all_reduce",
        "same order",
    )
    expect_error(
        ValueError,
        lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM if RANK == 0 else dist.ReduceOp.MAX),
        "reduces with",
        "SUM",
        "MAX",
    )
    expect_error(ValueError, lambda: dist.broadcast(t, src=RANK % 2), "names root rank")
    # One rank's bad argument: it raises its own error, the others say which rank was wrong.
    if RANK == 0:
        expect_error(
            ValueError,
            lambda: dist.all_reduce(torch.ones(4, device=DEVICE), op=dist.ReduceOp.RedOpType(9)),
            "unknown reduce op 9",
        )
    else:
        expect_error(
            ValueError,
            lambda: dist.all_reduce(torch.ones(4, device=DEVICE)),
            "rank 0 passed invalid arguments to the same call",
        )
    ok = torch.ones(4, device=DEVICE)
    dist.all_reduce(ok)
    assert ok.cpu().tolist() == [float(WORLD)] * 4
    return ["unknown_op", "cpu_tensor", "sizes", "mismatch_across_ranks", "one_rank_invalid"]


def init_variants() -> list[str]:
    """The three ways of naming the flagos backend; each gets a flagos backend and computes."""
    done = []
    for name, kwargs in (
        ("no_backend_argument", dict()),
        ("device_id", dict(device_id=True)),
        ("named_flagos", dict(backend="flagos")),
    ):
        init(tag=name, **kwargs)
        assert type(flagos_backend()).__name__ == "_FlagosBackend", type(flagos_backend())
        t = torch.full((3,), float(RANK + 1), device=DEVICE)
        dist.all_reduce(t)
        assert t.cpu().tolist() == [WORLD * (WORLD + 1) / 2] * 3
        objects = [None] * WORLD
        dist.all_gather_object(objects, RANK)
        assert objects == list(range(WORLD))
        dist.barrier()
        dist.destroy_process_group()
        done.append(name)
    return done


def run() -> dict:
    result = {"init": init_variants()}
    init("cpu:gloo,flagos:flagos", tag="mixed")
    backend = flagos_backend()
    # gloo (the simulated accelerator) lacks AVG and PREMUL_SUM; NCCL (flagos backed by CUDA) has them.
    on_nccl = torch_fl.accelerator() == "cuda"
    assert backend.native_avg_and_premul == on_nccl
    assert backend.check_across_ranks == (os.environ.get("FLAGOS_DIST_CHECK", "0" if on_nccl else "1") == "1")
    result["backend"] = type(backend.inner).__name__
    result["compared_with_gloo"] = compare_with_gloo()
    result["flagos_only"] = flagos_only()
    result["bad_input"] = bad_input()
    dist.destroy_process_group()
    return result
