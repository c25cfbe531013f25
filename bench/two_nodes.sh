#!/usr/bin/env bash
# Measure a world across nodes against one node on this machine and write reports/two_nodes.md,
# with the runs' output in reports/two_nodes.log: the motivating scenario (main_grad_reuse) run by
# one node, then by two `racecheck run` processes as two nodes sharing its ranks (a localhost c10d
# rendezvous). WORLD sets the ranks of the world (default 2, the scenario's own; WORLD=4 gives the
# 2x2 HSDP mesh, two nodes of 2 ranks).
#   bash bench/two_nodes.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-10}
world=${WORLD:-2}
rc=${RACECHECK:-.venv/bin/racecheck}
work=$(mktemp -d)
report=reports/two_nodes.md
log=reports/two_nodes.log
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=(--arms "fixed,baseline" --trials "$trials" --seed 0 --world-size "$world" --quiet)
nodes=(--nnodes 2 --rdzv-endpoint "127.0.0.1:$port")
per_node=$((world / 2))
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
  echo "# bash bench/two_nodes.sh $trials (WORLD=$world), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPU cores"
  for part in one node0 node1; do
    echo
    echo "## $part: racecheck run ${args[*]}$([ "$part" = one ] || echo " --nnodes 2 --node-rank ${part#node}")"
    cat "$work/$part.log"
  done
} >"$log"

{
  echo "# A world across two nodes, measured on $(nproc) CPU cores, $(date -u +%Y-%m-%d)"
  echo
  echo "Made by \`bash bench/two_nodes.sh $trials\` (WORLD=$world; the runs' output is in \`$log\`):"
  echo "\`racecheck run ${args[*]}\` (main_grad_reuse, $world gloo ranks), once on one node and"
  echo "once as two nodes of $per_node rank(s) each on this machine (\`--nnodes 2 --node-rank R"
  echo "--rdzv-endpoint 127.0.0.1:PORT\`). Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "(the machine is shared: wall times are noisy)."
  echo
  echo "| run | wall |"
  echo "| --- | --- |"
  echo "| one node, $world ranks | $one s |"
  echo "| two nodes, $per_node + $per_node rank(s) | $two s |"
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
echo "wrote $report and $log"
