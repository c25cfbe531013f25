"""Render a summary as one self-contained HTML page: inline CSS, the tables, and an embedded plot.

The plot (a PNG in a base64 data URI, drawn with matplotlib's Agg canvas so no display or global
backend is touched) shows each parametrization's failure rate per arm with 95% Wilson interval
error bars, one panel per scenario; matplotlib is imported only when a page is rendered.
"""

from __future__ import annotations

import base64
import html
import io

from racecheck.protocol.node_ids import short_name
from racecheck.results import failures, stats
from racecheck.results.rows import per_test_counts, rate_phrase, scenarios

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1100px; color: #1f2328; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { font-size: 1.25em; margin-top: 1.8em; }
p.note { color: #59636e; margin-top: 0; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
th, td { border: 1px solid #d1d9e0; padding: .3em .7em; text-align: right; }
th { background: #f6f8fa; } td.name, th.name { text-align: left; font-family: ui-monospace,
     SFMono-Regular, Menlo, monospace; font-size: .92em; }
td.bad { background: #ffebe9; color: #82071e; } td.good { background: #dafbe1; color: #116329; }
ul.rates { padding-left: 1.2em; } img.plot { max-width: 100%; border: 1px solid #d1d9e0; }
"""
# Arms expected to race are drawn in reds, safe arms in greens and blues, others in greys.
_COLOURS = {
    "race": ("#cf222e", "#bc4c00", "#a40e26"),
    "safe": ("#1a7f37", "#0969da", "#8250df", "#1b7c83"),
    "": ("#57606a", "#9a6700", "#6e7781"),
}


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _rate_cell(row) -> str:
    if not row.trials:
        return f"<td>skipped ({row.skipped})</td>"
    cls = "bad" if row.failures else "good"
    ci = f"{stats.format_pct(row.ci_low)}&ndash;{stats.format_pct(row.ci_high)}"
    return f'<td class="{cls}">{row.failures}/{row.trials} ({stats.format_pct(row.failure_rate)}; {ci})</td>'


def plot_failure_rates(summary) -> bytes:
    """PNG bytes: failure rate per parametrization (and `*`: any test) per arm, Wilson 95% bars."""
    import matplotlib

    # Test ids, arms and scenario names are shown as written: `$...$` in a parametrization is
    # no mathtext.
    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        return _plot(list(scenarios(summary)))


def _plot(panels) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6 * max(len(panels), 1)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(len(panels), 1), 1, squeeze=False)[:, 0]
    for ax, (name, star, tests) in zip(axes, panels, strict=False):  # one axis even for no panel
        arms = list(star["arm"])
        # A group per parametrization that ran in some arm; its label is the parametrization
        # alone when the scenario has one test function, else function and parametrization.
        ran = [(t, cells) for t, cells in per_test_counts(tests, arms) if any(r.trials for r in cells.values())]
        functions = {short_name(t).split("[", 1)[0] for t, _ in ran}
        groups = [("any test (trial)", {r.arm: r for r in star.itertuples()})]
        groups += [
            (
                short_name(t).split("[", 1)[1].rstrip("]")
                if len(functions) == 1 and "[" in short_name(t)
                else short_name(t),
                cells,
            )
            for t, cells in ran
        ]
        width = 0.8 / max(len(arms), 1)
        used = {kind: 0 for kind in _COLOURS}
        for i, arm in enumerate(arms):
            xs, ys, lo, hi = [], [], [], []
            for g, (_, cells) in enumerate(groups):
                if arm in cells and cells[arm].trials:  # a test that never ran has no rate
                    r = cells[arm]
                    xs.append(g - 0.4 + width * (i + 0.5))
                    ys.append(r.failure_rate)
                    lo.append(r.failure_rate - r.ci_low)
                    hi.append(r.ci_high - r.failure_rate)
            expect = star[star["arm"] == arm]["expect"].iloc[0]
            kind = expect if expect in _COLOURS else ""
            colour = _COLOURS[kind][used[kind] % len(_COLOURS[kind])]
            used[kind] += 1
            ax.bar(xs, ys, width * 0.9, color=colour, alpha=0.8, label=f"{arm} ({expect})" if expect else arm)
            # The point and its interval, so that a rate of 0 still shows its upper bound.
            ax.errorbar(
                xs, ys, yerr=[lo, hi], fmt="o", color=colour, ecolor="#1f2328", markersize=4, capsize=3, linewidth=1
            )
        ax.set_xticks(range(len(groups)), [g for g, _ in groups], rotation=20, ha="right")
        ax.set_ylim(-0.03, 1.05)
        ax.set_ylabel("failure rate")
        ax.set_title(f"{name}: failing trials per parametrization (95% Wilson interval)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _scenario_section(name, star, tests, *, detected: bool) -> list[str]:
    out = [f"<h2>{_e(name)}</h2>", '<ul class="rates">']
    for r in star.itertuples():
        label = f"{r.arm} ({r.expect})" if r.expect else r.arm
        out.append(f"<li><b>{_e(label)}</b>: {_e(rate_phrase(r))}</li>")
    out.append("</ul>")
    head = '<tr><th class="name">arm</th><th>expect</th><th>failing trials (rate; 95% CI)</th>'
    head += "<th>passed</th><th>failed</th><th>error</th><th>timeout</th><th>crash</th>"
    head += "<th>detected</th></tr>" if detected else "</tr>"
    out += ["<table>", head]
    for r in star.itertuples():
        cells = [f'<td class="name">{_e(r.arm)}</td>', f"<td>{_e(r.expect or '-')}</td>", _rate_cell(r)] + [
            f"<td>{getattr(r, c)}</td>" for c in ("passed", "failed", "error", "timeout", "crash")
        ]
        if detected:
            cells.append(f"<td>{r.detected}/{r.trials}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    arms = list(star["arm"])
    rows = per_test_counts(tests, arms)
    if rows:
        out += ["<table>", '<tr><th class="name">test</th>' + "".join(f"<th>{_e(a)}</th>" for a in arms) + "</tr>"]
        for test, by_arm in rows:
            tds = [_rate_cell(by_arm[a]) if a in by_arm else "<td>-</td>" for a in arms]
            out.append(f'<tr><td class="name" title="{_e(test)}">{_e(short_name(test))}</td>' + "".join(tds) + "</tr>")
        out.append("</table>")
    return out


def render_html(summary, *, records=None, title: str = "racecheck report") -> str:
    """The whole page as a string (no external resources); with the trial `records`, the distinct
    failures after the tables (failures.py)."""
    detected = "detected" in summary.columns
    png = base64.b64encode(plot_failure_rates(summary)).decode("ascii")
    body = [
        f"<h1>{_e(title)}</h1>",
        '<p class="note">A trial fails if any of its tests failed. Intervals are 95% Wilson '
        "score intervals; &ldquo;rate below X&rdquo; quotes the interval&rsquo;s upper end."
        "</p>",
    ]
    for name, star, tests in scenarios(summary):
        body += _scenario_section(name, star, tests, detected=detected)
    body += failures.render_html(records)
    body += [
        "<h2>Failure rate per parametrization</h2>",
        f'<img class="plot" alt="failure rate per parametrization per arm, with 95% Wilson '
        f'intervals" src="data:image/png;base64,{png}">',
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
