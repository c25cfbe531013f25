"""Render the trial log as JUnit XML in Maven Surefire's structure, for CI test-report viewers.

One `<testsuite>` per scenario x arm (name `scenario[arm]`, with the arm, its expectation and its
trial count as `<properties>`), one `<testcase>` per test over all of that arm's trials:

- failed in every trial: one `<failure>` (or `<error>` when every failing outcome was an error,
  timeout or crash), its text listing each trial's signature and replay command;
- failed in some trials and passed in others: it counts as passed, as Surefire counts a flaky
  test, with one `<flakyFailure>` (or `<flakyError>`) child per failing trial carrying the
  exception type, the trial's message, and a `<stackTrace>` with signature and replay command;
- skipped in every trial: `<skipped/>`.

Children follow the order of Surefire's XSD (failure, flakyFailure, skipped, error, flakyError),
`type` is always set (the XSD requires it), and characters XML 1.0 forbids are dropped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from racecheck.protocol.node_ids import split_node_id
from racecheck.protocol.records import Outcome
from racecheck.results import stats
from racecheck.results.rows import ALL_TESTS
from racecheck.results.tally import latest_records, summarize

_ERRORS = {Outcome.ERROR.value, Outcome.TIMEOUT.value, Outcome.CRASH.value}
_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text) -> str:
    return _FORBIDDEN.sub("", str(text))


def _classname_and_name(test: str) -> tuple[str, str]:
    """pytest's junitxml convention: `dir/test_f.py::Cls::test_x[p]` ->
    (`dir.test_f.Cls`, `test_x[p]`)."""
    file, classes, name = split_node_id(test)
    module = file.removesuffix(".py").replace("/", ".").replace("\\", ".")
    return ".".join([module, *classes]), name


def _exc_type(record) -> str:
    """The exception type from a signature "ExcType at file.py:LINE in func", else the outcome."""
    signature = record.signature or ""
    return signature.split(" at ", 1)[0].strip() if signature else record.outcome


def _trial_detail(record) -> str:
    lines = [f"trial {record.trial} (seed {record.seed}): {record.outcome}"]
    if record.signature:
        lines.append(f"  {record.signature}")
    if record.message:
        lines.append(f"  {record.message}")
    for report in record.reports or []:
        lines.append(f"  detector: {report}")
    if record.replay:
        lines.append(f"  replay: {record.replay}")
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def _testcase(suite: ET.Element, test: str, runs) -> tuple[str, float]:
    """Append one testcase for a test's records over the trials; return its verdict
    (`passed`, `failure`, `error`, `skipped`) and its time."""
    classname, name = _classname_and_name(test)
    elapsed = float(runs["duration"].fillna(0.0).sum())
    case = ET.SubElement(suite, "testcase", name=_clean(name), classname=_clean(classname), time=_seconds(elapsed))
    failing = [r for r in runs.itertuples() if Outcome(r.outcome).is_failure]
    ran = [r for r in runs.itertuples() if r.outcome != Outcome.SKIPPED.value]
    if not ran:
        ET.SubElement(case, "skipped", message=f"skipped in all {len(runs)} trials")
        return "skipped", elapsed
    if not failing:
        return "passed", elapsed
    if len(failing) == len(ran):
        kind = "error" if all(r.outcome in _ERRORS for r in failing) else "failure"
        types = [_exc_type(r) for r in failing]
        element = ET.SubElement(
            case,
            kind,
            type=_clean(max(set(types), key=types.count)),
            message=_clean(stats.describe_rate(len(failing), len(ran))),
        )
        element.text = _clean("\n".join(_trial_detail(r) for r in failing))
        return kind, elapsed
    # Flaky: Surefire's order puts every flakyFailure before every flakyError.
    for tag, members in (
        ("flakyFailure", [r for r in failing if r.outcome not in _ERRORS]),
        ("flakyError", [r for r in failing if r.outcome in _ERRORS]),
    ):
        for r in members:
            element = ET.SubElement(
                case, tag, type=_clean(_exc_type(r)), message=_clean(f"trial {r.trial}: {r.message or r.outcome}")
            )
            ET.SubElement(element, "stackTrace").text = _clean(_trial_detail(r))
    return "passed", elapsed


def render_junit(records, *, summary=None) -> str:
    """JUnit XML (a `<testsuites>` root) for a tally.load_records frame."""
    records = latest_records(records)
    summary = summarize(records) if summary is None else summary
    root = ET.Element("testsuites", name="racecheck")
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    total_time = 0.0
    star = summary[summary["test"] == ALL_TESTS]
    for row in star.itertuples():
        runs = records[(records["scenario"] == row.scenario) & (records["arm"] == row.arm)]
        suite = ET.SubElement(root, "testsuite", name=_clean(f"{row.scenario}[{row.arm}]"))
        props = ET.SubElement(suite, "properties")
        for key, value in (
            ("scenario", row.scenario),
            ("arm", row.arm),
            ("expect", row.expect or ""),
            ("trials", row.trials),
            ("failing_trials", row.failures),
        ):
            ET.SubElement(props, "property", name=key, value=_clean(value))
        counts = dict(tests=0, failures=0, errors=0, skipped=0)
        elapsed = 0.0
        for test in sorted(set(runs["test"])):
            verdict, seconds = _testcase(suite, test, runs[runs["test"] == test])
            counts["tests"] += 1
            elapsed += seconds
            if verdict != "passed":
                counts[{"failure": "failures", "error": "errors"}.get(verdict, verdict)] += 1
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", _seconds(elapsed))
        total_time += elapsed
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", _seconds(total_time))
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
