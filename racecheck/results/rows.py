"""What every reader of a summary shares: the all-tests marker, the report formats, a summary's
scenarios and per-test rows, and the words for a row's count and rate.

report.py (terminal, Markdown, CSV, JSON), render_html.py and gate.py all read summaries through
these, so every format says the same thing in the same words. Nothing here imports pandas or
scipy at module level, so the command line can offer the formats without loading them.
"""

from __future__ import annotations

import enum

ALL_TESTS = "*"  # the summary's per-trial rows: a trial fails if any of its tests failed


class Format(enum.StrEnum):
    TERMINAL = "terminal"
    MARKDOWN = "markdown"
    CSV = "csv"
    JSON = "json"
    JUNIT = "junit"
    HTML = "html"


def scenarios(summary):
    """(scenario, its `*` rows, its per-test rows), scenarios in summary order."""
    for name in dict.fromkeys(summary["scenario"]):
        rows = summary[summary["scenario"] == name]
        yield name, rows[rows["test"] == ALL_TESTS], rows[rows["test"] != ALL_TESTS]


def per_test_counts(tests, arms: list[str]) -> list[tuple[str, dict]]:
    """[(test, {arm: row})] in summary order: one table line per parametrization."""
    table: dict[str, dict] = {}
    for row in tests.itertuples(index=False):
        table.setdefault(row.test, {})[row.arm] = row
    return [(test, {arm: cells[arm] for arm in arms if arm in cells}) for test, cells in table.items()]


def arm_label(row) -> str:
    """`arm (expect)`, or the arm alone when it has no expectation."""
    return f"{row.arm} ({row.expect})" if row.expect else str(row.arm)


def count(row) -> str:
    """`failures/trials`, or `skipped` for a row whose test never ran."""
    return f"{row.failures}/{row.trials}" if row.trials else "skipped"


def rate_phrase(row, *, short: bool = False) -> str:
    """stats.describe_rate(_short) for a summary row, or what was skipped when nothing ran."""
    if not row.trials:
        return getattr(row, "note", "") or f"no trial ran ({row.skipped} skipped)"
    from racecheck.results import stats  # scipy: only once a row is worded

    describe = stats.describe_rate_short if short else stats.describe_rate
    return describe(row.failures, row.trials) + failure_kinds(row)


def failure_kinds(row) -> str:
    """How the failing trials failed, where not all by a failed assertion, e.g.
    `; of these 2 timed out, 1 crashed` (a trial counts under its worst outcome)."""
    kinds = [
        (getattr(row, "error", 0), "errored"),
        (getattr(row, "timeout", 0), "timed out"),
        (getattr(row, "crash", 0), "crashed"),
    ]
    parts = [f"{int(n)} {what}" for n, what in kinds if n and n == n]  # n == n: not NaN
    return "; of these " + ", ".join(parts) if parts else ""
