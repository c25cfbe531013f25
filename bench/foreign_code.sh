#!/usr/bin/env bash
# On the GPU machine: install racecheck and megatron-fsdp 0.6.1 into the machine's Python without
# touching its torch, run bench/foreign_code.py (the example projects in examples/ through
# `racecheck run`, every mode), and pack the run folders into $OUT/foreign_code.tar.gz beside the
# table ($OUT/foreign_code.csv and .md; copy both into reports/gpu/).
#   bash bench/foreign_code.sh [foreign_code.py options: --suites ... --modes ... --trials 10]
# Before the device call, fetch the wheels the GPU machine lacks into the ignored folder .whl/ and
# name it in the call's carry list (megatron-fsdp needs torch, einops and packaging, all there):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl megatron-fsdp==0.6.1 \
#     pytest-repeat==0.9.4 pytest-timeout==2.4.0 tqdm==4.70.1 psutil==7.2.2 \
#     mypy==2.4.1 mypy-extensions librt ast-serialize pathspec   # mypyc: setup.py compiles the engine
# Rows merge into an existing reports/gpu/foreign_code.csv, so the modes can be split over calls:
#   bash bench/foreign_code.sh --modes natural,profile,detect   then   --modes systematic,random
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
# Eager module loading: lazy loading serializes a process's first launches and hides races in its
# first iteration (measured on an H200, reports/gpu/README.md, "First iterations").
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-$PWD/foreign-out}
mkdir -p "$OUT/foreign"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$OUT/foreign/install.log" || exit 3
python3 -c "import racecheck.cli, megatron_fsdp.experimental, pytest_repeat, tqdm, psutil" 2>>"$OUT/foreign/install.log" || { tail -3 "$OUT/foreign/install.log"; exit 3; }
# The device call has a hard limit: start no run after FOREIGN_SECONDS, and pack what there is.
python3 bench/foreign_code.py --out "$OUT/foreign" --max-seconds "${FOREIGN_SECONDS:-480}" "$@"
rc=$?
cp reports/gpu/foreign_code.csv reports/gpu/foreign_code.md reports/gpu/foreign_code_bounds.csv "$OUT/" 2>/dev/null
tar -czf "$OUT/foreign_code.tar.gz" -C "$OUT" foreign && rm -rf "$OUT/foreign"
exit $rc
