#!/usr/bin/env bash
# On the GPU machine, in one device call: install racecheck into the machine's Python without
# touching its torch; run the CUDA tests of patch mode and of the detector on compiled code and
# Triton kernels (both paths); then bench/modern_code.py (examples/compiled through `racecheck run`,
# every mode, the detector on both paths). Packs every log and run folder into
# $OUT/modern_code.tar.gz beside the tables ($OUT/modern_code.csv, .md, _bounds.csv; copy them into
# reports/gpu/ and the log into reports/gpu/modern_code.log).
#   bash bench/modern_code.sh [modern_code.py options: --modes ... --jobs 8 --missing]
# MODERN_TESTS=0 leaves out the CUDA tests (a call that only adds runs to the table).
# The wheels the machine lacks travel in .whl/ (bench/gpu_check.sh's header says which).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-$PWD/modern-out}
mkdir -p "$OUT/modern"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$OUT/modern/install.log" || exit 3
python3 -c "import racecheck.cli, tqdm, psutil, pytest_repeat, triton; import racecheck.detect as d; print('engine', d.ENGINE)" \
  | tee -a "$OUT/modern/install.log" || exit 3
start=$(date +%s)
# The CUDA tests (about a minute): the tracker on compiled and Triton kernels and early records,
# patch mode on torch.cuda, a generated program in every form. Their Inductor compiles also warm the cache the runs below hit.
[ "${MODERN_TESTS:-1}" = 0 ] || python3 -m pytest -q -p no:cacheprovider -x tests/test_detect_cuda.py tests/test_patch_cuda.py \
  tests/test_kernel_launches.py tests/test_patch_modern.py \
  "tests/test_soundness.py::test_on_cuda_a_program_with_its_copies_in_every_form_is_correct_and_unreported" \
  2>&1 | tee "$OUT/modern/cuda_tests.log" | tail -5
(cd examples/compiled && SIDE_STREAM_ORDERING=fixed python3 -m pytest -q -p no:cacheprovider) 2>&1 \
  | tee "$OUT/modern/warm.log" | tail -2
left=$(( ${MODERN_SECONDS:-540} - ($(date +%s) - start) ))
python3 bench/modern_code.py --out "$OUT/modern" --max-seconds "$left" "$@" 2>&1 | tee "$OUT/modern/modern_code.log"
rc=${PIPESTATUS[0]}
cp reports/gpu/modern_code.csv reports/gpu/modern_code.md reports/gpu/modern_code_bounds.csv "$OUT/" 2>/dev/null
tar -czf "$OUT/modern_code.tar.gz" -C "$OUT" modern && rm -rf "$OUT/modern"
exit "$rc"
