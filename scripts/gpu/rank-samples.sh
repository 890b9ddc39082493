#!/usr/bin/env bash
# Where a distributed training step's host time goes, flagos against cuda, by library and by function:
# `perf` samples both ranks of examples.train_qwen3_distributed during steady steps, first on flagos,
# then on cuda (a separate launch that never imports torch_fl), then prints, for each shared library and
# for the functions that differ most, the CPU milliseconds per step and rank on each device.
#
#   scripts/gpu/rank-samples.sh [ddp|fsdp2]    (on nvidia-h200-x2; carry .perf and .whl)
#
# A library's samples over the sampled seconds, spread over the steps that fit in them (median step time)
# and halved for one of the two ranks, are its CPU milliseconds per step and rank. The busy-CPU figure says
# whether the step is host-bound: 2.00 means each rank always has a thread running (at 2x512 tokens a rank,
# the Python thread in the forward, the autograd engine's in the backward). Needs perf on the GPU machine
# (scripts/gpu/perf-bundle.sh fills .perf/) and an unstripped build, which this script makes (pip's
# `-C install.strip=false`). RANK_SAMPLES_SECONDS (8) seconds are sampled from step 30 of
# RANK_SAMPLES_STEPS (90); ranks on CPUs 0-15 and 16-31, as --bind-cpus numa gives on the lent VM. Outputs
# (reports, logs) in $OUT/rank-samples.tgz; the summary on stdout. About 3 minutes.
# RANK_SAMPLES_PYTHON=1: also by Python function, time spent inside it (callees included): the ranks run with
# Python's perf trampolines (PYTHONPERFSUPPORT=1, Python >= 3.12) and perf records call chains (frame pointers).
# A sample counts for a Python function only where its chain unwinds that far: libraries built without frame
# pointers (torch's, the CUDA driver) cut chains, so these figures are lower bounds, for comparing the devices.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
strategy=${1:-ddp}
[[ "$strategy" =~ ^(ddp|fsdp2)$ ]] || { echo "usage: scripts/gpu/rank-samples.sh [ddp|fsdp2]" >&2; exit 2; }
[ -x .perf/perf ] || { echo "error: no .perf/perf (scripts/gpu/perf-bundle.sh, then carry .perf)" >&2; exit 2; }
seconds=${RANK_SAMPLES_SECONDS:-8}
steps=${RANK_SAMPLES_STEPS:-90}
source scripts/gpu/lib.sh
R=$(mktemp -d /tmp/rank-samples.XXXX)
DEST=${OUT:-gpu-logs}
mkdir -p "$DEST"
trap 'tar czf "$DEST/rank-samples.tgz" --exclude="*.data" -C "$R" . && echo "logs: $DEST/rank-samples.tgz"' EXIT

gpu_site || exit 1
rm -rf build
python3 -m pip install -q --no-build-isolation --no-deps -C install.strip=false -e . > "$R/build.log" 2>&1 \
  || { echo "build failed"; tail -30 "$R/build.log"; exit 1; }
perf() { env LD_LIBRARY_PATH="$PWD/.perf/lib" "$PWD/.perf/perf" "$@"; }
frequency=1999  # samples a second per busy CPU
python_frames=${RANK_SAMPLES_PYTHON:-0}
record_args=() rank_env=()
report_args=()
[ "$python_frames" = 1 ] && { record_args=(-g); rank_env=(PYTHONPERFSUPPORT=1); report_args=(--no-children -g none); }
extension=$(python3 -c "import torch_fl._C as c; print(c.__file__.rsplit('/', 1)[1])")

