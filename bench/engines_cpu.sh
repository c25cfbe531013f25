#!/usr/bin/env bash
# The runtime observer's two engines fed the same events, on the CPU: the whole catalogue, every
# arm, under `racecheck run --detect --no-perturb` with RACECHECK_DETECT_ENGINE=compare (in every
# rank engine.py and the native engine see each event; a test whose reports differ between them
# fails with EnginesDisagree), then the soundness check's generated programs on the emulation, as
# generated and with each synchronization removed (bench/soundness.py, its detector compared the
# same way). The catalogue's trials are random only in their timing: its race arms must be
# reported, its safe arms not, and no test may fail for a disagreement.
#   bash bench/engines_cpu.sh        (ENGINES_TRIALS trials per arm, default 2)
# Regenerates reports/engines_cpu.{md,log}.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
OUT=$(mktemp -d)
export RACECHECK_DETECT_ENGINE=compare
log=reports/engines_cpu.log
start=$SECONDS
{
  echo "# $(date -u +%F) $(git rev-parse --short HEAD) torch $(python3 -c 'import torch; print(torch.__version__)')"
  echo "$ RACECHECK_DETECT_ENGINE=compare racecheck run --scenario all --arms all --trials ${ENGINES_TRIALS:-2} --detect --no-perturb --backend sim"
  racecheck run --scenario all --arms all --trials "${ENGINES_TRIALS:-2}" --detect --no-perturb --backend sim \
    --out "$OUT/catalogue"
  echo "rc=$?"
  echo "$ RACECHECK_DETECT_ENGINE=compare python3 bench/soundness.py --backend emulation --programs 40 --racy 40"
  python3 bench/soundness.py --backend emulation --programs 40 --racy 40 --out "$OUT/soundness.csv"
  echo "rc=$?"
  echo "disagreements: $(grep -c EnginesDisagree "$OUT/catalogue/trials.jsonl")"
  echo "$((SECONDS - start)) s"
} >"$log" 2>&1
{
  echo "# The runtime observer's engines on the same events, on the CPU"
  echo
  echo "\`bash bench/engines_cpu.sh\` ($(head -1 "$log" | cut -c3-)): RACECHECK_DETECT_ENGINE=compare feeds engine.py and"
  echo "the native engine every event of every rank; a test whose reports differ fails with EnginesDisagree."
  echo "Disagreements: $(grep -c EnginesDisagree "$OUT/catalogue/trials.jsonl") (the log: \`reports/engines_cpu.log\`)."
  echo
  python3 - "$OUT/catalogue/summary.csv" "$OUT/soundness.csv" <<'PY'
import csv, sys

def table(path, keep, columns):
    """A Markdown table of the CSV's rows that `keep` keeps: (heading, CSV column) pairs."""
    print("| " + " | ".join(h for h, _ in columns) + " |")
    print("|" + "|".join("---" if c in ("scenario", "arm", "expect", "case") else "---:" for _, c in columns) + "|")
    for r in filter(keep, csv.DictReader(open(path))):
        print("| " + " | ".join(r[c] for _, c in columns) + " |")

print("## The catalogue, every arm\n")
table(sys.argv[1], lambda r: r["test"] == "*", [("scenario", "scenario"), ("arm", "arm"), ("expect", "expect"),
      ("trials", "trials"), ("reported", "detected"), ("failed", "failures")])
print("\n## The soundness check's generated programs (bench/soundness.py, emulation)\n")
table(sys.argv[2], lambda r: r["mode"] == "detect", [("case", "case"), ("expect", "expect"),
      ("programs run", "trials"), ("reported", "detected")])
PY
} >reports/engines_cpu.md
grep -q "^disagreements: 0$" "$log" && grep -q " 0 unsound, 0 missed$" "$log"
