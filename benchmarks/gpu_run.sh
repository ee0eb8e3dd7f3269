#!/usr/bin/env bash
# One GPU session in one command (the lent GPU machines are costly to start): build by JIT, run the
# whole test suite, the CUDA tests under compute-sanitizer, and the benchmarks; logs and result files
# go to $OUT (default ./gpu-out). Usage, from the repo root on the GPU machine:
#   FASTOPS_GIT_SHA=<sha> bash benchmarks/gpu_run.sh [bench-args...]   e.g. --quick
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export FASTOPS_JIT=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/fastops-ext} PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} | tee "$OUT/env.txt"
$PY -m fastops.info 2>&1 | tee -a "$OUT/env.txt"
$PY -m pytest tests -q -p no:cacheprovider ${FASTOPS_TEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | tail -n 15
# memcheck over the CUDA-side tests (compile and opcheck tests excluded: they mostly exercise the CPU
# compiler and are slow under the sanitizer).
compute-sanitizer --tool memcheck --error-exitcode 1 $PY -m pytest tests/ops tests/optim -q -p no:cacheprovider \
  -k "cuda and not compile and not opcheck" 2>&1 | tail -n 6 | tee "$OUT/sanitizer.log"
for bench in ${FASTOPS_BENCHES:-benchmarks/bench_*.py}; do
  name=$(basename "$bench" .py)
  $PY -m "benchmarks.$name" --device cuda --out "$OUT" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? (log in $name.log)"
done
