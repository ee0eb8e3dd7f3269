#!/usr/bin/env bash
# The GPU run, in stages that each fit one device command (10 min) with room to spare. Run them back
# to back from the repo root on the GPU machine (it goes cold 30 s after a command returns):
#   bash .ci/gpu/run.sh focus      JIT build (timed) + the tests of .ci/gpu/focus.txt (last run's failures)
#   bash .ci/gpu/run.sh test       JIT build (timed) + every CUDA test, FASTOPS_TEST_LARGE=1
#   bash .ci/gpu/run.sh sanitize   compute-sanitizer memcheck (caching allocator off), racecheck, synccheck
#   bash .ci/gpu/run.sh bench      every benchmark with --device cuda
#   bash .ci/gpu/run.sh profile    Nsight Compute on the kernels that miss their targets (ours and eager's)
#   bash .ci/gpu/run.sh models     timm models swapped vs stock: outputs, gradients, 50 training steps
#   bash .ci/gpu/run.sh train      training-step benchmark: fastops convnet + timm models, bf16, channels_last
#   bash .ci/gpu/run.sh all        focus, test, bench, profile, sanitize, train, models: one command, ALL_BUDGET s (540)
# Each stage writes its logs and result files into $OUT/<stage>.tar.gz (OUT defaults to ./gpu-out).
# The JIT build lands in ./.gpu-build (git-ignored); carrying that folder to the next machine skips
# the rebuild. Extra arguments after the stage go to pytest (test/sanitize) or to each benchmark.
# A stage's cap interrupts pytest with SIGINT, so its summary of failures and its junit file are
# still written; every test is logged by name (-v), so a crash names the test it happened in.
set -uo pipefail
stage=${1:-}
[[ $stage =~ ^(focus|test|sanitize|bench|profile|models|train|all)$ ]] || { sed -n 2,16p "$0"; exit 2; }
shift
cd "$(dirname "$0")/../.."

if [[ $stage == all ]]; then
  # One device command for a short lease (a session gets 15 minutes of device time, the machine's
  # start included, and one command may run 10; on 2026-11-27 the start and transfers took ~30 s and
  # the cold JIT build 74 s): the stages in order of what a run must show first, each capped at its
  # share of ALL_BUDGET and at what is left of it; a stage that no longer fits says so and is
  # skipped. Each stage packs its own $OUT/<stage>.tar.gz: 7 files, and a tee'd log makes the 8 that
  # come back.
  # The first stage pays for the build. Leave ~250 s of the lease for one follow-up command on the
  # still-warm machine (it goes cold 30 s after a command returns).
  budget=${ALL_BUDGET:-540} start=$SECONDS
  fits() {  # fits <stage> <seconds>: sets $secs to min(seconds, budget left) or returns 1
    local left=$((budget - (SECONDS - start) - 10))
    secs=$(($2 < left ? $2 : left))
    ((secs >= 30)) || { echo "== $1: skipped, $left s of the $budget s budget left"; return 1; }
    echo "== $1 (up to $secs s, $((SECONDS - start)) s into the budget)"
  }
  fits focus 200 && FOCUS_TIMEOUT=$secs bash "$0" focus
  fits test 110 && TEST_TIMEOUT=$secs bash "$0" test
  fits bench 90 && BENCH_BUDGET=$secs bash "$0" bench --quick --no-compile
  fits profile 50 && PROFILE_TIMEOUT=$secs bash "$0" profile
  fits sanitize 50 && SAN_TOOLS="memcheck racecheck" SAN_TIMEOUT=$((secs / 2)) bash "$0" sanitize
  fits train 50 && TRAIN_TIMEOUT=$secs bash "$0" train --no-compile
  fits models 40 && MODELS_TIMEOUT=$secs bash "$0" models
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
timeout ${BUILD_TIMEOUT:-420} $PY -m fastops.info >>"$work/env.txt" 2>"$work/build.log" || { echo "build failed"; tail -n 60 "$work/build.log"; exit 1; }
echo "JIT build + load: $((SECONDS - t0)) s" | tee -a "$work/env.txt"
# cap <seconds> <command...>: SIGINT at the cap (pytest then prints its summary and writes junit), KILL 20 s later.
cap() { local secs=$1; shift; timeout -s INT -k 20 "$secs" "$@"; }
# What is left of a stage's cap once the build is done (the caps of `all` include the build).
after_build() { local left=$(($1 - (SECONDS - t0))); echo $((left > 30 ? left : 30)); }
PYTEST=(-p no:cacheprovider -v --tb=short -rfEs)