for device in flagos cuda; do
  env "${rank_env[@]}" timeout 300 torchrun --standalone --nproc-per-node 2 -m examples.train_qwen3_distributed --strategy "$strategy" \
    --device $device --seq-len 512 --steps "$steps" --cpus 0-15:16-31 --results "$R/$device.json" \
    > "$R/$device.log" 2>&1 &
  launcher=$!
  for _ in $(seq 400); do grep -q "^step 30:" "$R/$device.log" && break; sleep 0.5; done
  ranks=$(pgrep -P "$(pgrep -P $launcher | head -1)" | paste -sd,)  # timeout > torchrun > the ranks
  [ -n "$ranks" ] || { echo "$device: no ranks running"; tail -20 "$R/$device.log"; exit 1; }
  perf record "${record_args[@]}" -F $frequency -p "$ranks" -o "$R/$device.data" -- sleep "$seconds" 2> "$R/$device.record.log"
  wait $launcher || { echo "$device: the training failed"; tail -20 "$R/$device.log"; exit 1; }
  report() { perf report -i "$R/$device.data" --stdio "${report_args[@]}" "$@" 2> /dev/null | grep -v "^#" | grep -v "^$"; }
  report -n --sort dso > "$R/$device.dso.txt"
  report -n --sort dso,sym | head -600 > "$R/$device.sym.txt"
  report --sort comm,dso | head -60 > "$R/$device.threads.txt"
  [ "$python_frames" = 1 ] && perf report -i "$R/$device.data" --stdio --children -g none --sort sym 2> /dev/null | grep "py::" | head -400 > "$R/$device.python.txt"
  [ $device = flagos ] && report --dsos "$extension" --sort sym | head -200 > "$R/$device.extension.txt"
done

python3 - "$R" "$seconds" "$frequency" "$python_frames" <<'PY'
import json, re, statistics, sys

folder, seconds, frequency, python_frames = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"

def step_ms(device):
    return statistics.median(json.load(open(f"{folder}/{device}.json"))["step_seconds"][25:]) * 1e3

def samples(device, kind):
    rows = {}
    for line in open(f"{folder}/{device}.{kind}.txt"):
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(.*?)\s*$", line)
        if m:
            rows[re.sub(r"\s+\[\.\]\s+", "  ", m.group(2))] = int(m.group(1))
    return rows

step = {d: step_ms(d) for d in ("flagos", "cuda")}
print(f"median step (from step 25): flagos {step['flagos']:.1f} ms, cuda {step['cuda']:.1f} ms "
      f"({step['flagos'] / step['cuda']:.3f})")
for d in step:
    busy = sum(samples(d, "dso").values()) / (frequency * seconds)
    print(f"{d}: {busy:.2f} CPUs busy on average over the two ranks (2.00: each rank's host always busy)")

def ms(device, n):  # a count of samples as CPU milliseconds per step and rank
    return n / frequency * 1e3 / (seconds * 1e3 / step[device]) / 2

for kind, title, n in (("dso", "library", 14), ("sym", "function", 25)):
    f, c = samples("flagos", kind), samples("cuda", kind)
    diff = {k: ms("flagos", f.get(k, 0)) - ms("cuda", c.get(k, 0)) for k in set(f) | set(c)}
    print(f"\nCPU ms per step and rank by {title}, largest differences first: flagos, cuda, difference")
    for k in sorted(diff, key=lambda k: -abs(diff[k]))[:n]:
        print(f"{ms('flagos', f.get(k, 0)):7.2f} {ms('cuda', c.get(k, 0)):7.2f} {diff[k]:+7.2f}  {k[:110]}")

if python_frames:  # inclusive: a function's samples with its callees', from perf's Children column
    def inclusive(device):
        total = sum(samples(device, "dso").values())
        rows = {}
        for line in open(f"{folder}/{device}.python.txt"):
            m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+(?:\[\.\]\s+)?py::(.*?)\s*$", line)
            if m:
                rows[m.group(2)] = rows.get(m.group(2), 0) + float(m.group(1)) / 100 * total
        return rows
    f, c = inclusive("flagos"), inclusive("cuda")
    diff = {k: ms("flagos", f.get(k, 0)) - ms("cuda", c.get(k, 0)) for k in set(f) | set(c)}
    print("\nCPU ms per step and rank inside each Python function (callees included, where the call chain "
          "unwinds to it: lower bounds), largest differences first")
    for k in sorted(diff, key=lambda k: -abs(diff[k]))[:30]:
        print(f"{ms('flagos', f.get(k, 0)):7.2f} {ms('cuda', c.get(k, 0)):7.2f} {diff[k]:+7.2f}  {k[:110]}")
PY
