#!/usr/bin/env bash
# On the GPU machine: the evidence that a red result on a user's suite means a race (the README's
# "Soundness" section), packed into $OUT/verdicts.tar.gz:
#   tests      the CUDA tests (pytest -m cuda), their log
#   before     FSDP2 (examples/fsdp2, the transformer suite) under the profiles that failed it, with
#              racecheck as it was before allocator actions waited for an allocation (the package
#              of commit b7b4528, carried as .whl/old_racecheck.tar: `git archive -o
#              .whl/old_racecheck.tar b7b4528 racecheck`) and as it is
#   foreign    bench/foreign_code.py: the example projects in every mode and the soundness check's
#              generated programs on torch.cuda (FOREIGN_MODES, FOREIGN_SUITES, FOREIGN_JOBS;
#              FOREIGN_TRIALS for the detect runs, RANDOM_TRIALS, PROFILE_TRIALS, SYSTEMATIC_TRIALS;
#              FOREIGN_SEED for further trials of a mode, as rows of their own; FOREIGN_WORLD_SIZE=2
#              on nvidia-h200-x2, where FSDP2 issues its own all-gathers and reduce-scatters)
#   megatron   the same for megatron-fsdp alone (MEGATRON_MODES), beside the others
#   catalogue  the catalogue's scenarios that fit one GPU, every arm under its profile
#   own        bench/own_suite_gpu.sh: a user's one-rank NCCL suite, --world-size beyond the GPUs
#   bash bench/verdicts_gpu.sh [PART ...]      (default: every part; they run side by side)
# The wheels the machine lacks travel in .whl/ (bench/gpu_check.sh's header; hypothesis too).
# Regenerates reports/gpu/verdicts/, which the README's Soundness section cites.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=EAGER
OUT=${OUT:-$PWD/verdicts-out}
V=$OUT/verdicts
mkdir -p "$V"
# shellcheck source=bench/gpu_install.sh
source bench/gpu_install.sh
gpu_install "$V/install.log" || exit 3
python3 -c "import racecheck.cli, hypothesis, megatron_fsdp, pytest_repeat, tqdm, psutil" 2>>"$V/install.log" || exit 3
parts=("$@")
[ $# -gt 0 ] || parts=(tests before foreign catalogue)
SECONDS_LEFT=${VERDICTS_SECONDS:-540}

before() {  # FSDP2 under the profiles of the report, racecheck before and after the change
  mkdir -p /tmp/old && tar -xf .whl/old_racecheck.tar -C /tmp/old || return 3
  local spec code
  for code in old new; do
    for spec in "sleep@stream_enter:3ms,sleep@stream_wait:3ms,pressure@free" \
      "sleep@stream_enter:3ms,sleep@stream_wait:3ms,poison@free"; do
      if [ "$code" = old ]; then
        PYTHONPATH=/tmp/old:$PYTHONPATH python3 bench/fsdp2_free_before_wait.py --perturb "$spec" --trials 10
      else
        python3 bench/fsdp2_free_before_wait.py --perturb "$spec" --trials 10
      fi
    done
  done >"$V/before.pattern.log" 2>&1
  for code in old new; do
    for spec in "sleep@stream_enter:3ms,sleep@stream_wait:3ms,pressure@free" \
      "sleep@stream_enter:3ms,sleep@stream_wait:3ms,poison@free"; do
      local tag=${spec//[@:,]/_}
      (
        cd examples/fsdp2 || exit 3
        [ "$code" = old ] && export PYTHONPATH=/tmp/old:$PYTHONPATH RACECHECK_PURE_PYTHON=1
        timeout "$((SECONDS_LEFT - 60))" python3 -m racecheck run --arms bf16,fp32 --trials "${BEFORE_TRIALS:-10}" --quiet --perturb "$spec" \
          --out "$V/before/$code.$tag" -- tests/test_transformer.py
      ) >"$V/before.$code.$tag.log" 2>&1 &
    done
  done
  wait
}

for part in "${parts[@]}"; do
  case "$part" in
    tests) (timeout 400 python3 -m pytest -q -m cuda -p no:cacheprovider tests/ >"$V/cuda_tests.log" 2>&1; echo "exit $?" >>"$V/cuda_tests.log") & ;;
    before) before & ;;
    foreign) (python3 bench/foreign_code.py --out "$V/foreign" --report "$V/report" --jobs "${FOREIGN_JOBS:-6}" \
      --suites "${FOREIGN_SUITES:-megatron_fsdp,fsdp2,plain_torch}" \
      --modes "${FOREIGN_MODES:-natural,profile,detect,random,systematic,soundness}" \
      ${FOREIGN_WORLD_SIZE:+--world-size "$FOREIGN_WORLD_SIZE"} --seed "${FOREIGN_SEED:-0}" --trials "${FOREIGN_TRIALS:-10}" --random-trials "${RANDOM_TRIALS:-30}" --profile-trials "${PROFILE_TRIALS:-10}" --systematic-trials "${SYSTEMATIC_TRIALS:-30}" --profiles "${PROFILES:-.}" \
      --max-seconds "$((SECONDS_LEFT - 60))" >"$V/foreign.log" 2>&1) & ;;
    megatron) (python3 bench/foreign_code.py --out "$V/megatron" --report "$V/report-megatron" --jobs 2 \
      --suites megatron_fsdp --modes "${MEGATRON_MODES:-profile,systematic}" \
      --systematic-trials "${MEGATRON_SYSTEMATIC_TRIALS:-30}" --max-seconds "$((SECONDS_LEFT - 60))" \
      >"$V/megatron.log" 2>&1) & ;;
    catalogue) (timeout "$((SECONDS_LEFT - 40))" python3 -m racecheck run --backend cuda --arms all --trials 10 --quiet \
      --world-size 1 --max-time "$((SECONDS_LEFT - 80))" --out "$V/catalogue" --scenario "$(python3 -c '
import sys; sys.path.insert(0, "bench")
from gpu_check import catalogue_split
print(",".join(catalogue_split(1)[0]))')" >"$V/catalogue.log" 2>&1) & ;;
    own) (bash bench/own_suite_gpu.sh >/dev/null 2>&1; cp "$OUT/own_suite.log" "$V/") & ;;
    *) echo "verdicts_gpu.sh: unknown part '$part' (tests, before, foreign, megatron, catalogue, own)" >&2; exit 2 ;;
  esac
done
wait
cp reports/gpu/foreign_code_bounds.csv "$V/report/" 2>/dev/null
tar -czf "$OUT/verdicts.tar.gz" -C "$OUT" verdicts
tail -3 "$V"/*.log 2>/dev/null | head -80
