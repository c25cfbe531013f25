#!/usr/bin/env bash
# Measure the main job on this machine and write reports/main_grad_reuse.md: the motivating race
# under its default perturbation (fixed vs baseline, then the other two fixes), the natural rates
# without perturbation, both isolation modes' wall times for 10 trials x 2 arms, and the report's 2x2 HSDP mesh.
#   bash bench/main_job.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-10}
rc=${RACECHECK:-.venv/bin/racecheck}
work=$(mktemp -d)
report=reports/main_grad_reuse.md
section() {  # section TITLE NAME ARGS...: run, time it, append the Markdown table
  local title=$1 name=$2; shift 2
  local start end
  start=$(date +%s%N)
  "$rc" run --quiet --out "$work/$name" "$@" >"$work/$name.log" 2>&1
  end=$(date +%s%N)
  {
    printf '\n## %s\n\n`racecheck run %s` — %d.%d s wall\n\n' "$title" "$*" $(( (end - start) / 1000000000 )) $(( (end - start) / 100000000 % 10 ))
    "$rc" report "$work/$name" --format markdown
  } >>"$report"
  cp "$work/$name/summary.csv" "reports/main_grad_reuse_$name.csv"
}
{
  echo "# main_grad_reuse: measured on $(nproc) CPU cores, $(date -u +%Y-%m-%d)"
  echo
  echo "Made by \`bash bench/main_job.sh $trials\` (racecheck $(.venv/bin/python -c 'import racecheck; print(racecheck.__version__)'), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), CPU emulation over gloo, the scenario's world: 2 ranks, 2x1 mesh; the last section: the report's 4 ranks, 2x2 HSDP mesh)."
} >"$report"
section "Default perturbation (rs_window): fixed vs baseline" perturbed --arms fixed,baseline --trials "$trials"
section "Default perturbation: the other fixes" other_fixes --arms record_stream,hold_until_wait --trials "$trials"
section "No perturbation: the natural rates" natural --arms fixed,baseline --trials "$trials" --no-perturb
section "Process isolation (a fresh process world per trial)" process --arms fixed,baseline --trials "$trials" --isolation process
section "The report's HSDP mesh: 4 ranks, 2x2" hsdp_2x2 --arms fixed,baseline --trials "$trials" --world-size 4 --mesh 2x2
rm -rf "$work"
echo "wrote $report"
