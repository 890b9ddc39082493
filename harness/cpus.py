"""CPU lists as ``taskset -c`` writes them ("0-3,8,10-11"), and binding a process's threads to one
(``python -m examples.train_qwen3_distributed --cpus``, ``python -m benchmarks.distributed --bind-cpus``)."""

from __future__ import annotations

import os


def cpu_list(text: str) -> set[int]:
    """The CPUs of a list as taskset -c writes them: "0-3,8,10-11"."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or not (last.isdigit() or not last):
            raise ValueError(f"{part!r} is not a CPU number or range")
        if last and int(last) < int(first):
            raise ValueError(f"{part!r} is an empty range")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_ranges(cpus) -> str:
    """``cpus`` as taskset -c writes them: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def bind_to_cpus(lists: list[set[int]], local_rank: int) -> None:
    """Runs this process's threads, and so those they start, on ``lists[local_rank]``."""
    if local_rank >= len(lists):
        raise SystemExit(f"--cpus has {len(lists)} list(s), none for local rank {local_rank}")
    cpus = lists[local_rank]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended
        except OSError as e:
            raise SystemExit(f"--cpus: local rank {local_rank} cannot run on CPUs {sorted(cpus)}: {e}") from e
