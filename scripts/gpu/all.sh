#!/usr/bin/env bash
# The GPU checks in one command: one build, then the parts asked for side by side, one GPU each
# (scripts/gpu/README.md).
#
#   scripts/gpu/all.sh PART...          run them; the summary on stdout, every log in $OUT/gpu_all-<parts>.tgz
#   scripts/gpu/all.sh --plan PART...   print what would run (every process, its limit) and check that every
#                                       test file of tests/ is run by a part of `test`; builds nothing
#
# Parts: test (= suite models entry), suite, models, entry (= entry-native entry-flaggems), bench, multi-gpu, sim,
# opinfo:
#   suite      every test file on the cuda accelerator, one pytest process a file, SUITE_WORKERS (8) at a time;
#              but the files the parts below run; beside them the FlagGems kernel tests (their mm probe in a
#              process of its own), the model-shape sweep of the shipped FlagGems config, the C++ suites
#   models     Qwen3 at the 0.6B shape: inference, checkpoints, training, on the native route and on the FlagGems
#              config (GEMS_CONFIG); tests/compile/test_compile.py
#   entry      Qwen3 at the 0.6B shape: the demo and the benchmarks end to end, one part per config (entry-native,
#              entry-flaggems: two lanes where there are two GPUs), the training in a clean process, the compiled
#              model
#   bench      the benchmarks with --json, one after another (GPU_BENCH names them; default below)
#   multi-gpu  on every GPU at once, after the others: collective bandwidth, tests/distributed's GPU tests, DDP
#              and FSDP2 training side by side with cuda (MULTI_GPU_PARTS, DIST_REPEATS, DIST_TRAIN_ARGS)
#   sim        every test file with the GPU hidden (the simulated accelerator, as CI runs it)
#   opinfo     the OpInfo harness, flagos against cuda bitwise, in OPINFO_SHARDS (6) processes
#
# With N GPUs the parts go to N lanes, part i to GPU i mod N, the parts of one lane one after another; each lane
# has its share of the CPUs. Every process has its own limit and stops by GPU_DEADLINE_S seconds after the
# start (550 where OUT is set, as on the lent machine; none otherwise). Carry .whl where the machine lacks
# FlagGems (scripts/gpu/wheels.sh). GPU_BUILT=1: this tree is built already (torch_fl imports), skip the build.
# Exit status: 0 when every process passed, 1 otherwise, 2 for a wrong call, no GPU, or a test file that a part
# names and that does not exist (every other test file runs in the suite).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
[ -n "${OUT:-}" ] && : "${GPU_DEADLINE_S:=550}"
source scripts/gpu/lib.sh

usage() {
  echo "usage: scripts/gpu/all.sh [--plan] PART...   parts: test suite models entry entry-native entry-flaggems bench multi-gpu sim opinfo" >&2
  exit 2
}
PLAN=0
[ "${1:-}" = --plan ] && { PLAN=1; shift; }
[ $# -gt 0 ] || usage
parts=()
for arg in "$@"; do
  case $arg in
    test) parts+=(suite models entry-native entry-flaggems) ;;
    entry) parts+=(entry-native entry-flaggems) ;;
    suite | models | entry-native | entry-flaggems | bench | multi-gpu | sim | opinfo) parts+=("$arg") ;;
    *) echo "error: no part '$arg'" >&2; usage ;;
  esac
done
mapfile -t parts < <(printf '%s\n' "${parts[@]}" | awk '!seen[$0]++')
name=$(IFS=-; echo "$*")

GEMS_CONFIG=${GEMS_CONFIG:-torch_fl/configs/flaggems_cuda.conf}
SUITE_WORKERS=${SUITE_WORKERS:-8}
GPU_BENCH=${GPU_BENCH:-op_overhead op_overhead_qwen3 op_overhead_foreach op_overhead_generate transfers qwen3
  flaggems_overhead flaggems_kernels compat_overhead}
for bench in $GPU_BENCH; do
  [[ " op_overhead op_overhead_qwen3 op_overhead_foreach op_overhead_generate transfers qwen3 flaggems_overhead flaggems_kernels \
    compat_overhead qwen3_compile compile_time " \
    == *" $bench "* ]] || { echo "error: GPU_BENCH: no benchmark '$bench' here" >&2; exit 2; }
