"""Render a run's table in any of its formats: `render(fmt, ...)` is the one entry point the CLI
uses, and `RENDERERS` maps every Format to its renderer, each in a module of its own
(render_terminal, render_markdown, render_json, render_junit, render_html; the CSV is tally's
summary.csv). A new format is a member of rows.Format and a row here; a Format without one is an
error at import, never a silent fall-through to another format.

Every renderer reads a tally.summarize frame (one row per scenario x test x arm plus the `*` rows)
and words rates with stats.describe_rate*, so all formats say the same thing in the same words;
with the trial records, the terminal, Markdown, JSON and HTML renderings list the distinct
failures after the table (failures.py), and the terminal and Markdown ones the detector's reports.
"""

from __future__ import annotations

from collections.abc import Callable

from racecheck.results import failures
from racecheck.results.findings import detector_findings, render_findings
from racecheck.results.render_json import render_json
from racecheck.results.render_markdown import MARKDOWN_LIMIT, render_markdown
from racecheck.results.render_terminal import render_terminal
from racecheck.results.rows import Format
from racecheck.results.tally import summary_to_csv


def _terminal(summary, records) -> str:
    return (
        render_terminal(summary)
        + failures.render_terminal(records)
        + render_findings(detector_findings(records), markdown=False)
    )


def _markdown(summary, records) -> str:
    after = failures.render_markdown(records) + render_findings(detector_findings(records), markdown=True)
    return render_markdown(summary, max_bytes=MARKDOWN_LIMIT - len(after.encode())) + after


def _csv(summary, records) -> str:
    return summary_to_csv(summary)


def _junit(summary, records) -> str:
    from racecheck.results.render_junit import render_junit

    if records is None:
        raise ValueError("the JUnit report needs the trial records, not only the summary")
    return render_junit(records, summary=summary)


def _html(summary, records) -> str:
    from racecheck.results.render_html import render_html

    return render_html(summary, records=records)


RENDERERS: dict[Format, Callable[..., str]] = {
    Format.TERMINAL: _terminal,
    Format.MARKDOWN: _markdown,
    Format.CSV: _csv,
    Format.JSON: render_json,
    Format.JUNIT: _junit,
    Format.HTML: _html,
}
_missing = set(Format) - set(RENDERERS)
assert not _missing, f"formats without a renderer: {_missing}"


def render(fmt: str | Format, *, summary, records=None) -> str:
    """Render in `fmt`; JUnit needs the trial `records` (a tally.load_records frame)."""
    return RENDERERS[Format(fmt)](summary, records)
