#!/usr/bin/env bash
# On the GPU machine: the PyTorch tracker's native and Python recording paths give the same
# verdicts on code racecheck did not write, through `racecheck run --detect --no-perturb` with
# RACECHECK_DETECT_PATH set to each path in turn: the catalogue (every scenario that runs on the
# GPUs there are), the examples in examples/ and the soundness check's generated programs
# (bench/foreign_code.py, modes detect and soundness); and the native path once more with the
# Python engine (RACECHECK_DETECT_ENGINE=python, the reference of the native engine).
# bench/paths_compare.py then compares them trial by trial: the paths into $OUT/paths/compare.md,
# the engines into $OUT/paths/compare_engines.md; the exit code is 1 where either differs.
#   bash bench/paths_gpu.sh   (PATHS_TRIALS trials per arm, default 2; PATHS_SUITES and PATHS_MODES
#                              pick foreign_code.py's --suites and --modes, PATHS_CATALOGUE=0 skips
#                              the catalogue, PATHS_VARIANTS some of native, python and
#                              native-pyengine, to split the work over device calls)
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
  [ "${PATHS_CATALOGUE:-1}" = 0 ] ||
    racecheck run --scenario all --arms all --trials "$trials" \
      --detect --no-perturb --out "$P/$variant/catalogue" -q >"$P/$variant-catalogue.log" 2>&1
  python3 bench/foreign_code.py --out "$P/$variant/examples" \
    --suites "${PATHS_SUITES:-megatron_fsdp,fsdp2,plain_torch}" --modes "${PATHS_MODES:-detect,soundness}" \
    --trials "$trials" --report "$P/$variant/examples" --max-seconds "${PATHS_EXAMPLE_SECONDS:-150}" \
    >"$P/$variant-examples.log" 2>&1
  echo "$variant: $((SECONDS - start)) s" >>"$P/times.log"
done
unset RACECHECK_DETECT_PATH RACECHECK_DETECT_ENGINE
rc=0
if [ -d "$P/python" ]; then python3 bench/paths_compare.py "$P/native" "$P/python" --out "$P/compare.md" || rc=1; fi
if [ -d "$P/native-pyengine" ]; then
  python3 bench/paths_compare.py "$P/native" "$P/native-pyengine" --out "$P/compare_engines.md" || rc=1
fi
exit "$rc"
