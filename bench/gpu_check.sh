#!/usr/bin/env bash
# On the GPU machine: install racecheck into the machine's Python without touching its torch
# (wheels it lacks, such as pytest-repeat, travel in .whl/), then run bench/gpu_check.py and pack
# every table and log into $OUT/gpu.tar.gz (the device tool returns at most 8 files).
#   bash bench/gpu_check.sh [gpu_check.py options: --steps default|more|all|env,tests,... --trials 10]
# Before the device call, fetch the wheel the GPU machine lacks into the ignored folder .whl/ and
# name it in the call's carry list:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pytest-repeat==0.9.4 pytest-timeout==2.4.0 tqdm==4.70.1 psutil==7.2.2 \
#     mypy==2.4.1 mypy-extensions librt ast-serialize pathspec   # mypyc: setup.py compiles the engine
# Regenerates what bench/gpu_check.py does (reports/gpu/README.md lists it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
# Eager module loading: lazy loading serializes the first launches of a process and hides the race
# in its first iteration (measured on an H200); eager loading removes that first-iteration effect.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$OUT/install.log" || exit 3
python3 -c "import racecheck.cli, pandas, scipy, click, tqdm, psutil, pytest_repeat, pytest_timeout" || exit 3
python3 -c "import racecheck.detect as d; print('racecheck engine:', d.ENGINE)" | tee -a "$OUT/install.log"
# The device call has a hard limit: stop the check in time to pack what it has (GPU_CHECK_SECONDS).
timeout --signal=INT --kill-after=20 "${GPU_CHECK_SECONDS:-570}" python3 bench/gpu_check.py --out "$OUT/gpu" "$@"
rc=$?
tar -czf "$OUT/gpu.tar.gz" -C "$OUT" gpu install.log
cp "$OUT/gpu/summary.json" "$OUT/summary.json" 2>/dev/null
exit $rc
