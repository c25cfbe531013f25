#!/usr/bin/env bash
# The CI gate on real runs, written to reports/gates.md, plus the HTML report's screenshot
# (reports/main_grad_reuse_report.png, needs Debian's chromium):
# - the motivating scenario, 10 trials under its default perturbation: gate (fixed, baseline)
#   must pass, and fail with exit 1 when the arms are swapped;
# - the same without perturbation: on the CPU emulation the baseline still reproduces (the host
#   reuses the block at once), so the gate still passes there;
# - a scenario whose baseline reproduces reliably only under its perturbation (unshard_free), gated
#   with --min-rate 0.9 (the power CI requires of the perturbation): passes with its profile, fails
#   with exit 1 without it, as it must when a perturbation has lost its power.
#   bash bench/gates.sh [TRIALS]
set -uo pipefail
cd "$(dirname "$0")/.."
trials=${1:-10}
rc=${RACECHECK:-.venv/bin/racecheck}
work=$(mktemp -d)
report=reports/gates.md
"$rc" run --quiet --arms fixed,baseline --trials "$trials" --out "$work/perturbed" >/dev/null 2>&1
"$rc" run --quiet --arms fixed,baseline --trials "$trials" --no-perturb --out "$work/natural" >/dev/null 2>&1
"$rc" run --quiet --scenario unshard_free --arms record_stream,baseline --trials "$trials" \
  --out "$work/unshard_perturbed" >/dev/null 2>&1
"$rc" run --quiet --scenario unshard_free --arms record_stream,baseline --trials "$trials" --no-perturb \
  --out "$work/unshard_natural" >/dev/null 2>&1
gate() {  # gate TITLE DIR ARGS...
  local title=$1 dir=$2; shift 2
  local text code
  text=$("$rc" gate "$work/$dir" "$@" 2>&1); code=$?
  printf '\n## %s\n\n`racecheck gate OUT %s` exits **%d**\n\n```\n%s\n```\n' "$title" "$*" "$code" "$text" >>"$report"
}
{
  echo "# Gates on real runs ($(nproc) CPU cores, $(date -u +%Y-%m-%d))"
  echo
  echo "Made by \`bash bench/gates.sh $trials\`; each run has $trials trials per arm."
} >"$report"
gate "main_grad_reuse, default perturbation: the fix holds and the race reproduces" perturbed --fixed fixed --baseline baseline
gate "main_grad_reuse, default perturbation, baseline required to fail at least 90%" perturbed --fixed fixed --baseline baseline --min-rate 0.9
gate "main_grad_reuse, arms swapped: fails" perturbed --fixed baseline --baseline fixed
gate "main_grad_reuse, with --confidence 0.95 and a 30% bound" perturbed --fixed fixed --baseline baseline --max-rate 0.3 --min-rate 0.5 --confidence 0.95
gate "main_grad_reuse, no perturbation, same 90% gate (the CPU emulation still reproduces it)" natural --fixed fixed --baseline baseline --min-rate 0.9
gate "unshard_free, default perturbation, baseline required to fail at least 90%" unshard_perturbed --fixed record_stream --baseline baseline --min-rate 0.9
gate "unshard_free, no perturbation, same gate: the baseline's rate drops, the gate fails" unshard_natural --fixed record_stream --baseline baseline --min-rate 0.9
if [ -x /usr/bin/chromium ]; then
  bash scripts/screenshot_report.sh "$work/perturbed" reports/main_grad_reuse_report.png "$work/report.html" >/dev/null 2>&1 \
    && echo "wrote reports/main_grad_reuse_report.png"
fi
rm -rf "$work"
echo "wrote $report"