case $stage in
focus)
  # The tests named in .ci/gpu/focus.txt, one run per line "<tool> <pytest node id>...", tool = plain,
  # memcheck or racecheck (# comments): what the last GPU run saw fail, run first and alone, with
  # long tracebacks; a crash under plain also gets a native backtrace when gdb is on the image.
  left=$(after_build ${FOCUS_TIMEOUT:-300})
  preload=$work/crash_backtrace.so
  gcc -shared -fPIC -O1 -o "$preload" .ci/gpu/crash_backtrace.c 2>>"$work/build.log" || preload=
  symbolize() {  # the frames crash_backtrace.so printed as object(+0xoffset), named by addr2line
    $PY - "$1" <<'PYEOF'
import re, subprocess, sys
lines = open(sys.argv[1], errors="replace").read().split("== native backtrace (crash_backtrace.so) ==")[-1]
print("== the native backtrace, symbolized")
for line in lines.splitlines():
    m = re.match(r"(/\S+?)\(([^)+]*)\+(0x[0-9a-f]+)\)", line.strip())
    if not m:
        continue
    obj, sym, off = m.groups()
    if sym:
        name = subprocess.run(["c++filt", sym], capture_output=True, text=True).stdout.strip()
    else:
        out = subprocess.run(["addr2line", "-Cf", "-e", obj, off], capture_output=True, text=True).stdout
        name = out.splitlines()[0] if out else "?"
    print(f"  {obj.rsplit('/', 1)[-1]} +{off}: {name[:300]}")
PYEOF
  }
  mapfile -t lines < <(grep -vE '^\s*(#|$)' .ci/gpu/focus.txt 2>/dev/null)
  # Each line gets an equal share of what the lines before it left (a quick one leaves its time on).
  focus_start=$SECONDS
  k=0
  for line in "${lines[@]}"; do
    per=$(((left - (SECONDS - focus_start)) / (${#lines[@]} - k)))
    ((per >= 10)) || { echo "focus $((k + 1)): skipped, the stage's time is spent"; k=$((k + 1)); continue; }
    read -ra words <<<"$line"
    tool=${words[0]} nodes=("${words[@]:1}")
    # -n (pytest-xdist) where the image has it; else the tests run in one process.
    if ! $PY -c "import xdist" 2>/dev/null; then
      kept=()
      for w in "${nodes[@]}"; do [[ $w == -n* ]] || kept+=("$w"); done
      nodes=("${kept[@]}")
    fi
    k=$((k + 1)) log="$work/focus$k.$tool.log"
    echo "== $tool ${nodes[*]}" >"$log"
    case $tool in
    plain)
      # A crash prints its native stack too: gdb where the image has it, else crash_backtrace.so.
      LD_PRELOAD=$preload cap $per $PY -X faulthandler -m pytest "${nodes[@]}" "${PYTEST[@]}" --tb=long >>"$log" 2>&1
      rc=$?
      if ((rc > 128)) && command -v gdb >/dev/null; then
        cap $per gdb -q -batch -ex run -ex bt --args $PY -m pytest "${nodes[@]}" -p no:cacheprovider -q >>"$log" 2>&1
      elif ((rc > 128)) && [[ -n $preload ]]; then
        symbolize "$log" >>"$log"
      fi ;;
    memcheck|racecheck)
      extra=(--kernel-name kns=fastops)
      [[ $tool == memcheck ]] && extra+=(--leak-check no)
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 cap $per "$CUDA_HOME/bin/compute-sanitizer" --tool $tool "${extra[@]}" \
        --print-limit 20 $PY -X faulthandler -m pytest "${nodes[@]}" "${PYTEST[@]}" --tb=long >>"$log" 2>&1
      rc=$? ;;
    *) echo "focus.txt: unknown tool '$tool'" >>"$log"; rc=2 ;;
    esac
    echo "focus $k ($tool): rc=$rc ${nodes[*]}"; grep -E "(PASSED|FAILED|ERROR|SUMMARY|Fatal|Error)" "$log" | head -n 8
  done
  ;;
test)
  # tests/ops last: the runs of 2026-11-27 got through it (to squeeze_excite's opcheck) and no further
  # in their 140 s. The tests of focus.txt ran in the focus stage: left out here, so a known crash
  # does not end the run.
  known=()
  while read -ra words; do
    for node in "${words[@]:1}"; do [[ $node == -* ]] || known+=(--deselect "$node"); done
  done < <(grep -vE '^\s*(#|$)' .ci/gpu/focus.txt 2>/dev/null)
  FASTOPS_TEST_LARGE=1 cap $(after_build ${TEST_TIMEOUT:-480}) $PY -m pytest ${TEST_PATHS:-tests/optim tests/nn tests/train tests/test_*.py tests/ops} \
    -k cuda "${known[@]}" "${PYTEST[@]}" "$@" --junitxml="$work/junit.xml" >"$work/tests.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$work/tests.log" | tail -n 40
  ;;
