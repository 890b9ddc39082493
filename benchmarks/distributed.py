"""Distributed flagos against its native device: training step time and loss parity, and collective
bandwidth, one process per device (docs/distributed.md, figures in docs/performance.md).

    python -m benchmarks.distributed                          # both parts, one rank per visible GPU
    python -m benchmarks.distributed --parts train --steps 20 --strategies ddp,fsdp2
    python -m benchmarks.distributed --parts collectives --min-mib 1 --max-mib 1024
    python -m benchmarks.distributed --parts train --steps 45 --side-by-side

The native device is CUDA (NCCL) where flagos is backed by CUDA, else the CPU (gloo), which the simulated
accelerator's flagos memory is.

- ``train``: ``examples.train_qwen3_distributed`` under torchrun with each strategy, on flagos and on the
  native device (processes that never import torch_fl, so the CUDA backward works there), the runs of one
  strategy alternating ``--repeats`` times. Reports the median step time after ``--warmup`` steps, flagos /
  native (target <= 1.03), and compares the loss trajectories: every step's mean loss within the dtype's
  ``loss_rtol`` (bf16 mixed precision on GPUs, float32 otherwise). Exits 1 if they are not. Beside each
  step time: the host's queuing time (the step until its loss is read back); near the step time, the step
  is bound by the host, not the device. Each launch's figures print as it ends. ``--host-diff N`` profiles
  two more steps of each launch on rank 0 (host activity) and lists the N events whose self host time per
  step is most above the reference's: where a host-bound flagos step's extra time goes; then those whose
  calls per step differ most, and on a CUDA GPU the kernels and copies each side runs (count, device time).
  ``--side-by-side`` launches both devices' runs at the same time, on the same devices and CPUs; after
  ``--warmup`` their steps take turns in blocks of 5 (flagos, the reference, the reference, flagos, ...:
  ``harness.processes.Turns``), so that one runs at a time and a drift of the machine hits both alike, and
  each block is paired with the other device's beside it (paired blocks: the median of their ratios; the run fails if
  two timed steps overlapped). Host-bound steps moved by 20-30% from one launch to the next on the lent GPU
  machines, more than a few launches in turn average away. ``--bind-cpus`` (default ``numa`` on GPUs)
  runs each local rank of both devices on the same CPUs: an equal share of its GPU's NUMA node's
  (``numa``), of this process's (``split``), or wherever the OS places it (``off``). A host-bound step's
  time follows where the OS put its threads, so unbound launches compare placements as much as devices.
- ``collectives``: all_reduce, all_gather_into_tensor and reduce_scatter_tensor of float32 tensors from
  ``--min-mib`` to ``--max-mib`` (each size 4x the last), on flagos tensors (the flagos backend) and on
  native tensors (NCCL or gloo itself) in the same processes, the two alternating ``--repeats`` times.
  Size, algorithm and bus bandwidth as nccl-tests define them (size: the larger buffer; bus bandwidth:
  all_reduce 2(n-1)/n, the others (n-1)/n of size / time); the slowest rank's time counts. Each timed loop
  lasts about ``--min-seconds`` (a timed warm-up call sizes it) and starts with the ranks lined up, so that
  neither launch jitter nor one rank's late start moves the figure. Each op's result is checked once on
  both devices. Target: flagos / native >= 0.97 from 16 MiB up.

``--json [FILE]`` records the headline figures (benchmarks/records.py): ``<strategy>_step_time_ratio`` (range:
the paired blocks', else the launches'), ``<op>_lowest_bw_ratio`` (the lowest flagos / native from 16 MiB up,
or over all sizes where none is that large). ``--results FILE`` writes everything measured (the rows of both
tables, the losses) as one JSON object. Every launch has a time limit (``--timeout``), after which
torchrun is told to stop its ranks and whatever is left is killed; a SIGTERM to this script does the same.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile

from benchmarks import records
from benchmarks.common import Ratio, median, round_order
from harness.cpus import cpu_list, cpu_ranges
from harness.processes import REPO_ROOT, Turns, python_env

EXAMPLE = ["-m", "examples.train_qwen3_distributed"]  # torchrun's arguments that start the example
OPS = ("all_reduce", "all_gather", "reduce_scatter")
MiB = 1 << 20


# ---- The parent: launches, tables, verdicts ---------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--parts", default="train,collectives", help="comma-separated, run in this order: train, collectives"
    )
    p.add_argument("--world-size", type=int, help="default: the visible GPUs backed by CUDA, else 2")
    p.add_argument("--strategies", default="ddp,fsdp2", help="comma-separated: ddp, fsdp2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="training steps left out of the step time")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--shape", choices=["tiny", "0.6b"], help="default: 0.6b on GPUs, tiny otherwise")
    p.add_argument(
        "--host-diff",
        type=int,
        default=0,
        metavar="N",
        help="train: profile 2 more steps of each launch (rank 0) and list the N events whose self host time "
        "per step flagos exceeds the reference's most, those whose calls differ most, and on a CUDA GPU the "
        "kernels whose counts differ most",
    )
    p.add_argument(
        "--side-by-side",
        action="store_true",
        help="train: launch flagos and the reference at the same time on the same devices, their steps after "
        "--warmup taken in turns of 5 (ABBA), and pair each block with the other's",
    )
    p.add_argument(
        "--bind-cpus",
        choices=["numa", "split", "off"],
        help="train: the CPUs each local rank runs on, the same for both devices: an equal share of its GPU's "
        "NUMA node's or of this process's, or anywhere (default: numa on GPUs, else off)",
    )
    p.add_argument("--min-mib", type=float, default=1.0)
    p.add_argument("--max-mib", type=float, help="default: 1024 on GPUs, 64 otherwise")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--min-seconds",
        type=float,
        default=0.05,
        help="how long each timed loop of one collective lasts at least",
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds for each launch")
    records.add_json_argument(p)
    p.add_argument("--results", metavar="FILE", help="write everything measured here (JSON)")
    args = p.parse_args(argv)
    args.parts = _choices(p, "--parts", args.parts, ("train", "collectives"))
    args.strategies = _choices(p, "--strategies", args.strategies, ("ddp", "fsdp2"))
    for name in ("steps", "repeats", "batch", "seq_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be at least 0 and less than --steps ({args.steps}), got {args.warmup}")
    if args.min_mib <= 0 or (args.max_mib is not None and args.max_mib < args.min_mib):
        p.error(f"sizes must satisfy 0 < --min-mib <= --max-mib, got {args.min_mib} and {args.max_mib}")
    if args.host_diff < 0:
        p.error(f"--host-diff must be 0 (off) or more, got {args.host_diff}")
    if args.side_by_side:
        if (args.steps - args.warmup) % Turns.BLOCK:
            p.error(
                f"--side-by-side: the steps after --warmup ({args.steps} - {args.warmup}) must be whole "
                f"turns of {Turns.BLOCK}"
            )
    if args.side_by_side and args.host_diff:
        p.error("--side-by-side and --host-diff: the profiled steps would run beside the other launch's")
    if args.min_seconds <= 0:
        p.error(f"--min-seconds must be positive, got {args.min_seconds}")
    if args.world_size is not None and args.world_size < 1:
        p.error(f"--world-size must be at least 1, got {args.world_size}")
    return args


def _choices(parser, flag: str, value: str, valid: tuple[str, ...]) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    wrong = [v for v in chosen if v not in valid]
    if wrong or not chosen:
        parser.error(f"{flag}: {', '.join(wrong) or 'nothing'} given; valid: {', '.join(valid)}")
    return chosen


def native_device() -> str:
    """The device type under flagos: cuda when backed by CUDA, else cpu."""
    import torch_fl

    return "cuda" if torch_fl.accelerator() == "cuda" else "cpu"


def child_env(world_size: int) -> dict:
    env = python_env()
    # One simulated device per local rank (ignored on GPUs); single-host rendezvous over loopback.
    env["FLAGOS_SIM_DEVICES"] = str(max(2, world_size))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    # The lent GPU machines keep NVLink multicast off: keep it off in what is started here too.
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    return env


def torchrun(world_size: int, script_args: list[str], timeout: float, label: str) -> str:
    """Runs ``torchrun --standalone --nproc-per-node world_size <script_args>``; its output, or SystemExit
    naming the launch and showing the output's end when it fails or outlasts ``timeout``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    returncode, output = run_stoppably(
        [*command, str(world_size), *script_args], child_env(world_size), timeout
    )
    if returncode is None:
        raise SystemExit(f"{label}: not finished within {timeout:.0f} s, stopped\n{output[-6000:]}")
    if returncode != 0:
        raise SystemExit(f"{label}: exit code {returncode}\n{output[-6000:]}")
    return output


