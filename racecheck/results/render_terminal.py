"""The terminal rendering of a run's table: arms side by side per suite, then one line per
parametrization with each arm's count (what `racecheck run` prints and `report` shows by default)."""

from __future__ import annotations

from racecheck.protocol.node_ids import short_name
from racecheck.results.rows import arm_label, count, per_test_counts, rate_phrase, scenarios


def has_detected(summary) -> bool:
    """Whether the summary has the detector's column (a run with --detect)."""
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
            if has_detected(summary):
                line += f"; detector reported in {row.detected}/{row.trials}"
            out.append(line)
        arms = list(dict.fromkeys([*star["arm"], *tests["arm"]]))
        rows = per_test_counts(tests, arms)
        if rows:
            out.append("")
            cells = [[f"{arm} {count(cell[arm])}" if arm in cell else f"{arm} -" for arm in arms] for _, cell in rows]
            names = [short_name(t) for t, _ in rows]
            name_w = max(map(len, names))
            col_w = [max(len(c[i]) for c in cells) for i in range(len(arms))]
            for test, row_cells in zip(names, cells, strict=True):
                padded = "   ".join(c.ljust(w) for c, w in zip(row_cells, col_w, strict=True))
                out.append(f"  {test:<{name_w}}   {padded}".rstrip())
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