sanitize)
  # Only our kernels are instrumented (--kernel-name kns=fastops: every kernel of ours lives in
  # namespace fastops): on 2026-11-24 memcheck over every kernel, torch's included, got through 56
  # tests in 170 s. racecheck and synccheck only need the kernels with shared memory and barriers
  # (depthwise weight gradient, bias_gelu's bias gradient, squeeze_excite's reductions, the Adam launches).
  SAN="$CUDA_HOME/bin/compute-sanitizer"
  base="cuda and not compile and not opcheck and not large"
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    # The tests focus.txt lists for this tool ran in the focus stage: leave them out here, so a known
    # crash does not end the tool's run over everything else.
    known=()
    while read -ra words; do
      [[ ${words[0]} == "$tool" ]] && for node in "${words[@]:1}"; do [[ $node == -* ]] || known+=(--deselect "$node"); done
    done < <(grep -vE '^\s*(#|$)' .ci/gpu/focus.txt 2>/dev/null)
    sel=$base extra=(--kernel-name kns=${SAN_KERNELS:-fastops})
    [[ $tool == memcheck ]] && extra+=(--leak-check no)
    [[ $tool != memcheck ]] && sel="$base and (backward_weight or bias_gelu or squeeze or adam or amsgrad)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 cap ${SAN_TIMEOUT:-170} "$SAN" --tool $tool "${extra[@]}" --error-exitcode 1 \
      --log-file "$work/$tool.log" $PY -X faulthandler -m pytest tests/ops tests/optim -x -k "$sel" "${known[@]}" "${PYTEST[@]}" "$@" \
      >"$work/$tool.pytest.log" 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|HAZARD|SUMMARY' "$work/$tool.log" | tail -n 1) $(grep -cE ' PASSED' "$work/$tool.pytest.log") passed; last: $(grep -E '::' "$work/$tool.pytest.log" | tail -n 1 | cut -c1-160)"
  done
  ;;