done
# Test files that run in processes of their own, in the parts that name them; the suite runs every other one.
compile_tests=tests/compile/test_compile.py
gems_kernels=tests/flaggems/test_flaggems_kernels.py
inference=tests/models/test_qwen3_inference.py
checkpoint=tests/models/test_qwen3_checkpoint.py
training=tests/models/test_qwen3_training.py
entry_points=tests/models/test_qwen3_entry_points.py
compiled_model=tests/models/test_qwen3_compile.py
own_files=("$compile_tests" "$gems_kernels" "$inference" "$checkpoint" "$training" "$entry_points" "$compiled_model")

L=$(mktemp -d /tmp/gpu_all.XXXX)
trap 'rm -rf "$L"' EXIT  # until the run starts: then finish() archives it
TMP_BASE=/tmp/gpu_pytest.$$
export GPU_GROUPS_FILE=$L/groups.txt
COVERED=$L/covered.txt
: > "$COVERED"

# job PART NAME KIND CAP [VAR=VALUE...] COMMAND...: COMMAND in the background (KIND pytest, file or command),
# limited to CAP seconds or the deadline, its log $L/PART/NAME.log; what it did goes into $L/jobs.tsv.
# fg_job: the same in the foreground. In plan mode both only print and note the test files named.
job() { if [ "$PLAN" = 1 ]; then _job "$@"; else _job "$@" & fi; }
fg_job() { _job "$@"; }
_job() {
  local part=$1 name=$2 kind=$3 cap=$4 log status
  shift 4
  if [ "$PLAN" = 1 ]; then
    printf '%-14s %-44s %5s s  %s\n' "$part" "$name" "$cap" "$*"
    printf '%s\n' "$@" | grep -E '^tests/.*\.py$' >> "$COVERED"
    return 0
  fi
  log=$part/${name//\//_}.log
  mkdir -p "$L/$part" "$TMP_BASE/$part"  # pytest makes its --basetemp, not the folder above it
  run_limited "$(limit_for "$cap")" "$L/$log" env "$@"
  status=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$part" "$name" "$kind" "$status" "$log" >> "$L/jobs.tsv"
}
# pytest_job PART NAME CAP [VAR=VALUE...] PYTEST-ARGUMENTS...
pytest_job() {
  local part=$1 name=$2 cap=$3 envs=()
  shift 3
  while [[ "${1:-}" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do envs+=("$1"); shift; done
  job "$part" "$name" pytest "$cap" "${envs[@]}" python3 -m pytest "$@" -q -p no:cacheprovider -rfE --tb=short \
    --durations=8 --basetemp="$TMP_BASE/$part/${name//\//_}"
}
# pool PART WORKERS CAP [VAR=VALUE...] -- FILE...: one pytest process a file, WORKERS at a time.
pool() {
  local part=$1 workers=$2 cap=$3 envs=() running=0 file
  shift 3
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  for file in "$@"; do
    if [ "$PLAN" = 0 ] && [ $running -ge "$workers" ]; then wait -n; running=$((running - 1)); fi
    pytest_job "$part" "$file" "$cap" "${envs[@]}" "$file" -o faulthandler_timeout=$((cap / 2))
    running=$((running + 1))
  done
  wait
}
# The suite's files, the slow folders and files first so that the pool ends together (the distributed
# benchmark's tests take about 4 minutes beside the others).
suite_files() {
  local own
  own=$(printf '%s\n' "${own_files[@]}")
  test_files | grep -vxF "$own" | awk '{ print (/^tests\/(compile|graphs|distributed|extensions|flaggems)\/|opinfo|distributed_benchmark|flaggems_sweeps/ ? 0 : 1), $0 }' \
    | sort -k1,1n -s | cut -d' ' -f2
}

part_suite() {
  local files
  job suite ctest ctest 300 bash -c "source scripts/gpu/lib.sh && gpu_ctest"
  mapfile -t files < <(suite_files)
  if [ "$PLAN" = 1 ]; then
    pool suite "$SUITE_WORKERS" 480 -- "${files[@]}"
  else
    pool suite "$SUITE_WORKERS" 480 -- "${files[@]}" &
  fi
  # The mm probe's control compiles FlagGems' mm on a cold Triton cache for minutes: in a process of its own.
  pytest_job suite "$gems_kernels::mm_probe" 540 "$gems_kernels" -k mm_faults
  pytest_job suite "$gems_kernels" 540 "$gems_kernels" -k "not mm_faults" -o faulthandler_timeout=200
  job suite flaggems-model-sweep command 260 OUT="$L/suite" GEMS_CANDIDATE="$GEMS_CONFIG" GEMS_BENCH=0 \
    GEMS_MODEL_SWEEP_S=200 GEMS_SWEEP_WORKERS=5 scripts/gpu/flaggems.sh
  wait
}
part_models() {
  local gems=FLAGOS_BACKEND_CONFIG=$PWD/$GEMS_CONFIG shape=FLAGOS_QWEN3_SHAPE=0.6b
  pytest_job models native 560 "$shape" "$inference" "$checkpoint"
  pytest_job models native-training 560 "$shape" "$training" -k "not clean_process"
  pytest_job models flaggems 560 "$shape" "$gems" "$inference" "$checkpoint"
  pytest_job models flaggems-training 560 "$shape" "$gems" "$training" -k "not clean_process"
  pytest_job models compile 560 "$compile_tests"
  wait
}
part_entry() { part_entry_native; part_entry_flaggems; }
# The entry points of one config: the demos, the benchmarks, and apart from them the side-by-side training
# benchmarks and the slow compile-time ones (cold compiler caches); the native config also runs the clean-process training (it checks the
# reference, not the route) and the compiled model.
part_entry_native() { entry_points_of native; }
part_entry_flaggems() { entry_points_of flaggems FLAGOS_BACKEND_CONFIG="$PWD/$GEMS_CONFIG"; }
entry_points_of() {
  local config=$1 shape=FLAGOS_QWEN3_SHAPE=0.6b envs
  shift
  envs=("$shape" "$@")
  pytest_job "entry-$config" demo 560 "${envs[@]}" "$entry_points" -k demo
  pytest_job "entry-$config" benchmarks 560 "${envs[@]}" "$entry_points" \
    -k "not demo and not compile_time and not side_by_side"
  pytest_job "entry-$config" side-by-side 560 "${envs[@]}" "$entry_points" -k "side_by_side"
  pytest_job "entry-$config" compile-time 560 "${envs[@]}" "$entry_points" -k "compile_time and not steps"
  pytest_job "entry-$config" compile-time-steps 560 "${envs[@]}" "$entry_points" -k "compile_time_benchmark_steps"
  if [ "$config" = native ]; then
    pytest_job entry-native clean-process 560 "$shape" "$training" -k clean_process
    pytest_job entry-native compiled 560 "$shape" "$compiled_model"
  fi
  wait
}
part_bench() {  # one at a time, alone on the lane's GPU; each figure goes to the run's records/ as it is made
  local bench rec=$L/records
  for bench in $GPU_BENCH; do
    case $bench in
      op_overhead) fg_job bench "$bench" command 150 python3 -m benchmarks.op_overhead --repeats 9 \
        --json "$rec/op_overhead.jsonl" ;;
      op_overhead_qwen3) fg_job bench "$bench" command 150 python3 -m benchmarks.op_overhead --set qwen3 \
        --repeats 5 --json "$rec/op_overhead.jsonl" ;;
      op_overhead_foreach) fg_job bench "$bench" command 150 python3 -m benchmarks.op_overhead --set foreach \
        --repeats 5 --json "$rec/op_overhead.jsonl" ;;
      op_overhead_generate) fg_job bench "$bench" command 150 python3 -m benchmarks.op_overhead --set generate \
        --repeats 5 --json "$rec/op_overhead.jsonl" ;;
      transfers) fg_job bench "$bench" command 120 python3 -m benchmarks.transfers --json "$rec/transfers.jsonl" ;;
      qwen3) fg_job bench "$bench" command 330 python3 -m benchmarks.qwen3 --repeats 5 \
        --configs "native,$GEMS_CONFIG" --top-ops 12 --json "$rec/qwen3.jsonl" ;;
      flaggems_overhead) fg_job bench "$bench" command 60 python3 -m benchmarks.flaggems_overhead --n 200 \
        --repeats 3 --json "$rec/flaggems_overhead.jsonl" ;;
      flaggems_kernels) fg_job bench "$bench" command 120 python3 -m benchmarks.flaggems_kernels --n 20 \
        --repeats 3 --json "$rec/flaggems_kernels.jsonl" ;;
      compat_overhead) fg_job bench "$bench" command 120 python3 -m benchmarks.compat_overhead --rounds 5 \
        --json "$rec/compat_overhead.jsonl" ;;
      qwen3_compile) fg_job bench "$bench" command 560 python3 -m benchmarks.qwen3 --compile --repeats 3 \
        --json "$rec/qwen3.jsonl" ;;
      compile_time) fg_job bench "$bench" command 560 python3 -m benchmarks.compile_time --part train --layers 4 \
        --length 512 --steps 20 --json "$rec/compile_time.jsonl" ;;
    esac
  done
}
part_multi_gpu() {  # every GPU; NVLink multicast stays off (the lent machines require it; it is not needed)
  local which=" ${MULTI_GPU_PARTS:-collectives tests train} "
  if [[ $which == *" collectives "* ]]; then  # 5 alternating rounds, 1 MiB-1 GiB (~30 s)
    fg_job multi-gpu collectives command 200 python3 -m benchmarks.distributed --parts collectives --repeats 5 \
      --json "$L/records/distributed.jsonl"
  fi
  if [[ $which == *" tests "* ]]; then  # the NCCL tests at world size 1 and at every GPU
    pytest_job multi-gpu distributed-tests 400 tests/distributed tests/tools/test_distributed_benchmark.py -m gpu
    wait
  fi
  if [[ $which == *" train "* ]]; then
    # Qwen3-0.6B DDP and FSDP2, 2x512 tokens a rank (DIST_TRAIN_ARGS="--batch 8 --seq-len 1024": larger),
    # flagos and cuda launched side by side, 60 timed steps each taken in turns (~70 s a pair of launches).
    # shellcheck disable=SC2086  # DIST_TRAIN_ARGS: several arguments
    fg_job multi-gpu train command 585 python3 -m benchmarks.distributed --parts train \
      --repeats "${DIST_REPEATS:-1}" --steps 65 --side-by-side ${DIST_TRAIN_ARGS:-} \
      --json "$L/records/distributed.jsonl"
  fi
}
part_sim() {
  local files
  mapfile -t files < <(test_files)
  pool sim "$SUITE_WORKERS" 480 CUDA_VISIBLE_DEVICES= FLAGOS_ACCELERATOR=sim -- "${files[@]}"
}
part_opinfo() {
  local k shards=${OPINFO_SHARDS:-6}
  for k in $(seq 0 $((shards - 1))); do
    job opinfo "shard-$k" command 400 python3 -m harness.opinfo --device-ref cuda --exact \
      --dtypes float32,float64,bfloat16,int64,bool --shard "$k/$shards" --out "$L/opinfo/opinfo-cuda-$k.json"
  done
  wait
  fg_job opinfo merge command 60 bash -c "python3 -m harness.opinfo --merge $L/opinfo/opinfo-cuda-*.json \
    --out $L/opinfo/opinfo-cuda.json"
}

