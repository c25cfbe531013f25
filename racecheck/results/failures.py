"""The distinct failures of a run, each listed once: its signature, the first line of its message,
how many trials it failed and in which arms. Every renderer of a run (the table at the end of
`racecheck run`, `racecheck report` in terminal, Markdown, JSON and HTML) shows this list after
its table, so that what went wrong is read where the counts are, not only in trials.jsonl.

A failure kind is a (scenario, signature) pair: `ValueError at tests/conftest.py:15 in world` is
one kind however many tests and trials it failed. When every arm of a scenario (two or more)
failed in every trial with the same kinds, the counts say nothing about the race: the list says
whose failure it is, the suite's or racecheck's (blame.py).
"""

from __future__ import annotations

import dataclasses
import html

from racecheck.protocol.printable import first_line
from racecheck.protocol.records import Outcome
from racecheck.results import blame

MESSAGE_CHARS = 200  # of a message's first line, in the list
TERMINAL_KINDS = 10  # kinds listed in the terminal; the Markdown, JSON and HTML list them all


@dataclasses.dataclass
class FailureKind:
    scenario: str
    signature: str
    outcome: str  # the outcome of its first occurrence (failed, error, timeout, crash)
    message: str  # the first line of its first occurrence's message
    trials: dict[str, int]  # arm -> trials of that arm it failed, in the order the arms first failed
    tests: int  # distinct tests it failed

    @property
    def total(self) -> int:
        return sum(self.trials.values())

    def arms_phrase(self) -> str:
        return ", ".join(f"{arm} {n}" for arm, n in self.trials.items())

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "total_trials": self.total}


def failure_kinds(records) -> list[FailureKind]:
    """The kinds in a tally.load_records frame, most trials first (ties: first seen first)."""
    if records is None or not len(records):
        return []
    kinds: dict[tuple[str, str], FailureKind] = {}
    trials: dict[tuple[str, str], dict[str, set]] = {}
    tests: dict[tuple[str, str], set] = {}
    for r in records.itertuples():
        if not Outcome(r.outcome).is_failure:
            continue
        key = (r.scenario, r.signature or r.outcome)
        if key not in kinds:
            kinds[key] = FailureKind(r.scenario, key[1], r.outcome, first_line(r.message, MESSAGE_CHARS), {}, 0)
        trials.setdefault(key, {}).setdefault(r.arm, set()).add(r.trial)
        tests.setdefault(key, set()).add(r.test)
    for key, kind in kinds.items():
        kind.trials = {arm: len(t) for arm, t in trials[key].items()}
        kind.tests = len(tests[key])
    order = {key: i for i, key in enumerate(kinds)}
    return sorted(kinds.values(), key=lambda k: (-k.total, order[(k.scenario, k.signature)]))


def suites_failing(records) -> list[str]:
    """Scenarios of two or more arms in which every arm failed every trial with the same kinds."""
    if records is None or not len(records):
        return []
    out = []
    for scenario, rows in records.groupby("scenario", sort=False):
        arms = {}
        for arm, by_arm in rows.groupby("arm", sort=False):
            failing = by_arm[[Outcome(o).is_failure for o in by_arm["outcome"]]]
            every_trial = set(failing["trial"]) == set(by_arm["trial"])
            arms[arm] = frozenset(s or o for s, o in zip(failing["signature"], failing["outcome"], strict=True))
            if not every_trial:
                break
        else:
            if len(arms) >= 2 and len(set(arms.values())) == 1:
                out.append(str(scenario))
    return out


def verdict_lines(records, *, logs: str = "OUT/logs") -> list[str]:
    """Whose failures they are (blame.py): racecheck's where its own code raised them or a control
    trial without it passed (the run's, `records.attrs["control"]`, tally.load_records), else, for a
    suite failing alike in every arm, the suite's."""
    control = records.attrs.get("control") if hasattr(records, "attrs") else None
    lines = blame.raised_in_racecheck(records)
    return lines + [blame.suite_line(s, records, logs=logs, control=control) for s in suites_failing(records)]


def render_terminal(records, *, logs: str = "OUT/logs") -> str:
    """The list for a terminal (empty when nothing failed); `logs` names the session logs."""
    kinds = failure_kinds(records)
    if not kinds:
        return ""
    multi = len({k.scenario for k in kinds}) > 1
    lines = ["failures, each kind once (trials it failed per arm):"]
    for k in kinds[:TERMINAL_KINDS]:
        where = f"{k.scenario}: " if multi else ""
        lines.append(f"  {where}{k.signature}: {k.message or '(no message)'}")
        lines.append(f"    {k.total} trial(s): {k.arms_phrase()}; {k.tests} test(s)")
    if len(kinds) > TERMINAL_KINDS:
        lines.append(f"  and {len(kinds) - TERMINAL_KINDS} more kinds ('racecheck report OUT --format json' lists all)")
    lines += verdict_lines(records, logs=logs)
    return "\n" + "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("`", "'")


def render_markdown(records) -> str:
    """The list as a Markdown section (empty when nothing failed)."""
    kinds = failure_kinds(records)
    if not kinds:
        return ""
    lines = ["", "### Failures", "", "| scenario | failure | message | trials | arms |", "|---|---|---|---:|---|"]
    for k in kinds:
        cells = [_md(k.scenario), f"`{_md(k.signature)}`", _md(k.message or "-"), str(k.total), _md(k.arms_phrase())]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"**{_md(line)}**" for line in verdict_lines(records))]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_html(records) -> list[str]:
    """The list as HTML elements for render_html's page (empty when nothing failed)."""
    kinds = failure_kinds(records)
    if not kinds:
        return []
    e = html.escape
    out = ["<h2>Failures</h2>", "<table>"]
    out.append('<tr><th class="name">scenario</th><th class="name">failure</th><th class="name">message</th>')
    out[-1] += '<th>trials</th><th class="name">arms</th></tr>'
    for k in kinds:
        out.append(
            f'<tr><td class="name">{e(k.scenario)}</td><td class="name">{e(k.signature)}</td>'
            f'<td class="name">{e(k.message or "-")}</td><td>{k.total}</td>'
            f'<td class="name">{e(k.arms_phrase())}</td></tr>'
        )
    out.append("</table>")
    out += [f"<p><b>{e(line)}</b></p>" for line in verdict_lines(records)]
    return out
