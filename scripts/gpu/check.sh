#!/usr/bin/env bash
# Run on the lent GPU machine (see scripts/gpu/README.md): a fresh build against its torch, then the chosen
# stages, each with its own time limit, logs under $OUT (or ./gpu-logs).
#
#   scripts/gpu/check.sh [stage...]     stages: build ctest cuda sim opinfo bench models dist (default: all),
#                                       semantics (opt-in: the PyTorch-semantics tests against cuda alone)
#
# Wheels the machine lacks (expecttest, FlagGems; scripts/gpu/wheels.sh downloads them into .whl/) are
# installed into /tmp/site first when .whl/ is there.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build ctest cuda sim opinfo bench models dist)
want() { [[ " ${stages[*]} " == *" $1 "* ]]; }

# GPU_SKIP_INSTALL=1: another run installed them already (concurrent installs into one --target clash).
if [ "${GPU_SKIP_INSTALL:-0}" = 1 ]; then
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
elif compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"

if want build || [ ! -d build ]; then
  rm -rf build
  ( time python3 -m pip install -q --no-build-isolation --no-deps -e . ) > "$LOGS/build.log" 2>&1
  status=$?
  tail -4 "$LOGS/build.log"
  [ $status -eq 0 ] || { echo "build failed"; exit 1; }
fi
python3 -m torch_fl | tee "$LOGS/report.log"

if want ctest; then
  echo "== HAL conformance (ctest)"
  ( cmake -S tests/cpp/standalone -B build/hal-tests -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    cmake --build build/hal-tests > /dev/null &&
    timeout 120 ctest --test-dir build/hal-tests 2>&1 ) | tee "$LOGS/ctest.log" | grep -E "tests passed|Failed|\*\*\*"
fi
if want cuda; then
  # CUDA_SUITE_SHARDS=N: the test files in N pytest processes at once (round robin), each with the limit.
  # CUDA_SUITE_SKIP=<file name>: one more file left out (all.sh verify leaves test_compile.py to its compile
  # mode, which runs it alone: beside the rest it does not fit one call).
  shards=${CUDA_SUITE_SHARDS:-1}
  echo "== pytest, cuda accelerator (auto), $shards process(es)${CUDA_SUITE_SKIP:+, without $CUDA_SUITE_SKIP}"
  files=$(ls tests/test_*.py tests/conformance/test_*.py \
    | grep -v -e test_opinfo.py -e test_flaggems_gpu.py ${CUDA_SUITE_SKIP:+-e "$CUDA_SUITE_SKIP"})
  for k in $(seq 0 $((shards - 1))); do
    mine=$(echo "$files" | awk -v k="$k" -v n="$shards" '(NR - 1) % n == k')
    timeout ${CUDA_SUITE_TIMEOUT:-330} python3 -m pytest $mine -q -p no:cacheprovider --durations=5 \
      > "$LOGS/pytest-cuda-$k.log" 2>&1 &
  done
  wait
  cat "$LOGS"/pytest-cuda-*.log > "$LOGS/pytest-cuda.log" && rm -f "$LOGS"/pytest-cuda-*.log
  grep -E "^(FAILED|ERROR)|Timeout|passed|failed" "$LOGS/pytest-cuda.log" | tail -40
fi
if want semantics; then
  # Part of the cuda stage too; alone it takes about a minute. The CPU-reference cases skip when backed.
  echo "== PyTorch semantics against cuda: deterministic mode, overlap, sparse, quantized, cuDNN choices"
  timeout ${SEMANTICS_TIMEOUT:-300} python3 -m pytest tests/test_semantics_cuda.py tests/test_native_choices.py \
    tests/test_sparse.py tests/test_quantized.py tests/test_deterministic.py tests/test_overlap.py \
    -q -p no:cacheprovider -rxX 2>&1 | tee "$LOGS/semantics.log" | tail -25
fi
if want sim; then
  echo "== pytest, simulated accelerator (GPU hidden from torch, as on CI)"
  CUDA_VISIBLE_DEVICES= FLAGOS_ACCELERATOR=sim timeout 300 python3 -m pytest tests -q -p no:cacheprovider \
    --deselect tests/test_opinfo.py 2>&1 | tee "$LOGS/pytest-sim.log" | tail -15
fi
if want opinfo; then
  echo "== OpInfo: flagos (cuda) against cuda, bitwise, in ${OPINFO_SHARDS:=6} parallel shards"
  for k in $(seq 0 $((OPINFO_SHARDS - 1))); do
    timeout ${OPINFO_TIMEOUT:-400} python3 -m harness.opinfo --device-ref cuda --exact \
      --dtypes float32,float64,bfloat16,int64,bool --shard "$k/$OPINFO_SHARDS" \
      --out "$LOGS/opinfo-cuda-$k.json" > "$LOGS/opinfo-cuda-$k.log" 2>&1 &
  done
  wait
  python3 -m harness.opinfo --merge "$LOGS"/opinfo-cuda-*.json --out "$LOGS/opinfo-cuda.json" \
    2>&1 | tee "$LOGS/opinfo-cuda.log" | tail -40
  rm -f "$LOGS"/opinfo-cuda-*.json "$LOGS"/opinfo-cuda-*.log
fi
if want bench; then
  echo "== benchmarks"
  timeout 120 python3 -m benchmarks.op_overhead --repeats 9 2>&1 | tee "$LOGS/op_overhead.log"
  timeout 120 python3 -m benchmarks.transfers 2>&1 | tee "$LOGS/transfers.log"
fi
if want models; then
  echo "== Qwen3 at the 0.6B shape (bf16) on flagos (cuda route) against cuda"
  FLAGOS_QWEN3_SHAPE=0.6b timeout 300 python3 -m pytest tests/models -q -p no:cacheprovider \
    --ignore=tests/models/test_qwen3_compile.py 2>&1 \
    | tee "$LOGS/pytest-models.log" | tail -15
  timeout 150 python3 -m examples.qwen3_demo 2>&1 | tee "$LOGS/demo.log" | tail -25
  timeout 240 python3 -m benchmarks.qwen3 --repeats 3 2>&1 | tee "$LOGS/qwen3.log" | tail -25
fi
if want dist; then
  # The flagos c10d backend on NCCL: the multi-process scenarios with one process per GPU (world size 1,
  # and every visible GPU where there are two or more), then the torchrun example at the 0.6B shape.
  echo "== distributed: the flagos backend on NCCL (docs/distributed.md)"
  timeout 420 python3 -m pytest tests/distributed/test_nccl_gpu.py -q -p no:cacheprovider -rs --durations=6 2>&1 \
    | tee "$LOGS/dist-nccl.log" | grep -E "^(FAILED|ERROR|SKIPPED)|^E   |passed|failed" | head -30
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  for strategy in ddp fsdp2; do
    echo "-- torchrun --nproc-per-node $gpus -m examples.train_qwen3_distributed --strategy $strategy"
    timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
      -m examples.train_qwen3_distributed --strategy "$strategy" --steps 5 2>&1 \
      | tee "$LOGS/dist-example-$strategy.log" | grep -E "ranks:|^step|Error|error" | head -12
  done
fi