def run_stoppably(command: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
    """Runs ``command`` (a launcher: torchrun, or this benchmark) from the repository's root in a session of
    its own; returns its exit code and output (stderr in it), or None and the output when it outlasted
    ``timeout`` and was stopped. Also stopped when this process is told to stop (SIGTERM, see main)."""
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        return None, stop_launcher(proc)
    finally:
        if proc.poll() is None:
            stop_launcher(proc)


def stop_launcher(proc: subprocess.Popen, grace_s: float = 60) -> str:
    """torchrun starts each rank in a session of its own, so killing torchrun's process group would leave
    the ranks running: SIGTERM makes torchrun stop its ranks (SIGTERM, then SIGKILL after 30 s) and exit,
    and this script stop its torchrun; whatever is left after ``grace_s`` is killed. Returns the output."""
    proc.terminate()
    try:
        output, _ = proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    return output or ""


def loss_rtol(mixed_precision: bool) -> float:
    """harness.qwen3's training-loss tolerance for the dtype the model trains in."""
    import torch

    from harness import qwen3

    return qwen3.TOLERANCES[torch.bfloat16 if mixed_precision else torch.float32].loss_rtol


PROFILED_STEPS = 2  # --host-diff: steps profiled after the timed ones


def print_host_diff(strategy: str, flagos: dict, reference: dict, n: int) -> None:
    """The ``n`` profiler events (aten ops, collectives, FSDP's and DDP's own regions) whose self host time
    per step flagos exceeds the reference's most, from each side's first launch. The two devices name
    their collectives differently (the flagos backend's calls and NCCL's), so those show on both sides."""
    from benchmarks import host_time_diff

    steps = flagos["steps"]
    rows = host_time_diff.diff_rows(reference["events"], flagos["events"], per=steps)
    r_total, f_total = host_time_diff.totals_ms(rows)
    print(
        f"# {strategy}: {steps} profiled steps on rank 0, per step: wall {flagos['wall_seconds'] / steps * 1e3:.1f} "
        f"ms on flagos, {reference['wall_seconds'] / steps * 1e3:.1f} ms on the reference; self host time in "
        f"profiled events {f_total:.1f} ms and {r_total:.1f} ms"
    )
    host_time_diff.print_table(rows, n, prefix="#   ")
    by_calls = sorted(rows, key=lambda r: (-abs(r[3] - r[2]), r[1]))
    print(f"# {strategy}: the host events whose calls per step differ most")
    host_time_diff.print_table([r for r in by_calls if r[3] != r[2]], n, prefix="#   ")
    f_device, r_device = flagos.get("device_events") or {}, reference.get("device_events") or {}
    if bool(f_device) != bool(r_device):
        print(
            f"# {strategy}: device work recorded on {'flagos' if f_device else 'the reference'} only: not compared"
        )
    elif f_device:
        rows = host_time_diff.diff_rows(r_device, f_device, per=steps)
        r_total, f_total = host_time_diff.totals_ms(rows)
        calls = sum(r[2] for r in rows), sum(r[3] for r in rows)
        print(
            f"# {strategy}: device work per step: {calls[1]:.0f} kernels and copies on flagos, {calls[0]:.0f} on "
            f"the reference; their device time {f_total:.1f} ms and {r_total:.1f} ms"
        )
        host_time_diff.print_table(
            sorted(rows, key=lambda r: (-abs(r[3] - r[2]), -abs(r[0]), r[1])),
            n,
            prefix="#   ",
            label="kernel",
            clock="device",
        )


def gpu_numa_node(index: int) -> int:
    """The NUMA node of CUDA device ``index`` (the PCI device's in sysfs), -1 where none is known."""
    import torch

    props = torch.cuda.get_device_properties(index)
    try:
        address = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{address}/numa_node") as f:
            return int(f.read())
    except (AttributeError, OSError, ValueError):
        return -1


def node_cpus(node: int) -> set[int]:
    """The CPUs of NUMA node ``node`` (sysfs), none where it is unknown (-1) or unreadable."""
    if node < 0:
        return set()
    try:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            return cpu_list(f.read().strip())
    except (OSError, ValueError):
        return set()


def rank_cpus(mode: str, world_size: int) -> list[list[int]] | None:
    """The CPUs each local rank runs on (``--bind-cpus``), None where the OS places the ranks. Ranks whose
    GPUs share a NUMA node (``numa``), or all ranks (``split``), divide its CPUs into equal shares, in rank
    order, as torchrun's ``--numa-binding exclusive`` does."""
    if mode == "off":
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if mode == "split":
        pools = [allowed] * world_size
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--bind-cpus numa: no CUDA GPU, so no NUMA node to bind to (split or off)")
        pools = []
        for index in range(world_size):
            cpus = sorted(node_cpus(gpu_numa_node(index)) & set(allowed))
            pools.append(cpus or allowed)  # no node known, or none of its CPUs allowed here: every CPU
    shares = []
    for rank, pool in enumerate(pools):
        sharing = [other for other, p in enumerate(pools) if p == pool]
        size = len(pool) // len(sharing)
        if size == 0:
            raise SystemExit(
                f"--bind-cpus {mode}: {len(pool)} CPU(s) cannot be shared by {len(sharing)} ranks"
            )
        k = sharing.index(rank)
        shares.append(pool[k * size : (k + 1) * size])
    return shares


def launch(args, world_size: int, strategy: str, device: str, turns: str | None = None) -> dict:
    """One torchrun of the example: rank 0's results. ``turns``: FOLDER:ME of a side-by-side launch."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        script = [*EXAMPLE, "--device", device, "--strategy", strategy, "--steps", str(args.steps)]
        script += ["--batch", str(args.batch), "--seq-len", str(args.seq_len), "--results", path]
        if args.shape:
            script += ["--shape", args.shape]
        if args.host_diff:
            script += ["--profile-steps", str(PROFILED_STEPS)]
        if turns:
            script += ["--turns", turns, "--untimed", str(args.warmup)]
        if args.rank_cpus:
            script += ["--cpus", ":".join(cpu_ranges(cpus) for cpus in args.rank_cpus)]
        torchrun(world_size, script, args.timeout, f"{strategy} on {device}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def launch_both(args, world_size: int, strategy: str, order: list[str]) -> list[tuple[str, dict]]:
    """A launch on each device of ``order``: one after the other, or with ``--side-by-side`` both at once,
    their timed steps in turns (the first of ``order`` first). A launch that fails ends the other's
    waiting for its turn."""
    if not args.side_by_side:
        return [(device, launch(args, world_size, strategy, device)) for device in order]
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="torch_fl_distributed_turns_", dir=shm) as folder:

        def run(me: int, device: str) -> dict:
            try:
                return launch(args, world_size, strategy, device, f"{folder}:{me}")
            except BaseException:
                open(os.path.join(folder, "abort"), "w").close()
                raise

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(run, me, device) for me, device in enumerate(order)]
            launched = [(device, future.result()) for device, future in zip(order, futures, strict=True)]
    overlap = overlapping_steps(launched, args.warmup)
    if overlap:  # the turns are the measurement
        raise SystemExit(f"{strategy}: {overlap}")
    return launched


def overlapping_steps(launched: list[tuple[str, dict]], warmup: int) -> str | None:
    """What overlapped, where a timed step (from ``warmup`` on) of one launch ran while one of the other
    did, from their ``step_spans``; None where none did. Each launch's own steps run one after another, so
    a step that overlaps the other launch's overlaps the next one to start after it."""
    timed = sorted(
        (start, end, device, step)
        for device, run in launched
        for step, (start, end) in enumerate(run["step_spans"])
        if step >= warmup
    )
    for (_, end, first, i), (start, _, second, j) in zip(timed, timed[1:], strict=False):
        if first != second and start < end:
            return (
                f"step {j} on {second} began while step {i} on {first} ran: the launches did not take turns"
            )
    return None


def run_train(args, world_size: int, native: str) -> tuple[list[dict], bool]:
    rows, all_equal = [], True
    for strategy in args.strategies:
        runs = {"flagos": [], native: []}
        for repeat in range(args.repeats):
            # Alternating which device goes (or takes its turn) first, so that a drift of the machine hits
            # both alike.
            order = round_order(["flagos", native], repeat)
            for device, run in launch_both(args, world_size, strategy, order):
                runs[device].append(run)
                # Each launch's figure as it comes: a run cut by a time limit still shows what it measured.
                print(
                    f"# {strategy} on {device}, run {repeat + 1}: median step "
                    f"{median(run['step_seconds'][args.warmup :]) * 1e3:.1f} ms, of which "
                    f"queuing it on the host {median(run['issue_seconds'][args.warmup :]) * 1e3:.1f}",
                    flush=True,
                )
        flagos, reference = runs["flagos"], runs[native]
        if reference[0]["imported_torch_fl"]:
            raise SystemExit(f"the {native} reference imported torch_fl: it is not a plain PyTorch run")
        if args.host_diff:
            print_host_diff(strategy, flagos[0]["host_profile"], reference[0]["host_profile"], args.host_diff)
        tolerance = loss_rtol(flagos[0]["mixed_precision"])
        differences = [
            abs(a - b) / max(abs(b), 1e-12)
            for run in flagos
            for a, b in zip(run["losses"], reference[0]["losses"], strict=True)
        ]
        # Each flagos run is compared with the first reference run; how far the reference's own runs are
        # apart is reported beside it, so that a reference that is not deterministic shows as such.
        reference_spread = max(
            abs(a - b) / max(abs(b), 1e-12)
            for run in reference
            for a, b in zip(run["losses"], reference[0]["losses"], strict=True)
        )
        equal = max(differences) <= tolerance
        all_equal &= equal
        f_ms = median(s * 1e3 for run in flagos for s in run["step_seconds"][args.warmup :])
        r_ms = median(s * 1e3 for run in reference for s in run["step_seconds"][args.warmup :])
        f_issue = median(s * 1e3 for run in flagos for s in run["issue_seconds"][args.warmup :])
        r_issue = median(s * 1e3 for run in reference for s in run["issue_seconds"][args.warmup :])
        rows.append(
            dict(
                strategy=strategy,
                shape=flagos[0]["shape"],
                world_size=world_size,
                flagos_on=flagos[0]["on"],
                reference_on=reference[0]["on"],
                rank0_cpus=cpu_ranges(flagos[0]["cpus"]),
                flagos_step_ms=f_ms,
                reference_step_ms=r_ms,
                time_ratio=f_ms / r_ms,
                flagos_issue_ms=f_issue,
                reference_issue_ms=r_issue,
                per_run_ratios=[
                    median(a["step_seconds"][args.warmup :]) / median(b["step_seconds"][args.warmup :])
                    for a, b in zip(flagos, reference, strict=True)
                ],
                # Side by side: each block of flagos's timed steps against the reference's block that ran
                # right before or after it.
                block_ratios=[
                    ratio
                    for a, b in zip(flagos, reference, strict=True)
                    for ratio in Turns.block_pairs(
                        b["step_seconds"][args.warmup :], a["step_seconds"][args.warmup :]
                    )
                ]
                if args.side_by_side
                else [],
                max_loss_rel_diff=max(differences),
                reference_loss_rel_spread=reference_spread,
                loss_rtol=tolerance,
                losses_equal=equal,
                flagos_losses=flagos[0]["losses"],
                reference_losses=reference[0]["losses"],
            )
        )
    print(
        f"\n## Training, {args.steps} steps, step time from step {args.warmup} on (median), {args.repeats} run(s) each"
    )
    print(
        "| strategy | shape | ranks | flagos ms | reference ms | flagos / reference | per run "
        "| paired blocks: median (range, pairs) | host queuing ms, flagos / reference | max loss diff | within |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        paired = Ratio.of(r["block_ratios"]).text(3) if r["block_ratios"] else "-"
        print(
            f"| {r['strategy']} | {r['shape']} | {r['world_size']} | {r['flagos_step_ms']:.1f} "
            f"| {r['reference_step_ms']:.1f} | **{r['time_ratio']:.3f}** "
            f"| {', '.join(f'{x:.3f}' for x in r['per_run_ratios'])} | {paired} "
            f"| {r['flagos_issue_ms']:.1f} / {r['reference_issue_ms']:.1f} | {r['max_loss_rel_diff']:.2e} "
            f"| {'yes' if r['losses_equal'] else 'NO'} (rtol {r['loss_rtol']:g}) |"
        )
    for r in rows:
        print(f"flagos: {r['flagos_on']}; reference: {r['reference_on']}; rank 0 on CPUs {r['rank0_cpus']}")
        print(f"{r['strategy']} losses, flagos:    {' '.join(f'{x:.4f}' for x in r['flagos_losses'])}")
        print(f"{r['strategy']} losses, reference: {' '.join(f'{x:.4f}' for x in r['reference_losses'])}")
    return rows, all_equal


def sizes_bytes(min_mib: float, max_mib: float) -> list[int]:
    sizes, size = [], min_mib
    while size <= max_mib * (1 + 1e-9):
        sizes.append(int(size * MiB))
        size *= 4
    return sizes


def run_collectives(args, world_size: int, native: str) -> list[dict]:
    max_mib = args.max_mib if args.max_mib is not None else (1024.0 if native == "cuda" else 64.0)
    request = dict(
        sizes=sizes_bytes(args.min_mib, max_mib), repeats=args.repeats, min_seconds=args.min_seconds
    )
    with tempfile.TemporaryDirectory(prefix="flagos_dist_bench_") as tmp:
        out = os.path.join(tmp, "collectives.json")
        request["out"] = out
        worker = ["-m", "benchmarks.collectives_worker", json.dumps(request)]
        torchrun(world_size, worker, args.timeout, "collectives")
        with open(out) as f:
            rows = json.load(f)
    kind = "bus" if world_size > 1 else "algorithm"
    print(
        f"\n## Collectives, float32, {world_size} ranks, {kind} bandwidth in GB/s (median of {args.repeats})"
    )
    print(f"| op | size | flagos | {native} | flagos / {native} |")
    print("|---|---|---|---|---|")
    for r in rows:
        size = f"{r['bytes'] / MiB:g} MiB"
        print(
            f"| {r['op']} | {size} | {r['flagos_gbs']:.2f} | {r['native_gbs']:.2f} | **{r['ratio']:.3f}** |"
        )
    for op in OPS:
        large = [r["ratio"] for r in rows if r["op"] == op and r["bytes"] >= 16 * MiB]
        if large:
            print(f"{op}: lowest flagos / {native} from 16 MiB up: {min(large):.3f} (target >= 0.97)")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    # Stopped from outside (a test's time limit), stop the torchrun in flight too (torchrun()'s finally).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    import torch

    native = native_device()
    world_size = args.world_size or (torch.cuda.device_count() if native == "cuda" else 2)
    if native == "cuda" and world_size > torch.cuda.device_count():
        raise SystemExit(f"--world-size {world_size}: only {torch.cuda.device_count()} GPU(s) are visible")
    print(f"flagos on {native}; {world_size} ranks; torch {torch.__version__}")
    args.rank_cpus = None
    if "train" in args.parts:
        mode = args.bind_cpus or ("numa" if native == "cuda" else "off")
        args.rank_cpus = rank_cpus(mode, world_size)
        where = ", ".join(f"rank {i}: {cpu_ranges(c)}" for i, c in enumerate(args.rank_cpus or []))
        print(f"# training ranks on CPUs ({mode}): {where or 'wherever the OS places them'}")
    results, ok = {"native": native, "world_size": world_size}, True
    for part in args.parts:  # in the order given
        if part == "train":
            results["train"], ok = run_train(args, world_size, native)
        else:
            results["collectives"] = run_collectives(args, world_size, native)
    if args.results:
        with open(args.results, "w") as f:
            json.dump(results, f, indent=1)
    record(args, results)
    if not ok:
        print("FAILED: flagos's losses differ from the reference's beyond the tolerance", file=sys.stderr)
    return 0 if ok else 1


def record(args, results: dict) -> None:
    """The headline figures of ``results`` (main's) as records, with ``--json``."""
    import torch

    native, world_size = results["native"], results["world_size"]
    if native == "cuda":
        rec = records.Recorder(
            args, device=f"{world_size}x {torch.cuda.get_device_name(0)}", baseline="cuda (NCCL)"
        )
    else:
        rec = records.Recorder(args, baseline="cpu (gloo)")
    for row in results.get("train", []):
        pairs = row["block_ratios"] or (row["per_run_ratios"] if args.repeats > 1 else [])
        detail = (
            f"Qwen3 {row['shape']} {row['strategy'].upper()}, {world_size} ranks, {args.batch}x{args.seq_len} "
            f"a rank, {args.repeats} launch{'es' if args.repeats > 1 else ''} each"
        )
        if row["block_ratios"]:
            detail += f", side by side; paired {Ratio.of(row['block_ratios']).median:.3f}"
        rec.add(
            f"{row['strategy']}_step_time_ratio",
            row["time_ratio"],
            "time ratio",
            range=Ratio.of(pairs).range if pairs else None,
            detail=detail,
        )
    rows = results.get("collectives", [])
    for op in OPS:
        of_op = [r for r in rows if r["op"] == op]
        large = [r for r in of_op if r["bytes"] >= 16 * MiB] or of_op
        if not large:
            continue
        sizes = f"{large[0]['bytes'] / MiB:g}-{large[-1]['bytes'] / MiB:g} MiB"
        rec.add(
            f"{op}_lowest_bw_ratio",
            min(r["ratio"] for r in large),
            "speed ratio",
            detail=f"{op} bus bandwidth, {world_size} ranks, lowest over {sizes}, medians of {args.repeats} rounds",
        )


if __name__ == "__main__":
    sys.exit(main())
