#!/usr/bin/env bash
# The GPU run, in stages that each fit one device command (10 min) with room to spare. Run them back
# to back from the repo root on the GPU machine (it goes cold 30 s after a command returns):
#   bash .ci/gpu/run.sh test       JIT build (timed) + every CUDA test, FASTOPS_TEST_LARGE=1
#   bash .ci/gpu/run.sh sanitize   compute-sanitizer memcheck (caching allocator off), racecheck, synccheck
#   bash .ci/gpu/run.sh bench      every benchmark with --device cuda
#   bash .ci/gpu/run.sh models     timm models swapped vs stock: outputs, gradients, 50 training steps
#   bash .ci/gpu/run.sh train      training-step benchmark: fastops convnet + timm models, bf16, channels_last
#   bash .ci/gpu/run.sh all        all five in one command, within ALL_BUDGET seconds (default 480)
# Each stage writes its logs and result files into $OUT/<stage>.tar.gz (OUT defaults to ./gpu-out).
# The JIT build lands in ./.gpu-build (git-ignored); carrying that folder to the next machine skips
# the rebuild. Extra arguments after the stage go to pytest (test/sanitize) or to each benchmark.
set -uo pipefail
stage=${1:-}
[[ $stage =~ ^(test|sanitize|bench|models|train|all)$ ]] || { sed -n 2,12p "$0"; exit 2; }
shift
cd "$(dirname "$0")/../.."

if [[ $stage == all ]]; then
  # One device command for a short lease (a session gets 15 minutes of device time, the machine's
  # start included, and one command may run 10): the stages in order of what a run must show first,
  # each capped at its share of ALL_BUDGET and at what is left of it; a stage that no longer fits
  # says so and is skipped. Each stage packs its own $OUT/<stage>.tar.gz (5 files).
  budget=${ALL_BUDGET:-480} start=$SECONDS
  fits() {  # fits <stage> <seconds>: sets $secs to min(seconds, budget left) or returns 1
    local left=$((budget - (SECONDS - start) - 10))
    secs=$(($2 < left ? $2 : left))
    ((secs >= 30)) || { echo "== $1: skipped, $left s of the $budget s budget left"; return 1; }
    echo "== $1 (up to $secs s, $((SECONDS - start)) s into the budget)"
  }
  fits test 170 && TEST_TIMEOUT=$secs bash "$0" test
  fits models 80 && MODELS_TIMEOUT=$secs bash "$0" models
  fits bench 120 && BENCH_TIMEOUT=$((secs / 5)) bash "$0" bench --quick --no-compile
  fits sanitize 70 && SAN_TOOLS="memcheck racecheck" SAN_TIMEOUT=$((secs / 2)) bash "$0" sanitize
  fits train 60 && TRAIN_TIMEOUT=$secs bash "$0" train --no-compile
  echo "all: $((SECONDS - start)) s"
  exit 0
fi
OUT=${OUT:-$PWD/gpu-out}
work=$(mktemp -d)/$stage
mkdir -p "$OUT" "$work"
export FASTOPS_JIT=1 TORCH_EXTENSIONS_DIR=$PWD/.gpu-build PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PY:-python3}
SHA=${FASTOPS_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
pack() { tar -czf "$OUT/$stage.tar.gz" -C "$(dirname "$work")" "$stage"; }
trap pack EXIT

{
  echo "stage $stage, git $SHA, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$CUDA_HOME/bin/nvcc" --version | tail -n 2
} 2>&1 | tee "$work/env.txt"
t0=$SECONDS
timeout 420 $PY -m fastops.info >>"$work/env.txt" 2>"$work/build.log" || { echo "build failed"; tail -n 60 "$work/build.log"; exit 1; }
echo "JIT build + load: $((SECONDS - t0)) s" | tee -a "$work/env.txt"

case $stage in
test)
  FASTOPS_TEST_LARGE=1 timeout ${TEST_TIMEOUT:-480} $PY -m pytest tests -q -p no:cacheprovider -k cuda -rfE "$@" \
    --junitxml="$work/junit.xml" >"$work/tests.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$work/tests.log" | tail -n 40
  ;;
sanitize)
  # Only our kernels are instrumented (--kernel-name kns=fastops: every kernel of ours lives in
  # namespace fastops): on 2026-11-24 memcheck over every kernel, torch's included, got through 56
  # tests in 170 s. racecheck and synccheck only need the kernels with shared memory and barriers
  # (depthwise weight gradient, bias_gelu's bias gradient, the Adam launches).
  SAN="$CUDA_HOME/bin/compute-sanitizer"
  base="cuda and not compile and not opcheck and not large"
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    sel=$base extra=(--kernel-name kns=${SAN_KERNELS:-fastops})
    [[ $tool == memcheck ]] && extra+=(--leak-check no)
    [[ $tool != memcheck ]] && sel="$base and (backward_weight or bias_gelu or adam or amsgrad)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-170} "$SAN" --tool $tool "${extra[@]}" --error-exitcode 1 \
      --log-file "$work/$tool.log" $PY -m pytest tests/ops tests/optim -q -p no:cacheprovider -x -k "$sel" "$@" \
      >"$work/$tool.pytest.log" 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY' "$work/$tool.log" | tail -n 1) $(tail -n 1 "$work/$tool.pytest.log")"
  done
  ;;
bench)
  # depthwise_separable_conv2d has no CUDA kernel (CPU only): its benchmark refuses --device cuda.
  for bench in ${FASTOPS_BENCHES:-clipped_log gelu fused_adam depthwise_conv2d squeeze_excite}; do
    timeout ${BENCH_TIMEOUT:-130} $PY -m "benchmarks.bench_$bench" --device cuda --out "$work" --min-time 0.3 "$@" >"$work/bench_$bench.log" 2>&1
    echo "bench_$bench: rc=$?"; tail -n 25 "$work/bench_$bench.log"
  done
  ;;
models)
  timeout ${MODELS_TIMEOUT:-300} $PY -m pytest tests/models -q -p no:cacheprovider -rfE "$@" >"$work/models.log" 2>&1
  echo "models rc=$?"; tail -n 30 "$work/models.log"
  ;;
train)
  timeout ${TRAIN_TIMEOUT:-300} $PY -m benchmarks.bench_train --device cuda --out "$work" --amp bf16 --quick \
    --config synthetic224 mobilenetv3_large_100 efficientnet_b0 convnext_atto "$@" >"$work/bench_train.log" 2>&1
  echo "bench_train rc=$?"; tail -n 30 "$work/bench_train.log"
  ;;
esac
