#!/usr/bin/env bash
# On the GPU machine, in one call of about nine minutes: the PyTorch tracker's native path (the log,
# op_log.cpp, applied by the native engine, hb_*.cpp) checked and measured; results under $OUT/native:
#   build    compile the extension against the machine's torch (build.log: compiler, time)
#   check    the detector's CUDA tests on the native engine (all but the compiled and Triton kernels'
#            ones, which bench/modern_code.sh runs), among them the comparison of the native
#            and the Python engine on the same records, and the engines' comparison that runs on the
#            CPU too; then the tracker's CUDA tests on the Python engine: both in tests.log, each after
#            a `## RACECHECK_DETECT_ENGINE=...` line (one file, as the device brings back 8 a call)
#   bench    bench/detector_overhead_native.py, fresh processes, unpinned, every mode interleaved:
#            detector_overhead_native.{csv,md}, detector_overhead_native_runs.csv, bench.log.
#            NATIVE_WORKLOADS (mlp-adamw,fsdp2-adamw,fsdp2-compiled), NATIVE_MODES
#            (plain,native,python,sanitizer), NATIVE_REPEATS (10), NATIVE_WARMUP_ROUNDS (0: the parts
#            before warm the machine; the compiled workload's caches are warmed by one run first),
#            NATIVE_ITERS (100, the MLP's timed steps), NATIVE_FSDP2_ITERS (30), NATIVE_SANITIZER_SCALE
#            (0.25: the sanitizer, about 9x slower, times a quarter of the steps), NATIVE_CPUS (also
#            every mode pinned to these CPUs, a second table); the bench starts no round that would
#            end after NATIVE_BUDGET seconds (530) from the start of this script
#   pinned   bench/pinned_query.py: what asking CUDA whether host memory is pinned costs a query
#            (pinned_query.log); not run by default
#   record   bench/native_replay.py record per workload: the drains of a run, to replay on any
#            machine (WORKLOAD.dump, record.log); not run by default
#   bash bench/native_gpu.sh [PART ...]   (default: build check bench)
# ninja, which torch.utils.cpp_extension needs, travels in .whl/ with the other wheels
# (bench/gpu_check.sh's header).
# Regenerates reports/gpu/detector_overhead_native.{csv,md,log} and its _runs.csv, which the README's
# table is spliced from (several calls' runs merged by --from-runs, their parts.log, build.log and
# bench.log joined under `## call N` lines), and the CUDA tests' log beside them
# (reports/gpu/native_tests_adamw_h100_27rounds.log, from tests.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# The compiled workload compiles in every fresh process: from Inductor's caches after the first,
# in the process itself (no pool of compile workers to start per run).
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1 TORCHINDUCTOR_COMPILE_THREADS=1
OUT=${OUT:-$PWD/native-out}
N=$OUT/native
mkdir -p "$N"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
# The install log stays on the machine (its tail is printed if the install fails): the device
# tool brings back 8 files, and a call of every part writes 8 others.
gpu_install /tmp/racecheck-install.log || exit 3
export PATH=/tmp/site/bin:$PATH RACECHECK_NATIVE_CACHE=${RACECHECK_NATIVE_CACHE:-/tmp/racecheck-native}
parts=("$@")
[ $# -gt 0 ] || parts=(build check bench)

build() {
  {
    g++ --version | head -1
    python3 -c 'import torch; print("torch", torch.__version__)'
    local start=$SECONDS
    python3 -c "from racecheck.detect import op_log; print(op_log.build())"
    echo "build: $((SECONDS - start)) s wall"
  } >"$N/build.log" 2>&1
}

# The native engine's run takes every CUDA test of the detector but the compiled and Triton kernels'
# (each compiles; bench/modern_code.sh runs them), so that a new test of the tracker is taken too.
NATIVE_CHECK="not kernels_below_the_dispatcher"

check() {
  local rc=0
  {
    echo "## RACECHECK_DETECT_ENGINE=native pytest tests/test_detect_cuda.py tests/test_detect_engines.py -k '$NATIVE_CHECK'"
    RACECHECK_DETECT_ENGINE=native python3 -m pytest -q -p no:cacheprovider tests/test_detect_cuda.py \
      tests/test_detect_engines.py -k "$NATIVE_CHECK" 2>&1 || rc=$?
    echo
    echo "## RACECHECK_DETECT_ENGINE=python pytest tests/test_detect_cuda.py -k torch_tracker"
    RACECHECK_DETECT_ENGINE=python python3 -m pytest -q -p no:cacheprovider tests/test_detect_cuda.py \
      -k torch_tracker 2>&1 || rc=$?
  } >"$N/tests.log"
  return $rc
}

bench() {
  local left=$((${NATIVE_BUDGET:-530} - SECONDS))
  python3 bench/detector_overhead_native.py --out "$N" --repeats "${NATIVE_REPEATS:-10}" \
    --warmup-rounds "${NATIVE_WARMUP_ROUNDS:-0}" --iters "${NATIVE_ITERS:-100}" \
    --fsdp2-iters "${NATIVE_FSDP2_ITERS:-30}" --sanitizer-iters-scale "${NATIVE_SANITIZER_SCALE:-0.25}" \
    --workloads "${NATIVE_WORKLOADS:-mlp-adamw,fsdp2-adamw,fsdp2-compiled}" \
    --modes "${NATIVE_MODES:-plain,native,python,sanitizer}" --deadline "$left" \
    ${NATIVE_CPUS:+--cpus "$NATIVE_CPUS"} >"$N/bench.log" 2>&1
}

pinned() {
  python3 bench/pinned_query.py >"$N/pinned_query.log" 2>&1
}

record() {
  local w NATIVE_WORKLOADS=${NATIVE_WORKLOADS:-mlp-adamw,fsdp2-adamw}
  for w in ${NATIVE_WORKLOADS//,/ }; do
    python3 bench/native_replay.py record --workload "$w" --out "$N/$w.dump" >>"$N/record.log" 2>&1 || return 1
  done
}

rc=0
for part in "${parts[@]}"; do
  echo "== $part $(date +%T) (${SECONDS} s)" >>"$N/parts.log"
  "$part" || rc=$?
done
echo "== done $(date +%T) (${SECONDS} s) rc $rc" >>"$N/parts.log"
exit "$rc"
