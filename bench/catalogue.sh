#!/usr/bin/env bash
# Run the whole catalogue on this machine, every scenario with all its arms: under each scenario's
# default profile, without perturbation, under the seeded random schedule, and without
# perturbation with the happens-before detector. Writes reports/catalogue_{perturbed,natural,
# random,detect}.csv, reports/catalogue_table.md (the benchmark table: these CPU columns beside the
# GPU ones of reports/gpu/benchmark_x1_*.csv, "not run" where those are missing, and per tool
# recall and false reports) and splices the same table into reports/catalogue.md and README.md.
#   bash bench/catalogue.sh [TRIALS [SCENARIO,...]]
# With scenarios named, only those run and their rows replace theirs in the CSVs already there
# (bench/catalogue_replace.py), e.g. after those scenarios changed.
# `--table-only` as the only argument rebuilds the tables from the CSVs already there (and quotes
# the CPU runs that made them from reports/catalogue_cpu_runs.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
rc=${RACECHECK:-.venv/bin/racecheck}
py=${PYTHON:-.venv/bin/python}
note="Failing trials out of trials (\`*\` rows; detector and sanitizer columns: trials with a report)."
if [[ ${1:-} != --table-only ]]; then
  trials=${1:-10}
  only=${2:-}
  work=$(mktemp -d)
  declare -A seconds
  run() {  # run NAME ARGS...
    local name=$1; shift
    local start=$SECONDS
    "$rc" run --quiet --scenario "${only:-all}" --arms all --trials "$trials" --out "$work/$name" "$@" >"$work/$name.log" 2>&1
    seconds[$name]=$((SECONDS - start))
    if [[ -n $only ]]; then
      "$py" bench/catalogue_replace.py "reports/catalogue_$name.csv" "$work/$name/summary.csv" --output "reports/catalogue_$name.csv"
    else
      cp "$work/$name/summary.csv" "reports/catalogue_$name.csv"
    fi
  }
  run perturbed
  run natural --no-perturb
  run random --perturb random
  run detect --no-perturb --detect
  rm -rf "$work"
  times="wall times perturbed ${seconds[perturbed]} s, natural ${seconds[natural]} s, random ${seconds[random]} s, detect ${seconds[detect]} s"
  if [[ -n $only ]]; then
    cpu="CPU: the rows of ${only//,/, } from \`bash bench/catalogue.sh $trials $only\` ($times), the others from an earlier \`bash bench/catalogue.sh $trials\`."
  else
    cpu="CPU: \`bash bench/catalogue.sh $trials\`, $times."
  fi
  echo "$cpu" >reports/catalogue_cpu_runs.txt  # what --table-only quotes
fi
[[ -f reports/catalogue_cpu_runs.txt ]] && note="$note $(cat reports/catalogue_cpu_runs.txt)"
gpu=reports/gpu/benchmark_x1
"$py" bench/catalogue_table.py reports/catalogue_table.md --benchmark --splice reports/catalogue.md --splice README.md \
  cpu_perturbed=reports/catalogue_perturbed.csv cpu_natural=reports/catalogue_natural.csv \
  cpu_random=reports/catalogue_random.csv cpu_detect=reports/catalogue_detect.csv \
  gpu_perturbed=$gpu"_perturbed.csv" gpu_natural=$gpu"_natural.csv" gpu_random=$gpu"_random.csv" \
  gpu_detect=$gpu"_detect.csv" gpu_sanitizer=$gpu"_sanitizer.csv" \
  --title "The race catalogue as a benchmark" \
  --note "$note GPU: \`bash bench/gpu_check.sh\` on one H200 at one rank (\`reports/gpu/benchmark_x1_*.csv\`; the calls, and the rows a later call replaced, in reports/gpu/README.md), \"not run\" until those exist."
