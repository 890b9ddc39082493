"""Where flagos's host time goes beyond a reference's, by profiler event: the table that
``python -m benchmarks.qwen3 --host-diff`` and ``python -m benchmarks.distributed --host-diff`` print. Each
side is a mapping of event name -> [calls, self host microseconds] over the same work."""

from __future__ import annotations

Row = tuple[float, str, float, float, float, float]  # diff us, name, calls ref/flagos, host us ref/flagos


def diff_rows(reference: dict, flagos: dict, per: int = 1) -> list[Row]:
    """Every event of either side, divided by ``per`` (the profiled steps), largest flagos excess first."""
    rows = []
    for name in set(reference) | set(flagos):
        rc, rt = reference.get(name, [0, 0.0])
        fc, ft = flagos.get(name, [0, 0.0])
        rows.append(((ft - rt) / per, name, rc / per, fc / per, rt / per, ft / per))
    rows.sort(reverse=True)
    return rows


def totals_ms(rows: list[Row]) -> tuple[float, float]:
    """The reference's and flagos's self host time over all events, in ms."""
    return sum(r[4] for r in rows) / 1e3, sum(r[5] for r in rows) / 1e3


def print_table(rows: list[Row], n: int, prefix: str, label: str = "event", clock: str = "host") -> None:
    """The first ``n`` rows: calls and ``clock`` (host or device) ms on both sides and their difference,
    each line after ``prefix``."""
    top = rows[:n]
    width = max((len(r[1]) for r in top), default=len(label))
    print(
        f"{prefix}{label:{width}}{'calls':>9}{'calls fl':>10}{clock + ' ms':>10}{clock + ' ms fl':>12}"
        f"{'diff ms':>10}"
    )
    for diff, name, rc, fc, rt, ft in top:
        print(f"{prefix}{name:{width}}{rc:9.0f}{fc:10.0f}{rt / 1e3:10.2f}{ft / 1e3:12.2f}{diff / 1e3:10.2f}")
