#!/usr/bin/env bash
# Measure a world across nodes against one node on this machine and write reports/two_nodes.md:
# the motivating scenario (4 gloo ranks, 2x2 HSDP mesh) run by one node, then by two
# `racecheck run` processes as two nodes of 2 ranks each (a localhost c10d rendezvous).
#   bash bench/two_nodes.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-10}
rc=${RACECHECK:-.venv/bin/racecheck}
work=$(mktemp -d)
report=reports/two_nodes.md
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=(--arms "fixed,baseline" --trials "$trials" --seed 0 --quiet)
nodes=(--nnodes 2 --rdzv-endpoint "127.0.0.1:$port")
seconds() { echo "$(( ($2 - $1) / 1000000000 )).$(( ($2 - $1) / 100000000 % 10 ))"; }

start=$(date +%s%N)
"$rc" run "${args[@]}" --out "$work/one" >"$work/one.log" 2>&1
one=$(seconds "$start" "$(date +%s%N)")

start=$(date +%s%N)
"$rc" run "${args[@]}" --out "$work/two" "${nodes[@]}" --node-rank 1 >"$work/node1.log" 2>&1 &
follower=$!
"$rc" run "${args[@]}" --out "$work/two" "${nodes[@]}" --node-rank 0 >"$work/node0.log" 2>&1
wait "$follower"
two=$(seconds "$start" "$(date +%s%N)")

{
  echo "# A world across two nodes, measured on $(nproc) CPU cores, $(date -u +%Y-%m-%d)"
  echo
  echo "Made by \`bash bench/two_nodes.sh $trials\`: \`racecheck run ${args[*]}\` (main_grad_reuse, 4 gloo"
  echo "ranks), once on one node and once as two nodes of 2 ranks on this machine (\`--nnodes 2"
  echo "--node-rank R --rdzv-endpoint 127.0.0.1:PORT\`). Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "(the machine is shared: wall times are noisy)."
  echo
  echo "| run | wall |"
  echo "| --- | --- |"
  echo "| one node, 4 ranks | $one s |"
  echo "| two nodes, 2 + 2 ranks | $two s |"
  echo
  if diff -q "$work/one/summary.csv" "$work/two/summary.csv" >/dev/null; then
    echo "The two runs' summary.csv are identical:"
  else
    echo "The two runs' summary.csv DIFFER; one node:"
    echo
    "$rc" report "$work/one" --format markdown
    echo
    echo "two nodes:"
  fi
  echo
  "$rc" report "$work/two" --format markdown
} >"$report"
rm -rf "$work"
echo "wrote $report"
