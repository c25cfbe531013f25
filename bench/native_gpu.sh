#!/usr/bin/env bash
# On the GPU machine: the PyTorch tracker's native recording path (racecheck/detect/op_log.cpp)
# beside its Python path, results under $OUT/native:
#   build    compile the native log against the machine's torch (build.log: compiler, time)
#   tests    the tracker's CUDA tests and its CPU-driven tests, once per path (tests_<path>.log)
#   compare  bench/sanitizer_compare.py once per path (COMPARE_PATHS), the diff of the race's reports
#   bench    bench/detector_overhead_native.py (NATIVE_WORKLOADS, NATIVE_MODES, NATIVE_REPEATS,
#            NATIVE_WARMUP_ROUNDS, NATIVE_ITERS, NATIVE_FSDP2_ITERS, NATIVE_CPUS: pin every run to
#            these CPUs): detector_overhead_native.{csv,md}
#            and every run;
#            NATIVE_PROFILE=1: each run under cProfile too (profile-WORKLOAD-MODE.txt; times incomparable)
#   record   bench/native_replay.py record per workload: the drains of a run, to replay on any
#            machine (WORKLOAD.dump, record.log)
#   bash bench/native_gpu.sh [PART ...]   (default: every part, in this order)
# ninja, which torch.utils.cpp_extension needs, travels in .whl/ with the other wheels
# (bench/gpu_check.sh's header).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/native-out}
N=$OUT/native
mkdir -p "$N"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$N/install.log" || exit 3
export PATH=/tmp/site/bin:$PATH RACECHECK_NATIVE_CACHE=${RACECHECK_NATIVE_CACHE:-/tmp/racecheck-native}
parts=("$@")
[ $# -gt 0 ] || parts=(build tests compare bench)

build() {
  {
    g++ --version | head -1
    python3 -c 'import torch; print("torch", torch.__version__)'
    local start=$SECONDS
    python3 -c "from racecheck.detect import op_log; print(op_log.build())"
    echo "build: $((SECONDS - start)) s wall"
  } >"$N/build.log" 2>&1
}

tests() {
  local p
  for p in native python; do
    RACECHECK_DETECT_PATH=$p python3 -m pytest -q -p no:cacheprovider tests/test_detect_cuda.py \
      tests/test_detect_torch_tracker.py >"$N/tests_$p.log" 2>&1
  done
}

compare() {
  local p
  for p in ${COMPARE_PATHS:-native python}; do
    RACECHECK_DETECT_PATH=$p python3 bench/sanitizer_compare.py --out "$N/compare_$p" >"$N/compare_$p.log" 2>&1
  done
  if [ -d "$N/compare_python" ]; then
    diff "$N/compare_python/racecheck_report_race.txt" "$N/compare_native/racecheck_report_race.txt" >"$N/compare_diff.txt" 2>&1
    echo "diff exit $?" >>"$N/compare_diff.txt"
  fi
}

bench() {
  local modes=plain,native,python,sanitizer,native_hooks,native_record,native_nostacks,dispatch_floor,python_nostacks
  python3 bench/detector_overhead_native.py --out "$N" --repeats "${NATIVE_REPEATS:-3}" \
    --warmup-rounds "${NATIVE_WARMUP_ROUNDS:-1}" --iters "${NATIVE_ITERS:-200}" \
    --fsdp2-iters "${NATIVE_FSDP2_ITERS:-50}" --workloads "${NATIVE_WORKLOADS:-mlp,fsdp2}" \
    --modes "${NATIVE_MODES:-$modes}" ${NATIVE_CPUS:+--cpus "$NATIVE_CPUS"} ${NATIVE_PROFILE:+--profile "$N"} \
    >"$N/bench.log" 2>&1
}

record() {
  local w NATIVE_WORKLOADS=${NATIVE_WORKLOADS:-mlp,fsdp2}
  for w in ${NATIVE_WORKLOADS//,/ }; do
    python3 bench/native_replay.py record --workload "$w" --out "$N/$w.dump" >>"$N/record.log" 2>&1 || return 1
  done
}

rc=0
for part in "${parts[@]}"; do
  echo "== $part $(date +%T)" >>"$N/parts.log"
  "$part" || rc=$?
done
echo "== done $(date +%T) rc $rc" >>"$N/parts.log"
exit "$rc"