bench)
  # depthwise_separable_conv2d has no CUDA kernel (CPU only): its benchmark refuses --device cuda.
  # fused_adam twice: fp32 and bf16 params (the issue's targets name both). host_overhead first: a
  # few seconds, and what every small call costs on this host. depthwise_conv2d:cl is the
  # channels_last half, bf16 first (the NCHW CUDA path of the module is cuDNN). Each benchmark gets
  # BENCH_TIMEOUT s, or with BENCH_BUDGET an equal share of what the ones before it left.
  # Each run writes <op>/<run>.csv here: copy those into benchmarks/results/data/<op>/ and render
  # (python -m benchmarks.render_readme). Without .git, pass FASTOPS_GIT_SHA=<sha>[+dirty] along.
  benches=(${FASTOPS_BENCHES:-host_overhead gelu clipped_log depthwise_conv2d:cl squeeze_excite fused_adam fused_adam:bf16 batch_norm})
  bench_start=$SECONDS
  for k in "${!benches[@]}"; do
    bench=${benches[$k]} name=${bench%%:*} variant=() log=bench_${bench/:/_}
    [[ $bench == fused_adam:bf16 ]] && variant=(--dtype bfloat16 --tag bf16)
    [[ $bench == depthwise_conv2d:cl ]] && variant=(--layouts channels_last --dtypes bfloat16,float32 --tag cl)
    secs=${BENCH_TIMEOUT:-130}
    if [[ -n ${BENCH_BUDGET:-} ]]; then
      secs=$(((BENCH_BUDGET - (SECONDS - bench_start)) / (${#benches[@]} - k)))
      ((secs >= 10)) || { echo "$log: skipped, the bench budget is spent"; continue; }
    fi
    cap $secs $PY -m "benchmarks.bench_$name" --device cuda --out "$work" --min-time 0.3 "${variant[@]}" "$@" >"$work/$log.log" 2>&1
    echo "$log: rc=$?"; tail -n 25 "$work/$log.log"
  done
  ;;
profile)
  # Nsight Compute over benchmarks/profile_cuda_kernels.py: the kernels that miss their targets, each once
  # (ours, then eager's for the same work), after a warm-up outside the profiled range. Per kernel:
  # speed of light (DRAM and SM throughput, % of peak), occupancy, launch statistics, L1/L2 traffic and
  # hit rates, scheduler and warp-state statistics. The report and its table (csv) come back.
  NCU=$(command -v ncu || ls "$CUDA_HOME"/bin/ncu /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
  [[ -n $NCU ]] || { echo "profile: ncu not found on this image"; exit 0; }
  cap $(after_build ${PROFILE_TIMEOUT:-300}) "$NCU" --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    -o "$work/kernels" -f $PY -m benchmarks.profile_cuda_kernels "$@" >"$work/profile.log" 2>&1
  echo "profile rc=$?"; tail -n 12 "$work/profile.log"
  [[ -f $work/kernels.ncu-rep ]] && "$NCU" --import "$work/kernels.ncu-rep" --csv --page details >"$work/kernels.csv" 2>&1
  [[ -f $work/kernels.csv ]] && grep -E '"(Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread)"' "$work/kernels.csv" | cut -c1-220 | head -n 60
  ;;
models)
  cap ${MODELS_TIMEOUT:-300} $PY -m pytest tests/models "${PYTEST[@]}" "$@" >"$work/models.log" 2>&1
  echo "models rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$work/models.log" | tail -n 30
  ;;
train)
  # convnext_atto second: its GELU MLPs run our bias GELU in training since the H200 run of 2026-11-27
  # (mobilenetv3_large_100 was measured then, last here).
  cap ${TRAIN_TIMEOUT:-300} $PY -m benchmarks.bench_train --device cuda --out "$work" --amp bf16 --quick \
    --config synthetic224 convnext_atto efficientnet_b0 mobilenetv3_large_100 "$@" >"$work/bench_train.log" 2>&1
  echo "bench_train rc=$?"; tail -n 30 "$work/bench_train.log"
  ;;
esac
