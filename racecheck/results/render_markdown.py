"""The Markdown rendering of a run's table, for a pull request or $GITHUB_STEP_SUMMARY, kept under
the size GitHub accepts."""

from __future__ import annotations

from racecheck.protocol.node_ids import short_name
from racecheck.results import stats
from racecheck.results.render_terminal import has_detected
from racecheck.results.rows import count, per_test_counts, rate_phrase, scenarios

# GitHub refuses a step summary above 1 MiB; stay below it with room for the truncation note.
MARKDOWN_LIMIT = 1024 * 1024 - 4096


def md(text: str) -> str:
    """Text safe in a Markdown table cell."""
    return str(text).replace("|", "\\|")


def _markdown_lines(summary) -> list[tuple[str, bool]]:
    """Every Markdown line with a flag: True for a table data row (what truncation drops)."""
    lines: list[tuple[str, bool]] = []
    detected = has_detected(summary)
    for name, star, tests in scenarios(summary):
        lines += [(f"### racecheck: `{md(name)}`", False), ("", False)]
        head = "| arm | expect | failing trials | failure rate | 95% CI |"
        rule = "|---|---|---:|---:|---:|"
        if detected:
            head, rule = head + " detected |", rule + "---:|"
        lines += [(head, False), (rule, False)]
        for r in star.itertuples():
            ci = f"{stats.format_pct(r.ci_low)}-{stats.format_pct(r.ci_high)}"
            cells = [
                f"**{md(r.arm)}**",
                md(r.expect or "-"),
                count(r),
                stats.format_pct(r.failure_rate) if r.trials else "-",
                ci if r.trials else "-",
            ]
            if detected:
                cells.append(f"{r.detected}/{r.trials}")
            lines.append(("| " + " | ".join(cells) + " |", True))
        lines.append(("", False))
        for r in star.itertuples():
            lines.append((f"- **{md(r.arm)}**: {rate_phrase(r)}", False))
        arms = list(star["arm"])
        rows = per_test_counts(tests, arms)
        if rows:
            lines += [
                ("", False),
                ("| test | " + " | ".join(map(md, arms)) + " |", False),
                ("|---|" + "---:|" * len(arms), False),
            ]
            for test, cell in rows:
                counts = [count(cell[a]) if a in cell else "-" for a in arms]
                lines.append((f"| `{md(short_name(test))}` | " + " | ".join(counts) + " |", True))
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
