#!/usr/bin/env bash
# On the GPU machine: the PyTorch tracker's native and Python recording paths give the same
# verdicts on code racecheck did not write, through `racecheck run --detect --no-perturb` with
# RACECHECK_DETECT_PATH set to each path in turn: the examples in examples/ (bench/foreign_code.py,
# mode detect; examples/compiled through bench/modern_code.py, whose detect mode runs both paths
# itself) and the soundness check's generated programs (foreign_code.py's mode soundness); and the
# native path once more with the Python engine (RACECHECK_DETECT_ENGINE=python, the reference of
# the native engine).
# The catalogue's detector is the runtime observer (racecheck.detect.observer.RaceDetector), which
# the tracker's path does not reach: its scenarios run once, with RACECHECK_DETECT_ENGINE=compare
# (engine.py and the native engine fed every event, a test failing where their reports differ),
# into $OUT/paths/catalogue-compare (PATHS_CATALOGUE=0 skips it).
# bench/paths_compare.py then compares them trial by trial: the paths into $OUT/paths/compare.md,
# the engines into $OUT/paths/compare_engines.md (examples/compiled's: compare_engines_compiled.md);
# the exit code is 1 where any differs.
#   bash bench/paths_gpu.sh   (PATHS_TRIALS trials per arm, default 2; PATHS_SUITES and PATHS_MODES
#                              pick foreign_code.py's --suites and --modes, PATHS_COMPILED=0 skips
#                              examples/compiled, PATHS_CATALOGUE=0 the catalogue, PATHS_VARIANTS
#                              some of native, python and native-pyengine, to split the work over
#                              device calls)
# The wheels the machine lacks travel in .whl/ (bench/foreign_code.sh's header: megatron-fsdp too).
# Regenerates reports/gpu/paths_compare.{md,log}, which the README cites.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-$PWD/paths-out}
P=$OUT/paths
mkdir -p "$P"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$P/install.log" || exit 3
export PATH=/tmp/site/bin:$PATH RACECHECK_NATIVE_CACHE=${RACECHECK_NATIVE_CACHE:-/tmp/racecheck-native}
trials=${PATHS_TRIALS:-2}
for variant in ${PATHS_VARIANTS:-native python native-pyengine}; do
  start=$SECONDS
  path=${variant%-pyengine}
  engine=native
  [ "$variant" = native-pyengine ] && engine=python
  export RACECHECK_DETECT_PATH=$path RACECHECK_DETECT_ENGINE=$engine
  # examples/compiled: modern_code.py runs both paths itself (its table has a row per path), so it
  # runs with each engine, into a folder of its own
  [ "${PATHS_COMPILED:-1}" = 0 ] || [ "$variant" = python ] ||
    python3 bench/modern_code.py --out "$P/compiled/$variant" --modes detect --trials "$trials" \
      --report "$P/compiled/$variant" --jobs 4 --max-seconds "${PATHS_EXAMPLE_SECONDS:-150}" \
      >"$P/$variant-compiled.log" 2>&1
  python3 bench/foreign_code.py --out "$P/$variant/examples" \
    --suites "${PATHS_SUITES:-megatron_fsdp,fsdp2,plain_torch}" --modes "${PATHS_MODES:-detect,soundness}" \
    --trials "$trials" --report "$P/$variant/examples" --max-seconds "${PATHS_EXAMPLE_SECONDS:-150}" \
    >"$P/$variant-examples.log" 2>&1
  echo "$variant: $((SECONDS - start)) s" >>"$P/times.log"
done
unset RACECHECK_DETECT_PATH RACECHECK_DETECT_ENGINE
rc=0
if [ "${PATHS_CATALOGUE:-1}" != 0 ]; then
  RACECHECK_DETECT_ENGINE=compare racecheck run --scenario all --arms all --trials "$trials" --detect --no-perturb \
    --out "$P/catalogue-compare" -q >"$P/catalogue-compare.log" 2>&1 || rc=1
  grep -q EnginesDisagree "$P/catalogue-compare/trials.jsonl" && rc=1
fi
if [ -d "$P/python" ]; then python3 bench/paths_compare.py "$P/native" "$P/python" --out "$P/compare.md" || rc=1; fi
if [ -d "$P/native-pyengine" ]; then
  python3 bench/paths_compare.py "$P/native" "$P/native-pyengine" --out "$P/compare_engines.md" || rc=1
fi
if [ -d "$P/compiled/native" ] && [ -d "$P/compiled/native-pyengine" ]; then
  python3 bench/paths_compare.py "$P/compiled/native" "$P/compiled/native-pyengine" \
    --out "$P/compare_engines_compiled.md" || rc=1
fi
exit "$rc"
