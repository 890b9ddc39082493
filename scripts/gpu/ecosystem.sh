#!/usr/bin/env bash
# The GPU checks of the ecosystem issue (docs/ecosystem.md): profiler, memory tools, extensions and the
# CUDA compatibility layer, on the lent GPU machine (scripts/gpu/README.md), in one call of about 7 minutes:
#
#   scripts/gpu/ecosystem.sh
#
# 1. fresh build (check.sh build);
# 2. a probe of what this torch's profiler does with PrivateUse1 (supported activities, the state
#    torch.profiler picks, whether flagos ops get device time through it);
# 3. the four test files on the cuda accelerator, gpu tests included (two extension builds, one with nvcc);
#    beside it, the same files on the simulated accelerator with the GPU hidden (torch 2.11's sim paths: the
#    profiler stubs, memory history, load_inline on CPU, the compat training script);
# 4. benchmarks/compat_overhead.py (the profiler's cost per op on the cuda accelerator; the compat part
#    says it refuses there).
# Logs: $OUT/gpu_ecosystem.tgz; a summary on stdout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1
L=$(mktemp -d /tmp/gpu_ecosystem.XXXX)
DEST=${OUT:-gpu-logs}
mkdir -p "$DEST"
trap 'tar czf "$DEST/gpu_ecosystem.tgz" -C "$L" . && echo "logs: $DEST/gpu_ecosystem.tgz"' EXIT
summary() {
  echo "---- $1"
  grep -E "^(FAILED|ERROR)|^E   |passed|failed|skipped|Timeout" "$L/$1" | head -${2:-30}
}

OUT=$L scripts/gpu/check.sh build 2>&1 | tail -3
python3 -c "import torch_fl" || { echo "build failed"; tail -40 "$L/build.log"; exit 1; }
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}

echo "== [$SECONDS s] profiler probe"
timeout 120 python3 - > "$L/probe.log" 2>&1 <<'PY'
import torch, torch_fl
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
print("torch", torch.__version__, "accelerator", torch_fl.accelerator(), "build", torch_fl.build_info())
print("supported activities:", torch._C._autograd._supported_activities())
x = torch.randn(256, 256, device="flagos")
x.mm(x); torch.flagos.synchronize()
for activities in ([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], [ProfilerActivity.CPU, ProfilerActivity.CUDA]):
    with profile(activities=activities) as p:
        x.mm(x); torch.flagos.synchronize()
    rows = {r.key: r for r in p.key_averages()}
    devices = sorted({str(e.device_type) for e in p.events()})
    print(activities, "profiler kind", getattr(p.profiler, "profiler_kind", "?"), "device types", devices,
          "aten::mm device us", getattr(rows.get("aten::mm"), "device_time_total", None))
PY
cat "$L/probe.log"

echo "== [$SECONDS s] tests: cuda accelerator | simulated accelerator (GPU hidden), in parallel"
files=(tests/test_profiler.py tests/test_memory_history.py tests/test_cpp_extension.py tests/test_compat_cuda.py)
timeout 480 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short "${files[@]}" > "$L/pytest-cuda.log" 2>&1 &
CUDA_VISIBLE_DEVICES= FLAGOS_ACCELERATOR=sim timeout 480 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
  --basetemp=/tmp/pytest-ecosystem-sim "${files[@]}" > "$L/pytest-sim.log" 2>&1 &
wait
summary pytest-cuda.log 40
summary pytest-sim.log

echo "== [$SECONDS s] benchmarks/compat_overhead.py"
timeout 120 python3 -m benchmarks.compat_overhead --rounds 5 2>&1 | grep -v USDT | tee "$L/compat_overhead.log"
