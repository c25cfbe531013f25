#!/usr/bin/env bash
# On the GPU machine: the README's main job as a newcomer runs it there (installed into the Python
# that holds the machine's torch, no constraints file), timed, then the whole catalogue at the world one machine
# allows (scenarios that need more GPUs are skipped and named). The machine has no package index:
# the wheels in .whl/ stand in for it (see bench/gpu_check.sh for the download command; setuptools
# and mypy are the build requirements). Writes $OUT/front_door.log and the run folders' CSVs.
#   bash bench/front_door_gpu.sh
# Regenerates reports/gpu/front_door_x1.log, which the README cites.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
log="$OUT/front_door.log"
{
  echo "== $(nvidia-smi -L 2>/dev/null | head -4)"
  python3 -c "import torch; print('torch', torch.__version__, 'GPUs', torch.cuda.device_count())"
  python3 -c "import sys, torch; print(sys.prefix, sys.base_prefix, torch.__file__)"
  start=$(date +%s)
  # README, on a GPU machine: install into the Python that holds its CUDA torch.
  python3 -m pip install -q --no-index --find-links .whl -e . >"$OUT/install.log" 2>&1 ||
    { tail -20 "$OUT/install.log"; exit 3; }
  echo "== setup: $(( $(date +%s) - start )) s"
  echo "== racecheck run --arms fixed,baseline --trials 10"
  /usr/bin/time -f "wall %e s" racecheck run --arms fixed,baseline --trials 10 --out "$OUT/main_job"
  echo "exit $?"
  echo "== racecheck run --scenario all --arms all --trials 3"
  /usr/bin/time -f "wall %e s" racecheck run --scenario all --arms all --trials 3 --out "$OUT/all"
  echo "exit $?"
  cat "$OUT/all/summary.csv" | grep -E ',\*,'
} 2>&1 | tee "$log"
cp "$OUT/main_job/summary.csv" "$OUT/main_job_summary.csv" 2>/dev/null
cp "$OUT/all/summary.csv" "$OUT/all_summary.csv" 2>/dev/null
rm -rf "$OUT/main_job" "$OUT/all"