# Every test file must be run by a part of `test`, and every file a part names must exist.
check_coverage() {
  local saved_plan=$PLAN missing stale
  PLAN=1
  : > "$COVERED"
  { part_suite; part_models; part_entry; } > /dev/null
  PLAN=$saved_plan
  missing=$(comm -23 <(test_files) <(sort -u "$COVERED"))
  stale=$(comm -13 <(test_files) <(sort -u "$COVERED"))
  [ -z "$missing" ] && [ -z "$stale" ] && return 0
  [ -n "$missing" ] && echo "error: test files that no part of 'test' runs: $(echo "$missing" | paste -sd' ')" >&2
  [ -n "$stale" ] && echo "error: scripts/gpu/all.sh names test files that do not exist: $(echo "$stale" | paste -sd' ')" >&2
  exit 2
}
check_coverage

# The GPUs: CUDA_VISIBLE_DEVICES where set, else every one nvidia-smi lists (GPU_COUNT for --plan).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
else
  count=${GPU_COUNT:-$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')}
  [ "$PLAN" = 1 ] && [ "$count" -eq 0 ] && count=1
  mapfile -t gpus < <(seq 0 $((count - 1)))
fi
[ ${#gpus[@]} -gt 0 ] || { echo "error: no NVIDIA GPU here (nvidia-smi lists none)" >&2; exit 2; }
side=()
multi=0
bench=0
for part in "${parts[@]}"; do
  case $part in
    multi-gpu) multi=1 ;;
    bench) bench=1 ;;
    *) side+=("$part") ;;
  esac
