"""The summary of a scripts/gpu/all.sh run: python3 scripts/gpu/summary.py LOGDIR.

LOGDIR holds plan.txt (every process the run meant to start: part, name, cap, command), jobs.tsv (one line a
process that ended: part, name, kind, exit status, log), the logs and records/ (the benchmark records the run
added). Prints, per part, the tests passed, failed and skipped (from the final line of each pytest log), each
process that failed, stopped at its time limit or never ran, and the records; exits 1 unless every planned
process ran and passed."""

from __future__ import annotations

import collections
import pathlib
import re
import sys

COUNTS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")
FINAL = re.compile(r"\bin [0-9.]+s\b")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
TIME_LIMIT = {124, 137}
NOT_STARTED = 125
LISTED = 8  # a part of more processes lists only those that did not pass


def final_line(text: str) -> str | None:
    """pytest's last line, e.g. '3 failed, 120 passed, 4 skipped in 81.20s'; None when the log has none."""
    for line in reversed(text.splitlines()):
        if FINAL.search(line) and (COUNT.search(line) or "no tests ran" in line):
            return line.strip(" =")
    return None


def counts(line: str | None) -> collections.Counter:
    found = collections.Counter()
    for n, what in COUNT.findall(line or ""):
        found["error" if what.startswith("error") else what] += int(n)
    return found


def outcome(kind: str, status: int, text: str) -> tuple[bool, str]:
    """(passed, what to print) of one process."""
    if status in TIME_LIMIT:
        return False, "stopped by its time limit"
    if status == NOT_STARTED:
        return False, "not started: no time left"
    if kind == "pytest":
        line = final_line(text)
        if status == 0:
            return True, line or "passed"
        if status == 5:
            return False, "no tests collected"
        return False, f"exit {status}: {line or 'no final line'}"
    if kind == "ctest":
        line = next((x for x in reversed(text.splitlines()) if "tests passed" in x), None)
        return status == 0, line or f"exit {status}"
    return status == 0, "ok" if status == 0 else f"exit {status}: {last_words(text)}"


def last_words(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:160] if lines else "no output"


def planned(folder: pathlib.Path) -> list[tuple[str, str]]:
    plan = folder / "plan.txt"
    if not plan.exists():
        return []
    rows = []
    for line in plan.read_text().splitlines():
        words = line.split()
        if len(words) >= 3 and not line.startswith("==") and words[2].isdigit():
            rows.append((words[0], words[1]))
    return rows


def main(folder: pathlib.Path) -> int:
    jobs = {}
    table = folder / "jobs.tsv"
    for line in table.read_text().splitlines() if table.exists() else []:
        part, name, kind, status, log = line.split("\t")
        path = folder / log
        text = path.read_text(errors="replace") if path.exists() else ""
        jobs[part, name] = (kind, int(status), text)
    order = list(dict.fromkeys([*planned(folder), *jobs]))
    if not order:
        print("==== no process ran")
        return 1
    print("==== summary")
    all_passed = True
    for part in dict.fromkeys(p for p, _ in order):
        names = [n for p, n in order if p == part]
        total, lines, bad = collections.Counter(), [], 0
        for name in names:
            if (part, name) not in jobs:
                passed, what = False, "did not run"
            else:
                kind, status, text = jobs[part, name]
                passed, what = outcome(kind, status, text)
                if kind == "pytest":
                    total += counts(final_line(text))
                    failures = [x for x in text.splitlines() if x.startswith(("FAILED ", "ERROR "))]
                    what += "".join(f"\n      {x[:200]}" for x in failures[:10])
            bad += not passed
            if not passed or len(names) <= LISTED:
                lines.append(f"  {'ok  ' if passed else 'FAIL'} {name}: {what}")
        tests = ", ".join(f"{total[c]} {c}" for c in COUNTS if total[c])
        print(f"{part}: {len(names)} processes, {bad} not passed{'; tests: ' + tests if tests else ''}")
        print("\n".join(lines))
        all_passed &= bad == 0
    records = sorted((folder / "records").glob("*.jsonl"))
    if records:
        made = ", ".join(f"{r.stem} {len(r.read_text().splitlines())}" for r in records)
        print(f"records: {made} (scripts/gpu/take-records.sh adds them to benchmarks/records/)")
    print("RESULT: " + ("every process passed" if all_passed else "some processes did not pass"))
    return 0 if all_passed else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/gpu/summary.py LOGDIR")
    sys.exit(main(pathlib.Path(sys.argv[1])))
