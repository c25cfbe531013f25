#!/usr/bin/env bash
# Render `racecheck report OUT --format html` to a file and screenshot it with headless chromium,
# to check by eye that the tables and the plot show (used when reviewing report changes).
#
# usage: scripts/screenshot_report.sh OUT [PNG] [HTML]
#   OUT   a run directory holding trials.jsonl
#   PNG   the screenshot to write (default: OUT/report.png)
#   HTML  the page to write (default: OUT/report.html)
# env:    RACECHECK (default: racecheck on PATH, else .venv/bin/python -m racecheck.cli)
#         CHROMIUM  (default: /usr/bin/chromium)  WINDOW (default: 1200,1600)
set -euo pipefail

if [[ $# -lt 1 || $# -gt 3 ]]; then
  sed -n '5,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
out=$1
png=$(realpath -m "${2:-$out/report.png}")
page=$(realpath -m "${3:-$out/report.html}")
chromium=${CHROMIUM:-/usr/bin/chromium}
window=${WINDOW:-1200,1600}

if [[ ! -x $chromium ]]; then
  echo "screenshot_report: no chromium at $chromium; install it with:" >&2
  echo "  apt-get update && apt-get install -y chromium" >&2
  echo "(or point CHROMIUM at another chromium/chrome binary)" >&2
  exit 3
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
if [[ -n ${RACECHECK:-} ]]; then
  read -r -a racecheck <<<"$RACECHECK"
elif command -v racecheck >/dev/null; then
  racecheck=(racecheck)
else
  racecheck=("$repo/.venv/bin/python" -c "from racecheck.cli import main; main()")
fi

"${racecheck[@]}" report "$out" --format html --output "$page"

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# Flags: no sandbox (containers run as root), no GPU, and no network side traffic at all, so the
# screenshot needs nothing beyond the self-contained page.
"$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --screenshot="$png" --window-size="$window" \
  "file://$page" >/dev/null 2>&1 || {
  echo "screenshot_report: chromium failed; rerun without the redirect to see why" >&2
  exit 3
}
[[ -s $png ]] || { echo "screenshot_report: chromium wrote no screenshot" >&2; exit 3; }
echo "page:       $page"
echo "screenshot: $png"
