"""The JSON rendering of a run's table: its summary rows and, with the trial records, the
distinct failures."""

from __future__ import annotations

import json
import math

from racecheck.results import failures


def render_json(summary, records=None) -> str:
    """The summary rows as JSON: {"summary": [{column: value, ...}, ...]}, rates rounded to 6
    significant digits as in summary.csv, null for the rate of a row that never ran; with the
    trial `records`, also the distinct failures ({"failures": [...]}, failures.py)."""

    def value(v):
        if isinstance(v, float):
            return None if math.isnan(v) else float(f"{v:.6g}")  # NaN: a rate with no trials
        return v

    rows = [{k: value(v) for k, v in row.items()} for row in summary.to_dict(orient="records")]
    data: dict = {"summary": rows}
    if records is not None:
        data["failures"] = [k.to_json() for k in failures.failure_kinds(records)]
        data["suite_failing"] = failures.suites_failing(records)
        data["verdicts"] = failures.verdict_lines(records)  # whose failures they are (blame.py)
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