done
# bench after the parts named before it in its lane (the GPU to itself, where the lane has one).
[ $bench = 1 ] && side+=(bench)
lanes=$((${#side[@]} < ${#gpus[@]} ? ${#side[@]} : ${#gpus[@]}))
cpus=$(nproc)
lane_parts() { local i; for i in "${!side[@]}"; do [ $((i % lanes)) -eq "$1" ] && echo "${side[$i]}"; done; }
lane_cpus() {  # a lane's share of the CPUs; all of them where there are fewer CPUs than lanes
  if [ "$cpus" -lt "$lanes" ]; then echo "0-$((cpus - 1))"; else echo "$(($1 * cpus / lanes))-$((($1 + 1) * cpus / lanes - 1))"; fi
}

# What runs where: every process with its cap; summary.py reads it back to name what did not run.
print_plan() {
  local saved_plan=$PLAN i part
  PLAN=1
  echo "$(test_files | wc -l) test files, $(suite_files | wc -l) of them in the suite's pool; ${#gpus[@]} GPU(s)"
  for ((i = 0; i < lanes; i++)); do
    echo "== GPU ${gpus[$i]}, CPUs $(lane_cpus "$i"): $(lane_parts "$i" | paste -sd' ')"
    for part in $(lane_parts "$i"); do "part_${part//-/_}"; done
  done
  if [ $multi = 1 ]; then
    echo "== then on every GPU"
    part_multi_gpu
  fi
  PLAN=$saved_plan
}
if [ "$PLAN" = 1 ]; then
  print_plan
  exit 0
fi
print_plan > "$L/plan.txt"

python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" \
  || { echo "error: torch sees no CUDA GPU here; these checks need one" >&2; exit 2; }
DEST=${OUT:-gpu-logs}
mkdir -p "$DEST"
# The benchmarks write their records into the archive's records/, never into this tree, whose records the
# suite's records test compares with docs/performance.md while a lane benchmarks beside it:
# scripts/gpu/take-records.sh adds them to the checkout's.
mkdir -p "$L/records"
finish() {
  [ ${#lane_pids[@]} -gt 0 ] && kill "${lane_pids[@]}" 2> /dev/null  # no lane starts another process
  stop_groups
  python3 scripts/gpu/summary.py "$L" | tee "$L/summary.txt" "$DEST/gpu_all-$name-summary.txt"
  local status=${PIPESTATUS[0]}
  rm -rf "$TMP_BASE"
  tar czf "$DEST/gpu_all-$name.tgz" --exclude=covered.txt -C "$L" . && echo "logs: $DEST/gpu_all-$name.tgz" \
    && rm -rf "$L"
  return "$status"
}
lane_pids=()
trap 'finish; exit $?' EXIT

gpu_site || exit 1
if [ "${GPU_BUILT:-0}" = 1 ] && python3 -c "import torch_fl" 2> /dev/null; then
  echo "== [$SECONDS s] built already (GPU_BUILT=1)"
else
  echo "== [$SECONDS s] build"
  gpu_build "$L" || exit 1
fi
export GPU_SKIP_INSTALL=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for ((i = 0; i < lanes; i++)); do
  mapfile -t mine < <(lane_parts "$i")
  echo "== [$SECONDS s] GPU ${gpus[$i]}, CPUs $(lane_cpus "$i"): ${mine[*]}"
  (
    export CUDA_VISIBLE_DEVICES=${gpus[$i]}
    [ "$lanes" -gt 1 ] && command -v taskset > /dev/null && taskset -pc "$(lane_cpus "$i")" $BASHPID > /dev/null
    for part in "${mine[@]}"; do "part_${part//-/_}"; done
  ) &
  lane_pids+=($!)
done
wait
if [ $multi = 1 ]; then
  echo "== [$SECONDS s] multi-gpu on ${#gpus[@]} GPU(s)"
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${gpus[*]}") part_multi_gpu
fi
echo "== [$SECONDS s] done"
