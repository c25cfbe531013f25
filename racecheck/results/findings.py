"""The detector's findings in a run: its distinct reports per suite and arm, as a section after
the table in the terminal and Markdown renderings."""

from __future__ import annotations

from racecheck.protocol.printable import first_line
from racecheck.results.render_markdown import md


def detector_findings(records) -> list[dict]:
    """The detector's distinct reports per scenario and arm, merged by their first line (the race
    in one sentence): how many trials saw each, and the full text of its first occurrence."""
    if records is None or "reports" not in records.columns:
        return []
    found: dict[tuple, dict] = {}
    for row in records.itertuples():
        for text in row.reports if isinstance(row.reports, list) else ():
            key = (row.scenario, row.arm, first_line(text))
            entry = found.setdefault(
                key, {"scenario": row.scenario, "arm": row.arm, "sentence": key[2], "trials": set(), "text": text}
            )
            entry["trials"].add(row.trial)
    return [{**f, "trials": len(f["trials"])} for f in found.values()]


def render_findings(findings: list[dict], *, markdown: bool) -> str:
    """A section listing the detector's findings (empty when there are none)."""
    if not findings:
        return ""
    if not markdown:
        lines = ["detector reports"]
        lines += [f"  {f['scenario']} / {f['arm']}: in {f['trials']} trial(s): {f['sentence']}" for f in findings]
        return "\n" + "\n".join(lines) + "\n"
    lines = ["", "### Detector reports", ""]
    for f in findings:
        lines += [
            f"<details><summary><b>{md(f['scenario'])} / {md(f['arm'])}</b>, "
            f"{f['trials']} trial(s): {md(f['sentence'])}</summary>",
            "",
            "```",
            f["text"].rstrip(),
            "```",
            "</details>",
            "",
        ]
    return "\n".join(lines)
