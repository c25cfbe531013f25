"""Render a summary (and, for JUnit, the trial log) as terminal text, Markdown, CSV or JSON.

`render(fmt, ...)` is the one entry point the CLI uses; JUnit XML and HTML live in
render_junit.py and render_html.py. Every renderer reads a tally.summarize frame (one row per
scenario x test x arm plus the `*` rows) and words rates with stats.describe_rate*, so all formats
say the same thing in the same words.
"""

from __future__ import annotations

import json
import math

from racecheck.results import failures, stats
from racecheck.results.rows import Format, arm_label, count, per_test_counts, rate_phrase, scenarios, short_test
from racecheck.results.tally import summary_to_csv

# GitHub refuses a step summary above 1 MiB; stay below it with room for the truncation note.
MARKDOWN_LIMIT = 1024 * 1024 - 4096


def _has_detected(summary) -> bool:
    return "detected" in summary.columns


def render_terminal(summary) -> str:
    """Arms side by side per scenario ("failing trials out of trials"), then one line per
    parametrization with each arm's count, e.g.
    `test_hsdp_losses_match_baseline[1-True]   baseline 10/10   fixed 0/10`."""
    out: list[str] = []
    for name, star, tests in scenarios(summary):
        out.append(name)
        labels = [arm_label(r) for r in star.itertuples()]
        width = max(map(len, labels), default=0)
        for label, row in zip(labels, star.itertuples(), strict=True):
            line = f"  {label:<{width}}  {rate_phrase(row, short=True)}"
            if _has_detected(summary):
                line += f"; detector reported in {row.detected}/{row.trials}"
            out.append(line)
        arms = list(dict.fromkeys([*star["arm"], *tests["arm"]]))
        rows = per_test_counts(tests, arms)
        if rows:
            out.append("")
            cells = [[f"{arm} {count(cell[arm])}" if arm in cell else f"{arm} -" for arm in arms] for _, cell in rows]
            names = [short_test(t) for t, _ in rows]
            name_w = max(map(len, names))
            col_w = [max(len(c[i]) for c in cells) for i in range(len(arms))]
            for test, row_cells in zip(names, cells, strict=True):
                padded = "   ".join(c.ljust(w) for c, w in zip(row_cells, col_w, strict=True))
                out.append(f"  {test:<{name_w}}   {padded}".rstrip())
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def _markdown_lines(summary) -> list[tuple[str, bool]]:
    """Every Markdown line with a flag: True for a table data row (what truncation drops)."""
    lines: list[tuple[str, bool]] = []
    detected = _has_detected(summary)
    for name, star, tests in scenarios(summary):
        lines += [(f"### racecheck: `{_md(name)}`", False), ("", False)]
        head = "| arm | expect | failing trials | failure rate | 95% CI |"
        rule = "|---|---|---:|---:|---:|"
        if detected:
            head, rule = head + " detected |", rule + "---:|"
        lines += [(head, False), (rule, False)]
        for r in star.itertuples():
            ci = f"{stats.format_pct(r.ci_low)}-{stats.format_pct(r.ci_high)}"
            cells = [
                f"**{_md(r.arm)}**",
                _md(r.expect or "-"),
                count(r),
                stats.format_pct(r.failure_rate) if r.trials else "-",
                ci if r.trials else "-",
            ]
            if detected:
                cells.append(f"{r.detected}/{r.trials}")
            lines.append(("| " + " | ".join(cells) + " |", True))
        lines.append(("", False))
        for r in star.itertuples():
            lines.append((f"- **{_md(r.arm)}**: {rate_phrase(r)}", False))
        arms = list(star["arm"])
        rows = per_test_counts(tests, arms)
        if rows:
            lines += [
                ("", False),
                ("| test | " + " | ".join(map(_md, arms)) + " |", False),
                ("|---|" + "---:|" * len(arms), False),
            ]
            for test, cell in rows:
                counts = [count(cell[a]) if a in cell else "-" for a in arms]
                lines.append((f"| `{_md(short_test(test))}` | " + " | ".join(counts) + " |", True))
        lines.append(("", False))
    return lines


def render_markdown(summary, *, max_bytes: int = MARKDOWN_LIMIT) -> str:
    """Markdown for a pull request or $GITHUB_STEP_SUMMARY, at most `max_bytes` of UTF-8: past
    that, table rows are left out and a note says how many (summary.csv has them all)."""
    lines = _markdown_lines(summary)
    out, size = [], 0
    for i, (line, _) in enumerate(lines):
        size += len(line.encode("utf-8")) + 1
        if size > max_bytes - 256:  # keep room for the note
            omitted = sum(1 for _, row in lines[i:] if row)
            out += [
                "",
                f"_{omitted} more table rows left out to stay under "
                f"{max_bytes} bytes; see summary.csv for all of them._",
            ]
            break
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


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
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def detector_findings(records) -> list[dict]:
    """The detector's distinct reports per scenario and arm, merged by their first line (the race
    in one sentence): how many trials saw each, and the full text of its first occurrence."""
    if records is None or "reports" not in records.columns:
        return []
    found: dict[tuple, dict] = {}
    for row in records.itertuples():
        for text in row.reports if isinstance(row.reports, list) else ():
            key = (row.scenario, row.arm, text.strip().splitlines()[0] if text.strip() else "")
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
            f"<details><summary><b>{_md(f['scenario'])} / {_md(f['arm'])}</b>, "
            f"{f['trials']} trial(s): {_md(f['sentence'])}</summary>",
            "",
            "```",
            f["text"].rstrip(),
            "```",
            "</details>",
            "",
        ]
    return "\n".join(lines)


def render(fmt: str | Format, *, summary, records=None) -> str:
    """Render in `fmt`; JUnit needs the trial `records` (a tally.load_records frame); with them
    the terminal, Markdown, JSON and HTML renderings list the distinct failures after the table
    (failures.py), and the terminal and Markdown ones the detector's reports."""
    fmt = Format(fmt)
    if fmt is Format.TERMINAL:
        return (
            render_terminal(summary)
            + failures.render_terminal(records)
            + render_findings(detector_findings(records), markdown=False)
        )
    if fmt is Format.MARKDOWN:
        after = failures.render_markdown(records) + render_findings(detector_findings(records), markdown=True)
        return render_markdown(summary, max_bytes=MARKDOWN_LIMIT - len(after.encode())) + after
    if fmt is Format.CSV:
        return summary_to_csv(summary)
    if fmt is Format.JSON:
        return render_json(summary, records)
    if fmt is Format.JUNIT:
        from racecheck.results.render_junit import render_junit

        if records is None:
            raise ValueError("the JUnit report needs the trial records, not only the summary")
        return render_junit(records, summary=summary)
    from racecheck.results.render_html import render_html

    return render_html(summary, records=records)
