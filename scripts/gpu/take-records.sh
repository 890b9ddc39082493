#!/usr/bin/env bash
# Adds the benchmark records of a scripts/gpu/all.sh archive (its records/ folder) to this checkout's
# benchmarks/records/, then regenerate docs/performance.md's table with `python -m benchmarks.report`:
#
#   scripts/gpu/take-records.sh [--relabel] ARCHIVE [COMMIT]
#
# A tree copied to the lent machine has no .git, so its records say commit "unknown": they get COMMIT, by
# default this checkout's HEAD (the tree that was sent, when nothing was committed since). Records that name
# a commit keep it, unless --relabel: a copy that finds a .git left on the machine by an earlier one names
# that old commit ("+dirty"), and --relabel gives every record COMMIT instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
relabel=0
[ "${1:-}" = --relabel ] && { relabel=1; shift; }
archive=${1:-}
[ -f "$archive" ] || { echo "usage: scripts/gpu/take-records.sh [--relabel] ARCHIVE [COMMIT]" >&2; exit 2; }
commit=${2:-$(git rev-parse --short HEAD)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# all.sh's archives name it ./records; one made with `tar -C DIR records` names it records.
tar xzf "$archive" -C "$tmp" ./records 2> /dev/null || tar xzf "$archive" -C "$tmp" records 2> /dev/null ||
  { echo "$archive holds no records/" >&2; exit 1; }
python3 - "$tmp/records" benchmarks/records "$commit" "$relabel" <<'PY'
import json, pathlib, sys

from benchmarks.records import check

source, target, commit = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
relabel = sys.argv[4] == "1"
for path in sorted(source.glob("*.jsonl")):
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in records:
        if relabel or record.get("commit", "unknown") == "unknown":
            record["commit"] = commit
    with open(target / path.name, "a") as out:
        out.writelines(json.dumps(check(record)) + "\n" for record in records)
    print(f"{target / path.name}: {len(records)} records added")
PY
